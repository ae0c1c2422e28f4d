// Geometry and patch access shared by the two convolution routes (not
// installed): im2col + linear (engine/ops/conv.cpp) and the direct convolution
// (engine/ops/conv_direct.cpp), which builds its patches a few at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/conv.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad::detail {

/// The geometry of one convolution or im2col application, checked against x (B, H, W, C).
struct ConvGeom {
  std::size_t b = 0, h = 0, w = 0, c = 0, kh = 0, kw = 0, sh = 0, sw = 0, ho = 0, wo = 0;
  Pad2d pad;
  std::size_t image() const { return h * w * c; }
  std::size_t patch() const { return kh * kw * c; }
  std::size_t positions() const { return ho * wo; }
  std::size_t cols() const { return positions() * patch(); }  // per image
};

/// Throws std::invalid_argument naming `op` when x is not (B, H, W, C), the
/// kernel or a stride is empty, or the kernel does not fit the padded image.
ConvGeom conv_geometry(const Shape& xs, std::size_t kh, std::size_t kw, std::size_t sh, std::size_t sw, Pad2d pad,
                       const char* op);

/// Images per parallel piece: about 2^16 patch entries each.
inline std::size_t image_grain(const ConvGeom& g) {
  return std::max<std::size_t>(1, (std::size_t(1) << 16) / std::max<std::size_t>(1, g.cols()));
}

/// A window row's n values copied (Add: added) from s to d; Row of them when
/// Row > 0, known at compile time, so that rows as short as conv1's 8 values
/// cost a handful of instructions rather than a loop's setup.
template <std::size_t Row, bool Add, class T>
inline void move_row(const T* __restrict s, T* __restrict d, std::size_t n) {
  const std::size_t len = Row ? Row : n;
  for (std::size_t l = 0; l < len; ++l) {
    if constexpr (Add) d[l] += s[l];
    else d[l] = s[l];
  }
}

/// One image seen as patch rows, one row per output position (row-major over
/// (Ho, Wo)), each ordered (i, j, c) over its window. A padded image goes
/// through a zero-bordered frame, so every window lies inside it and its kh
/// rows are contiguous runs: no per-row bounds or calls.
template <class T>
class ImagePatches {
 public:
  explicit ImagePatches(const ConvGeom& g)
      : g_(g), ph_(g.h + g.pad.top + g.pad.bottom), pw_(g.w + g.pad.left + g.pad.right),
        padded_(ph_ != g.h || pw_ != g.w), frame_(padded_ ? ph_ * pw_ * g.c : 0, T(0)) {}

  /// Windows over `image` (H, W, C) from now on (copied into the frame when padded).
  void load(const T* image) {
    if (!padded_) {
      image_ = image;
      return;
    }
    for (std::size_t y = 0; y < g_.h; ++y) std::copy_n(image + y * g_.w * g_.c, g_.w * g_.c, frame_row(y));
    image_ = frame_.data();
  }
  /// rows ((q1 - q0), kh*kw*C) = the patches of positions [q0, q1).
  void gather(std::size_t q0, std::size_t q1, T* rows) const {
    switch (g_.kw * g_.c) {
      case 4: return walk<4, false>(q0, q1, const_cast<T*>(image_), rows);
      case 8: return walk<8, false>(q0, q1, const_cast<T*>(image_), rows);
      case 16: return walk<16, false>(q0, q1, const_cast<T*>(image_), rows);
      case 64: return walk<64, false>(q0, q1, const_cast<T*>(image_), rows);
      default: return walk<0, false>(q0, q1, const_cast<T*>(image_), rows);
    }
  }

  /// The reverse (col2im of one image): begin_scatter(dx), then scatter rows of
  /// any positions, each entry added to its pixel, then end_scatter(dx).
  void begin_scatter(T* image) {
    if (padded_) std::fill(frame_.begin(), frame_.end(), T(0));
    target_ = padded_ ? frame_.data() : image;
  }
  void scatter(std::size_t q0, std::size_t q1, const T* rows) {
    switch (g_.kw * g_.c) {
      case 4: return walk<4, true>(q0, q1, target_, const_cast<T*>(rows));
      case 8: return walk<8, true>(q0, q1, target_, const_cast<T*>(rows));
      case 16: return walk<16, true>(q0, q1, target_, const_cast<T*>(rows));
      case 64: return walk<64, true>(q0, q1, target_, const_cast<T*>(rows));
      default: return walk<0, true>(q0, q1, target_, const_cast<T*>(rows));
    }
  }
  void end_scatter(T* image) {
    if (!padded_) return;
    for (std::size_t y = 0; y < g_.h; ++y)
      move_row<0, true>(frame_row(y), image + y * g_.w * g_.c, g_.w * g_.c);
  }

 private:
  T* frame_row(std::size_t y) { return frame_.data() + ((y + g_.pad.top) * pw_ + g_.pad.left) * g_.c; }

  /// Visits the window rows of positions [q0, q1) in patch order: copies them
  /// to rows, or (ToImage) adds rows onto them. Row = kw * C when known.
  template <std::size_t Row, bool ToImage>
  void walk(std::size_t q0, std::size_t q1, T* img, T* rows) const {
    const std::size_t row = g_.kw * g_.c, line = pw_ * g_.c;
    for (std::size_t q = q0; q < q1; ++q) {
      const std::size_t oy = q / g_.wo, ox = q % g_.wo;
      T* p = img + (oy * g_.sh * pw_ + ox * g_.sw) * g_.c;
      for (std::size_t i = 0; i < g_.kh; ++i, p += line, rows += row) {
        if constexpr (ToImage) move_row<Row, true>(rows, p, row);
        else move_row<Row, false>(p, rows, row);
      }
    }
  }

  ConvGeom g_;
  std::size_t ph_, pw_;
  bool padded_;
  std::vector<T> frame_;
  const T* image_ = nullptr;
  T* target_ = nullptr;
};

}  // namespace dpgrad::detail
