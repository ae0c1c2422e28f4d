// Tests for image views (augmentation multiplicity): every view is its image
// flipped and/or shifted with edge pixels repeated, checked against a direct
// transcription of that definition; views are repeatable from (seed, step, id)
// and vary with each; labels and ids follow their example.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include "engine/random.hpp"
#include "examples/data/augment.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using namespace dpgrad::data;

namespace {

BatchT<float> images(std::size_t b, std::size_t c, std::size_t h, std::size_t w) {
  BatchT<float> batch;
  batch.inputs = ArrayT<float>::from_shape({b, c, h, w});
  for (std::size_t k = 0; k < batch.inputs.size(); ++k) batch.inputs.data()[k] = float(k);  // every pixel distinct
  for (std::size_t i = 0; i < b; ++i) {
    batch.labels.push_back(std::int32_t(i % 3));
    batch.ids.push_back(std::int64_t(100 + 7 * i));
  }
  return batch;
}

/// Image i of `src` moved by (dy, dx), then mirrored if `flip`: out(y, x) = in(clamp(y - dy), m(clamp(x - dx))).
std::vector<float> transformed(const BatchT<float>& src, std::size_t i, long dy, long dx, bool flip) {
  const long c = long(src.inputs.shape()[1]), h = long(src.inputs.shape()[2]), w = long(src.inputs.shape()[3]);
  std::vector<float> out;
  for (long ch = 0; ch < c; ++ch)
    for (long y = 0; y < h; ++y)
      for (long x = 0; x < w; ++x) {
        long sy = std::min(std::max(y - dy, 0L), h - 1), sx = std::min(std::max(x - dx, 0L), w - 1);
        if (flip) sx = w - 1 - sx;
        out.push_back(src.inputs(i, std::size_t(ch), std::size_t(sy), std::size_t(sx)));
      }
  return out;
}

std::vector<float> row(const BatchT<float>& b, std::size_t r) {
  std::size_t n = b.inputs.size() / b.size();
  return std::vector<float>(b.inputs.data() + r * n, b.inputs.data() + (r + 1) * n);
}

}  // namespace

TEST_CASE("augment: every view is its image shifted (edges repeated) and maybe flipped") {
  BatchT<float> src = images(5, 2, 6, 7);
  ImageAugment a;
  a.views = 6;
  a.shift = 2;
  a.seed = 9;
  BatchT<float> v = augment_images(src, a, 3);
  REQUIRE(v.views == 6);
  REQUIRE(v.size() == 30);
  REQUIRE(v.examples() == 5);
  CHECK(v.inputs.shape()[0] == 30);
  std::set<std::tuple<long, long, bool>> seen;
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t k = 0; k < 6; ++k) {
      const std::size_t r = i * 6 + k;
      CHECK(v.labels[r] == src.labels[i]);
      CHECK(v.ids[r] == src.ids[i]);
      std::vector<float> got = row(v, r);
      int matches = 0;
      for (long dy = -2; dy <= 2; ++dy)
        for (long dx = -2; dx <= 2; ++dx)
          for (bool flip : {false, true})
            if (transformed(src, i, dy, dx, flip) == got) {
              ++matches;
              seen.insert({dy, dx, flip});
            }
      CAPTURE(r);
      CHECK(matches == 1);  // pixels are distinct, so exactly one transform fits
    }
  CHECK(seen.size() > 10);  // 30 views draw from 50 transforms: many distinct ones
  bool any_flip = false, any_plain = false;
  for (const auto& t : seen) (std::get<2>(t) ? any_flip : any_plain) = true;
  CHECK(any_flip);
  CHECK(any_plain);
}

TEST_CASE("augment: no shift and no flip gives copies; views are repeatable and vary with step and seed") {
  BatchT<float> src = images(3, 1, 5, 5);
  ImageAugment a;
  a.views = 2;
  a.shift = 0;
  a.flip = false;
  BatchT<float> copies = augment_images(src, a, 0);
  for (std::size_t r = 0; r < copies.size(); ++r) CHECK(row(copies, r) == row(src, r / 2));

  a.shift = 1;
  a.flip = true;
  a.views = 4;
  BatchT<float> x = augment_images(src, a, 11), y = augment_images(src, a, 11), z = augment_images(src, a, 12);
  const bool repeatable = x.inputs == y.inputs, step_matters = x.inputs != z.inputs;
  CHECK(repeatable);
  CHECK(step_matters);
  a.seed = 1;
  BatchT<float> s = augment_images(src, a, 11);
  const bool seed_matters = x.inputs != s.inputs;
  CHECK(seed_matters);
  // an example's views depend on its id, not on where it sits in the batch
  BatchT<float> last = augment_images(src.select({2}), a, 11);
  for (std::size_t k = 0; k < 4; ++k) CHECK(row(last, k) == row(s, 2 * 4 + k));
}

TEST_CASE("augment: bad requests are clear errors") {
  BatchT<float> src = images(2, 1, 4, 4);
  ImageAugment a;
  a.views = 0;
  CHECK_THROWS_WITH_AS(augment_images(src, a, 0), doctest::Contains("views"), std::invalid_argument);
  a.views = 2;
  a.shift = -1;
  CHECK_THROWS_WITH_AS(augment_images(src, a, 0), doctest::Contains("shift"), std::invalid_argument);
  a.shift = 1;
  BatchT<float> twice = augment_images(src, a, 0);
  CHECK_THROWS_WITH_AS(augment_images(twice, a, 0), doctest::Contains("several views"), std::invalid_argument);
  BatchT<float> flat;
  flat.inputs = ArrayT<float>::from_shape({2, 16});
  flat.labels = {0, 1};
  flat.ids = {0, 1};
  CHECK_THROWS_WITH_AS(augment_images(flat, a, 0), doctest::Contains("image"), std::invalid_argument);
  BatchT<float> no_ids = src;
  no_ids.ids.clear();
  CHECK_THROWS_WITH_AS(augment_images(no_ids, a, 0), doctest::Contains("id"), std::invalid_argument);
}
