// Per-sample rules of linear's uses (docs/math.md section 7): a weight used as
// y = a W (matmul) and a bias (engine/per_sample_rule.hpp).
#include <algorithm>
#include <stdexcept>

#include "engine/blas.hpp"
#include "engine/simd.hpp"
#include "engine/per_sample_rule.hpp"

namespace dpgrad::detail {
namespace {

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
  /// g = A_i^T D_i: (d, p), overwritten. Zeroed here and summed into with beta 1: OpenBLAS's
  /// own pass for beta 0 is slower than memset (4% of the product on the transformer's shapes).
  void gradient(T* g) const {
    std::fill_n(g, d_ * p_, T(0));
    blas::gemm<T>(true, false, d_, p_, steps_, T(1), a_, delta_, T(1), g);
  }

 private:
  const std::vector<UseView<T>>& vs_;
  std::size_t d_, p_, steps_ = 0;
  std::vector<T> a_buf_, delta_buf_;
  const T* a_ = nullptr;
  const T* delta_ = nullptr;
};

/// sum_t delta_t of sample i (its bias gradient) into acc: (p).
template <class T>
void bias_gradient(const std::vector<UseView<T>>& vs, std::size_t i, std::size_t p, T* acc) {
  std::fill_n(acc, p, T(0));
  for (const auto& v : vs) simd::add_rows(v.delta + i * v.steps * p, v.steps, p, acc);  // its steps, in order
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
class MatmulRule final : public PerSampleRule<T> {
 public:
  void view(const ParamUse<T>& u, const Shape& ps, UseView<T>& v, std::size_t& d, std::size_t& p) const override {
    d = ps[0];
    p = ps[1];
    v.a = u.input->value.data();
  }
  NormMethod cheaper_norm_method(const ParamUses<T>& g) const override {
    std::size_t d = g.param->value.shape()[0], p = g.param->value.shape()[1], total = 0;
    for (const auto* u : g.uses) {
      std::size_t b = u->input->value.shape()[0];
      total += b == 0 ? 0 : u->input->value.size() / (b * d);
    }
    // ghost: T^2 (d + p) per sample; materialise: T d p
    return total * (d + p) <= d * p ? NormMethod::ghost : NormMethod::materialise;
  }
  ArrayT<T> norms_squared(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d, std::size_t p,
                          NormMethod method) const override {
    return method == NormMethod::materialise ? matmul_materialised_norms(vs, batch, d, p)
                                             : matmul_ghost_norms(vs, batch, d, p);
  }
  void gradient(const std::vector<UseView<T>>& vs, std::size_t i, std::size_t, std::size_t d, std::size_t p,
                T* g) const override {
    StackedSample<T> st(vs, d, p);
    st.load(i);
    st.gradient(g);
  }
  void weighted_sum(const std::vector<UseView<T>>& vs, const T* ci, std::size_t batch, std::size_t d, std::size_t p,
                    T* out) const override {
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
      blas::gemm<T>(true, false, d, p, rows, T(1), scale_a ? scaled.data() : v.a, scale_a ? v.delta : scaled.data(),
                    T(1), out);
    }
  }
};

template <class T>
class BiasRule final : public PerSampleRule<T> {
 public:
  void view(const ParamUse<T>&, const Shape& ps, UseView<T>&, std::size_t& d, std::size_t& p) const override {
    d = 1;
    p = ps[0];
  }
  ArrayT<T> norms_squared(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t, std::size_t p,
                          NormMethod) const override {
    return bias_norms(vs, batch, p);
  }
  void gradient(const std::vector<UseView<T>>& vs, std::size_t i, std::size_t, std::size_t, std::size_t p,
                T* g) const override {
    bias_gradient(vs, i, p, g);
  }
  void weighted_sum(const std::vector<UseView<T>>& vs, const T* ci, std::size_t batch, std::size_t, std::size_t p,
                    T* out) const override {
    std::vector<T> acc(p);
    for (std::size_t i = 0; i < batch; ++i) {
      bias_gradient(vs, i, p, acc.data());
      axpy(p, ci[i], acc.data(), out);
    }
  }
};

}  // namespace

template <class T>
const PerSampleRule<T>& matmul_rule() {
  static const MatmulRule<T> rule;
  return rule;
}
template <class T>
const PerSampleRule<T>& bias_rule() {
  static const BiasRule<T> rule;
  return rule;
}
template const PerSampleRule<float>& matmul_rule<float>();
template const PerSampleRule<double>& matmul_rule<double>();
template const PerSampleRule<float>& bias_rule<float>();
template const PerSampleRule<double>& bias_rule<double>();

}  // namespace dpgrad::detail
