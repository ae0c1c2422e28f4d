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
#include "layers/registry.hpp"
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
  CHECK(checked == 20);  // 5 records at each of 4 scales
  t.step();
  CHECK(records - checked == calls - checked);  // one call a record
}

// ---- round 4: every strategy that batches examples is checked, per record and by the neighbour test

namespace {

/// Dense(3) on tanh(x) scaled by a hidden function of the batch's size: cos(2 pi B / 3),
/// the same at B = 1 and 4 (the sizes the check compared before round 4), 1 at B = 3.
class SizeScaled final : public ModelT<double> {
 public:
  explicit SizeScaled(Rng& rng) : dense_(6, 3, rng, "dense") {}
  D forward(const BatchT<double>& b) override {
    const double s = std::cos(2 * 3.141592653589793 * double(b.examples()) / 3);
    return scale(dense_.forward(tanh(per_sample_input(b.inputs))), s);
  }
  std::vector<D> parameters() const override { return dense_.parameters(); }
  std::string name() const override { return "size-scaled"; }

 private:
  DenseT<double> dense_;
};

/// Dense(3) on tanh(x), less the batch's mean of the features whose magnitude
/// passes 10 (hidden from the engine): mixing that standard normal records never show.
class LargeMixing final : public ModelT<double> {
 public:
  explicit LargeMixing(Rng& rng) : dense_(6, 3, rng, "dense") {}
  D forward(const BatchT<double>& b) override {
    ArrayT<double> big = xt::where(xt::abs(b.inputs) > 10.0, b.inputs, 0.0);
    return dense_.forward(tanh(sub(per_sample_input(b.inputs), constant(column_means(big)))));
  }
  std::vector<D> parameters() const override { return dense_.parameters(); }
  std::string name() const override { return "large-mixing"; }

 private:
  DenseT<double> dense_;
};

/// Two dense layers on x less the batch's hidden mean: per-layer clipping sees two layers.
class TwoLayerCentred final : public ModelT<double> {
 public:
  explicit TwoLayerCentred(Rng& rng) : a_(6, 4, rng, "a"), b_(4, 3, rng, "b") {}
  D forward(const BatchT<double>& b) override {
    return b_.forward(tanh(a_.forward(sub(per_sample_input(b.inputs), constant(column_means(b.inputs))))));
  }
  std::vector<D> parameters() const override {
    auto p = a_.parameters();
    for (const auto& q : b_.parameters()) p.push_back(q);
    return p;
  }
  std::string name() const override { return "two-layer-centred"; }

 private:
  DenseT<double> a_, b_;
};

// (microbatch:M runs each group on its own: mixing inside a group is what its sensitivity 2C covers)
const std::vector<std::string> kBatchingStrategies{"vanilla",        "ghost",          "jl:3",
                                                   "ghost+layers",   "vanilla+layers", "ghost+layers:size",
                                                   "ghost+layers:adaptive"};

}  // namespace

TEST_CASE("structural self-check: every strategy that batches examples is checked, per-layer ones too (before: "
          "ghost+layers trained a hidden batch mean, 5.4 C)") {
  FastRng init(21);
  TwoLayerCentred hidden(init);
  const BatchT<double> like = rows(10, init);
  for (const std::string& name : kBatchingStrategies) {
    CAPTURE(name);
    auto s = make_clip_strategy<double>(name, 10);
    test::check_error<std::invalid_argument>([&] { structural_self_check<double>(hidden, *s, like, {}); },
                                             {"structural self-check", name, "naive"});
  }
  // the header says what ran, and "passed" only for what did
  auto mlp = make_mlp<double>({6, 4, 3}, Activation::tanh, init);
  for (const std::string& name : {std::string("ghost+layers"), std::string("jl:2"), std::string("ghost")}) {
    const SelfCheckReport r = structural_self_check<double>(*mlp, *make_clip_strategy<double>(name, 10), like, {});
    CHECK(r.str().find("per-record gradients") != std::string::npos);
    CHECK((r.str().find("per-layer norms") != std::string::npos) == (name == "ghost+layers"));  // only what ran
    CHECK(r.str().find("neighbour test") != std::string::npos);
    CHECK(r.str().find("passed") != std::string::npos);
  }
  const SelfCheckReport naive = structural_self_check<double>(*mlp, *make_clip_strategy<double>("naive"), like, {});
  CHECK(naive.str().find("per-record") == std::string::npos);  // naive runs each example alone: only the neighbour test
  CHECK(naive.str().find("neighbour test") != std::string::npos);
  // a per-layer strategy in a private run refuses too
  SgdT<double> sgd(hidden.parameters(), 0.1);
  const BatchT<double> train = rows(100, init);
  test::check_error<std::invalid_argument>(
      [&] { PrivateTrainerT<double> t(hidden, sgd, train, config(clipping::ghost<double>())); },
      {"structural self-check", "ghost"});
  auto c = config(nullptr);
  c.clipping = std::shared_ptr<ClipStrategyT<double>>(make_clip_strategy<double>("vanilla+layers:size"));
  test::check_error<std::invalid_argument>([&] { PrivateTrainerT<double> t(hidden, sgd, train, c); },
                                           {"structural self-check", "vanilla+layers:size"});
}

