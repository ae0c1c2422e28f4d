// Per-sample gradients of a parameter from its recorded uses: the generic part.
// What each kind of use contributes (its norms, G_i, the weighted sum) is its
// rule, beside its op (engine/per_sample_rule.hpp); here the uses are checked,
// viewed as per-sample blocks, and handed to their kind's rule.
// Shapes: B samples; a use of W (d, p) has activations a (B, Ta, d) and output
// cotangents delta (B, Ta, p), Ta = steps or positions of that use.
#include "engine/per_sample.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/blas.hpp"
#include "engine/per_sample_rule.hpp"
#include "engine/runtime.hpp"

namespace dpgrad {

namespace detail {
template <class T>
void PerSampleRule<T>::sparse_gradients(const std::vector<UseView<T>>&, std::size_t, std::size_t, std::size_t,
                                        PerSampleGradients<T>&) const {
  throw std::logic_error("per-sample rule: this kind of use keeps dense gradients");
}
template class PerSampleRule<float>;
template class PerSampleRule<double>;
}  // namespace detail

namespace {

using detail::axpy;
using detail::for_samples;
using detail::PerSampleRule;
using detail::sq_norm;
using detail::UseView;

/// The rule of each kind of use.
template <class T>
const PerSampleRule<T>& rule_for(UseKind kind) {
  switch (kind) {
    case UseKind::matmul: return detail::matmul_rule<T>();
    case UseKind::bias: return detail::bias_rule<T>();
    case UseKind::gather: return detail::gather_rule<T>();
    case UseKind::conv: return detail::conv_rule<T>();
    case UseKind::elementwise: return detail::elementwise_rule<T>();
  }
  throw std::logic_error("per-sample rule: unknown kind of use");
}

/// Refuses a use whose input does not hold the batch's samples in blocks along
/// axis 0, the layout every rule below reads (docs/per-sample.md).
template <class T>
void check_samples(const ParamUses<T>& g, const ParamUse<T>& u, std::size_t batch) {
  const Samples& s = u.samples;
  if (s.blocks_on(0) && (batch == 0 ? s.count == 0 : s.count % batch == 0)) return;
  if (batch == 1 && s.kind == Samples::Kind::axis && s.count == 1) return;  // one sample owns every row
  std::string what;
  switch (s.kind) {
    case Samples::Kind::none:
      what = "that holds no samples (a constant; mark the batch's data with per_sample_input)";
      break;
    case Samples::Kind::mixed:
      what = "that mixes samples" + mixing_explained(s);
      break;
    case Samples::Kind::subset:
      what = "that holds a subset of the samples (sliced along its per-sample axis " + std::to_string(s.axis) + ")";
      break;
    case Samples::Kind::axis:
      what = s.axis != 0  ? "whose per-sample axis is " + std::to_string(s.axis) + ", not 0"
             : s.outer > 1 ? "whose samples are interleaved along axis 0 (" + std::to_string(s.outer) +
                                 " runs of them), not in consecutive blocks"
                           : "whose per-sample axis holds " + std::to_string(s.count) + " samples, not the batch's " +
                                 std::to_string(batch);
      break;
  }
  throw std::invalid_argument("parameter '" + g.param->name + "' is used by " + u.op + " on an input " + what +
                              "; the per-sample rules need the samples on axis 0 (see docs/per-sample.md)");
}

/// The uses of one parameter that are of one kind, seen as per-sample blocks,
/// with their rule and the (d, p) it views the parameter as.
template <class T>
struct Part {
  const PerSampleRule<T>* rule = nullptr;
  UseKind kind;
  std::vector<UseView<T>> vs;
  std::size_t d = 0, p = 0;
  std::size_t steps() const {
    std::size_t s = 0;
    for (const auto& v : vs) s += v.steps;
    return s;
  }
};

/// A parameter's uses grouped by kind, in order of first use. A parameter used
/// by several kinds of op (a table read by gather and scaled by mul) gets G_i
/// as the sum of each kind's part; only dense parts can be summed that way.
template <class T>
std::vector<Part<T>> parts_of(const ParamUses<T>& g, std::size_t batch) {
  if (g.uses.empty()) throw std::logic_error("per-sample rule: parameter '" + g.param->name + "' has no uses");
  const auto& ps = g.param->value.shape();
  std::vector<Part<T>> out;
  for (const ParamUse<T>* u : g.uses) {
    check_samples(g, *u, batch);
    if (!u->delta)
      throw std::logic_error("per-sample rule: parameter '" + g.param->name +
                             "' has a use without an output gradient (backward did not reach it)");
    const ArrayT<T>& delta = *u->delta;
    // an example's rows (its views, then its positions) are contiguous: (R, ...) with R = B * views is (B, views * ...)
    if (delta.dimension() < 2 || (batch == 0 ? delta.shape()[0] != 0 : delta.shape()[0] % batch != 0))
      throw std::invalid_argument("per-sample rule: parameter '" + g.param->name + "': batch axis " +
                                  std::to_string(delta.dimension() ? delta.shape()[0] : 0) +
                                  " is not a whole number of rows for each of " + std::to_string(batch) + " examples");
    if (u->kind == UseKind::conv && !u->sample_gradient)
      throw std::logic_error("per-sample rule: parameter '" + g.param->name + "' has a conv use without its rule");
    auto part = std::find_if(out.begin(), out.end(), [&](const Part<T>& q) { return q.kind == u->kind; });
    if (part == out.end()) {
      out.push_back(Part<T>{&rule_for<T>(u->kind), u->kind, {}, 0, 0});
      part = out.end() - 1;
    }
    UseView<T> v;
    v.delta = delta.data();
    try {
      part->rule->view(*u, Shape(ps.begin(), ps.end()), v, part->d, part->p);
    } catch (const std::invalid_argument& e) {  // the rule knows the use, not the parameter's name
      throw std::invalid_argument("parameter '" + g.param->name + "': " + e.what());
    }
    v.steps = batch == 0 ? 0 : delta.size() / (batch * part->p);
    part->vs.push_back(v);
  }
  if (out.size() > 1)
    for (const auto& part : out)
      if (!part.rule->dense_gradients())
        throw std::invalid_argument("per-sample rule: parameter '" + g.param->name +
                                    "' is read as a table (gather) and used by another kind of op; no rule "
                                    "covers that mix");
  return out;
}

/// G_i of a parameter used by several kinds of op: the sum of each part's.
template <class T>
void mixed_gradient(const std::vector<Part<T>>& parts, std::size_t i, std::size_t batch, std::size_t n, T* g,
                    std::vector<T>& scratch) {
  scratch.resize(n);
  std::fill_n(g, n, T(0));
  for (const auto& part : parts) {
    part.rule->gradient(part.vs, i, batch, part.d, part.p, scratch.data());
    axpy(n, T(1), scratch.data(), g);
  }
}

}  // namespace

template <class T>
ArrayT<T> PerSampleGradients<T>::norms_squared() const {
  profile::Scope timed("per-sample norms");
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  if (sq_norms.size() == batch) {
    std::copy(sq_norms.begin(), sq_norms.end(), r.begin());
  } else if (sparse) {
    const std::size_t p = param_shape.back();
    for (std::size_t i = 0; i < batch; ++i)
      r.data()[i] = sq_norm(rows.data() + offsets[i] * p, (offsets[i + 1] - offsets[i]) * p);
  } else {
    const std::size_t n = numel(param_shape);
    for_samples(batch, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) r.data()[i] = sq_norm(dense.data() + i * n, n);
    });
  }
  return r;
}

