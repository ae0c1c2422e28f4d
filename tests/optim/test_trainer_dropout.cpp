// Dropout in PrivateTrainer runs (docs/data-privacy.md, "Dropout masks"): each
// record's mask at a step is the same whether or not another record is in the
// data set (naive and ghost), a resumed run draws the masks an uninterrupted one
// draws, and a secure run's dropout key is saved with the checkpoint and used
// again on resume. And the sum of clipped gradients moves by at most C when a
// record is added, at its step, and not at all at the steps after.
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "layers/dense.hpp"
#include "layers/dropout.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/sampling/sampler.hpp"
#include "optim/run/private_trainer.hpp"
#include "support/batches.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;

namespace {

using Masks = std::map<std::pair<long, std::int64_t>, std::vector<bool>>;  // (step, record id) -> kept elements

/// (B, 8) -> Dense(8, 16) -> Dropout(0.5) -> Dense(16, 3), recording in training
/// mode which elements each row's dropout kept, by record id.
class Recorder final : public ModelT<double> {
 public:
  explicit Recorder(std::uint64_t seed) : init_(seed), d1_(8, 16, init_, "d1"), d2_(16, 3, init_, "d2"), drop_(0.5) {}
  TensorT<double> forward(const BatchT<double>& b) override {
    const DropoutRecords records(b);
    const TensorT<double> h = d1_.forward(per_sample_input(b.inputs));  // (B, 16)
    const TensorT<double> dropped = drop_.forward(h);
    if (this->training())
      for (std::size_t r = 0; r < b.size(); ++r) {
        std::vector<bool> kept;
        for (std::size_t j = 0; j < 16; ++j) kept.push_back(dropped.value()(r, j) != 0.0);
        seen.emplace_back(b.ids[r], std::move(kept));
      }
    return d2_.forward(dropped);
  }
  std::vector<TensorT<double>> parameters() const override {
    auto p = d1_.parameters();
    for (const auto& q : d2_.parameters()) p.push_back(q);
    return p;
  }
  void set_training(bool on) override {
    this->training_ = on;
    drop_.set_training(on);
  }
  std::string name() const override { return "recorder"; }
  std::vector<std::pair<std::int64_t, std::vector<bool>>> seen;

 private:
  FastRng init_;
  DenseT<double> d1_, d2_;
  DropoutT<double> drop_;
};

/// n records of 8 features with ids first_id, first_id + 1, ...; labels in [0, 3).
BatchT<double> records(std::size_t n, std::int64_t first_id, std::uint64_t seed) {
  FastRng rng(seed);
  BatchT<double> b;
  b.inputs = test::randn<double>({n, 8}, rng);
  for (std::size_t i = 0; i < n; ++i) {
    b.labels.push_back(std::int32_t(rng.below(3)));
    b.ids.push_back(first_id + std::int64_t(i));
  }
  return b;
}

PrivateTrainingConfigT<double> small_run() {
  PrivateTrainingConfigT<double> c;
  c.noise_multiplier = 1.0;
  c.batch_size = 30;
  c.epochs = 2;
  c.accounting = Accounting::rdp;  // quick to set up: these runs are about masks, not epsilon
  return c;
}

/// One step of `t`, its masks added to `out` (a record seen twice in a step must get one mask).
void step_recording(PrivateTrainerT<double>& t, Recorder& m, Masks& out) {
  const long step = t.steps_done();
  m.seen.clear();
  t.step();
  for (auto& [id, kept] : m.seen) {
    const auto [it, fresh] = out.emplace(std::make_pair(step, id), kept);
    if (!fresh) CHECK(it->second == kept);
  }
}

/// The mask of record `id` at `step` under `key`, as the first dropout of a forward pass draws it.
std::vector<bool> expected(const HashKey& key, long step, std::int64_t id) {
  const std::vector<std::int64_t> ids{id};
  const DropoutKeyScope scope(key, std::uint64_t(step));
  const DropoutRecords named(ids, 1);
  DropoutT<double> drop(0.5);
  const ArrayT<double> y = drop.forward(per_sample_input<double>(xt::ones<double>({1, 16}))).value();
  std::vector<bool> kept;
  for (double v : y) kept.push_back(v != 0.0);
  return kept;
}

/// The dropout key in the latest checkpoint of `dir` (state.json, "keys").
HashKey saved_dropout_key(const std::filesystem::path& dir) {
  std::ifstream latest(dir / "latest");
  std::string name;
  latest >> name;
  std::ifstream in(dir / name / "state.json");
  const nlohmann::json state = nlohmann::json::parse(in);
  REQUIRE(state.contains("keys"));
  const std::string hex = state["keys"].at("dropout").get<std::string>();
  REQUIRE(hex.size() == 32);
  HashKey k{};
  for (std::size_t i = 0; i < k.size(); ++i)
    k[i] = static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return k;
}

}  // namespace