TEST_CASE("structural self-check: a function of the batch size equal at sizes 1 and 4 is refused; naive runs") {
  FastRng init(22);
  SizeScaled model(init);
  const BatchT<double> like = rows(10, init);
  for (const std::string& name : kBatchingStrategies) {
    CAPTURE(name);
    auto s = make_clip_strategy<double>(name, 10);
    test::check_error<std::invalid_argument>([&] { structural_self_check<double>(model, *s, like, {}); },
                                             {"structural self-check", name});
  }
  CHECK_NOTHROW(structural_self_check<double>(model, *make_clip_strategy<double>("naive"), like, {}));
}

TEST_CASE("structural self-check: mixing that only large features show is caught at the larger scales") {
  FastRng init(23);
  LargeMixing model(init);
  const BatchT<double> like = rows(10, init);
  // standard normal records alone would not show it: the hidden mean is 0 unless |x| > 10
  FastRng r(3);
  BatchT<double> normal = synthetic_records(like, 5, 3, r);
  normal.inputs = xt::clip(normal.inputs, -3.0, 3.0);
  auto ghost = make_clip_strategy<double>("ghost");
  const NeighbourMove quiet = neighbour_test(model, *ghost, normal, {0, 2, 4}, 1.0, 7);
  CHECK(quiet.excess < 1e-9);
  for (const std::string& name : {std::string("ghost"), std::string("vanilla"), std::string("jl:4")}) {
    CAPTURE(name);
    auto s = make_clip_strategy<double>(name, 10);
    test::check_error<std::invalid_argument>([&] { structural_self_check<double>(model, *s, like, {}); },
                                             {"structural self-check", name});
  }
}

TEST_CASE("neighbour test: every registered model under every strategy moves the clipped sum by at most its "
          "sensitivity, and leaves the other records' contributions alone") {
  FastRng init(24);
  for (const ModelEntry& entry : model_registry()) {
    ModelSpec spec;
    spec.length = 6;
    spec.classes = 3;
    spec.hidden = 16;
    BatchT<float> like;
    if (entry.input == ModelInput::tokens) {
      like.tokens = xt::zeros<std::int32_t>({std::size_t(1), spec.length});
      like.lengths = {1};
    } else if (entry.input == ModelInput::scattering) {
      like.inputs = xt::zeros<float>({std::size_t(1), std::size_t(7), std::size_t(7), std::size_t(81)});
    } else {
      like.inputs = xt::zeros<float>({std::size_t(1), std::size_t(1), std::size_t(28), std::size_t(28)});
    }
    like.labels = {0};
    like.ids = {0};
    auto model = build_model<float>(entry.name, spec, init);
    FastRng r(25);
    const BatchT<float> records = synthetic_records(like, 5, spec.classes, r);
    for (const std::string& name : {"naive", "vanilla", "ghost", "jl:2", "microbatch:2", "ghost+layers",
                                    "vanilla+layers:size", "naive+layers"}) {
      CAPTURE(entry.name);
      CAPTURE(name);
      // cnn17m is cnn26k's layers with a wider dense one: ghost alone there (17M gradients per record are slow)
      if (std::string(entry.name) == "cnn17m" && std::string(name) != "ghost") continue;
      auto s = make_clip_strategy<float>(name, 4);
      const NeighbourMove m = neighbour_test(*model, *s, records, {0, 2, 4}, 0.5, 26);
      if (s->jl_dim() == 0 || !s->per_example_contributions()) CHECK(m.moved <= s->sensitivity() * (1 + 1e-3));
      if (s->per_example_contributions()) CHECK(m.excess <= 5e-3);
    }
  }
  // and the test can fail: a model that reads the batch's size moves the others
  FastRng i2(27);
  SizeScaled sized(i2);
  FastRng r(28);
  const BatchT<double> records = synthetic_records(rows(3, r), 3, 3, r);  // sizes 3, 2 and 1: s = 1, -1/2, -1/2
  const NeighbourMove m = neighbour_test(sized, *make_clip_strategy<double>("ghost"), records, {0, 1, 2}, 0.1, 29);
  CHECK(m.excess > 1);
  const NeighbourMove alone = neighbour_test(sized, *make_clip_strategy<double>("naive"), records, {0, 1, 2}, 0.1, 29);
  CHECK(alone.excess < 1e-9);
  CHECK(alone.moved <= 1 + 1e-9);
}

