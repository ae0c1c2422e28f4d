// Dropout masks keyed per record (docs/data-privacy.md, "Dropout masks"): in a
// private run a record's mask depends on the run's key, the step, its id and the
// element alone, so adding a record to the batch leaves every other record's mask
// as it was, at that step and the next; a record's mask changes from step to
// step; the keep rate is 1 - p; and inputs that mix records are refused.
#include <cstdint>
#include <vector>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/random.hpp"
#include "layers/dropout.hpp"

using namespace dpgrad;
using A = ArrayT<double>;

namespace {

/// Records `ids`, each `views` rows of ones (rows, 6, 5): the model's output in
/// training mode is the mask itself.
BatchT<double> ones_batch(const std::vector<std::int64_t>& ids, std::size_t views = 1) {
  BatchT<double> b;
  b.views = views;
  for (auto id : ids)
    for (std::size_t v = 0; v < views; ++v) {
      b.ids.push_back(id);
      b.labels.push_back(0);
    }
  b.inputs = xt::ones<double>({b.ids.size(), std::size_t(6), std::size_t(5)});
  return b;
}

/// A model of one Dropout(p) (seed 7), as a private run would hold it.
std::unique_ptr<FeatureModelT<double>> dropout_model(double p = 0.5, int layers = 1) {
  SequentialT<double> net;
  for (int k = 0; k < layers; ++k) net.emplace<DropoutT<double>>(p, 7);
  return std::make_unique<FeatureModelT<double>>("dropout", std::move(net));
}

/// The model's output for `batch` at `step` under `key`.
A masks(FeatureModelT<double>& m, const BatchT<double>& batch, std::uint64_t step, const HashKey& key) {
  const DropoutKeyScope scope(key, step);
  return m.forward(batch).value();
}

/// Rows [first, first + n) of a (rows, ...) array.
A rows(const A& a, std::size_t first, std::size_t n) {
  return xt::view(a, xt::range(first, first + n));
}

}  // namespace

TEST_CASE("dropout keyed per record: adding a record changes no other record's mask, at this step or later") {
  const HashKey key = hash_key_from_seed(5, "test");
  const std::vector<std::int64_t> ids{3, 8, 21, 5};
  std::vector<std::int64_t> more{99};  // the added record comes first: every other one moves down a row
  more.insert(more.end(), ids.begin(), ids.end());
  for (std::size_t views : {1, 2}) {
    CAPTURE(views);
    // two runs, each with its own model, over two steps: D, then D with one record more at step 0
    auto a = dropout_model(), b = dropout_model();
    const A a0 = masks(*a, ones_batch(ids, views), 0, key), a1 = masks(*a, ones_batch(ids, views), 1, key);
    const A b0 = masks(*b, ones_batch(more, views), 0, key), b1 = masks(*b, ones_batch(ids, views), 1, key);
    const std::size_t r = ids.size() * views;
    CHECK(rows(b0, views, r) == a0);  // the same step
    CHECK(b1 == a1);                  // the next step, after a larger batch
    // and the added record at the end instead
    std::vector<std::int64_t> after = ids;
    after.push_back(99);
    CHECK(rows(masks(*b, ones_batch(after, views), 0, key), 0, r) == a0);
  }
}

TEST_CASE("dropout keyed per record: a record's mask changes with the step and the key, and two layers differ") {
  const HashKey key = hash_key_from_seed(5, "test");
  auto m = dropout_model();
  const BatchT<double> batch = ones_batch({4, 11});
  const A s0 = masks(*m, batch, 0, key), s1 = masks(*m, batch, 1, key);
  CHECK(rows(s0, 0, 1) != rows(s1, 0, 1));
  CHECK(rows(s0, 0, 1) != rows(s0, 1, 1));  // two records at one step
  CHECK(masks(*m, batch, 0, hash_key_from_seed(6, "test")) != s0);
  CHECK(masks(*m, batch, 0, key) == s0);  // repeatable: a second forward pass of the step draws the same
  // two Dropout(0.5) in a row keep an element with probability 1/4 when their masks are independent (1/2 if equal)
  auto two = dropout_model(0.5, 2);
  std::vector<std::int64_t> many;
  for (std::int64_t i = 0; i < 200; ++i) many.push_back(i);
  const A y = masks(*two, ones_batch(many), 0, key);
  const double kept = double(xt::sum(xt::not_equal(y, 0.0))()) / double(y.size());
  CHECK(kept == doctest::Approx(0.25).epsilon(0.1));
}

