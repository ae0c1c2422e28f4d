// Dense (fully connected) layer and the elementwise activations as layers.
#pragma once

#include <string>

#include "layers/module.hpp"

namespace dpgrad {

/// y = x W + b: x (B, ..., in), W (in, out), b (out).
template <class T>
class DenseT final : public LayerT<T> {
 public:
  DenseT(std::size_t in, std::size_t out, Rng& rng, const std::string& name = "dense", bool bias = true);
  TensorT<T> forward(const TensorT<T>& x) override;
  std::vector<TensorT<T>> parameters() const override;
  const TensorT<T>& weight() const { return w_; }
  const TensorT<T>& bias() const { return b_; }

 private:
  TensorT<T> w_, b_;
};

enum class Activation { relu, tanh, sigmoid };
Activation parse_activation(const std::string& name);  // "relu", "tanh", "sigmoid"
const char* to_string(Activation a);

template <class T>
class ActivationT final : public LayerT<T> {
 public:
  explicit ActivationT(Activation a) : a_(a) {}
  TensorT<T> forward(const TensorT<T>& x) override;

 private:
  Activation a_;
};

/// (B, ...) -> (B, prod(...)).
template <class T>
class FlattenT final : public LayerT<T> {
 public:
  TensorT<T> forward(const TensorT<T>& x) override;
};

using Dense = DenseT<float>;
using Flatten = FlattenT<float>;

}  // namespace dpgrad