TEST_CASE("trainer dropout: a record's masks do not depend on whether another record is in the data set") {
  const BatchT<double> d = records(60, 0, 1);
  // D' = D with one record more, placed first: every record of D moves down a row
  BatchT<double> d_more = concat_batches<double>({records(1, 1000, 2), d});
  for (const char* strategy : {"naive", "ghost"}) {
    CAPTURE(strategy);
    auto run = [&](const BatchT<double>& data) {
      Recorder m(3);
      SgdT<double> sgd(m.parameters(), 0.1);
      PrivateTrainingConfigT<double> c = small_run();
      c.clipping = std::string(strategy) == "naive" ? clipping::naive<double>() : clipping::ghost<double>();
      c.reproducible_noise = true;  // the same seed: the same dropout key in both runs
      c.seed = 5;
      PrivateTrainerT<double> t(m, sgd, data, c);
      Masks masks;
      for (int s = 0; s < 3; ++s) step_recording(t, m, masks);
      return masks;
    };
    const Masks a = run(d), b = run(d_more);
    std::size_t common = 0, differ = 0;
    for (const auto& [at, kept] : a)
      if (const auto it = b.find(at); it != b.end()) {
        ++common;
        differ += it->second != kept;
      }
    CHECK(common >= 10);  // records both runs sampled at the same step
    CHECK(differ == 0);
  }
}

TEST_CASE("trainer dropout: a resumed run draws the masks an uninterrupted one draws") {
  const BatchT<double> train = records(90, 0, 4);
  test::TempDir dir("dpgrad-trainer-dropout");
  PrivateTrainingConfigT<double> c = small_run();
  c.reproducible_noise = true;
  c.seed = 9;
  auto model = [](std::uint64_t seed) {
    FastRng init(seed);
    SequentialT<double> net;
    net.emplace<DenseT<double>>(8, 16, init, "d1");
    net.emplace<ActivationT<double>>(Activation::tanh);
    net.emplace<DropoutT<double>>(0.3, 1);
    net.emplace<DenseT<double>>(16, 3, init, "d2");
    return std::make_unique<FeatureModelT<double>>("mlp-dropout", std::move(net));
  };
  auto whole = model(7);
  {
    SgdT<double> sgd(whole->parameters(), 0.2, 0.9);
    PrivateTrainerT<double> t(*whole, sgd, train, c);
    t.train();
  }
  {
    auto first = model(7);
    SgdT<double> sgd(first->parameters(), 0.2, 0.9);
    PrivateTrainerT<double> t(*first, sgd, train, c);
    for (int i = 0; i < 3; ++i) t.step();
    t.save(dir.path);
  }
  auto again = model(99);  // a new process: other parameters, and its dropout layer's own stream from the start
  SgdT<double> sgd(again->parameters(), 0.2, 0.9);
  PrivateTrainerT<double> t(*again, sgd, train, c, dir.path);
  CHECK(t.steps_done() == 3);
  t.train();
  const auto a = whole->parameters(), b = again->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(a[i].value() == b[i].value(), a[i].name());
}

TEST_CASE("trainer dropout: a secure run's key is saved with the checkpoint and keys the masks after resuming") {
  const BatchT<double> train = records(60, 500, 6);
  test::TempDir dir("dpgrad-trainer-dropout");
  const PrivateTrainingConfigT<double> c = small_run();  // secure generators: a key from the operating system
  Masks before, after;
  {
    Recorder m(3);
    SgdT<double> sgd(m.parameters(), 0.1);
    PrivateTrainerT<double> t(m, sgd, train, c);
    REQUIRE(t.is_private());
    for (int s = 0; s < 2; ++s) step_recording(t, m, before);
    t.save(dir.path);
  }
  const HashKey key = saved_dropout_key(dir.path);
  {
    Recorder m(4);
    SgdT<double> sgd(m.parameters(), 0.1);
    PrivateTrainerT<double> t(m, sgd, train, c, dir.path);
    REQUIRE(t.steps_done() == 2);
    for (int s = 0; s < 2; ++s) step_recording(t, m, after);
  }
  REQUIRE(!before.empty());
  REQUIRE(!after.empty());
  for (const Masks* masks : {&before, &after})
    for (const auto& [at, kept] : *masks) CHECK(kept == expected(key, at.first, at.second));
  for (const auto& [at, kept] : after) CHECK(at.first >= 2);
}

