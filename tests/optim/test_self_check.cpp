// Models that mix samples are refused by every strategy that trusts the batch:
// jl:K through the tracked per-sample axis, and vanilla, ghost and jl:K through
// the trainer's structural self-check on synthetic records, which catches mixing
// the engine cannot see (a constant built from the batch). The transform sees one
// record at a time.
#include <cmath>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/random.hpp"
#include "layers/dense.hpp"
#include "layers/models.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/run/private_trainer.hpp"
#include "support/batches.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;

namespace {

/// The mean of each column of x (B, d): (1, d).
ArrayT<double> column_means(const ArrayT<double>& x) {
  ArrayT<double> m = xt::zeros<double>({std::size_t(1), x.shape()[1]});
  for (std::size_t i = 0; i < x.shape()[0]; ++i)
    for (std::size_t k = 0; k < x.shape()[1]; ++k) m(0, k) += x(i, k) / double(x.shape()[0]);
  return m;
}

/// x (B, 6) less the batch's mean, then Dense(3): `seen` on the tape (mean over
/// axis 0), or `hidden` from it (the mean taken from the values, a constant).
enum class Centring { none, seen, hidden };
class Centred final : public ModelT<double> {
 public:
  Centred(Rng& rng, Centring how) : how_(how), dense_(6, 3, rng, "dense") {}
  D forward(const BatchT<double>& b) override {
    D x = per_sample_input(b.inputs);
    if (how_ == Centring::seen) x = sub(x, mean(x, {0}, true));
    if (how_ == Centring::hidden) x = sub(x, constant(column_means(b.inputs)));
    return dense_.forward(tanh(x));
  }
  std::vector<D> parameters() const override { return dense_.parameters(); }
  std::string name() const override { return "centred"; }

