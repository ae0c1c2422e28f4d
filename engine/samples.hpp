// Where a tensor's samples are: the per-sample axis every tensor carries through
// every op, the way a batching transform tracks its batch dimension. The
// per-sample rules read it to refuse inputs whose samples are not on axis 0
// (docs/per-sample.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/array.hpp"

namespace dpgrad {

/// How a tensor's samples came to be mixed, for messages that say what
/// happened: the op that first mixed them and what it saw there.
struct MixedBy {
  /// The kind of mixing, for the message (statistics get the batch-normalisation hint).
  enum class What : std::uint8_t {
    statistics,  // a reduction or normalisation over the per-sample axis
    reshape,     // a reshape that merges the per-sample axis with another
    product,     // a product whose second factor (a weight) holds samples
    other,       // anything else: joins, broadcasts, an op without a samples rule
    batch_size,  // a value computed from the batch size, which is private
  };
  What what = What::other;
  std::string op;      // the op's name ("sum", "reshape", "matmul"); apply() fills it in
  std::string detail;  // what it did: "over the per-sample axis 0", ...
  std::string node;    // the model's node it ran for ("node 'n' (ReduceSum)" in an ONNX graph), if known
  /// "node 'n' (ReduceSum): sum over the per-sample axis 0 (statistics over
  /// the batch, as batch normalisation takes: ...)": the hint is given for
  /// statistics and for the batch size.
  std::string str() const;
};

/// none: holds no sample's data (a constant, a parameter). axis: along `axis`,
/// `count` consecutive blocks of equal length hold sample 0, 1, ... in order
/// (an example's views are one block) and each element depends on its own
/// sample only; with `outer` > 1 that run of blocks repeats `outer` times along
/// the axis: the axis has merged an outer axis with the samples' (a reshape of
/// (L, B, d) to (L B, d), the batch inner). mixed: some element depends on
/// several samples, or the samples are laid out otherwise. subset: a slice
/// along the per-sample axis, whose blocks no longer line up with the batch's
/// samples.
struct Samples {
  /// The four layouts above; `axis` and `count` are those of axis, `axis` that of subset.
  enum class Kind : std::uint8_t { none, axis, mixed, subset };
  Kind kind = Kind::none;
  std::size_t axis = 0;
  std::size_t count = 0;
  std::size_t outer = 1;  // axis: repeats of the run of `count` blocks (1: the blocks are the whole axis)
  std::shared_ptr<const MixedBy> by;  // mixed: where and how, when known (not part of equality)

  /// The layouts by name: none(); at(axis, count), `count` blocks along `axis`;
  /// mixed() with no account of how; subset(axis), a slice along `axis`.
  static Samples none() { return {}; }
  static Samples at(std::size_t axis, std::size_t count) { return {Kind::axis, axis, count, 1, nullptr}; }
  /// Along `axis`, `outer` repeats of `count` consecutive blocks: (outer, count, block).
  static Samples interleaved(std::size_t axis, std::size_t count, std::size_t outer) {
    return {Kind::axis, axis, count, outer == 0 ? 1 : outer, nullptr};
  }
  static Samples mixed() { return {Kind::mixed, 0, 0, 1, nullptr}; }
  /// Mixed here, by the op being applied: `detail` says what it did.
  static Samples mixed(MixedBy::What what, std::string detail) {
    return {Kind::mixed, 0, 0, 1, std::make_shared<const MixedBy>(MixedBy{what, "", std::move(detail), ""})};
  }
  /// Mixed because the value depends on the batch size: under Poisson sampling
  /// one record changes it by one, so a value computed from it is every
  /// sample's (docs/per-sample.md, "The batch size"). `node` names where.
  static Samples batch_size(std::string node, std::string detail) {
    return {Kind::mixed, 0, 0, 1,
            std::make_shared<const MixedBy>(MixedBy{MixedBy::What::batch_size, "", std::move(detail), std::move(node)})};
  }
  static Samples subset(std::size_t axis) { return {Kind::subset, axis, 0, 1, nullptr}; }
  bool is_none() const { return kind == Kind::none; }
  /// The samples lie along axis a (in blocks, or interleaved with an outer axis).
  bool on_axis(std::size_t a) const { return kind == Kind::axis && axis == a; }
  /// The samples are consecutive blocks of axis a, the layout the per-sample rules read.
  bool blocks_on(std::size_t a) const { return on_axis(a) && outer == 1; }
  bool operator==(const Samples& o) const {
    return kind == o.kind && axis == o.axis && count == o.count && outer == o.outer;
  }
  /// "per-sample axis 1 (2 samples)", "mixed samples (by sum over ...)", ...
  std::string str() const;
};

/// How to bring a tensor's samples to the front: its shape with the per-sample
/// axis split into (outer, count, block), and the permutation that puts the
/// count axis first, the others in order. The result, made contiguous, holds
/// sample i's elements in block i of axis 0 (the layout of Samples::at(0, count)).
struct SamplesToFront {
  Shape split;                    // the shape with the per-sample axis split in three
  std::vector<std::size_t> perm;  // count axis first
  Shape moved;                    // (count, ...the other axes of split, in order)
  bool identity = true;           // already in front, in blocks: nothing to move
};
/// For a tensor of `shape` whose samples are `s` (kind axis).
SamplesToFront samples_to_front(const Samples& s, const Shape& shape);

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
/// samples, else mixed (never silently per-sample; an input mixed before keeps
/// its account of where).
Samples samples_unknown(std::span<const Samples> in);
/// The output of op `op` whose rule gave `out` from inputs `in`: when the op
/// mixed samples, says which op did (keeping an earlier op's account when an
/// input was mixed already). Called by apply() for every op.
Samples samples_named(Samples out, std::span<const Samples> in, const char* op);
/// The text a refusal gives for mixed samples: ": <op> <what it did>" with the
/// batch-normalisation hint for statistics over the batch, or a general remark
/// when the op is unknown; "" for samples that are not mixed.
std::string mixing_explained(const Samples& s);
/// Sum or mean over `axes` (sorted, unique) of a tensor of `rank` axes: over
/// the per-sample axis mixes (unless there is one sample).
Samples samples_reduced(const Samples& x, const std::vector<std::size_t>& axes, bool keepdims, std::size_t rank);
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
