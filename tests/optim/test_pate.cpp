// PATE's teachers (optim/pate/teachers.hpp): the partition puts one record in one part,
// whatever the other records; the votes count one per teacher; and a predicted
// class is the largest output.
#include <algorithm>
#include <set>
#include <stdexcept>
#include <vector>

#include <doctest/doctest.h>

#include "data/datasets.hpp"
#include "engine/random.hpp"
#include "layers/models.hpp"
#include "optim/pate/teachers.hpp"
#include "optim/run/private_trainer.hpp"

using namespace dpgrad;

namespace {

/// Each teacher's part as a set of record ids.
std::vector<std::set<std::int64_t>> parts_as_ids(const std::vector<std::int64_t>& ids, const HashKey& key,
                                                 std::size_t teachers) {
  std::vector<std::set<std::int64_t>> out;
  for (const auto& part : pate_partition(ids, key, teachers)) {
    std::set<std::int64_t> s;
    for (std::size_t row : part) s.insert(ids[row]);
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST_CASE("pate partition: removing or adding one record changes one teacher's part, and by that record only") {
  const HashKey key = hash_key_from_seed(3, "test");
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < 5000; ++i) ids.push_back(i * 7 + 11);
  const std::size_t teachers = 50;
  const auto full = parts_as_ids(ids, key, teachers);
  for (std::size_t drop : {std::size_t(0), std::size_t(1234), std::size_t(4999)}) {
    std::vector<std::int64_t> fewer = ids;
    fewer.erase(fewer.begin() + long(drop));
    std::reverse(fewer.begin(), fewer.end());  // order does not matter either
    const auto less = parts_as_ids(fewer, key, teachers);
    int changed = 0;
    for (std::size_t t = 0; t < teachers; ++t) {
      if (full[t] == less[t]) continue;
      ++changed;
      std::set<std::int64_t> diff;
      std::set_difference(full[t].begin(), full[t].end(), less[t].begin(), less[t].end(),
                          std::inserter(diff, diff.begin()));
      CHECK(diff == std::set<std::int64_t>{ids[drop]});
      CHECK(full[t].size() == less[t].size() + 1);
      CHECK(t == pate_teacher_of(key, ids[drop], teachers));
    }
    CHECK(changed == 1);
  }
  // every record in exactly one part; parts near n / teachers = 100 (binomial sd about 10)
  std::size_t total = 0;
  for (const auto& p : full) {
    total += p.size();
    CHECK(p.size() > 50);
    CHECK(p.size() < 150);
  }
  CHECK(total == ids.size());
  // another key, another partition
  CHECK(parts_as_ids(ids, hash_key_from_seed(4, "test"), teachers) != full);
}

TEST_CASE("pate partition: more teachers than records, repeated ids and no teachers are refused") {
  const HashKey key = hash_key_from_seed(1, "test");
  CHECK_THROWS_WITH_AS(pate_partition({1, 2, 3}, key, 4), doctest::Contains("4 teachers need at least as many records"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(pate_partition({1, 2, 2}, key, 2), doctest::Contains("appears twice"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(pate_partition({1, 2, 3}, key, 0), doctest::Contains("must be >= 1"), std::invalid_argument);
}

TEST_CASE("pate teachers: one vote per teacher per pool example, and agreeing teachers on separable data") {
  // two well separated classes: x = +-2 + noise in 4 dimensions
  FastRng data(5);
  auto make = [&](std::size_t n, std::int64_t first_id) {
    BatchT<float> b;
    b.inputs = ArrayT<float>::from_shape({n, 4});
    for (std::size_t i = 0; i < n; ++i) {
      const int y = int(i % 2);
      b.labels.push_back(y);
      b.ids.push_back(first_id + std::int64_t(i));
      for (std::size_t d = 0; d < 4; ++d) b.inputs(i, d) = float((y ? 2.0 : -2.0) + 0.5 * data.normal());
    }
    return b;
  };
  const BatchT<float> train = make(400, 0), pool = make(60, 100000);
  const auto parts = pate_partition(train.ids, hash_key_from_seed(2, "test"), 5);
  PateTraining how;
  how.make_model = [](Rng& rng) { return make_mlp<float>({4, 2}, Activation::relu, rng); };
  how.epochs = 5;
  how.batch_size = 16;
  std::vector<std::size_t> progress;
  const ArrayT<double> votes =
      pate_teacher_votes(how, train, parts, pool, 2, [&](std::size_t done, std::size_t) { progress.push_back(done); });
  REQUIRE(votes.shape()[0] == 60);
  REQUIRE(votes.shape()[1] == 2);
  CHECK(progress == std::vector<std::size_t>{1, 2, 3, 4, 5});
  std::size_t unanimous_and_right = 0;
  for (std::size_t i = 0; i < 60; ++i) {
    CHECK(votes(i, 0) + votes(i, 1) == 5.0);
    unanimous_and_right += votes(i, std::size_t(pool.labels[i])) == 5.0;
  }
  CHECK(unanimous_and_right >= 55);
  CHECK(top_classes(ArrayT<float>{{0.f, 2.f, 2.f}, {3.f, -1.f, 0.f}}) == std::vector<std::int32_t>{1, 0});
}

TEST_CASE("pate teachers: a teacher whose training diverges abstains, and the run goes on") {
  const data::DataSplit d = data::load_dataset("synthetic");
  const BatchT<float> train = d.train.select([] {
    std::vector<std::size_t> r(200);
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = i;
    return r;
  }());
  const BatchT<float> pool = d.test.select({0, 1, 2, 3, 4, 5, 6, 7});
  const auto parts = pate_partition(train.ids, hash_key_from_seed(1, "test"), 4);
  auto logreg = [](Rng& rng) { return make_mlp<float>({784, 10}, Activation::relu, rng); };
  PateTraining sane{logreg, 1, 16, 0.05, 0.9, 3};
  const ArrayT<double> votes = pate_teacher_votes(sane, train, parts, pool, 10);
  CHECK(double(xt::sum(votes)()) == 4.0 * 8);  // one vote per teacher per pool image
  PateTraining wild{logreg, 1, 16, 1e30, 0.9, 3};  // every teacher's parameters explode
  const ArrayT<double> none = pate_teacher_votes(wild, train, parts, pool, 10);
  CHECK(double(xt::sum(none)()) == 0.0);
}
