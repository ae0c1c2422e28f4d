// Per-sample rules for the four kinds of parameter use (matmul, bias, gather, conv).
// Shapes: B samples; a use of W (d, p) has activations a (B, Ta, d) and output
// cotangents delta (B, Ta, p), Ta = steps or positions of that use.
#include "engine/per_sample.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/blas.hpp"
#include "engine/parallel.hpp"
#include "engine/runtime.hpp"

namespace dpgrad {
namespace {

/// Runs f(i0, i1) over pieces of samples on the engine's threads; each piece
/// keeps its own scratch, and every result is written by the sample's own piece.
template <class F>
void for_samples(std::size_t batch, F&& f) {
  parallel::for_range(batch, 1, f);
}

template <class T>
struct UseView {  // one use seen as per-sample blocks
  const T* a = nullptr;      // (B, Ta, d) or nullptr
  const T* delta = nullptr;  // (B, Ta, p)
  const std::int32_t* ids = nullptr;  // (B, Ta) for gather
  const ParamUse<T>* use = nullptr;   // conv: builds G_i itself
  std::size_t steps = 0;     // Ta
};

/// Refuses a use whose input does not hold the batch's samples in blocks along
/// axis 0, the layout every rule below reads (docs/per-sample.md).
template <class T>
void check_samples(const ParamUses<T>& g, const ParamUse<T>& u, std::size_t batch) {
  const Samples& s = u.samples;
  if (s.on_axis(0) && (batch == 0 ? s.count == 0 : s.count % batch == 0)) return;
  std::string what;
  switch (s.kind) {
    case Samples::Kind::none:
      what = "that holds no samples (a constant; mark the batch's data with per_sample_input)";
      break;
    case Samples::Kind::mixed: what = "that mixes samples"; break;
    case Samples::Kind::subset:
      what = "that holds a subset of the samples (sliced along its per-sample axis " + std::to_string(s.axis) + ")";
      break;
    case Samples::Kind::axis:
      what = s.axis != 0 ? "whose per-sample axis is " + std::to_string(s.axis) + ", not 0"
                         : "whose per-sample axis holds " + std::to_string(s.count) + " samples, not the batch's " +
                               std::to_string(batch);
      break;
  }
  throw std::invalid_argument("parameter '" + g.param->name + "' is used by " + u.op + " on an input " + what +
                              "; the per-sample rules need the samples on axis 0 (see docs/per-sample.md)");
}

template <class T>
std::vector<UseView<T>> views(const ParamUses<T>& g, std::size_t batch, std::size_t& d, std::size_t& p) {
  const auto& ps = g.param->value.shape();
  std::vector<UseView<T>> out;
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
    UseView<T> v;
    v.delta = delta.data();
    switch (u->kind) {
      case UseKind::matmul:
        d = ps[0];
        p = ps[1];
        v.a = u->input->value.data();
        break;
      case UseKind::bias:
        d = 1;
        p = ps[0];
        break;
      case UseKind::gather:
        d = ps[0];  // vocabulary
        p = ps[1];
        v.ids = u->ids->data();
        break;
      case UseKind::conv:
        d = ps[0];
        p = ps[1];
        if (!u->sample_gradient)
          throw std::logic_error("per-sample rule: parameter '" + g.param->name + "' has a conv use without its rule");
        v.use = u;
        break;
    }
    v.steps = batch == 0 ? 0 : delta.size() / (batch * p);
    out.push_back(v);
  }
  return out;
}

/// <x, y> with 16 partial sums, which the compiler keeps in vector registers (one
/// running sum is a chain of dependent adds: 4x slower on 16k floats).
template <class T>
T dot(const T* x, const T* y, std::size_t n) {
  constexpr std::size_t K = 16;
  T part[K] = {};
  std::size_t i = 0;
  for (; i + K <= n; i += K)
    for (std::size_t k = 0; k < K; ++k) part[k] += x[i + k] * y[i + k];
  T s = 0;
  for (; i < n; ++i) s += x[i] * y[i];
  for (std::size_t k = 0; k < K; ++k) s += part[k];
  return s;
}

template <class T>
T sq_norm(const T* x, std::size_t n) {
  return dot(x, x, n);
}

template <class T>
void axpy(std::size_t n, T alpha, const T* x, T* y) {  // y += alpha x
  for (std::size_t j = 0; j < n; ++j) y[j] += alpha * x[j];
}

template <class T>
UseKind kind_of(const ParamUses<T>& g) {
  return g.uses.front()->kind;
}

/// One sample's activations A_i (S, d) and cotangents D_i (S, p) of a matmul
/// parameter, all its uses stacked along time (S = the uses' steps together), so
/// that G_i = A_i^T D_i is one GEMM however many steps share the weight (an LSTM's
/// w_hh: 149 uses of one step each). One use is read in place; several are copied.
template <class T>
class StackedSample {
 public:
  StackedSample(const std::vector<UseView<T>>& vs, std::size_t d, std::size_t p) : vs_(vs), d_(d), p_(p) {
    for (const auto& v : vs) steps_ += v.steps;
    if (vs.size() > 1) {
      a_buf_.resize(steps_ * d);
      delta_buf_.resize(steps_ * p);
    }
  }
  std::size_t steps() const { return steps_; }
  void load(std::size_t i) {
    if (vs_.size() == 1) {
      a_ = vs_[0].a + i * steps_ * d_;
      delta_ = vs_[0].delta + i * steps_ * p_;
      return;
    }
    std::size_t off = 0;
    for (const auto& v : vs_) {
      std::copy_n(v.a + i * v.steps * d_, v.steps * d_, a_buf_.data() + off * d_);
      std::copy_n(v.delta + i * v.steps * p_, v.steps * p_, delta_buf_.data() + off * p_);
      off += v.steps;
    }
    a_ = a_buf_.data();
    delta_ = delta_buf_.data();
  }
  const T* a() const { return a_; }          // (S, d)
  const T* delta() const { return delta_; }  // (S, p)
  /// g = A_i^T D_i: (d, p), overwritten.
  void gradient(T* g) const { blas::gemm<T>(true, false, d_, p_, steps_, T(1), a_, delta_, T(0), g); }

