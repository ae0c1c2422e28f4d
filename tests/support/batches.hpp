// Small random batches shared by the per-sample tests.
#pragma once

#include <cstdint>

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

}  // namespace dpgrad::test
