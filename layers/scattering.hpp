// The 2-D scattering transform of order 2 (Mallat 2012; Bruna and Mallat 2013;
// the ScatterNet of Oyallon and Mallat) with the Morlet filter bank kymatio
// defines: J scales, L angles (docs/scattering.md). It is a fixed, data-
// independent map built from engine ops (convolutions with fixed real and
// imaginary filters, a complex modulus, low-pass averaging): no parameters,
// no privacy cost, and a model that starts with it keeps exact per-sample rules
// for the layers after it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "layers/module.hpp"

namespace dpgrad {

/// One filter sampled on the pixel grid, for a convolution: real and imaginary
/// parts, (2R + 1) x (2R + 1) values each, row-major, centred.
struct ScatteringFilter {
  std::size_t radius = 0;      // R: the filter covers offsets -R..R on each axis
  std::vector<double> re, im;  // real and imaginary parts, (2R + 1)^2 values each
};

/// Kymatio's Morlet wavelet psi_{j, l} (scale j, angle index l of L), sampled at
/// spacing 2^res (a map already subsampled by 2^res), amplitude 4^res.
ScatteringFilter morlet_filter(int j, int l, int L, int res);
/// The Gaussian low-pass filter phi_J at spacing 2^res.
ScatteringFilter lowpass_filter(int J, int res);

/// x (B, H, W, C) channels-last -> (B, ceil(H / 2^J), ceil(W / 2^J), C K), K =
/// 1 + J L + L^2 J (J - 1) / 2 coefficients per input channel, in the order:
/// S0; S1 for j1 = 0..J-1, l1 = 0..L-1; S2 for j1 < j2, l1, l2 (l2 fastest).
/// How the image is extended past its border before filtering: by zeros (the
/// default, with which EXPERIMENTS.md's results were measured) or by reflection
/// about the edge pixels (kymatio's choice; no better on Fashion-MNIST so far).
enum class ScatteringBorder { zero, reflect };

/// The scattering transform as a layer with no parameters: x (B, H, W, C) ->
/// (B, ceil(H / 2^J), ceil(W / 2^J), C K), input channel c's K coefficients at
/// c K .. c K + K - 1 (their order is in the comment above ScatteringBorder).
template <class T>
class ScatteringT final : public LayerT<T> {
 public:
  /// C = channels, J scales, L angles and how the border is extended. Throws
  /// std::invalid_argument when channels is 0, J is outside [1, 6] or L outside
  /// [1, 32]; forward throws it on an input not (B, H, W, C), and with
  /// ScatteringBorder::reflect on images of 2^J pixels or fewer on a side.
  ScatteringT(std::size_t channels = 1, int J = 2, int L = 8, ScatteringBorder border = ScatteringBorder::zero);
  TensorT<T> forward(const TensorT<T>& x) override;
  std::size_t coefficients() const;  // K per input channel
  /// (B, H, W, C) -> (B, ceil(H / 2^J), ceil(W / 2^J), C K). Throws
  /// std::invalid_argument when `in` is not (B, H, W, C).
  Shape output_shape(const Shape& in) const;
  /// The transform of a data set's images (B, H, W, C) in pieces of `chunk`,
  /// recording nothing, `progress(done, total)` after each piece: features
  /// computed once before training (the transform is fixed and data-independent,
  /// so this is the same model, run faster).
  ArrayT<T> transform(const ArrayT<T>& images, std::size_t chunk = 256,
                      const std::function<void(std::size_t, std::size_t)>& progress = {});

 private:
  TensorT<T> scatter_one_channel(const TensorT<T>& x) const;  // (N, H, W, 1) -> (N, h, w, K)
  std::size_t channels_;
  int J_, L_;
  ScatteringBorder border_;
  // [res][j]: psi_j as conv weights (k*k, 2L): L real parts, then L imaginary parts
  std::vector<std::vector<ArrayT<T>>> psi_;
  std::vector<std::vector<std::size_t>> psi_radius_;
  std::vector<ArrayT<T>> phi_;  // [res]: (k*k, 1)
  std::vector<std::size_t> phi_radius_;
};

/// The float instantiation.
using Scattering = ScatteringT<float>;

}  // namespace dpgrad