 private:
  const std::vector<UseView<T>>& vs_;
  std::size_t d_, p_, steps_ = 0;
  std::vector<T> a_buf_, delta_buf_;
  const T* a_ = nullptr;
  const T* delta_ = nullptr;
};

/// One sample's gradient of a table used by gather: the rows its ids touch, each
/// the sum of the cotangents at the positions that hold that id (in order of first
/// occurrence; padding, id -1, has none). No sort: a slot per table row.
template <class T>
class SampleRows {
 public:
  SampleRows(const std::vector<UseView<T>>& vs, std::size_t vocab, std::size_t p)
      : vs_(vs), p_(p), slot_(vocab, -1) {
    std::size_t steps = 0;
    for (const auto& v : vs) steps += v.steps;
    ids_.reserve(steps);
    rows_.reserve(steps * p);
  }
  void load(std::size_t i) {
    for (std::int32_t id : ids_) slot_[std::size_t(id)] = -1;
    ids_.clear();
    rows_.clear();
    for (const auto& v : vs_)
      for (std::size_t t = 0; t < v.steps; ++t) {
        std::int32_t id = v.ids[i * v.steps + t];
        if (id < 0) continue;
        const T* src = v.delta + (i * v.steps + t) * p_;
        std::int32_t& s = slot_[std::size_t(id)];
        if (s < 0) {
          s = std::int32_t(ids_.size());
          ids_.push_back(id);
          rows_.insert(rows_.end(), src, src + p_);
        } else {
          axpy(p_, T(1), src, rows_.data() + std::size_t(s) * p_);
        }
      }
  }
  std::size_t count() const { return ids_.size(); }
  const std::vector<std::int32_t>& ids() const { return ids_; }
  const T* rows() const { return rows_.data(); }  // (count, p)

