// Convolutional layers on channels-last images (B, H, W, C): Conv2d (im2col +
// linear, so per-sample rules come from linear), MaxPool2d, and a Reshape that
// turns loader images (B, 1, R, C) into (B, R, C, 1).
#pragma once

#include <string>

#include "engine/conv.hpp"
#include "layers/module.hpp"

namespace dpgrad {

/// y = conv(x, W) + b: x (B, H, W, Cin) -> (B, Ho, Wo, Cout). W is stored as
/// (kh*kw*Cin, Cout), the GEMM's orientation (rows ordered (i, j, cin)); b (Cout).
template <class T>
class Conv2dT final : public LayerT<T> {
 public:
  /// A kernel_h x kernel_w kernel, `stride` on both axes, `padding` (Padding::same(),
  /// valid() or explicit_pads). W and b drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
  /// fan_in = kh*kw*Cin, named NAME.weight and NAME.bias; bias = false: no b.
  /// Throws std::invalid_argument when a channel count, kernel size or stride is 0.
  Conv2dT(std::size_t in_channels, std::size_t out_channels, std::size_t kernel_h, std::size_t kernel_w,
          std::size_t stride, Padding padding, Rng& rng, const std::string& name = "conv", bool bias = true);
  TensorT<T> forward(const TensorT<T>& x) override;
  std::vector<TensorT<T>> parameters() const override;
  /// (B, H, W, Cin) -> (B, Ho, Wo, Cout); throws on a bad input shape.
  Shape output_shape(const Shape& in) const;
  /// W (kh*kw*Cin, Cout) and b (Cout; undefined without a bias).
  const TensorT<T>& weight() const { return w_; }
  const TensorT<T>& bias() const { return b_; }
  /// The kernel's size, the stride, and the padding of an input (B, H, W, Cin).
  std::size_t kernel_h() const { return kh_; }
  std::size_t kernel_w() const { return kw_; }
  std::size_t stride() const { return stride_; }
  Pad2d padding_of(const Shape& in) const { return pads(in); }

 private:
  Pad2d pads(const Shape& in) const;
  std::size_t cin_, cout_, kh_, kw_, stride_;
  Padding padding_;
  std::string name_;
  TensorT<T> w_, b_;
};

/// Max over 'valid' kernel x kernel windows: (B, H, W, C) -> (B, Ho, Wo, C).
template <class T>
class MaxPool2dT final : public LayerT<T> {
 public:
  /// Square kernel x kernel windows, `stride` on both axes. Throws
  /// std::invalid_argument when kernel or stride is 0.
  MaxPool2dT(std::size_t kernel, std::size_t stride);
  TensorT<T> forward(const TensorT<T>& x) override;
  std::size_t kernel() const { return kernel_; }
  std::size_t stride() const { return stride_; }

 private:
  std::size_t kernel_, stride_;
};

/// (B, ...) -> (B, ...sample_shape), same elements: e.g. (B, 1, 28, 28) -> (B, 28, 28, 1).
template <class T>
class ReshapeT final : public LayerT<T> {
 public:
  /// sample_shape: one sample's shape after the layer. forward throws
  /// std::invalid_argument when x has no batch axis or its samples hold another
  /// number of elements.
  explicit ReshapeT(Shape sample_shape);
  TensorT<T> forward(const TensorT<T>& x) override;
  const Shape& sample_shape() const { return sample_; }

 private:
  Shape sample_;
};

/// The float instantiations.
using Conv2d = Conv2dT<float>;
using MaxPool2d = MaxPool2dT<float>;

}  // namespace dpgrad
