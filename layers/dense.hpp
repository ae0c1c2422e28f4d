// Dense (fully connected) layer and the elementwise activations as layers.
#pragma once

#include <string>

#include "layers/module.hpp"

namespace dpgrad {

/// y = x W + b: x (B, ..., in), W (in, out), b (out).
template <class T>
class DenseT final : public LayerT<T> {
 public:
  /// W and b drawn from U(-1/sqrt(in), 1/sqrt(in)) (fan_in_uniform), named
  /// NAME.weight and NAME.bias; bias = false: no b. Throws std::invalid_argument
  /// when in or out is 0.
  DenseT(std::size_t in, std::size_t out, Rng& rng, const std::string& name = "dense", bool bias = true);
  TensorT<T> forward(const TensorT<T>& x) override;
  std::vector<TensorT<T>> parameters() const override;
  /// W (in, out) and b (out; undefined without a bias).
  const TensorT<T>& weight() const { return w_; }
  const TensorT<T>& bias() const { return b_; }

 private:
  TensorT<T> w_, b_;
};

/// An elementwise activation: ReLU, tanh or the logistic sigmoid.
enum class Activation { relu, tanh, sigmoid };
/// The activation called `name`; throws std::invalid_argument on another name.
Activation parse_activation(const std::string& name);  // "relu", "tanh", "sigmoid"
/// The activation's name, as parse_activation reads it.
const char* to_string(Activation a);

/// An Activation as a layer: (B, ...) -> (B, ...), element by element.
template <class T>
class ActivationT final : public LayerT<T> {
 public:
  /// The layer that applies `a`.
  explicit ActivationT(Activation a) : a_(a) {}
  TensorT<T> forward(const TensorT<T>& x) override;
  Activation activation() const { return a_; }

 private:
  Activation a_;
};

/// (B, ...) -> (B, prod(...)).
template <class T>
class FlattenT final : public LayerT<T> {
 public:
  TensorT<T> forward(const TensorT<T>& x) override;
};

/// The float instantiations.
using Dense = DenseT<float>;
using Flatten = FlattenT<float>;

}  // namespace dpgrad
