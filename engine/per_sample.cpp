// Per-sample rules for the three kinds of parameter use (matmul, bias, gather).
// Shapes: B samples; a use of W (d, p) has activations a (B, Ta, d) and output
// cotangents delta (B, Ta, p), Ta = steps or positions of that use.
#include "engine/per_sample.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/blas.hpp"

namespace dpgrad {
namespace {

template <class T>
struct UseView {  // one use seen as per-sample blocks
  const T* a = nullptr;      // (B, Ta, d) or nullptr
  const T* delta = nullptr;  // (B, Ta, p)
  const std::int32_t* ids = nullptr;  // (B, Ta) for gather
  std::size_t steps = 0;     // Ta
};

template <class T>
std::vector<UseView<T>> views(const ParamUses<T>& g, std::size_t batch, std::size_t& d, std::size_t& p) {
  const auto& ps = g.param->value.shape();
  std::vector<UseView<T>> out;
  for (const ParamUse<T>* u : g.uses) {
    if (!u->delta)
      throw std::logic_error("per-sample rule: parameter '" + g.param->name +
                             "' has a use without an output gradient (backward did not reach it)");
    const ArrayT<T>& delta = *u->delta;
    if (delta.dimension() < 2 || delta.shape()[0] != batch)
      throw std::invalid_argument("per-sample rule: parameter '" + g.param->name + "': batch axis " +
                                  std::to_string(delta.dimension() ? delta.shape()[0] : 0) + " but batch is " +
                                  std::to_string(batch));
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
    }
    v.steps = batch == 0 ? 0 : delta.size() / (batch * p);
    out.push_back(v);
  }
  return out;
}

template <class T>
T sq_norm(const T* x, std::size_t n) {
  T s = 0;
  for (std::size_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

template <class T>
UseKind kind_of(const ParamUses<T>& g) {
  return g.uses.front()->kind;
}

/// ||sum_t delta_t||^2 per sample (bias).
template <class T>
ArrayT<T> bias_norms(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t p) {
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  std::vector<T> acc(p);
  for (std::size_t i = 0; i < batch; ++i) {
    std::fill(acc.begin(), acc.end(), T(0));
    for (const auto& v : vs)
      for (std::size_t t = 0; t < v.steps; ++t) {
        const T* row = v.delta + (i * v.steps + t) * p;
        for (std::size_t j = 0; j < p; ++j) acc[j] += row[j];
      }
    r(i) = sq_norm(acc.data(), p);
  }
  return r;
}

/// ||G_i||^2 for an embedding: sum over positions with equal ids of delta_t . delta_s.
template <class T>
ArrayT<T> gather_norms(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t p) {
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  std::vector<std::pair<std::int32_t, const T*>> rows;
  std::vector<T> acc(p);
  for (std::size_t i = 0; i < batch; ++i) {
    rows.clear();
    for (const auto& v : vs)
      for (std::size_t t = 0; t < v.steps; ++t) {
        std::int32_t id = v.ids[i * v.steps + t];
        if (id >= 0) rows.emplace_back(id, v.delta + (i * v.steps + t) * p);
      }
    std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    T total = 0;
    for (std::size_t s = 0; s < rows.size();) {
      std::fill(acc.begin(), acc.end(), T(0));
      std::size_t e = s;
      for (; e < rows.size() && rows[e].first == rows[s].first; ++e)
        for (std::size_t j = 0; j < p; ++j) acc[j] += rows[e].second[j];
      total += sq_norm(acc.data(), p);
      s = e;
    }
    r(i) = total;
  }
  return r;
}

/// Ghost norms of a matmul parameter: ||G_i||^2 = <A_i A_i^T, D_i D_i^T> with all
/// uses stacked along time (Goodfellow 2015; Li et al. 2021).
template <class T>
ArrayT<T> matmul_ghost_norms(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d, std::size_t p) {
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  std::size_t total = 0;
  for (const auto& v : vs) total += v.steps;
  if (vs.size() == 1 && total == 1) {  // one step: ||a_i||^2 ||delta_i||^2
    for (std::size_t i = 0; i < batch; ++i) r(i) = sq_norm(vs[0].a + i * d, d) * sq_norm(vs[0].delta + i * p, p);
    return r;
  }
  std::vector<T> a_buf, d_buf, ga(total * total), gd(total * total);
  if (vs.size() > 1) {
    a_buf.resize(total * d);
    d_buf.resize(total * p);
  }
  for (std::size_t i = 0; i < batch; ++i) {
    const T *ai, *di;
    if (vs.size() == 1) {
      ai = vs[0].a + i * total * d;
      di = vs[0].delta + i * total * p;
    } else {
      std::size_t off = 0;
      for (const auto& v : vs) {
        std::copy_n(v.a + i * v.steps * d, v.steps * d, a_buf.data() + off * d);
        std::copy_n(v.delta + i * v.steps * p, v.steps * p, d_buf.data() + off * p);
        off += v.steps;
      }
      ai = a_buf.data();
      di = d_buf.data();
    }
    blas::gemm<T>(false, true, total, total, d, T(1), ai, ai, T(0), ga.data());
    blas::gemm<T>(false, true, total, total, p, T(1), di, di, T(0), gd.data());
    T s = 0;
    for (std::size_t k = 0; k < total * total; ++k) s += ga[k] * gd[k];
    r(i) = s;
  }
  return r;
}

template <class T>
ArrayT<T> materialise(const ParamUses<T>& g, std::size_t batch) {
  std::size_t d = 0, p = 0;
  auto vs = views(g, batch, d, p);
  Shape s{batch};
  const auto& ps = g.param->value.shape();
  s.insert(s.end(), ps.begin(), ps.end());
  // matmul: the first use writes with beta = 0, so the buffer needs no zeroing
  ArrayT<T> out = ArrayT<T>::from_shape(s);
  if (kind_of(g) != UseKind::matmul) out.fill(T(0));
  std::size_t block = g.param->value.size();
  for (std::size_t u = 0; u < vs.size(); ++u) {
    const auto& v = vs[u];
    for (std::size_t i = 0; i < batch; ++i) {
      T* gi = out.data() + i * block;
      const T* delta = v.delta + i * v.steps * p;
      switch (kind_of(g)) {
        case UseKind::matmul:
          blas::gemm<T>(true, false, d, p, v.steps, T(1), v.a + i * v.steps * d, delta, u == 0 ? T(0) : T(1), gi);
          break;
        case UseKind::bias:
          for (std::size_t t = 0; t < v.steps; ++t)
            for (std::size_t j = 0; j < p; ++j) gi[j] += delta[t * p + j];
          break;
        case UseKind::gather:
          for (std::size_t t = 0; t < v.steps; ++t) {
            std::int32_t id = v.ids[i * v.steps + t];
            if (id < 0) continue;
            for (std::size_t j = 0; j < p; ++j) gi[std::size_t(id) * p + j] += delta[t * p + j];
          }
          break;
      }
    }
  }
  return out;
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
NormMethod cheaper_norm_method(const ParamUses<T>& g) {
  check_kinds(g);
  if (kind_of(g) != UseKind::matmul) return NormMethod::ghost;  // bias and gather rules never build G_i
  std::size_t d = g.param->value.shape()[0], p = g.param->value.shape()[1], total = 0;
  for (const auto* u : g.uses) {
    std::size_t b = u->input->value.shape()[0];
    total += b == 0 ? 0 : u->input->value.size() / (b * d);
  }
  // ghost: T^2 (d + p) per sample; materialise: T d p
  return total * (d + p) <= d * p ? NormMethod::ghost : NormMethod::materialise;
}

template <class T>
ArrayT<T> per_sample_norms_squared(const ParamUses<T>& g, std::size_t batch, NormMethod method) {
  check_kinds(g);
  std::size_t d = 0, p = 0;
  auto vs = views(g, batch, d, p);
  if (method == NormMethod::automatic) method = cheaper_norm_method(g);
  if (method == NormMethod::materialise && kind_of(g) == UseKind::matmul) {
    ArrayT<T> r = ArrayT<T>::from_shape({batch});
    std::size_t block = d * p;
    std::vector<T> gi(block);
    for (std::size_t i = 0; i < batch; ++i) {
      T beta = T(0);
      for (const auto& v : vs) {
        blas::gemm<T>(true, false, d, p, v.steps, T(1), v.a + i * v.steps * d, v.delta + i * v.steps * p, beta,
                      gi.data());
        beta = T(1);
      }
      r(i) = sq_norm(gi.data(), block);
    }
    return r;
  }
  switch (kind_of(g)) {
    case UseKind::matmul: return matmul_ghost_norms(vs, batch, d, p);
    case UseKind::bias: return bias_norms(vs, batch, p);
    case UseKind::gather: return gather_norms(vs, batch, p);
  }
  return {};
}

template <class T>
ArrayT<T> per_sample_gradients(const ParamUses<T>& g, std::size_t batch) {
  check_kinds(g);
  return materialise(g, batch);
}

template <class T>
ArrayT<T> weighted_gradient_sum(const ParamUses<T>& g, const ArrayT<T>& c) {
  check_kinds(g);
  std::size_t batch = c.size(), d = 0, p = 0;
  auto vs = views(g, batch, d, p);
  ArrayT<T> out = xt::zeros<T>(g.param->value.shape());
  std::vector<T> scaled;
  for (const auto& v : vs) {
    std::size_t rows = batch * v.steps;
    switch (kind_of(g)) {
      case UseKind::matmul: {
        // sum_i c_i a_i^T delta_i = a^T (c-scaled delta): one GEMM over all rows
        scaled.resize(rows * p);
        for (std::size_t i = 0; i < batch; ++i)
          for (std::size_t k = 0; k < v.steps * p; ++k)
            scaled[i * v.steps * p + k] = c(i) * v.delta[i * v.steps * p + k];
        blas::gemm<T>(true, false, d, p, rows, T(1), v.a, scaled.data(), T(1), out.data());
        break;
      }
      case UseKind::bias:
        for (std::size_t i = 0; i < batch; ++i)
          for (std::size_t t = 0; t < v.steps; ++t)
            for (std::size_t j = 0; j < p; ++j) out.data()[j] += c(i) * v.delta[(i * v.steps + t) * p + j];
        break;
      case UseKind::gather:
        for (std::size_t i = 0; i < batch; ++i)
          for (std::size_t t = 0; t < v.steps; ++t) {
            std::int32_t id = v.ids[i * v.steps + t];
            if (id < 0) continue;
            T* row = out.data() + std::size_t(id) * p;
            const T* src = v.delta + (i * v.steps + t) * p;
            for (std::size_t j = 0; j < p; ++j) row[j] += c(i) * src[j];
          }
        break;
    }
  }
  return out;
}

#define DPGRAD_INSTANTIATE(T)                                                                 \
  template ArrayT<T> per_sample_norms_squared(const ParamUses<T>&, std::size_t, NormMethod); \
  template ArrayT<T> per_sample_gradients(const ParamUses<T>&, std::size_t);                 \
  template ArrayT<T> weighted_gradient_sum(const ParamUses<T>&, const ArrayT<T>&);           \
  template NormMethod cheaper_norm_method(const ParamUses<T>&);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
