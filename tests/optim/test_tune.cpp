// Private hyperparameter search (optim/run/tune.hpp, docs/tuning.md): the plan
// calibrates the trials' noise to the search's target, the refusals, a search
// that releases only its best trial, and an interrupted search that resumes
// without running a trial twice or dropping one.
#include <cmath>
#include <stdexcept>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "engine/random.hpp"
#include "layers/models.hpp"
#include "optim/checkpoint/checkpoint.hpp"
#include "optim/clipping/clip_spec.hpp"
#include "optim/run/tune.hpp"
#include "support/batches.hpp"
#include "support/check.hpp"
#include "support/key_store.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;

namespace {

SearchConfigT<double> search_config(const std::filesystem::path& dir) {
  SearchConfigT<double> c;
  c.trial.delta = 1e-4;
  c.space.lr = {0.05, 0.5};
  c.space.clip_norm = {0.3, 3};
  c.space.batch_sizes = {50, 100};
  c.space.epochs = {1, 2};
  c.trials = privacy::TrialCount::parse("tnb:1,0.34");
  c.target_epsilon = 4;
  c.delta = 1e-4;
  c.score_noise = 0.1;  // a noise std of 10 records in 100: the scores of small sets are costly
  c.dir = dir;
  c.reproducible = true;
  c.seed = 3;
  return c;
}

/// Counts the models it builds; throws on the `fail_at`-th (0: never).
struct Factory {
  int built = 0, fail_at = 0;
  TrialFactoryT<double> fn() {
    return [this](const TrialSettings& s) {
      if (++built == fail_at) throw std::runtime_error("interrupted");
      FastRng init(s.init_seed);
      TrialModelT<double> m;
      m.model = make_mlp<double>({8, 3}, Activation::relu, init);
      m.optimizer = std::make_unique<SgdT<double>>(m.model->parameters(), s.lr);
      return m;
    };
  }
};

/// Plain SGD that throws once `fail_after` more updates are asked of it (-1: never): a process killed mid-trial.
struct FlakySgd final : OptimizerT<double> {
  static inline long fail_after = -1;
  FlakySgd(std::vector<TensorT<double>> p, double lr) : OptimizerT<double>(std::move(p), lr) {}
  std::string name() const override { return "flaky-sgd"; }

 protected:
  void update(std::size_t i, TensorT<double>& p, const ArrayT<double>& g) override {
    if (fail_after == 0 && i == 0) throw std::runtime_error("killed mid-trial");
    if (fail_after > 0 && i == 0) --fail_after;
    double* w = p.mutable_value().data();
    for (std::size_t k = 0; k < g.size(); ++k) w[k] -= lr_of(i) * g.data()[k];
  }
};

TrialFactoryT<double> flaky_factory(int& built) {
  return [&built](const TrialSettings& s) {
    ++built;
    FastRng init(s.init_seed);
    TrialModelT<double> m;
    m.model = make_mlp<double>({8, 3}, Activation::relu, init);
    m.optimizer = std::make_unique<FlakySgd>(m.model->parameters(), s.lr);
    return m;
  };
}

nlohmann::json saved_state(const std::filesystem::path& dir) { return CheckpointDir(dir / "search").read_extra(); }

}  // namespace

TEST_CASE("tune: the plan calibrates the trials' noise so that the whole search just meets its target") {
  test::TempDir dir("dpgrad-tune");
  SearchConfigT<double> c = search_config(dir.path);
  const SearchPlan p = plan_search(c, 1000, 27);
  CHECK(p.validation_records == 100);
  CHECK(p.train_records == 900);
  CHECK(p.epsilon <= 4);
  CHECK(p.epsilon > 3.99);
  CHECK(p.max_trials >= 1);
  CHECK(p.cap_tail * (1 + std::exp(p.epsilon)) <= 1e-4);
  CHECK(p.score_noise_multiplier == doctest::Approx(10.0));  // 0.1 x 100 records
  // a larger target needs less noise; more trials need more
  c.target_epsilon = 8;
  CHECK(plan_search(c, 1000, 27).noise_multiplier < p.noise_multiplier);
  c.target_epsilon = 4;
  c.trials = privacy::TrialCount::parse("tnb:1,0.05");
  CHECK(plan_search(c, 1000, 27).noise_multiplier > p.noise_multiplier);
  // Poisson numbers of trials (Theorem 6) calibrate the same way
  c.trials = privacy::TrialCount::parse("poisson:3");
  const SearchPlan q = plan_search(c, 1000, 27);
  CHECK(q.epsilon <= 4);
  CHECK(q.epsilon > 3.99);
}

