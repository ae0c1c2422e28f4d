// A record whose loss or gradient is not finite (a model that divides by the
// record's own norm, given an all-zero record) adds nothing to the clipped sum,
// counts as clipped, and leaves the other records' contributions as they are
// without it, in every private strategy; a run over data holding one finishes
// with the epsilon of the same run without it (docs/math.md section 1).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/random.hpp"
#include "layers/models.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/run/private_trainer.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;

namespace {

/// logits = (x / ||x||) W + b: an all-zero record gives 0 / 0, a NaN loss. x (B, 4).
class NormalisedLinear final : public ModelT<double> {
 public:
  explicit NormalisedLinear(Rng& rng)
      : w_(make_parameter<double>("lin.w", randn<double>({4, 3}, rng, 0.5))),
        b_(make_parameter<double>("lin.b", randn<double>({3}, rng, 0.5))),
        v_(make_parameter<double>("out.w", randn<double>({3, 3}, rng, 0.5))) {}
  D forward(const BatchT<double>& b) override {
    const D x = per_sample_input(b.inputs);
    const D h = div(x, sqrt(sum(mul(x, x), {1}, true)));
    return linear(tanh(linear(h, w_, b_)), v_);
  }
  std::vector<D> parameters() const override { return {w_, b_, v_}; }
  std::string name() const override { return "normalised"; }

 private:
  D w_, b_, v_;
};

/// logits = z + ||z||, z = x W: an all-zero record has a finite loss (log 3) but
/// the derivative of ||z|| at z = 0 is 0 / 0: a NaN gradient. x (B, 4).
class NormPlusLinear final : public ModelT<double> {
 public:
  explicit NormPlusLinear(Rng& rng) : w_(make_parameter<double>("lin.w", randn<double>({4, 3}, rng, 0.5))) {}
  D forward(const BatchT<double>& b) override {
    const D z = linear(per_sample_input(b.inputs), w_);
    return add(z, sqrt(sum(mul(z, z), {1}, true)));
  }
  std::vector<D> parameters() const override { return {w_}; }
  std::string name() const override { return "norm-plus"; }

