// The one place dpgrad includes xtensor from: array aliases and shape helpers.
// Training runs in float32; every op is also instantiated for double, which the
// gradient checks use.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/config.hpp"

#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xio.hpp>

namespace dpgrad {

/// The allocator of every dpgrad array: DPGRAD_ARRAY_ALIGNMENT-byte aligned
/// storage, the same under any compile flags (engine/config.hpp).
template <class T>
using Allocator = xsimd::aligned_allocator<T, DPGRAD_ARRAY_ALIGNMENT>;

/// An n-dimensional xtensor array of T, row-major; Array is the float32 one the
/// training runs in, and Shape an array's dimensions, outermost first. Its type
/// does not depend on -march or XTENSOR_USE_XSIMD.
template <class T>
using ArrayT = xt::xarray<T, xt::layout_type::row_major, Allocator<T>>;
using Array = ArrayT<float>;
using Shape = std::vector<std::size_t>;

/// The shape of `a` as a Shape.
template <class T>
Shape shape_of(const ArrayT<T>& a) {
  return Shape(a.shape().begin(), a.shape().end());
}

/// "(2, 3, 4)", for error messages.
inline std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

/// The number of elements of an array of shape `s`: the product of its
/// dimensions, 1 for the empty shape (a scalar).
inline std::size_t numel(const Shape& s) {
  std::size_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

}  // namespace dpgrad