TEST_CASE("dropout keyed per record: the keep rate is 1 - p, the kept values 1/(1 - p)") {
  // 200 records of 30 elements at each of 4 steps: 24,000 draws. Hoeffding: the kept
  // share is within 0.015 of 1 - p but with probability 2 exp(-2 * 24000 * 0.015^2) < 3e-5
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < 200; ++i) ids.push_back(1000 + 7 * i);
  for (double p : {0.1, 0.5, 0.9}) {
    CAPTURE(p);
    auto m = dropout_model(p);
    std::size_t kept = 0, all = 0;
    bool values_ok = true;
    for (std::uint64_t step = 0; step < 4; ++step) {
      const A y = masks(*m, ones_batch(ids), step, hash_key_from_seed(8, "test"));
      for (double v : y) {
        values_ok = values_ok && (v == 0.0 || v == 1.0 / (1.0 - p));
        kept += v != 0.0;
      }
      all += y.size();
    }
    CHECK(values_ok);
    CHECK(std::abs(double(kept) / double(all) - (1 - p)) < 0.015);
  }
}

TEST_CASE("dropout keyed per record: a time-major layout is keyed by the record too; mixed inputs are refused") {
  const HashKey key = hash_key_from_seed(5, "test");
  DropoutT<double> drop(0.5);
  // (B, 6, 5) moved to (6, B, 5): the samples on axis 1
  auto time_major = [&](const BatchT<double>& b) {
    const DropoutKeyScope scope(key, 2);
    const DropoutRecords records(b);
    A y = drop.forward(transpose(per_sample_input(b.inputs), {1, 0, 2})).value();
    return A(xt::transpose(y, {1, 0, 2}));
  };
  const A small = time_major(ones_batch({3, 8})), large = time_major(ones_batch({99, 3, 8}));
  CHECK(rows(large, 1, 2) == small);
  // a sum over the batch mixes the records: no record owns the result
  const BatchT<double> b = ones_batch({3, 8});
  const DropoutKeyScope scope(key, 0);
  {
    const DropoutRecords records(b);
    CHECK_THROWS_AS(drop.forward(sum(per_sample_input(b.inputs), {0})), std::invalid_argument);
    // a constant holds no record: keyed by no record, allowed
    CHECK_NOTHROW(drop.forward(constant<double>(xt::ones<double>({4, 3}))));
  }
  // no records named by the forward pass: refused rather than drawn by position
  CHECK_THROWS_WITH_AS(drop.forward(per_sample_input(b.inputs)), doctest::Contains("DropoutRecords"),
                       std::invalid_argument);
  // a batch without ids
  BatchT<double> no_ids = b;
  no_ids.ids.clear();
  const DropoutRecords records(no_ids);
  CHECK_THROWS_WITH_AS(drop.forward(per_sample_input(b.inputs)), doctest::Contains("Batch::ids"),
                       std::invalid_argument);
}

TEST_CASE("dropout outside a private run: masks from the layer's seed, a fresh one per call") {
  auto a = dropout_model(), b = dropout_model();
  const BatchT<double> batch = ones_batch({1, 2, 3});
  const A first = a->forward(batch).value();
  CHECK(b->forward(batch).value() == first);  // the same seed
  CHECK(a->forward(batch).value() != first);  // the stream moves on
  a->set_training(false);
  CHECK(a->forward(batch).value() == batch.inputs);
}