TEST_CASE("tune: settings the search cannot analyse or reach are refused before any data is read") {
  test::TempDir dir("dpgrad-tune");
  auto refused = [&](auto edit, const std::string& words) {
    SearchConfigT<double> c = search_config(dir.path);
    edit(c);
    try {
      plan_search(c, 1000, 27);
      FAIL("accepted: " << words);
    } catch (const std::invalid_argument& e) {
      CHECK_MESSAGE(std::string(e.what()).find(words) != std::string::npos, e.what());
    }
  };
  refused([](auto& c) { c.trial.clipping = make_clip_strategy<double>(parse_clip_spec("jl:4"), 100); }, "jl:K");
  refused([](auto& c) { c.trial.target_epsilon = 1; }, "calibrates");
  refused([](auto& c) { c.trial.sampling = Sampling::shuffle; }, "Poisson");
  refused([](auto& c) { c.target_epsilon = 0.01; c.score_noise = 0.001; }, "out of reach");
  refused([](auto& c) { c.space.lr = {0.5, 0.05}; }, "lr");
  refused([](auto& c) { c.space.batch_sizes = {}; }, "batch sizes");
  refused([](auto& c) { c.validation_fraction = 0.9; }, "validation_fraction");
  refused([](auto& c) { c.target_epsilon = NAN; }, "target epsilon");
}

TEST_CASE("tune: a search releases its best trial; an interrupted one resumes without rerunning or dropping a trial") {
  test::KeyStoreForTests keys;
  test::TempDir dir("dpgrad-tune");
  const BatchT<double> data = test::three_class_records(600, 8, 21);
  SearchConfigT<double> c = search_config(dir.path);
  c.trials = privacy::TrialCount::parse("poisson:4");

  // the whole search in one go, in a directory of its own
  test::TempDir whole_dir("dpgrad-tune");
  SearchConfigT<double> w = c;
  w.dir = whole_dir.path;
  Factory plain;
  const SearchResultT<double> whole = tune(plain.fn(), data, w);
  const nlohmann::json whole_state = saved_state(whole_dir.path);
  const long k = long(whole_state["settings"].size());
  REQUIRE(k >= 2);  // seed 3 draws enough trials to interrupt one
  // the search's state and its trials' folders are the user's only: another user cannot count the trials
  for (const auto& e : std::filesystem::directory_iterator(whole_dir.path)) {
    CAPTURE(e.path().string());
    CHECK((e.status().permissions() & (std::filesystem::perms::group_all | std::filesystem::perms::others_all)) ==
          std::filesystem::perms::none);
  }
  CHECK(plain.built == 1 + k);  // the probe, then one model a trial
  CHECK(whole_state["scores"].size() == std::size_t(k));
  REQUIRE(whole.released);
  CHECK(whole.model);
  double best = -INFINITY;
  for (const auto& s : whole_state["scores"]) best = std::max(best, s.get<double>());
  CHECK(whole.score == best);
  CHECK(whole.score > 0.5);  // the records' rule is easy: the best noised accuracy is well above a third
  CHECK(whole.plan.epsilon <= 4);
  CHECK(whole.privacy_statement().find("epsilon " + privacy::format_epsilon(whole.plan.epsilon) + " (delta 0.0001") == 0);

  // the same search, stopped while building its second trial's model
  Factory failing;
  failing.fail_at = 3;  // the probe, trial 1, then trial 2's model
  CHECK_THROWS_WITH_AS(tune(failing.fn(), data, c), "interrupted", std::runtime_error);
  const nlohmann::json part = saved_state(dir.path);
  CHECK(part["scores"].size() == 1);
  CHECK(part["settings"] == whole_state["settings"]);  // the same draws (reproducible seed)
  // starting afresh in that directory is refused; resuming runs trials 2..K only
  CHECK_THROWS_AS(tune(plain.fn(), data, c), std::invalid_argument);
  c.resume = true;
  Factory resumed;
  const SearchResultT<double> after = tune(resumed.fn(), data, c);
  const nlohmann::json done = saved_state(dir.path);
  CHECK(done["scores"].size() == std::size_t(k));
  CHECK(done["scores"][0] == part["scores"][0]);  // trial 1 kept its released score
  CHECK(done["scores"] == whole_state["scores"]);  // and the rest are the trials of the search in one go
  CHECK(resumed.built == 1 + (k - 1) + (done["best"] == 0 ? 1 : 0));  // + rebuilding a best trial from session one
  REQUIRE(after.released);
  CHECK(after.model);
  // a resumed search keeps its settings
  SearchConfigT<double> other = c;
  other.score_noise = 0.02;
  CHECK_THROWS_AS(tune(resumed.fn(), data, other), std::invalid_argument);
}