 private:
  D w_;
};

/// n records of 4 features, labels in [0, 3), ids 0, 1, ...; record `zero` (if < n) all zero.
BatchT<double> records(std::size_t n, Rng& rng, std::size_t zero = std::size_t(-1)) {
  BatchT<double> b;
  b.inputs = randn<double>({n, 4}, rng);
  for (std::size_t i = 0; i < n; ++i) {
    b.labels.push_back(std::int32_t(rng.below(3)));
    b.ids.push_back(std::int64_t(i));
  }
  if (zero < n)
    for (std::size_t k = 0; k < 4; ++k) b.inputs(zero, k) = 0;
  return b;
}

bool all_finite(const std::vector<ArrayT<double>>& sum) {
  for (const auto& a : sum)
    for (const double v : a)
      if (!std::isfinite(v)) return false;
  return true;
}

double distance(const std::vector<ArrayT<double>>& a, const std::vector<ArrayT<double>>& b) {
  double s = 0;
  for (std::size_t j = 0; j < a.size(); ++j) s += double(xt::sum((a[j] - b[j]) * (a[j] - b[j]))());
  return std::sqrt(s);
}

double norm(const std::vector<ArrayT<double>>& a) {
  double s = 0;
  for (const auto& x : a) s += double(xt::sum(x * x)());
  return std::sqrt(s);
}

template <class Model>
void check_record_adds_nothing(const std::string& what) {
  FastRng init(3), data(4);
  Model model(init);
  const std::size_t bad = 2;
  const BatchT<double> batch = records(6, data, bad);
  const BatchT<double> without = batch.select({0, 1, 3, 4, 5});
  const double clip = 0.05;  // some records clipped, some not
  for (const std::string s : {"naive", "vanilla", "ghost", "jl:2", "microbatch:1", "naive+layers", "vanilla+layers",
                              "ghost+layers:size"}) {
    CAPTURE(what);
    CAPTURE(s);
    FastRng rng(7), rng_without(7);  // jl:2 draws the same directions for both
    ClipResult<double> got, ref;
    REQUIRE_NOTHROW(got = make_clip_strategy<double>(s, 6)->clipped_sum(model, batch, clip, rng));
    ref = make_clip_strategy<double>(s, 6)->clipped_sum(model, without, clip, rng_without);
    CHECK(all_finite(got.sum));
    const double d = distance(got.sum, ref.sum), scale = norm(ref.sum);
    CAPTURE(d);
    CHECK(d <= 1e-9 * scale + 1e-12);
    CHECK(got.clipped == ref.clipped + 1);  // the record counts as clipped
    CHECK(std::isfinite(got.loss_sum));
    CHECK(got.loss_sum == doctest::Approx(ref.loss_sum).epsilon(1e-9));  // its loss is not in the sum
    REQUIRE(got.norms.size() == 6);
    CHECK(double(got.norms(bad)) == std::numeric_limits<double>::infinity());  // above every C: clipped
    for (std::size_t i = 0, j = 0; i < 6; ++i)
      if (i != bad) CHECK(double(got.norms(i)) == doctest::Approx(double(ref.norms(j++))).epsilon(1e-9));
  }
  // microbatch:2: the bad record's microbatch adds nothing, the others as without it
  FastRng rng(7), rng_without(7);
  const auto got = make_clip_strategy<double>("microbatch:2", 6)->clipped_sum(model, batch, clip, rng);
  const auto ref = make_clip_strategy<double>("microbatch:2", 6)->clipped_sum(model, without, clip, rng_without);
  CHECK(all_finite(got.sum));
  std::size_t infinite = 0;
  for (const double n : got.norms) infinite += n == std::numeric_limits<double>::infinity();
  CHECK(infinite == 1);
  CHECK(distance(got.sum, ref.sum) <= clip * (1 + 1e-9));  // at most the bad microbatch's partners' clipped mean
}

}  // namespace

TEST_CASE("non-finite records: a record with a NaN loss adds nothing and leaves the others' clipped sum as without it") {
  check_record_adds_nothing<NormalisedLinear>("NaN loss");
}

TEST_CASE("non-finite records: a record with a finite loss and a NaN gradient adds nothing either") {
  check_record_adds_nothing<NormPlusLinear>("NaN gradient");
}

TEST_CASE("non-finite records: a run over data holding one finishes with the epsilon of the same run without it") {
  const std::size_t n = 40, bad = 7;
  for (const std::string s : {"naive", "vanilla", "ghost", "jl:2", "microbatch:2"}) {
    CAPTURE(s);
    double epsilon[2] = {0, 0};
    for (int with_bad = 0; with_bad < 2; ++with_bad) {
      FastRng init(11), data(12);
      NormalisedLinear model(init);
      const BatchT<double> train = records(n, data, with_bad ? bad : n);
      SgdT<double> sgd(model.parameters(), 0.1);
      PrivateTrainingConfigT<double> c;
      c.noise_multiplier = 4.0;
      c.delta = 1e-2;  // jl:2 proves a finite epsilon at this delta (its chi-square factor's tail)
      c.batch_size = 20;
      c.epochs = 2;  // 4 steps at q = 0.5: the record is drawn (this seed: the test fails without the fix)
      c.clip_norm = 0.1;
      c.clipping = make_clip_strategy<double>(s, 20);
      c.reproducible_noise = true;
      c.seed = 5;
      PrivateTrainerT<double> t(model, sgd, train, c);
      TrainResult r;
      REQUIRE_NOTHROW(r = t.train());
      CHECK(r.status == RunStatus::complete);
      CHECK(r.steps == t.total_steps());
      for (const auto& p : model.parameters()) CHECK(all_finite({p.value()}));
      epsilon[with_bad] = r.epsilon;
    }
    CHECK(epsilon[1] == epsilon[0]);
  }
}