 private:
  const std::vector<UseView<T>>& vs_;
  std::size_t p_;
  std::vector<std::int32_t> slot_;  // (V): row of each table row in rows_, or -1
  std::vector<std::int32_t> ids_;
  std::vector<T> rows_;
};

/// G_i of a conv parameter into g (d p values, overwritten): each use's op builds
/// its share from the sample's image and output gradient.
template <class T>
void conv_gradient(const std::vector<UseView<T>>& vs, std::size_t i, std::size_t batch, std::size_t n, T* g) {
  std::fill_n(g, n, T(0));
  for (const auto& v : vs) v.use->sample_gradient(i, batch, g);
}

/// ||G_i||^2 of a conv parameter, G_i built one sample at a time.
template <class T>
ArrayT<T> conv_norms(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d, std::size_t p) {
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  for_samples(batch, [&](std::size_t i0, std::size_t i1) {
    std::vector<T> gi(d * p);
    for (std::size_t i = i0; i < i1; ++i) {
      conv_gradient(vs, i, batch, d * p, gi.data());
      r.data()[i] = sq_norm(gi.data(), d * p);
    }
  });
  return r;
}

/// sum_t delta_t of sample i (its bias gradient) into acc: (p).
template <class T>
void bias_gradient(const std::vector<UseView<T>>& vs, std::size_t i, std::size_t p, T* acc) {
  std::fill_n(acc, p, T(0));
  for (const auto& v : vs)
    for (std::size_t t = 0; t < v.steps; ++t) axpy(p, T(1), v.delta + (i * v.steps + t) * p, acc);
}

/// ||sum_t delta_t||^2 per sample (bias).
template <class T>
ArrayT<T> bias_norms(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t p) {
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  for_samples(batch, [&](std::size_t i0, std::size_t i1) {
    std::vector<T> acc(p);
    for (std::size_t i = i0; i < i1; ++i) {
      bias_gradient(vs, i, p, acc.data());
      r.data()[i] = sq_norm(acc.data(), p);
    }
  });
  return r;
}

/// ||G_i||^2 for a table: sum over its distinct ids of ||sum of their delta_t||^2.
template <class T>
ArrayT<T> gather_norms(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t vocab, std::size_t p) {
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  for_samples(batch, [&](std::size_t i0, std::size_t i1) {
    SampleRows<T> rows(vs, vocab, p);
    for (std::size_t i = i0; i < i1; ++i) {
      rows.load(i);
      r.data()[i] = sq_norm(rows.rows(), rows.count() * p);
    }
  });
  return r;
}

/// Ghost norms of a matmul parameter: ||G_i||^2 = <A_i A_i^T, D_i D_i^T> with all
/// uses stacked along time (Goodfellow 2015; Li et al. 2021).
template <class T>
ArrayT<T> matmul_ghost_norms(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d, std::size_t p) {
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  std::size_t n = 0;
  for (const auto& v : vs) n += v.steps;
  if (vs.size() == 1 && n == 1) {  // one step: ||a_i||^2 ||delta_i||^2
    for (std::size_t i = 0; i < batch; ++i)
      r.data()[i] = sq_norm(vs[0].a + i * d, d) * sq_norm(vs[0].delta + i * p, p);
    return r;
  }
  for_samples(batch, [&](std::size_t i0, std::size_t i1) {
    StackedSample<T> s(vs, d, p);
    std::vector<T> ga(n * n), gd(n * n);
    for (std::size_t i = i0; i < i1; ++i) {
      s.load(i);
      blas::gemm<T>(false, true, n, n, d, T(1), s.a(), s.a(), T(0), ga.data());
      blas::gemm<T>(false, true, n, n, p, T(1), s.delta(), s.delta(), T(0), gd.data());
      r.data()[i] = dot(ga.data(), gd.data(), n * n);
    }
  });
  return r;
}

/// ||A_i^T D_i||^2 per sample, G_i built one sample at a time.
template <class T>
ArrayT<T> matmul_materialised_norms(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d,
                                    std::size_t p) {
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  for_samples(batch, [&](std::size_t i0, std::size_t i1) {
    StackedSample<T> s(vs, d, p);
    std::vector<T> gi(d * p);
    for (std::size_t i = i0; i < i1; ++i) {
      s.load(i);
      s.gradient(gi.data());
      r.data()[i] = sq_norm(gi.data(), d * p);
    }
  });
  return r;
}

template <class T>
void check_kinds(const ParamUses<T>& g) {
  if (g.uses.empty()) throw std::logic_error("per-sample rule: parameter '" + g.param->name + "' has no uses");
  for (const auto* u : g.uses)
    if (u->kind != g.uses.front()->kind)
      throw std::invalid_argument("per-sample rule: parameter '" + g.param->name +
                                  "' is used by different kinds of op; no rule covers that mix");
}

}  // namespace

