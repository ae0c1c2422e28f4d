// Dense layer, activations, flatten, and the initialisers.
#include "layers/dense.hpp"

#include <cmath>
#include <stdexcept>

#include "engine/ops.hpp"
#include "layers/init.hpp"

namespace dpgrad {

namespace {
template <class T>
ArrayT<T> uniform(const Shape& shape, double bound, Rng& rng) {
  ArrayT<T> a = ArrayT<T>::from_shape(shape);
  for (auto& v : a) v = T((2 * rng.uniform() - 1) * bound);
  return a;
}
}  // namespace

template <class T>
ArrayT<T> glorot_uniform(const Shape& shape, std::size_t fan_in, std::size_t fan_out, Rng& rng) {
  return uniform<T>(shape, std::sqrt(6.0 / double(fan_in + fan_out)), rng);
}

template <class T>
ArrayT<T> fan_in_uniform(const Shape& shape, std::size_t fan_in, Rng& rng) {
  return uniform<T>(shape, 1.0 / std::sqrt(double(fan_in)), rng);
}

template <class T>
DenseT<T>::DenseT(std::size_t in, std::size_t out, Rng& rng, const std::string& name, bool bias) {
  if (in == 0 || out == 0) throw std::invalid_argument("Dense: sizes must be positive");
  w_ = make_parameter<T>(name + ".weight", fan_in_uniform<T>({in, out}, in, rng));
  if (bias) b_ = make_parameter<T>(name + ".bias", fan_in_uniform<T>({out}, in, rng));
}

template <class T>
TensorT<T> DenseT<T>::forward(const TensorT<T>& x) {
  return linear(x, w_, b_);
}

template <class T>
std::vector<TensorT<T>> DenseT<T>::parameters() const {
  if (b_.defined()) return {w_, b_};
  return {w_};
}

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "tanh") return Activation::tanh;
  if (name == "sigmoid") return Activation::sigmoid;
  throw std::invalid_argument("unknown activation '" + name + "' (relu, tanh, sigmoid)");
}

const char* to_string(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::tanh: return "tanh";
    case Activation::sigmoid: return "sigmoid";
  }
  return "?";
}

template <class T>
TensorT<T> ActivationT<T>::forward(const TensorT<T>& x) {
  switch (a_) {
    case Activation::relu: return relu(x);
    case Activation::tanh: return tanh(x);
    case Activation::sigmoid: return sigmoid(x);
  }
  return x;
}

template <class T>
TensorT<T> FlattenT<T>::forward(const TensorT<T>& x) {
  Shape s = x.shape();
  if (s.empty()) throw std::invalid_argument("Flatten: needs a batch axis");
  std::size_t b = s[0];
  return reshape(x, {b, b == 0 ? 0 : x.size() / b});
}

template ArrayT<float> glorot_uniform(const Shape&, std::size_t, std::size_t, Rng&);
template ArrayT<double> glorot_uniform(const Shape&, std::size_t, std::size_t, Rng&);
template ArrayT<float> fan_in_uniform(const Shape&, std::size_t, Rng&);
template ArrayT<double> fan_in_uniform(const Shape&, std::size_t, Rng&);
template class DenseT<float>;
template class DenseT<double>;
template class ActivationT<float>;
template class ActivationT<double>;
template class FlattenT<float>;
template class FlattenT<double>;

}  // namespace dpgrad
