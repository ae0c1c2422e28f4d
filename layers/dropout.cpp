// Dropout: a constant mask/(1 - p) multiplied in with the engine's `mul`.
#include "layers/dropout.hpp"

#include <stdexcept>
#include <string>

#include "engine/ops.hpp"

namespace dpgrad {

template <class T>
DropoutT<T>::DropoutT(double p, std::uint64_t seed) : p_(p), rng_(seed) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("Dropout: p must be in [0, 1), got " + std::to_string(p));
}

template <class T>
TensorT<T> DropoutT<T>::forward(const TensorT<T>& x) {
  if (!this->training() || p_ == 0.0) return x;
  ArrayT<T> mask = ArrayT<T>::from_shape(x.shape());
  const T keep_scale = T(1.0 / (1.0 - p_));
  for (auto& m : mask) m = rng_.bernoulli(1.0 - p_) ? keep_scale : T(0);
  return mul(x, constant<T>(std::move(mask)));
}

template class DropoutT<float>;
template class DropoutT<double>;

}  // namespace dpgrad
