// A batch of examples, as data loaders produce it and models and samplers use
// it: features or token sequences, class labels or real-valued targets, and
// record identities.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/array.hpp"

namespace dpgrad {

/// A batch of examples: dense features or padded token sequences, with labels.
/// Each example may come as several rows (augmentation multiplicity, De et al.
/// 2022): rows [i * views, (i + 1) * views) are views of example i, and the
/// example's loss is the mean of its rows' losses, so its one per-sample
/// gradient (the thing clipped) averages over its views.
template <class T>
struct BatchT {
  ArrayT<T> inputs;                    // (R, ...) features; empty for token models
  ArrayT<std::int32_t> tokens;         // (R, L) token ids padded with 0; empty for feature models
  std::vector<std::int32_t> lengths;   // (R) true sequence lengths (token models)
  std::vector<std::int32_t> labels;    // (R) class labels (classification); may be empty with targets
  ArrayT<T> targets;                   // (R, ...) real-valued targets (regression, multi-label); may be absent
  std::vector<std::int64_t> ids;       // (R) dataset indices, for rules fixed per example; may be empty
  std::size_t views = 1;               // rows per example (R = examples() * views)
  /// Rows: the labels', or the targets' when there are no labels.
  std::size_t size() const;
  /// Examples: what is clipped, sampled and counted for privacy. Throws unless
  /// the rows are whole examples (views >= 1 dividing the row count).
  std::size_t examples() const;
  /// The examples at `index` (each with all its views), in that order.
  BatchT select(const std::vector<std::size_t>& index) const;
};

/// The examples of `parts`, in order, as one batch. The parts must agree in
/// views, in which fields they hold and in the shape of a row; throws
/// std::invalid_argument naming the first disagreement.
template <class T>
BatchT<T> concat_batches(const std::vector<BatchT<T>>& parts);

/// The batch of float models, as the data loaders produce it.
using Batch = BatchT<float>;

}  // namespace dpgrad