 private:
  Centring how_;
  DenseT<double> dense_;
};

BatchT<double> rows(std::size_t n, Rng& rng) {
  BatchT<double> b;
  b.inputs = randn<double>({n, 6}, rng);
  for (std::size_t i = 0; i < n; ++i) {
    b.labels.push_back(std::int32_t(rng.below(3)));
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

PrivateTrainingConfigT<double> config(std::shared_ptr<ClipStrategyT<double>> s) {
  PrivateTrainingConfigT<double> c;
  c.noise_multiplier = 1.0;
  c.batch_size = 10;
  c.delta = 1e-3;
  c.clipping = std::move(s);
  c.reproducible_noise = true;
  return c;
}

}  // namespace

TEST_CASE("jl:K refuses a model that takes statistics over the batch (before: the noised sum moved by 12.7 C)") {
  FastRng init(1), data(2);
  Centred mixing(init, Centring::seen), plain(init, Centring::none);
  BatchT<double> batch = rows(51, data);
  for (auto& v : xt::view(batch.inputs, 50, xt::all())) v *= 100;  // 50 records and one outlier
  ReproducibleRng dirs(3);
  test::check_error<std::invalid_argument>(
      [&] { make_clip_strategy<double>("jl:4")->clipped_sum(mixing, batch, 1.0, dirs); },
      {"mixes samples", "naive"});
  CHECK_NOTHROW(make_clip_strategy<double>("jl:4")->clipped_sum(plain, batch, 1.0, dirs));
  // the projections themselves, too
  std::vector<ArrayT<double>> v;
  for (const auto& p : mixing.parameters()) {
    Shape s{2};
    for (auto d : p.value().shape()) s.push_back(d);
    v.push_back(randn<double>(s, dirs));
  }
  CHECK_THROWS_AS(jl_projections(mixing, batch, v), std::invalid_argument);
  CHECK(shape_of(jl_projections(plain, batch, v)) == Shape{2, 51});
  // and so does a private run with jl:4
  SgdT<double> sgd(mixing.parameters(), 0.1);
  const BatchT<double> train = rows(100, data);
  test::check_error<std::invalid_argument>(
      [&] { PrivateTrainerT<double> t(mixing, sgd, train, config(clipping::jl<double>(4))); }, {"mixes samples"});
}

TEST_CASE("structural self-check: mixing hidden from the engine is refused by vanilla, ghost and jl:K; naive runs") {
  FastRng init(4), data(5);
  Centred hidden(init, Centring::hidden), plain(init, Centring::none);
  const BatchT<double> train = rows(100, data);
  // the engine sees nothing: a constant holds no samples, so the rules alone would train on it
  FastRng any(6);
  CHECK_NOTHROW(make_clip_strategy<double>("ghost")->clipped_sum(hidden, train, 1.0, any));
  for (auto strategy : {clipping::vanilla<double>(), clipping::ghost<double>(), clipping::jl<double>(3)}) {
    CAPTURE(strategy->name());
    SgdT<double> sgd(hidden.parameters(), 0.1);
    test::check_error<std::invalid_argument>(
        [&] { PrivateTrainerT<double> t(hidden, sgd, train, config(strategy)); },
        {"structural self-check", strategy->name(), "synthetic record", "naive"});
    SgdT<double> plain_sgd(plain.parameters(), 0.1);
    PrivateTrainerT<double> ok(plain, plain_sgd, train, config(strategy));
    CHECK(ok.self_check_seconds() >= 0);
    ok.step();
  }
  for (auto strategy : {clipping::naive<double>(), clipping::microbatch<double>(2, 10)}) {
    SgdT<double> sgd(hidden.parameters(), 0.1);
    PrivateTrainerT<double> t(hidden, sgd, train, config(strategy));  // each example (or group) alone: nothing shared
    t.step();
  }
}

TEST_CASE("structural self-check: the synthetic records copy the training data's layout, never its values") {
  FastRng data(7);
  BatchT<double> a = rows(5, data), b = rows(5, data);
  b.inputs *= 1000.0;
  FastRng r1(8), r2(8);
  const BatchT<double> x = synthetic_records(a, 3, 4, r1), y = synthetic_records(b, 3, 4, r2);
  CHECK(shape_of(x.inputs) == Shape{3, 6});
  CHECK(x.inputs == y.inputs);
  CHECK(x.labels == y.labels);
  for (auto l : x.labels) CHECK((l >= 0 && l < 4));
  // tokens: ids 0 or 1 up to a random length, the sequences' padded length kept
  BatchT<double> text;
  text.tokens = xt::zeros<std::int32_t>({2, 9});
  text.tokens(0, 0) = 8000;
  text.lengths = {1, 9};
  text.labels = {0, 1};
  FastRng r3(9);
  const BatchT<double> t = synthetic_records(text, 4, 2, r3);
  CHECK(shape_of(t.tokens) == Shape{4, 9});
  CHECK(t.lengths.size() == 4);
  for (auto v : t.tokens) CHECK((v == 0 || v == 1));
}

TEST_CASE("private trainer: the transform sees one record at a time") {
  FastRng init(10), data(11);
  auto model = make_mlp<double>({6, 3}, Activation::tanh, init);
  SgdT<double> sgd(model->parameters(), 0.1);
  const BatchT<double> train = rows(200, data);
  auto c = config(clipping::ghost<double>());
  c.batch_size = 40;
  std::size_t calls = 0, records = 0;
  c.transform = [&](const BatchT<double>& b, long) {
    ++calls;
    records += b.examples();
    CHECK(b.examples() <= 1);
    BatchT<double> r = b;  // a transform that would centre on the batch's mean: alone, a record is its own mean
    r.inputs = b.inputs - column_means(b.inputs);
    return r;
  };
  PrivateTrainerT<double> t(*model, sgd, train, c);
  const std::size_t checked = calls;  // the self-check's synthetic records
  CHECK(checked == 4);
  t.step();
  CHECK(records - checked == calls - checked);  // one call a record
}
