// Random views of images for augmentation multiplicity (De et al. 2022): each
// example becomes `views` rows, flipped and shifted at random, and the training
// loss averages over them, so the one per-example gradient that is clipped sees
// every view. Privacy is unchanged: an example still contributes one clipped
// gradient per step, whatever its views.
#pragma once

#include <cstdint>

#include "layers/module.hpp"

namespace dpgrad::data {

struct ImageAugment {
  std::size_t views = 1;  // rows per example
  bool flip = true;       // mirror left-right with probability 1/2
  int shift = 2;          // translate by up to this many pixels along each axis (edge pixels repeat)
  std::uint64_t seed = 0;
};

/// Each example of `batch` (inputs (B, ..., H, W), one view each, ids set) as
/// a.views random views: (B * views, ..., H, W), batch.views = a.views. View k
/// of the example with id `id` at step `step` depends only on (seed, step, id,
/// k): repeatable, and the same after a resume, with no generator state to keep.
BatchT<float> augment_images(const BatchT<float>& batch, const ImageAugment& a, std::uint64_t step);

}  // namespace dpgrad::data
