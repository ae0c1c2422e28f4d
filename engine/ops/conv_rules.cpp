// Per-sample rule of conv's uses: each use's op builds a sample's kernel
// gradient G_i itself from the image and the output gradient (engine/ops/conv*.cpp).
#include <stdexcept>

#include "engine/per_sample_rule.hpp"

namespace dpgrad::detail {
namespace {

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

template <class T>
class ConvRule final : public PerSampleRule<T> {
 public:
  void view(const ParamUse<T>& u, const Shape& ps, UseView<T>& v, std::size_t& d, std::size_t& p) const override {
    d = ps[0];
    p = ps[1];
    v.use = &u;
  }
  // its only rule: no patches to take a Gram of
  NormMethod cheaper_norm_method(const ParamUses<T>&) const override { return NormMethod::materialise; }
  ArrayT<T> norms_squared(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d, std::size_t p,
                          NormMethod) const override {
    return conv_norms(vs, batch, d, p);  // materialised whatever the method says
  }
  void gradient(const std::vector<UseView<T>>& vs, std::size_t i, std::size_t batch, std::size_t d, std::size_t p,
                T* g) const override {
    conv_gradient(vs, i, batch, d * p, g);
  }
  void weighted_sum(const std::vector<UseView<T>>& vs, const T* ci, std::size_t batch, std::size_t d, std::size_t p,
                    T* out) const override {
    // sum_i c_i G_i, each G_i built by its op, in parallel pieces of samples
    parallel::sum_pieces(batch, 1, d * p, out, [&](std::size_t i0, std::size_t i1, T* acc) {
      std::vector<T> gi(d * p);
      for (std::size_t i = i0; i < i1; ++i) {
        conv_gradient(vs, i, batch, d * p, gi.data());
        axpy(d * p, ci[i], gi.data(), acc);
      }
    });
  }
};

}  // namespace

template <class T>
const PerSampleRule<T>& conv_rule() {
  static const ConvRule<T> rule;
  return rule;
}
template const PerSampleRule<float>& conv_rule<float>();
template const PerSampleRule<double>& conv_rule<double>();

}  // namespace dpgrad::detail
