// Random views of images for augmentation multiplicity (De et al. 2022): each
// example becomes `views` rows, flipped and shifted at random, and the training
// loss averages over them, so the one per-example gradient that is clipped sees
// every view. Privacy is unchanged: an example still contributes one clipped
// gradient per step, whatever its views. Draws are keyed by the example's record
// id and a per-run key, never by its position (docs/data-privacy.md).
#pragma once

#include <array>
#include <cstdint>

#include "engine/random.hpp"
#include "data/batch.hpp"

namespace dpgrad::data {

using dpgrad::HashKey;          // engine/random.hpp
using dpgrad::random_hash_key;  // a secret key, from the operating system's entropy
/// dpgrad::hash_key_from_seed(seed, "dpgrad-augment"): repeatable draws, for
/// runs that ask for reproducibility.
HashKey hash_key_from_seed(std::uint64_t seed);

/// How augment_images() draws views; it throws std::invalid_argument for views
/// outside 1..256 or a negative shift.
struct ImageAugment {
  std::size_t views = 1;  // rows per example
  bool flip = true;       // mirror left-right with probability 1/2
  int shift = 2;          // translate by up to this many pixels along each axis (edge pixels repeat)
  HashKey key{};          // the run's key: random_hash_key() or hash_key_from_seed(seed)
};

/// Checks `a` for images of shape `images` ((N, ..., H, W)): views in 1..256, a
/// shift >= 0 and below H and W (a larger one could leave a view none of its
/// image). Throws std::invalid_argument naming the problem; augment_images
/// checks its batch the same way.
void check_augment(const ImageAugment& a, const Shape& images);

/// Each example of `batch` (inputs (B, ..., H, W), one view each, ids set) as
/// a.views random views: (B * views, ..., H, W), batch.views = a.views. View k
/// of the example with record id `id` at step `step` is drawn from the 64 bits
/// SipHash-2-4(key, step || id || k) (each as 8 little-endian bytes): it depends
/// on nothing else, so no other example (its presence, position or content)
/// changes it, and with the same key it is repeatable (private runs draw a
/// secret key, and a new one when they resume).
BatchT<float> augment_images(const BatchT<float>& batch, const ImageAugment& a, std::uint64_t step);

}  // namespace dpgrad::data
