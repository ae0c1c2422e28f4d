// Random flips and shifts of images: data/augment.hpp.
#include "data/augment.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dpgrad::data {

namespace {

/// SipHash-2-4(key, step || id || view).
std::uint64_t draw(const HashKey& key, std::uint64_t step, std::uint64_t id, std::uint64_t view) {
  return keyed_hash(key, {step, id, view});
}

}  // namespace

HashKey hash_key_from_seed(std::uint64_t seed) { return dpgrad::hash_key_from_seed(seed, "dpgrad-augment"); }

void check_augment(const ImageAugment& a, const Shape& images) {
  if (a.views < 1 || a.views > 256) throw std::invalid_argument("augmentation: views must be in 1..256, not " + std::to_string(a.views));
  if (a.shift < 0) throw std::invalid_argument("augmentation: shift must be >= 0, not " + std::to_string(a.shift));
  if (images.size() < 3)
    throw std::invalid_argument("augmentation needs image inputs (B, ..., H, W), not token sequences or flat features");
  const std::size_t h = images[images.size() - 2], w = images.back();
  if (std::size_t(a.shift) >= std::min(h, w))
    throw std::invalid_argument("augmentation: shift " + std::to_string(a.shift) + " is not smaller than the images (" +
                                std::to_string(h) + " x " + std::to_string(w) + "): a view would hold none of it");
}

BatchT<float> augment_images(const BatchT<float>& batch, const ImageAugment& a, std::uint64_t step) {
  check_augment(a, shape_of(batch.inputs));
  if (batch.views != 1) throw std::invalid_argument("augmentation: the batch already has several views per example");
  const std::size_t b = batch.size();
  if (batch.inputs.shape()[0] != b || batch.ids.size() != b)
    throw std::invalid_argument("augmentation: the batch needs one input row and one dataset id per label");
  const std::size_t rank = batch.inputs.dimension();
  const long h = long(batch.inputs.shape()[rank - 2]), w = long(batch.inputs.shape()[rank - 1]);
  const std::size_t plane = std::size_t(h * w), row = batch.inputs.size() / std::max<std::size_t>(b, 1);
  const std::size_t planes = row / std::max<std::size_t>(plane, 1);
  const long s = a.shift;

  BatchT<float> r;
  r.views = a.views;
  Shape shape(batch.inputs.shape().begin(), batch.inputs.shape().end());
  shape[0] = b * a.views;
  r.inputs = ArrayT<float>::from_shape(shape);
  for (std::size_t i = 0; i < b; ++i) {
    for (std::size_t k = 0; k < a.views; ++k) {
      const std::uint64_t z = draw(a.key, step, std::uint64_t(batch.ids[i]), std::uint64_t(k));
      const bool flip = a.flip && (z & 1);
      const long span = 2 * s + 1;
      const long dy = long((z >> 8) % std::uint64_t(span)) - s, dx = long((z >> 32) % std::uint64_t(span)) - s;
      const float* src = batch.inputs.data() + i * row;
      float* dst = r.inputs.data() + (i * a.views + k) * row;
      for (std::size_t c = 0; c < planes; ++c, src += plane, dst += plane)
        for (long y = 0; y < h; ++y) {
          const long sy = std::clamp(y - dy, 0L, h - 1);
          for (long x = 0; x < w; ++x) {
            long sx = std::clamp(x - dx, 0L, w - 1);
            if (flip) sx = w - 1 - sx;
            dst[y * w + x] = src[sy * w + sx];
          }
        }
      r.labels.push_back(batch.labels[i]);
      r.ids.push_back(batch.ids[i]);
    }
  }
  return r;
}

}  // namespace dpgrad::data
