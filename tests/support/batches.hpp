// Small random batches shared by the per-sample tests.
#pragma once

#include <cstdint>

#include "engine/random.hpp"
#include "layers/module.hpp"
#include "support/check.hpp"

namespace dpgrad::test {

/// b random 28x28 one-channel images with labels in [0, 10).
inline BatchT<double> image_batch(std::size_t b, Rng& rng) {
  BatchT<double> batch;
  batch.inputs = randn<double>({b, 1, 28, 28}, rng);
  for (std::size_t i = 0; i < b; ++i) batch.labels.push_back(std::int32_t(rng.below(10)));
  return batch;
}

/// n records of `features` normal features (standard deviation `scale`), labels
/// in [0, 3) from a fixed linear rule of the first two, ids 0..n-1.
inline BatchT<double> three_class_records(std::size_t n, std::size_t features, std::uint64_t seed, double scale = 1.0) {
  FastRng rng(seed);
  BatchT<double> b;
  b.inputs = randn<double>({n, features}, rng, scale);
  for (std::size_t i = 0; i < n; ++i) {
    const double s = (b.inputs(i, 0) + 0.5 * b.inputs(i, 1)) / scale;
    b.labels.push_back(s < -0.4 ? 0 : s < 0.4 ? 1 : 2);
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

/// Standard normal inputs of shape `s` (examples first), labels in [0, classes),
/// ids 0..B-1.
inline BatchT<double> random_batch(const Shape& s, std::size_t classes, Rng& rng) {
  BatchT<double> b;
  b.inputs = randn<double>(s, rng);
  for (std::size_t i = 0; i < s[0]; ++i) {
    b.labels.push_back(std::int32_t(rng.below(classes)));
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

}  // namespace dpgrad::test