template <class T>
ArrayT<T> PerSampleGradients<T>::weighted_sum(const ArrayT<T>& c) const {
  profile::Scope timed("weighted sum");
  if (c.size() != batch)
    throw std::invalid_argument("weighted_sum: " + std::to_string(c.size()) + " weights for " +
                                std::to_string(batch) + " per-sample gradients");
  ArrayT<T> out = xt::zeros<T>(param_shape);
  if (sparse) {  // a scatter-add of c_i times sample i's rows
    const std::size_t p = param_shape.back(), table_rows = p == 0 ? 0 : out.size() / p;
    detail::for_table_rows(table_rows, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = 0; i < batch; ++i)
        for (std::size_t r = offsets[i]; r < offsets[i + 1]; ++r)
          if (const auto id = std::size_t(row_ids[r]); id >= lo && id < hi)
            axpy(p, c.data()[i], rows.data() + r * p, out.data() + id * p);
    });
  } else {  // G^T c, G (B, n)
    blas::gemv<T>(true, batch, out.size(), T(1), dense.data(), c.data(), T(0), out.data());
  }
  return out;
}

template <class T>
ArrayT<T> PerSampleGradients<T>::to_dense() const {
  if (!sparse) return dense;
  Shape s{batch};
  s.insert(s.end(), param_shape.begin(), param_shape.end());
  ArrayT<T> out = xt::zeros<T>(s);
  const std::size_t n = numel(param_shape), p = param_shape.back();
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t r = offsets[i]; r < offsets[i + 1]; ++r)
      std::copy_n(rows.data() + r * p, p, out.data() + i * n + std::size_t(row_ids[r]) * p);
  return out;
}

template <class T>
bool per_sample_gradients_are_small(const ParamUses<T>& g, std::size_t batch) {
  if (batch == 0) return false;
  const auto parts = parts_of(g, batch);
  if (parts.size() > 1) return true;  // G_i is built as a sum anyway
  if (!parts[0].rule->dense_gradients()) return false;
  return gradient_is_small(parts[0].d, parts[0].p, parts[0].steps());
}

template <class T>
NormMethod cheaper_norm_method(const ParamUses<T>& g) {
  if (g.uses.empty()) throw std::logic_error("per-sample rule: parameter '" + g.param->name + "' has no uses");
  for (const auto* u : g.uses)
    if (u->kind != g.uses.front()->kind) return NormMethod::materialise;  // several kinds: G_i is their sum
  return rule_for<T>(g.uses.front()->kind).cheaper_norm_method(g);
}