template <class T>
ArrayT<T> PerSampleGradients<T>::norms_squared() const {
  profile::Scope timed("per-sample norms");
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  if (sparse) {
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
    const std::size_t p = param_shape.back();
    for (std::size_t i = 0; i < batch; ++i)
      for (std::size_t r = offsets[i]; r < offsets[i + 1]; ++r)
        axpy(p, c.data()[i], rows.data() + r * p, out.data() + std::size_t(row_ids[r]) * p);
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
  check_kinds(g);
  if (kind_of(g) == UseKind::gather || batch == 0) return false;
  std::size_t d = 0, p = 0;
  std::size_t steps = 0;
  for (const auto& v : views(g, batch, d, p)) steps += v.steps;
  return gradient_is_small(d, p, steps);
}

template <class T>
NormMethod cheaper_norm_method(const ParamUses<T>& g) {
  check_kinds(g);
  if (kind_of(g) == UseKind::conv) return NormMethod::materialise;  // its only rule: no patches to take a Gram of
  if (kind_of(g) != UseKind::matmul) return NormMethod::ghost;      // bias and gather rules never build G_i
  std::size_t d = g.param->value.shape()[0], p = g.param->value.shape()[1], total = 0;
  for (const auto* u : g.uses) {
    std::size_t b = u->input->value.shape()[0];
    total += b == 0 ? 0 : u->input->value.size() / (b * d);
  }
  // ghost: T^2 (d + p) per sample; materialise: T d p
  return total * (d + p) <= d * p ? NormMethod::ghost : NormMethod::materialise;
}

template <class T>
void check_per_sample_losses(const TensorT<T>& losses, std::size_t batch) {
  const Samples& s = losses.samples();
  if (losses.dim() >= 1 && losses.shape()[0] == batch && (batch == 0 || (s.on_axis(0) && s.count == batch))) return;
  throw std::invalid_argument("per-sample losses of shape " + shape_str(losses.shape()) + " carry " + s.str() +
                              ", not one loss for each of the batch's " + std::to_string(batch) +
                              " samples: the model mixes samples (batch statistics?) or moves them off axis 0 "
                              "(see docs/per-sample.md); use the naive strategy");
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
  check_kinds(g);
  std::size_t d = 0, p = 0;
  auto vs = views(g, batch, d, p);
  if (method == NormMethod::automatic) method = cheaper_norm_method(g);
  switch (kind_of(g)) {
    case UseKind::matmul:
      return method == NormMethod::materialise ? matmul_materialised_norms(vs, batch, d, p)
                                               : matmul_ghost_norms(vs, batch, d, p);
    case UseKind::bias: return bias_norms(vs, batch, p);
    case UseKind::gather: return gather_norms(vs, batch, d, p);
    case UseKind::conv: return conv_norms(vs, batch, d, p);  // materialised whatever `method` says
  }
  return {};
}

template <class T>
PerSampleGradients<T> materialise_per_sample_gradients(const ParamUses<T>& g, std::size_t batch) {
  profile::Scope timed("per-sample grads");
  check_kinds(g);
  std::size_t d = 0, p = 0;
  auto vs = views(g, batch, d, p);
  PerSampleGradients<T> r;
  r.param_shape = shape_of(g.param->value);
  r.batch = batch;
  if (kind_of(g) == UseKind::gather) {
    r.sparse = true;
    r.offsets.assign(1, 0);
    std::size_t positions = 0;  // an upper bound on the rows kept
    for (const auto& v : vs) positions += batch * v.steps;
    r.row_ids.reserve(positions);
    r.rows.reserve(positions * p);
    SampleRows<T> rows(vs, d, p);
    for (std::size_t i = 0; i < batch; ++i) {
      rows.load(i);
      r.row_ids.insert(r.row_ids.end(), rows.ids().begin(), rows.ids().end());
      r.rows.insert(r.rows.end(), rows.rows(), rows.rows() + rows.count() * p);
      r.offsets.push_back(r.row_ids.size());
    }
    return r;
  }
  Shape s{batch};
  s.insert(s.end(), r.param_shape.begin(), r.param_shape.end());
  r.dense = ArrayT<T>::from_shape(s);  // every G_i is overwritten whole
  const std::size_t block = numel(r.param_shape);
  T* dense = r.dense.data();
  if (kind_of(g) == UseKind::bias) {
    for_samples(batch, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) bias_gradient(vs, i, p, dense + i * block);
    });
  } else if (kind_of(g) == UseKind::conv) {
    for_samples(batch, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) conv_gradient(vs, i, batch, block, dense + i * block);
    });
  } else {
    for_samples(batch, [&](std::size_t i0, std::size_t i1) {
      StackedSample<T> st(vs, d, p);
      for (std::size_t i = i0; i < i1; ++i) {
        st.load(i);
        st.gradient(dense + i * block);
      }
    });
  }
  return r;
}

