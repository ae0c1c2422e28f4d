// Convolution and pooling primitives on channels-last images x (B, H, W, C).
// A convolution is im2col followed by the parametric op `linear`, so linear's
// per-sample rules (a use with the patches as activations, T = Ho*Wo) cover
// convolutions without a rule of their own; or, for kernels small against
// their positions, one direct op that never stores the patches (its own
// per-sample rule). Geometry helpers compute padding.
#pragma once

#include <cstddef>

#include "engine/tensor.hpp"

namespace dpgrad {

/// Zero padding added around an image, in pixels.
struct Pad2d {
  /// Rows above and below, columns left and right of the image.
  std::size_t top = 0, bottom = 0, left = 0, right = 0;
  bool operator==(const Pad2d&) const = default;
};

/// The kinds of Padding (below): 'same', 'valid', or the fixed amounts of Padding::pads.
enum class PaddingMode { same, valid, explicit_pads };

/// How a layer pads: 'same' (TensorFlow's convention), 'valid' (none) or fixed amounts.
struct Padding {
  PaddingMode mode = PaddingMode::valid;  // which of the three; resolve_padding turns it into pixels
  Pad2d pads{};  // used by explicit_pads only
  /// A Padding of each kind; explicit_pads takes the four amounts in pixels.
  static Padding same() { return {PaddingMode::same, {}}; }
  static Padding valid() { return {PaddingMode::valid, {}}; }
  static Padding explicit_pads(std::size_t top, std::size_t bottom, std::size_t left, std::size_t right) {
    return {PaddingMode::explicit_pads, {top, bottom, left, right}};
  }
};

/// Zero padding along one spatial axis, in pixels.
struct Pad1d {
  std::size_t before = 0, after = 0;  // before the first pixel and after the last
};

/// One spatial axis of 'same' padding (TF): out = ceil(in / stride),
/// total = max((out - 1) * stride + k - in, 0), the smaller half before.
/// Throws std::invalid_argument on k or stride 0.
Pad1d same_padding(std::size_t in, std::size_t kernel, std::size_t stride);

/// The pads `padding` gives for an (h, w) image and a (kh, kw) kernel with strides (sh, sw).
Pad2d resolve_padding(const Padding& padding, std::size_t h, std::size_t w, std::size_t kh, std::size_t kw,
                      std::size_t sh, std::size_t sw);

/// Output length of a window sweep: floor((in + before + after - k) / stride) + 1.
/// 'valid' is the case of no padding. Throws when the padded input is shorter than k.
std::size_t window_output_size(std::size_t in, std::size_t kernel, std::size_t stride, std::size_t before = 0,
                               std::size_t after = 0);

/// Patches of x (B, H, W, C) -> (B, Ho, Wo, kh*kw*C), zero-padded by `pad`; a patch
/// row is ordered (i, j, c) over the window, matching weights (kh*kw*C, Cout).
/// Linear in x: vjp = col2im (scatter-add of patches), jvp = im2col of the tangents.
template <class T>
TensorT<T> im2col(const TensorT<T>& x, std::size_t kernel_h, std::size_t kernel_w, std::size_t stride_h,
                  std::size_t stride_w, Pad2d pad = {});

/// How conv2d computes.
enum class ConvMethod {
  automatic,  // direct where direct_conv_pays, else patches
  patches,    // linear(im2col(x), w, b): the patch array is stored; linear's per-sample rules
  direct,     // conv2d_direct: patches built a block at a time and never stored
};

/// (B, Ho, Wo, Cout) for x (B, H, W, C), w (kh*kw*C, Cout), b (Cout) or
/// undefined: cross-correlation with zero padding `pad`, by either route.
template <class T>
TensorT<T> conv2d(const TensorT<T>& x, const TensorT<T>& w, const TensorT<T>& b, std::size_t kernel_h,
                  std::size_t kernel_w, std::size_t stride_h, std::size_t stride_w, Pad2d pad = {},
                  ConvMethod method = ConvMethod::automatic);

/// The convolution as one op that keeps x, not its patches. Its per-sample rule
/// (a `conv` use) builds each sample's G_i (kh*kw*C, Cout) from x_i and delta_i,
/// so it suits kernels whose G_i are small against a sample's patches.
template <class T>
TensorT<T> conv2d_direct(const TensorT<T>& x, const TensorT<T>& w, const TensorT<T>& b, std::size_t kernel_h,
                         std::size_t kernel_w, std::size_t stride_h, std::size_t stride_w, Pad2d pad = {});

/// True when a kernel of `patch` = kh*kw*C rows and `cout` columns over
/// `positions` = Ho*Wo outputs suits the direct route: G_i at most an eighth of
/// what a sample's patches and output gradients hold (gradient_at_most), and W
/// within 2^14 values so that the kernels' working set stays in cache.
/// cnn26k's conv1 (64 x 16 over 196 positions) fits; its conv2 (256 x 32 over
/// 25) does not.
bool direct_conv_fits(std::size_t patch, std::size_t cout, std::size_t positions);

/// The width in bytes of the vectors conv2d_direct's kernels run with: those of
/// the engine's kernel set chosen at run time (engine/simd.hpp), 32 with AVX2, 16
/// on the portable build's x86-64-v2 baseline (a -march=native build's baseline
/// may be wider: 64 with AVX-512).
std::size_t direct_conv_vector_bytes();

/// True when `automatic` takes the direct route: the kernel fits
/// (direct_conv_fits) and the direct kernels run with vectors of 32 bytes or
/// more; below that, patches and OpenBLAS are faster (docs/per-sample.md,
/// "Convolutions: two routes").
bool direct_conv_pays(std::size_t patch, std::size_t cout, std::size_t positions);

/// Max over 'valid' windows: x (B, H, W, C) -> (B, Ho, Wo, C), channel by channel.
/// d out / d x = 1 at the window's argmax, 0 elsewhere. Ties (a kink): the first
/// maximum in row-major window order wins and the derivative is taken there.
template <class T>
TensorT<T> max_pool2d(const TensorT<T>& x, std::size_t kernel_h, std::size_t kernel_w, std::size_t stride_h,
                      std::size_t stride_w);

/// Mean over windows of x (B, H, W, C) zero-padded by `pad` -> (B, Ho, Wo, C),
/// channel by channel. count_include_pad: divided by kh * kw; else by the
/// window's elements inside the image. Linear in x: the jvp pools the tangents,
/// the vjp spreads dout / divisor over each window.
template <class T>
TensorT<T> avg_pool2d(const TensorT<T>& x, std::size_t kernel_h, std::size_t kernel_w, std::size_t stride_h,
                      std::size_t stride_w, Pad2d pad = {}, bool count_include_pad = true);

/// Square window and stride.
template <class T>
TensorT<T> max_pool2d(const TensorT<T>& x, std::size_t kernel, std::size_t stride) {
  return max_pool2d(x, kernel, kernel, stride, stride);
}

}  // namespace dpgrad
