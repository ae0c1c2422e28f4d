// Checkpoints: a restored run continues exactly as the original (parameters,
// Adam moments, sampler position, generators, ledger); damaged or mismatched
// checkpoints are refused with a message naming the problem, before anything
// is modified.
#include <fstream>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "layers/dense.hpp"
#include "optim/checkpoint/checkpoint.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/sampling/sampler.hpp"
#include "privacy/accountant.hpp"
#include "support/check.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
namespace fs = std::filesystem;

namespace {

/// Everything a DP training run holds, built from one seed.
struct Run {
  FastRng init;
  ReproducibleRng noise, aux, sampling;
  std::unique_ptr<ModelT<double>> model;
  std::unique_ptr<AdamT<double>> adam;
  std::unique_ptr<ClipStrategyT<double>> strategy;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<privacy::Accountant> accountant;
  std::unique_ptr<DPOptimizerT<double>> dp;
  BatchT<double> data;
  ArrayT<double> extra;  // a further named array (as a parameter average would be)

  explicit Run(std::uint64_t seed, std::size_t hidden = 6)
      : init(seed), noise(seed + 1), aux(seed + 2), sampling(seed + 3) {
    SequentialT<double> net;
    net.emplace<DenseT<double>>(5, hidden, init, "d1");
    net.emplace<ActivationT<double>>(Activation::tanh);
    net.emplace<DenseT<double>>(hidden, 3, init, "d2");
    model = std::make_unique<FeatureModelT<double>>("small", std::move(net));
    adam = std::make_unique<AdamT<double>>(model->parameters(), 0.01);
    strategy = make_clip_strategy<double>("ghost");
    sampler = make_sampler("shuffle", 40, 8, 0.5);
    privacy::AccountantOptions ao;
    ao.dataset_size = 40;
    ao.batch_size = 8;
    ao.epoch_fraction = 0.5;
    accountant = privacy::make_accountant("shuffle", ao);
    dp = std::make_unique<DPOptimizerT<double>>(*model, *adam, *strategy, DPConfig{1.0, 1.2}, *sampler, noise, aux,
                                                accountant.get());
    extra = ArrayT<double>{double(seed), 2.0, 3.0};
    FastRng d(99);
    data.inputs = ArrayT<double>::from_shape({40, 5});
    for (auto& v : data.inputs) v = d.normal();
    for (std::size_t i = 0; i < 40; ++i) {
      data.labels.push_back(std::int32_t(d.below(3)));
      data.ids.push_back(std::int64_t(i));
    }
  }
  void train(int steps) {
    for (int i = 0; i < steps; ++i) dp->step(data.select(sampler->next(sampling)));
  }
  TrainingStateT<double> state() {
    TrainingStateT<double> s;
    s.params = model->parameters();
    s.optimizer = adam.get();
    s.sampler = sampler.get();
    s.generators = {{"noise", &noise}, {"aux", &aux}, {"sampling", &sampling}};
    s.accountant = accountant.get();
    s.arrays["extra"] = &extra;
    return s;
  }
};

std::string latest_name(const fs::path& dir) {
  std::ifstream in(dir / "latest");
  std::string s;
  in >> s;
  return s;
}

}  // namespace

TEST_CASE("checkpoint: a restored run continues bit for bit, ledger included") {
  test::TempDir tmp("dpgrad-ckpt");
  Run a(11);
  a.train(3);  // mid-epoch for the shuffle sampler (2 steps per pass)
  CheckpointDir dir(tmp.path / "ck");
  auto key = RunKey::create();
  CHECK_FALSE(dir.has_checkpoint());
  dir.save(3, a.state(), {{"note", "three steps"}}, *key);
  CHECK(dir.has_checkpoint());
  CHECK(dir.latest_step() == 3);
  CHECK(dir.read_extra()["note"] == "three steps");
  a.train(5);

  Run b(12);  // different initialisation and generators: all overwritten
  auto st = b.state();
  CHECK(dir.load(st, *key) == 3);
  CHECK(b.accountant->total_steps() == 3);
  CHECK(b.adam->steps() == 3);
  CHECK(b.extra(0) == 11.0);
  b.train(5);
  auto pa = a.model->parameters(), pb = b.model->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    bool same = pa[i].value() == pb[i].value();
    CHECK_MESSAGE(same, pa[i].name());
  }
  CHECK(a.accountant->epsilon(1e-5) == b.accountant->epsilon(1e-5));
  CHECK(a.noise.state() == b.noise.state());
}