TEST_CASE("tune: a search killed in the middle of a trial resumes that trial from its checkpoint") {
  test::KeyStoreForTests keys;
  test::TempDir whole_dir("dpgrad-tune"), dir("dpgrad-tune");
  const BatchT<double> data = test::three_class_records(600, 8, 21);
  SearchConfigT<double> c = search_config(dir.path);
  c.trials = privacy::TrialCount::parse("poisson:4");
  c.trial.checkpoints.every_steps = 1;  // each trial saves every step
  // the search in one go, for reference
  SearchConfigT<double> w = c;
  w.dir = whole_dir.path;
  int built = 0;
  FlakySgd::fail_after = -1;
  tune(flaky_factory(built), data, w);
  const nlohmann::json whole = saved_state(whole_dir.path);
  // killed after 3 updates of the first trial (its steps 1 to 3 are saved), then resumed
  FlakySgd::fail_after = 3;
  CHECK_THROWS_WITH_AS(tune(flaky_factory(built), data, c), "killed mid-trial", std::runtime_error);
  CHECK(saved_state(dir.path)["scores"].empty());
  CHECK(CheckpointDir(dir.path / "trial-0001").latest_step() == 3);
  FlakySgd::fail_after = -1;
  c.resume = true;
  tune(flaky_factory(built), data, c);
  const nlohmann::json done = saved_state(dir.path);
  CHECK(done["settings"] == whole["settings"]);
  CHECK(done["scores"].size() == whole["scores"].size());
  CHECK(done["best"] == whole["best"]);
  CHECK(done["scores"] == whole["scores"]);  // the resumed trial continued the same run (its generators are in its checkpoint)
}

TEST_CASE("tune: a configuration its trial would refuse at the calibrated sigma is refused before K is drawn") {
  test::KeyStoreForTests keys;
  test::TempDir dir("dpgrad-tune");
  const BatchT<double> data = test::three_class_records(600, 8, 21);
  SearchConfigT<double> c = search_config(dir.path / "search");
  c.space.batch_sizes = {20, 100};
  c.target_epsilon = 2;
  // adaptive clipping's default count noise is the batch / 20: 1 at batch 20, which needs sigma < 2
  const double sigma = plan_search(c, 600, 27).noise_multiplier;
  REQUIRE(sigma > 2);  // the rule fails at the calibrated sigma, not at sigma 1
  c.space.clip_quantile = std::pair{0.4, 0.6};
  c.trial.adaptive_clipping = AdaptiveClipping{};
  try {
    plan_search(c, 600, 27);
    FAIL("accepted");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("calibrated noise multiplier") != std::string::npos, what);
    CHECK_MESSAGE(what.find("batch size 20") != std::string::npos, what);
    CHECK_MESSAGE(what.find("count noise 1 must exceed half the noise multiplier") != std::string::npos, what);
  }
  Factory f;
  CHECK_THROWS_WITH_AS(tune(f.fn(), data, c), doctest::Contains("count noise"), std::invalid_argument);
  CHECK_FALSE(std::filesystem::exists(c.dir));  // no search state, no trial folder: K was never drawn
  // with a count noise that meets the rule at that sigma, the plan goes through
  c.trial.adaptive_clipping->count_noise = sigma;
  CHECK(plan_search(c, 600, 27).noise_multiplier == doctest::Approx(sigma).epsilon(1e-3));
}

TEST_CASE("tune: a target out of reach for any number of records is refused before the records are counted") {
  test::TempDir dir("dpgrad-tune");
  SearchConfigT<double> c = search_config(dir.path);
  c.target_epsilon = 0.001;
  CHECK_THROWS_WITH_AS(check_search_settings(c), doctest::Contains("out of reach whatever the number of records"),
                       std::invalid_argument);
  // the floor is below every plan's: a target some plan reaches passes the check (which refuses less than plans do)
  c = search_config(dir.path);
  c.score_noise = 1;
  bool reached = false;
  for (const double target : {0.02, 0.05, 0.1, 0.2, 0.5})
    for (const bool default_delta : {false, true})
    for (const std::size_t n : {1000, 8000}) {
      c.target_epsilon = target;
      c.delta = default_delta ? std::optional<double>() : std::optional<double>(1e-4);
      CAPTURE(target);
      CAPTURE(default_delta);
      CAPTURE(n);
      try {
        plan_search(c, n, 27);
      } catch (const std::invalid_argument& e) {
        CHECK_MESSAGE(std::string(e.what()).find("out of reach") != std::string::npos, std::string(e.what()));
        continue;
      }
      reached = true;
      CHECK_NOTHROW(check_search_settings(c));
    }
  CHECK(reached);
}

TEST_CASE("tune: a search folder other users can list is refused, saying how to close it; a new one is 0700") {
  test::KeyStoreForTests keys;
  test::TempDir dir("dpgrad-tune");
  const BatchT<double> data = test::three_class_records(600, 8, 21);
  SearchConfigT<double> c = search_config(dir.path);
  namespace fs = std::filesystem;
  fs::permissions(dir.path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
  Factory f;
  test::check_error<std::invalid_argument>([&] { tune(f.fn(), data, c); },
                                           {dir.path.string(), "open to other users (mode 755)", "chmod 700"});
  CHECK(f.built == 0);
  CHECK_FALSE(fs::exists(dir.path / "search"));
  // a folder the search creates (and its missing parents) is the user's only
  c.dir = dir.path / "new" / "search-dir";
  c.trials = privacy::TrialCount::parse("poisson:0.01");  // most likely no trial: the folder is what is checked
  tune(f.fn(), data, c);
  for (const fs::path& p : {dir.path / "new", c.dir, c.dir / "search"}) {
    CAPTURE(p.string());
    CHECK((fs::status(p).permissions() & (fs::perms::group_all | fs::perms::others_all)) == fs::perms::none);
  }
}
