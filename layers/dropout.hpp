// Dropout (Srivastava et al. 2014), inverted: in training mode each element is
// kept with probability 1 - p and scaled by 1/(1 - p); in evaluation mode it is
// the identity. The mask enters as a constant factor of `mul`, so no rule here.
// In a private run a record's mask depends on the run's key, the step, the
// record's id and the element's place in the record alone, never on the other
// records of the batch (docs/data-privacy.md, "Dropout masks").
#pragma once

#include <cstdint>
#include <span>

#include "engine/random.hpp"
#include "layers/module.hpp"

namespace dpgrad {

/// While alive (on this thread), dropout draws its masks keyed by `key` at
/// `step`: PrivateTrainer holds one around each step, with the run's dropout
/// key. The forward pass must then name its records (DropoutRecords).
class DropoutKeyScope {
 public:
  /// Masks keyed by (a copy of) `key` at `step` until this scope ends; the previous scope's after.
  DropoutKeyScope(const HashKey& key, std::uint64_t step);
  ~DropoutKeyScope();
  DropoutKeyScope(const DropoutKeyScope&) = delete;
  DropoutKeyScope& operator=(const DropoutKeyScope&) = delete;

 private:
  HashKey key_;
  const HashKey* saved_key_;
  std::uint64_t saved_step_;
};

/// Whether a DropoutKeyScope is alive on this thread (masks keyed per record).
bool dropout_keyed();

/// While alive (on this thread), a forward pass runs on the rows of a batch:
/// row r is record ids[r], and rows [i * views, (i + 1) * views) are the views
/// of one example. A model's forward(batch) holds one (FeatureModel and ONNX
/// models do); it also numbers the dropout calls of the pass from 0, so that
/// two dropout layers draw different masks. `ids` must outlive it.
class DropoutRecords {
 public:
  /// Rows of record ids `ids` (one per row), `views` rows to an example; or those of `batch`.
  DropoutRecords(std::span<const std::int64_t> ids, std::size_t views);
  template <class T>
  explicit DropoutRecords(const BatchT<T>& batch) : DropoutRecords(batch.ids, batch.views) {}
  ~DropoutRecords();
  DropoutRecords(const DropoutRecords&) = delete;
  DropoutRecords& operator=(const DropoutRecords&) = delete;

 private:
  std::span<const std::int64_t> saved_ids_;
  std::size_t saved_views_;
  std::uint64_t saved_calls_;
  bool saved_set_;
};

/// The mask of inverted dropout for x, p in [0, 1): each element 1/(1 - p)
/// (kept) or 0 (dropped), in x's shape. Inside a DropoutKeyScope, element e of
/// the record with id `id` is dropped when SipHash-2-4(key, r || e's
/// coordinates in the record) < ceil(p 2^64), r = SipHash-2-4(key, step || id
/// || view || call): keyed per record, found along x's per-sample axis
/// (x.samples()), so x must hold the batch's records (or their views) in blocks
/// along one axis, be all one record's, or hold none. Outside one, the elements
/// are drawn in order from `fallback`. Throws std::invalid_argument when a keyed
/// mask cannot be drawn per record (the forward pass named no records, ids are
/// missing, or x mixes records).
template <class T>
ArrayT<T> dropout_mask(const TensorT<T>& x, double p, Rng& fallback);

/// Inverted dropout as a layer (the top of this file says how it works).
template <class T>
class DropoutT final : public LayerT<T> {
 public:
  /// p in [0, 1): the probability of dropping an element. In a private run the
  /// masks are keyed per record (dropout_mask); elsewhere they come from a
  /// FastRng seeded with `seed` (a fresh mask per forward call).
  /// Throws std::invalid_argument when p is outside [0, 1).
  explicit DropoutT(double p, std::uint64_t seed = 0);
  /// x (B, ...) -> (B, ...): x * mask / (1 - p) in training, x in evaluation.
  TensorT<T> forward(const TensorT<T>& x) override;
  /// The probability of dropping an element.
  double p() const { return p_; }

 private:
  double p_;
  FastRng rng_;
};

/// The float instantiation.
using Dropout = DropoutT<float>;

}  // namespace dpgrad
