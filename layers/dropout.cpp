// Dropout: a constant mask/(1 - p) multiplied in with the engine's `mul`; the
// mask keyed per record in a private run (docs/data-privacy.md, "Dropout masks").
#include "layers/dropout.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/ops.hpp"
#include "engine/parallel.hpp"

namespace dpgrad {

namespace {

/// What the scopes of this thread say: the run's key and step (DropoutKeyScope),
/// the forward pass's records and its dropout calls so far (DropoutRecords).
struct DropoutContext {
  const HashKey* key = nullptr;
  std::uint64_t step = 0;
  std::span<const std::int64_t> ids;
  std::size_t views = 1;
  std::uint64_t calls = 0;
  bool records = false;
};

thread_local DropoutContext context;

// The view word of an element whose record's block holds all its views, and of
// an element that belongs to no record (a tensor without samples).
constexpr std::uint64_t kAllViews = std::uint64_t(1) << 63;
constexpr std::uint64_t kNoRecord = kAllViews + 1;
constexpr std::size_t kMaxCoordinates = 8;  // two 32-bit coordinates a word, four words

/// Where x's elements belong: per index of `axis` (with per_axis) the record's
/// digest and the two coordinates that index gives within the record, or one
/// digest for every element.
struct RecordLayout {
  bool per_axis = false;
  std::size_t axis = 0;
  std::vector<std::uint64_t> digest, outer, block;  // per index of `axis`; digest[0] alone without per_axis
};

[[noreturn]] void refuse(const std::string& why) {
  throw std::invalid_argument("Dropout in a private run: " + why + " (docs/data-privacy.md, \"Dropout masks\")");
}

/// SipHash-2-4(key, step || id || view || call): what a record's elements are drawn under at this call.
std::uint64_t record_digest(const DropoutContext& c, std::int64_t id, std::uint64_t view) {
  return keyed_hash(*c.key, {c.step, std::uint64_t(id), view, c.calls});
}

RecordLayout layout_of(const Samples& s, const Shape& shape, const DropoutContext& c) {
  if (!c.records)
    refuse("the forward pass did not name its records; a model's forward(batch) must hold a DropoutRecords(batch)");
  const std::size_t rows = c.ids.size(), views = c.views;
  if (views == 0 || rows % views != 0)
    refuse(std::to_string(rows) + " record ids are not whole examples of " + std::to_string(views) + " views");
  const std::size_t examples = rows / views;
  RecordLayout l;
  if (s.kind == Samples::Kind::axis && s.count > 0 && (s.count == rows || s.count == examples)) {
    // the per-sample axis runs (outer, count, block): index i is sample (i / block) % count
    l.per_axis = true;
    l.axis = s.axis;
    const std::size_t n = shape[s.axis], block = n / (s.outer * s.count);
    const bool by_row = s.count == rows;  // a block per row (view); else one per example, all its views
    std::vector<std::uint64_t> digests(s.count);
    for (std::size_t k = 0; k < s.count; ++k)
      digests[k] = by_row ? record_digest(c, c.ids[k], k % views) : record_digest(c, c.ids[k * views], kAllViews);
    for (std::size_t i = 0; i < n; ++i) {
      l.digest.push_back(digests[i / block % s.count]);
      l.outer.push_back(i / (block * s.count));
      l.block.push_back(i % block);
    }
    return l;
  }
  if (s.is_none()) {
    l.digest = {record_digest(c, 0, kNoRecord)};  // depends on no record: the same for all of them
    return l;
  }
  if (examples == 1) {  // every element is the one record's, however the model laid them out
    l.digest = {record_digest(c, c.ids[0], kAllViews)};
    return l;
  }
  if (rows == 0) refuse("the batch has no record ids (Batch::ids), which key the masks");
  refuse("its input holds " + s.str() + ", not the " + std::to_string(examples) +
         " records of the batch in blocks along one axis, so its masks cannot be drawn per record");
}

/// SipHash-2-4(key, digest || the coordinates, two 32-bit ones a word): as few words as hold them.
std::uint64_t element_hash(const HashKey& key, std::uint64_t digest, const std::uint64_t* c, std::size_t n) {
  const auto w = [&](std::size_t k) { return c[2 * k] | c[2 * k + 1] << 32; };
  switch ((n + 1) / 2) {
    case 0: return keyed_hash(key, {digest});
    case 1: return keyed_hash(key, {digest, w(0)});
    case 2: return keyed_hash(key, {digest, w(0), w(1)});
    case 3: return keyed_hash(key, {digest, w(0), w(1), w(2)});
    default: return keyed_hash(key, {digest, w(0), w(1), w(2), w(3)});
  }
}

/// The keyed mask (dropout_mask's top comment) of a tensor of `shape` laid out as `l`.
template <class T>
void keyed_mask(ArrayT<T>& mask, const Shape& shape, const RecordLayout& l, const HashKey& key, double p) {
  const std::size_t rank = shape.size(), coordinates = rank + (l.per_axis ? 1 : 0);
  if (coordinates > kMaxCoordinates)
    refuse("its input has " + std::to_string(rank) + " axes; masks keyed per record take at most " +
           std::to_string(kMaxCoordinates - 1));
  for (std::size_t d : shape)
    if (d >> 32) refuse("an axis of " + std::to_string(d) + " elements is too long for its coordinates");
  const std::uint64_t threshold = std::uint64_t(std::ceil(std::ldexp(p, 64)));  // dropped below it: P = p + < 2^-64
  const T keep = T(1.0 / (1.0 - p));
  T* out = mask.data();
  if (mask.size() == 0) return;
  parallel::for_range(mask.size(), 2048, [&](std::size_t begin, std::size_t end) {
    std::size_t index[kMaxCoordinates] = {};  // of element e, row-major, counted up as e moves on
    for (std::size_t d = rank, rest = begin; d-- > 0; rest /= shape[d]) index[d] = rest % shape[d];
    std::uint64_t c[kMaxCoordinates] = {};
    for (std::size_t e = begin; e < end; ++e) {
      std::size_t n = 0;
      std::uint64_t digest = l.digest[0];
      for (std::size_t d = 0; d < rank; ++d) {
        if (l.per_axis && d == l.axis) {
          const std::size_t i = index[d];
          digest = l.digest[i];
          c[n++] = l.outer[i];
          c[n++] = l.block[i];
        } else {
          c[n++] = index[d];
        }
      }
      out[e] = element_hash(key, digest, c, n) < threshold ? T(0) : keep;
      for (std::size_t d = rank; d-- > 0;) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
  });
}

}  // namespace

bool dropout_keyed() { return context.key != nullptr; }

DropoutKeyScope::DropoutKeyScope(const HashKey& key, std::uint64_t step)
    : key_(key), saved_key_(context.key), saved_step_(context.step) {
  context.key = &key_;
  context.step = step;
}

DropoutKeyScope::~DropoutKeyScope() {
  context.key = saved_key_;
  context.step = saved_step_;
}

DropoutRecords::DropoutRecords(std::span<const std::int64_t> ids, std::size_t views)
    : saved_ids_(context.ids), saved_views_(context.views), saved_calls_(context.calls), saved_set_(context.records) {
  context.ids = ids;
  context.views = views;
  context.calls = 0;
  context.records = true;
}

DropoutRecords::~DropoutRecords() {
  context.ids = saved_ids_;
  context.views = saved_views_;
  context.calls = saved_calls_;
  context.records = saved_set_;
}

template <class T>
ArrayT<T> dropout_mask(const TensorT<T>& x, double p, Rng& fallback) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("Dropout: p must be in [0, 1), got " + std::to_string(p));
  ArrayT<T> mask = ArrayT<T>::from_shape(x.shape());
  if (!context.key) {
    const T keep = T(1.0 / (1.0 - p));
    for (auto& m : mask) m = fallback.bernoulli(1.0 - p) ? keep : T(0);
    return mask;
  }
  const Shape shape = x.shape();
  keyed_mask(mask, shape, layout_of(x.samples(), shape, context), *context.key, p);
  ++context.calls;
  return mask;
}

template <class T>
DropoutT<T>::DropoutT(double p, std::uint64_t seed) : p_(p), rng_(seed) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("Dropout: p must be in [0, 1), got " + std::to_string(p));
}

template <class T>
TensorT<T> DropoutT<T>::forward(const TensorT<T>& x) {
  if (!this->training() || p_ == 0.0) return x;
  return mul(x, constant<T>(dropout_mask(x, p_, rng_)));
}

template ArrayT<float> dropout_mask(const TensorT<float>&, double, Rng&);
template ArrayT<double> dropout_mask(const TensorT<double>&, double, Rng&);
template class DropoutT<float>;
template class DropoutT<double>;

}  // namespace dpgrad