TEST_CASE("checkpoint: saves replace older ones atomically; a second save of one step gets a new name") {
  test::TempDir tmp("dpgrad-ckpt");
  Run a(21);
  CheckpointDir dir(tmp.path / "ck");
  auto key = RunKey::create();
  a.train(1);
  dir.save(1, a.state(), {}, *key);
  fs::create_directories(tmp.path / "ck" / ".partial-step-00000002-1");  // left by a killed save
  a.train(1);
  dir.save(2, a.state(), {}, *key);
  CHECK(latest_name(tmp.path / "ck") == "step-00000002");
  dir.save(2, a.state(), {{"again", true}}, *key);
  CHECK(latest_name(tmp.path / "ck") == "step-00000002.1");
  CHECK(dir.latest_step() == 2);
  CHECK(dir.read_extra()["again"] == true);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path / "ck")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step-00000002.1"});
}

TEST_CASE("checkpoint: damage and mismatches are refused, and nothing is restored") {
  test::TempDir tmp("dpgrad-ckpt");
  Run a(31);
  a.train(2);
  fs::path ck = tmp.path / "ck";
  CheckpointDir dir(ck);
  auto key = RunKey::create();
  dir.save(2, a.state(), {}, *key);
  fs::path root = ck / latest_name(ck);
  fs::path param = *fs::directory_iterator(root / "params");

  Run b(32);
  auto before = b.model->parameters()[0].value();
  auto st = b.state();
  auto refused = [&](const char* what) {
    CHECK_THROWS_WITH_AS(dir.load(st, *key), doctest::Contains(what), CheckpointError);
    bool untouched = b.model->parameters()[0].value() == before;
    CHECK(untouched);
    CHECK(b.accountant->total_steps() == 0);
  };
  SUBCASE("no checkpoint") {
    CheckpointDir empty(tmp.path / "nothing");
    CHECK_THROWS_WITH_AS(empty.load(st, *key), doctest::Contains("no checkpoint"), CheckpointError);
  }
  SUBCASE("truncated parameter file") {
    fs::resize_file(param, fs::file_size(param) - 8);
    refused("truncated");
  }
  SUBCASE("modified parameter file of the same size") {
    std::fstream f(param, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
    f.close();
    refused("hash");
  }
  SUBCASE("missing file") {
    fs::remove(root / "state.json");
    refused("missing");
  }
  SUBCASE("latest names nothing") {
    std::ofstream(ck / "latest") << "step-00000099\n";
    refused("step-00000099");
  }
  SUBCASE("a different model") {
    Run c(33, 7);
    auto sc = c.state();
    CHECK_THROWS_WITH_AS(dir.load(sc, *key), doctest::Contains("shape"), CheckpointError);
  }
  SUBCASE("a different accountant") {
    auto pld = privacy::make_accountant("gdp");
    st.accountant = pld.get();
    refused("accountant");
  }
  SUBCASE("a secure generator where the run had a fast one") {
    SecureRng secure;
    st.generators["noise"] = &secure;
    refused("generator");
  }
}

TEST_CASE("checkpoint: a run's hash keys come back as saved; a checkpoint without one leaves it") {
  test::TempDir tmp("dpgrad-ckpt");
  Run a(41);
  a.train(1);
  HashKey dropout = random_hash_key();
  auto with_key = a.state();
  with_key.keys = {{"dropout", &dropout}};
  CheckpointDir dir(tmp.path / "ck");
  auto key = RunKey::create();
  dir.save(1, with_key, {}, *key);

  Run b(42);
  HashKey restored{};
  auto st = b.state();
  st.keys = {{"dropout", &restored}};
  CHECK(dir.load(st, *key) == 1);
  CHECK(restored == dropout);

  // one written without the key (an older run): the key drawn for this run stays
  CheckpointDir old(tmp.path / "old");
  auto old_key = RunKey::create();
  old.save(1, a.state(), {}, *old_key);
  Run c(43);
  HashKey fresh = hash_key_from_seed(1, "test");
  auto sc = c.state();
  sc.keys = {{"dropout", &fresh}};
  CHECK(old.load(sc, *old_key) == 1);
  CHECK(fresh == hash_key_from_seed(1, "test"));
}
