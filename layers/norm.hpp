// Normalisation layers that normalise within a sample, so that the per-sample
// rules stay exact (docs/adding-a-layer.md): LayerNorm over the last axis, and
// GroupNorm over each group of channels and every position of a sample. Their
// gain and shift are elementwise parameters (docs/per-sample.md). Batch
// normalisation mixes the samples of a batch and has no place in private
// training: a model that takes batch statistics is refused by the per-sample
// strategies with a pointer to these.
#pragma once

#include <string>

#include "layers/module.hpp"

namespace dpgrad {

/// y = (x - mean) / sqrt(var + eps) * gain + shift, the mean and variance over
/// the last axis of each position: x (B, ..., d), gain and shift (d).
template <class T>
class LayerNormT final : public LayerT<T> {
 public:
  /// gain (ones) and shift (zeros) named NAME.gain and NAME.shift; affine = false:
  /// neither, y is the normalised x. Throws std::invalid_argument when dim is 0 or
  /// eps <= 0; forward throws it when x has no last axis of size dim after the batch axis.
  explicit LayerNormT(std::size_t dim, const std::string& name = "layernorm", double eps = 1e-5, bool affine = true);
  TensorT<T> forward(const TensorT<T>& x) override;
  std::vector<TensorT<T>> parameters() const override;

 private:
  std::size_t dim_;
  double eps_;
  TensorT<T> gain_, shift_;
};

/// GroupNorm (Wu and He 2018) on channels-last x (B, ..., C): the C channels in
/// `groups` groups of C / groups consecutive channels, each normalised over its
/// channels and all of the sample's positions; then gain and shift (C).
template <class T>
class GroupNormT final : public LayerT<T> {
 public:
  /// gain (ones) and shift (zeros) named NAME.gain and NAME.shift; affine = false:
  /// neither. Throws std::invalid_argument unless groups > 0 divides channels > 0,
  /// or when eps <= 0; forward throws it when x is not (B, ..., channels).
  GroupNormT(std::size_t channels, std::size_t groups, const std::string& name = "groupnorm", double eps = 1e-5,
             bool affine = true);
  TensorT<T> forward(const TensorT<T>& x) override;
  std::vector<TensorT<T>> parameters() const override;

 private:
  std::size_t channels_, groups_;
  double eps_;
  TensorT<T> gain_, shift_;
};

/// (x - mean) / sqrt(var + eps) with the mean and (biased) variance over `axes`
/// (kept as size-1 axes): the part the two layers share.
template <class T>
TensorT<T> normalise(const TensorT<T>& x, std::vector<std::size_t> axes, double eps);

/// y = x - m: a fixed vector m (a constant, not a parameter) taken from every
/// sample, x (B, ...) and m the shape of one sample. Centring features on their
/// mean before a private linear model spends the clipping norm on what tells the
/// samples apart (docs/feature-centring.md); m must then be a private estimate.
template <class T>
class CentreT final : public LayerT<T> {
 public:
  /// `centre` has one sample's shape (kept as (1, ...)). Throws std::invalid_argument
  /// when it is empty or has a non-finite value; forward throws it when a sample
  /// of x has another shape.
  explicit CentreT(ArrayT<T> centre);
  TensorT<T> forward(const TensorT<T>& x) override;
  /// (1, ...): the centre broadcast over the batch.
  const ArrayT<T>& centre() const { return centre_; }
  /// Replaces the centre by `centre` (its values, in order: the same count, any
  /// shape), a release made after the model was built (private_feature_mean).
  /// Throws std::invalid_argument on another count or a non-finite value.
  void set_centre(const ArrayT<T>& centre);

 private:
  ArrayT<T> centre_;  // (1, ...): broadcast over the batch
};

/// The float instantiations.
using LayerNorm = LayerNormT<float>;
using GroupNorm = GroupNormT<float>;

}  // namespace dpgrad