template <class T>
ArrayT<T> per_sample_gradients(const ParamUses<T>& g, std::size_t batch) {
  return materialise_per_sample_gradients(g, batch).to_dense();
}

template <class T>
ArrayT<T> weighted_gradient_sum(const ParamUses<T>& g, const ArrayT<T>& c) {
  profile::Scope timed("weighted sum");
  check_kinds(g);
  std::size_t batch = c.size(), d = 0, p = 0;
  auto vs = views(g, batch, d, p);
  ArrayT<T> out = xt::zeros<T>(g.param->value.shape());
  const T* ci = c.data();
  switch (kind_of(g)) {
    case UseKind::matmul: {
      // sum_i c_i a_i^T delta_i = a^T (c-scaled delta) = (c-scaled a)^T delta: one
      // GEMM over all rows of a use, scaling whichever of a and delta is narrower
      const bool scale_a = d <= p;
      const std::size_t w = scale_a ? d : p;
      std::vector<T> scaled;
      for (const auto& v : vs) {
        const std::size_t rows = batch * v.steps, block = v.steps * w;
        scaled.resize(rows * w);
        const T* src = scale_a ? v.a : v.delta;
        T* dst = scaled.data();
        for_samples(batch, [&](std::size_t i0, std::size_t i1) {
          for (std::size_t i = i0; i < i1; ++i) {
            const T* x = src + i * block;
            T* y = dst + i * block;
            for (std::size_t k = 0; k < block; ++k) y[k] = ci[i] * x[k];
          }
        });
        blas::gemm<T>(true, false, d, p, rows, T(1), scale_a ? scaled.data() : v.a,
                      scale_a ? v.delta : scaled.data(), T(1), out.data());
      }
      break;
    }
    case UseKind::bias: {
      std::vector<T> acc(p);
      for (std::size_t i = 0; i < batch; ++i) {
        bias_gradient(vs, i, p, acc.data());
        axpy(p, ci[i], acc.data(), out.data());
      }
      break;
    }
    case UseKind::conv:  // sum_i c_i G_i, each G_i built by its op, in parallel pieces of samples
      parallel::sum_pieces(batch, 1, d * p, out.data(), [&](std::size_t i0, std::size_t i1, T* acc) {
        std::vector<T> gi(d * p);
        for (std::size_t i = i0; i < i1; ++i) {
          conv_gradient(vs, i, batch, d * p, gi.data());
          axpy(d * p, ci[i], gi.data(), acc);
        }
      });
      break;
    case UseKind::gather:
      for (const auto& v : vs)
        for (std::size_t i = 0; i < batch; ++i)
          for (std::size_t t = 0; t < v.steps; ++t) {
            std::int32_t id = v.ids[i * v.steps + t];
            if (id < 0) continue;
            axpy(p, ci[i], v.delta + (i * v.steps + t) * p, out.data() + std::size_t(id) * p);
          }
      break;
  }
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