TEST_CASE("trainer dropout: an added record moves the clipped sum by at most C at its step, and not at all later") {
  const BatchT<double> d = records(12, 0, 7), extra = records(1, 1000, 8);
  auto model = [] {
    FastRng init(3);
    SequentialT<double> net;
    net.emplace<DenseT<double>>(8, 16, init, "d1");
    net.emplace<ActivationT<double>>(Activation::tanh);
    net.emplace<DropoutT<double>>(0.5, 1);
    net.emplace<DenseT<double>>(16, 3, init, "d2");
    return std::make_unique<FeatureModelT<double>>("mlp-dropout", std::move(net));
  };
  const HashKey key = hash_key_from_seed(2, "test");
  for (const char* name : {"naive", "ghost"}) {
    CAPTURE(name);
    const auto strategy = make_clip_strategy<double>(name);
    auto a = model(), b = model();  // the same parameters throughout: only the masks can differ
    FastRng rng(1);
    for (std::uint64_t t = 0; t < 3; ++t) {
      const BatchT<double> batch = d.select({t, t + 1, t + 2, t + 4, t + 6, t + 9});
      // at step 0 run b also holds the added record, first: every other record is a row further down
      const BatchT<double> with = t == 0 ? concat_batches<double>({extra, batch}) : batch;
      const DropoutKeyScope scope(key, t);
      const auto sa = strategy->clipped_sum(*a, batch, 1.0, rng).sum;
      const auto sb = strategy->clipped_sum(*b, with, 1.0, rng).sum;
      double moved = 0;
      for (std::size_t i = 0; i < sa.size(); ++i) moved += double(xt::sum(xt::square(sa[i] - sb[i]))());
      moved = std::sqrt(moved);
      INFO(std::string(name) << " step " << t << ": the clipped sum moved by " << moved << " C");
      if (t == 0) CHECK(moved <= 1.0 + 1e-9);  // the record's own clipped gradient, norm <= C (rounding far below)
      else CHECK(moved == 0.0);
    }
  }
}

TEST_CASE("trainer dropout: a model that does not name its records is refused at its first step, nothing accounted") {
  // Recorder's layers without the DropoutRecords its forward holds: masks could only be drawn by position
  class Unnamed final : public ModelT<double> {
   public:
    Unnamed() : init_(3), d1_(8, 16, init_, "d1"), drop_(0.5) {}
    TensorT<double> forward(const BatchT<double>& b) override {
      return drop_.forward(d1_.forward(per_sample_input(b.inputs)));
    }
    std::vector<TensorT<double>> parameters() const override { return d1_.parameters(); }
    void set_training(bool on) override {
      this->training_ = on;
      drop_.set_training(on);
    }
    std::string name() const override { return "unnamed"; }

   private:
    FastRng init_;
    DenseT<double> d1_;
    DropoutT<double> drop_;
  } m;
  SgdT<double> sgd(m.parameters(), 0.1);
  PrivateTrainingConfigT<double> c = small_run();
  c.reproducible_noise = true;
  const BatchT<double> train = records(60, 0, 9);
  PrivateTrainerT<double> t(m, sgd, train, c);
  CHECK_THROWS_WITH_AS(t.step(), doctest::Contains("DropoutRecords"), std::invalid_argument);
  CHECK(t.accountant()->total_steps() == 0);
}

TEST_CASE("dropout: a DPOptimizer stepped directly, outside a PrivateTrainer, keys each record's masks too") {
  Recorder m(5);
  m.set_training(true);
  SgdT<double> sgd(m.parameters(), 0.1);
  auto strategy = make_clip_strategy<double>("ghost");
  auto sampler = make_sampler("poisson", 100, 10);
  ReproducibleRng noise(6), aux(7);  // reproducible: the optimizer's key is the named one below
  DPOptimizerT<double> dp(m, sgd, *strategy, DPConfig{1.0, 1.0}, *sampler, noise, aux, nullptr);
  const HashKey key = hash_key_from_seed(0, "dpgrad-dropout-optimizer");
  for (long step = 0; step < 2; ++step) {
    m.seen.clear();
    dp.step(records(step == 0 ? 5 : 9, 40, 8));  // the same records 40.. at other batch sizes
    REQUIRE(!m.seen.empty());
    for (const auto& [id, kept] : m.seen) CHECK(kept == expected(key, step, id));
  }
  CHECK_FALSE(dropout_keyed());  // the optimizer's scope ends with its step
}