TEST_CASE("attacks of round 4, measured: how far one added record moves the clipped sum when the strategy runs "
          "unchecked, and the self-check's verdict (run with -s to see the figures)") {
  FastRng init(30);
  TwoLayerCentred centred(init);
  SizeScaled sized(init);
  LargeMixing large(init);
  const BatchT<double> like = rows(10, init);
  struct Attack {
    const char* what;
    ModelT<double>* model;
    double scale;
  };
  for (const Attack& a : {Attack{"hidden batch mean", &centred, 1.0}, Attack{"cos(2 pi B / 3) scaling", &sized, 1.0},
                          Attack{"mean of |x| > 10 features", &large, 1e3}}) {
    for (const std::string& name : {"ghost", "ghost+layers", "vanilla+layers:size", "jl:4", "naive"}) {
      FastRng r(31);
      BatchT<double> records = synthetic_records(like, 3, 3, r);
      records.inputs *= a.scale;
      auto s = make_clip_strategy<double>(name, 10);
      const NeighbourMove m = neighbour_test(*a.model, *s, records, {0, 1, 2}, 0.1, 32);
      bool refused = false;
      try {
        structural_self_check<double>(*a.model, *s, like, {});
      } catch (const std::invalid_argument&) {
        refused = true;
      }
      MESSAGE(std::string(a.what) << ", " << name << ": one record moves the clipped sum by " << m.moved << " C, the others' by "
                     << m.excess << " C; self-check: " << std::string(refused ? "refused" : "passed"));
      // every strategy that batches examples refuses; naive (each example alone) stays within 1 C and passes
      CHECK(refused == !s->runs_examples_alone());
      if (s->runs_examples_alone()) CHECK(m.moved <= 1 + 1e-9);
    }
  }
}

TEST_CASE("a batch of one example with several views: every strategy clips it as the per-example loop does (the "
          "reshape of its rows alone took the views for samples, and a private step on it stopped the run)") {
  FastRng init(33);
  auto model = make_mlp<double>({6, 4, 3}, Activation::tanh, init);
  BatchT<double> one = rows(3, init);  // three rows: one example's three views
  one.views = 3;
  one.ids = {7, 7, 7};
  FastRng r1(1);
  const ClipResult<double> want = make_clip_strategy<double>("naive")->clipped_sum(*model, one, 0.5, r1);
  for (const std::string& name : {"vanilla", "ghost", "ghost+layers", "jl:3"}) {
    CAPTURE(name);
    FastRng r(1);
    const ClipResult<double> got = make_clip_strategy<double>(name)->clipped_sum(*model, one, 0.5, r);
    REQUIRE(got.norms.size() == 1);
    if (name != "jl:3") CHECK(got.norms(0) == doctest::Approx(want.norms(0)).epsilon(1e-10));
  }
}
