// Tests for image views (augmentation multiplicity): every view is its image
// flipped and/or shifted with edge pixels repeated, checked against a direct
// transcription of that definition; views are repeatable from (key, step, id),
// vary with each, match SipHash-2-4 values computed outside dpgrad, and do not
// move when another record is removed; labels and ids follow their example.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include "engine/random.hpp"
#include "data/augment.hpp"
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
  a.key = hash_key_from_seed(9);
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

TEST_CASE("augment: no shift and no flip gives copies; views are repeatable and vary with step and key") {
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
  a.key = hash_key_from_seed(1);
  BatchT<float> s = augment_images(src, a, 11);
  const bool key_matters = x.inputs != s.inputs;
  CHECK(key_matters);
  // an example's views depend on its id, not on where it sits in the batch
  BatchT<float> last = augment_images(src.select({2}), a, 11);
  for (std::size_t k = 0; k < 4; ++k) CHECK(row(last, k) == row(s, 2 * 4 + k));
}

TEST_CASE("augment: keys: from a seed is BLAKE2b of a fixed tag, random keys differ") {
  // hashlib.blake2b(b"dpgrad-augment" + seed.to_bytes(8, "little"), digest_size=16) in Python
  const HashKey k0{0x8a, 0x39, 0xab, 0xa9, 0x4b, 0x6b, 0x60, 0x47, 0xcc, 0x36, 0x75, 0xb2, 0xba, 0x00, 0xba, 0xb6};
  const HashKey k42{0x03, 0x95, 0x3a, 0x75, 0x5a, 0x7c, 0xdf, 0x01, 0xd3, 0x5b, 0xdf, 0x07, 0x62, 0x88, 0xf7, 0x8e};
  CHECK(hash_key_from_seed(0) == k0);
  CHECK(hash_key_from_seed(42) == k42);
  const HashKey r1 = random_hash_key(), r2 = random_hash_key();
  CHECK(r1 != r2);  // 128 random bits each
  CHECK(r1 != HashKey{});
}

TEST_CASE("augment: the draws are SipHash-2-4(key, step || id || view), as computed outside dpgrad") {
  // Python: z = siphash24(key, step.to_bytes(8, "little") + id.to_bytes(8, "little") + view.to_bytes(8, "little"));
  // flip = z & 1, dy = (z >> 8) % 5 - 2, dx = (z >> 32) % 5 - 2, key = hash_key_from_seed(42), step 3
  BatchT<float> src = images(2, 1, 6, 6);  // ids 100 and 107
  ImageAugment a;
  a.views = 3;
  a.shift = 2;
  a.key = hash_key_from_seed(42);
  const BatchT<float> v = augment_images(src, a, 3);
  struct Draw { long dy, dx; bool flip; };
  const Draw expected[2][3] = {{{0, 1, true}, {-2, -2, false}, {2, -2, true}},
                               {{1, 2, false}, {0, 2, false}, {1, 0, true}}};
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t k = 0; k < 3; ++k) {
      CAPTURE(i);
      CAPTURE(k);
      const Draw& d = expected[i][k];
      CHECK(row(v, i * 3 + k) == transformed(src, i, d.dy, d.dx, d.flip));
    }
}

TEST_CASE("augment: removing one record changes no other record's views") {
  BatchT<float> full = images(6, 1, 8, 8);
  ImageAugment a;
  a.views = 4;
  a.shift = 3;
  a.key = random_hash_key();
  for (std::uint64_t step : {0u, 5u}) {
    const BatchT<float> all = augment_images(full, a, step);
    for (std::size_t removed = 0; removed < 6; ++removed) {
      std::vector<std::size_t> keep;
      for (std::size_t i = 0; i < 6; ++i)
        if (i != removed) keep.push_back(i);
      const BatchT<float> part = augment_images(full.select(keep), a, step);
      REQUIRE(part.size() == 20);
      for (std::size_t j = 0; j < keep.size(); ++j)
        for (std::size_t k = 0; k < 4; ++k) {
          CAPTURE(removed);
          CAPTURE(j);
          CHECK(part.ids[j * 4 + k] == full.ids[keep[j]]);
          CHECK(row(part, j * 4 + k) == row(all, keep[j] * 4 + k));
        }
    }
  }
}

TEST_CASE("augment: bad requests are clear errors") {
  BatchT<float> src = images(2, 1, 4, 4);
  ImageAugment a;
  a.views = 0;
  CHECK_THROWS_WITH_AS(augment_images(src, a, 0), doctest::Contains("views"), std::invalid_argument);
  a.views = 2;
  a.shift = -1;
  CHECK_THROWS_WITH_AS(augment_images(src, a, 0), doctest::Contains("shift"), std::invalid_argument);
  a.shift = 4;  // as large as the 4 x 4 images: a view could hold none of its image
  CHECK_THROWS_WITH_AS(augment_images(src, a, 0), doctest::Contains("shift 4 is not smaller than the images (4 x 4)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(check_augment(a, {60000, 1, 4, 6}), doctest::Contains("(4 x 6)"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(check_augment(a, {60000, 784}), doctest::Contains("image inputs"), std::invalid_argument);
  a.shift = 3;
  CHECK_NOTHROW(check_augment(a, {60000, 1, 4, 6}));
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