template <class T>
void check_per_sample_losses(const TensorT<T>& losses, std::size_t batch) {
  const Samples& s = losses.samples();
  if (losses.dim() >= 1 && losses.shape()[0] == batch && (batch == 0 || (s.blocks_on(0) && s.count == batch))) return;
  const std::string head = "per-sample losses of shape " + shape_str(losses.shape()) + " carry ";
  const std::string want = ", not one loss for each of the batch's " + std::to_string(batch) + " samples: ";
  if (s.kind == Samples::Kind::mixed)
    throw std::invalid_argument(head + "mixed samples" + want + "the model mixes samples" +
                                mixing_explained(s) +
                                "; use the naive strategy (see docs/per-sample.md)");
  throw std::invalid_argument(head + s.str() + want +
                              "the model moves or regroups them (the losses must hold one sample each, in order, on "
                              "axis 0: see docs/per-sample.md); use the naive strategy");
}

template <class T>
void check_per_sample_tape(const TapeT<T>& tape, const TensorT<T>& losses, std::size_t batch) {
  for (const auto& g : tape.uses())
    for (const ParamUse<T>* u : g.uses) check_samples(g, *u, batch);
  check_per_sample_losses(losses, batch);
}

template <class T>
ArrayT<T> per_sample_norms_squared(const ParamUses<T>& g, std::size_t batch, NormMethod method) {
  profile::Scope timed("per-sample norms");
  const auto parts = parts_of(g, batch);
  if (parts.size() == 1) {
    const Part<T>& part = parts[0];
    if (method == NormMethod::automatic) method = part.rule->cheaper_norm_method(g);
    return part.rule->norms_squared(part.vs, batch, part.d, part.p, method);
  }
  const std::size_t n = g.param->value.size();
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  for_samples(batch, [&](std::size_t i0, std::size_t i1) {
    std::vector<T> gi(n), scratch;
    for (std::size_t i = i0; i < i1; ++i) {
      mixed_gradient(parts, i, batch, n, gi.data(), scratch);
      r.data()[i] = sq_norm(gi.data(), n);
    }
  });
  return r;
}

template <class T>
PerSampleGradients<T> materialise_per_sample_gradients(const ParamUses<T>& g, std::size_t batch) {
  profile::Scope timed("per-sample grads");
  const auto parts = parts_of(g, batch);
  PerSampleGradients<T> r;
  r.param_shape = shape_of(g.param->value);
  r.batch = batch;
  if (parts.size() == 1 && !parts[0].rule->dense_gradients()) {
    parts[0].rule->sparse_gradients(parts[0].vs, batch, parts[0].d, parts[0].p, r);
    return r;
  }
  Shape s{batch};
  s.insert(s.end(), r.param_shape.begin(), r.param_shape.end());
  r.dense = ArrayT<T>::from_shape(s);  // every G_i is overwritten whole
  r.sq_norms.resize(batch);
  const std::size_t block = numel(r.param_shape);
  T* dense = r.dense.data();
  for_samples(batch, [&](std::size_t i0, std::size_t i1) {
    std::vector<T> scratch;
    for (std::size_t i = i0; i < i1; ++i) {
      if (parts.size() == 1) parts[0].rule->gradient(parts[0].vs, i, batch, parts[0].d, parts[0].p, dense + i * block);
      else mixed_gradient(parts, i, batch, block, dense + i * block, scratch);
      r.sq_norms[i] = sq_norm(dense + i * block, block);  // while G_i is still in cache
    }
  });
  return r;
}

template <class T>
ArrayT<T> per_sample_gradients(const ParamUses<T>& g, std::size_t batch) {
  return materialise_per_sample_gradients(g, batch).to_dense();
}

template <class T>
ArrayT<T> weighted_gradient_sum(const ParamUses<T>& g, const ArrayT<T>& c) {
  profile::Scope timed("weighted sum");
  const std::size_t batch = c.size();
  ArrayT<T> out = xt::zeros<T>(g.param->value.shape());
  for (const auto& part : parts_of(g, batch))  // each part adds its sum_i c_i G_i
    part.rule->weighted_sum(part.vs, c.data(), batch, part.d, part.p, out.data());
  return out;
}

template struct PerSampleGradients<float>;
template struct PerSampleGradients<double>;

#define DPGRAD_INSTANTIATE(T)                                                                    \
  template ArrayT<T> per_sample_norms_squared(const ParamUses<T>&, std::size_t, NormMethod);    \
  template PerSampleGradients<T> materialise_per_sample_gradients(const ParamUses<T>&, std::size_t); \
  template ArrayT<T> per_sample_gradients(const ParamUses<T>&, std::size_t);                    \
  template ArrayT<T> weighted_gradient_sum(const ParamUses<T>&, const ArrayT<T>&);              \
  template NormMethod cheaper_norm_method(const ParamUses<T>&);                                  \
  template bool per_sample_gradients_are_small(const ParamUses<T>&, std::size_t);                \
  template void check_per_sample_tape(const TapeT<T>&, const TensorT<T>&, std::size_t);          \
  template void check_per_sample_losses(const TensorT<T>&, std::size_t);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
