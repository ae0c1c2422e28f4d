// Where a tensor's samples are: the per-sample axis every tensor carries through
// every op, the way a batching transform tracks its batch dimension. The
// per-sample rules read it to refuse inputs whose samples are not on axis 0
// (docs/per-sample.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/array.hpp"

namespace dpgrad {

/// none: holds no sample's data (a constant, a parameter). axis: along `axis`,
/// `count` consecutive blocks of equal length hold sample 0, 1, ... in order
/// (an example's views are one block) and each element depends on its own
/// sample only. mixed: some element depends on several samples, or the
/// samples are laid out otherwise. subset: a slice along the per-sample axis,
/// whose blocks no longer line up with the batch's samples.
struct Samples {
  enum class Kind : std::uint8_t { none, axis, mixed, subset };
  Kind kind = Kind::none;
  std::size_t axis = 0;
  std::size_t count = 0;

  static Samples none() { return {}; }
  static Samples at(std::size_t axis, std::size_t count) { return {Kind::axis, axis, count}; }
  static Samples mixed() { return {Kind::mixed, 0, 0}; }
  static Samples subset(std::size_t axis) { return {Kind::subset, axis, 0}; }
  bool is_none() const { return kind == Kind::none; }
  bool on_axis(std::size_t a) const { return kind == Kind::axis && axis == a; }
  bool operator==(const Samples&) const = default;
  /// "per-sample axis 1 (2 samples)", "mixed", ...
  std::string str() const;
};

// Propagation rules, each from the inputs' Samples and shapes to the output's.

/// Elementwise ops with numpy broadcasting: each input's axis k is the output's
/// axis k + (out rank - its rank); inputs that put their samples on the same
/// output axis in compatible blocks agree, anything else mixes.
Samples samples_broadcast(std::span<const Samples> in, std::span<const Shape> shapes, const Shape& out);
/// Ops that work row by row on axis 0 and mix everything else (linear's x,
/// im2col, pooling, a convolution's images, a cell's gates): kept on axis 0,
/// mixed on any other axis. Several inputs: all rows must agree.
Samples samples_rowwise(std::span<const Samples> in, std::span<const Shape> shapes);
/// The default for an op that declares no rule: none if no input holds
/// samples, else mixed (never silently per-sample).
Samples samples_unknown(std::span<const Samples> in);
/// Sum or mean over `axes` (sorted, unique): over the per-sample axis mixes.
Samples samples_reduced(const Samples& x, const std::vector<std::size_t>& axes, bool keepdims);
/// Row-major reshape of `from` to `to`: exact (the samples stay blocks along
/// one output axis, or the result is mixed).
Samples samples_reshaped(const Samples& x, const Shape& from, const Shape& to);
/// out.shape[i] = x.shape[perm[i]].
Samples samples_transposed(const Samples& x, const std::vector<std::size_t>& perm);
/// x[..., begin:end, ...] along `axis` of x (shape `from`).
Samples samples_sliced(const Samples& x, const Shape& from, std::size_t axis, std::size_t begin, std::size_t end);
/// Joining along `axis`: along the per-sample axis mixes; along another axis
/// the inputs must agree.
Samples samples_concatenated(std::span<const Samples> in, std::span<const Shape> shapes, std::size_t axis);

}  // namespace dpgrad
