// PrivateTrainer: the run object ties q and the batch size to its sampler,
// calibrates with the sensitivity, refuses mismatches before any step, stops at
// the budget, resumes exactly, and chunks logical batches; and the losses users
// plug in reach every strategy.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <stdlib.h>

#include "engine/communicator.hpp"
#include "engine/ops.hpp"
#include "engine/random.hpp"
#include "layers/losses.hpp"
#include "layers/models.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "optim/run/private_trainer.hpp"
#include "privacy/accountant.hpp"
#include "privacy/calibration.hpp"
#include "privacy/mechanisms.hpp"
#include "support/batches.hpp"
#include "support/check.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
using test::randn;

namespace {

/// n examples of 8 features, labels in [0, 3) from a fixed linear rule.
template <class T>
BatchT<T> separable(std::size_t n, Rng& rng) {
  BatchT<T> b;
  b.inputs = randn<T>({n, 8}, rng);
  for (std::size_t i = 0; i < n; ++i) {
    const T s = b.inputs(i, 0) + T(0.5) * b.inputs(i, 1);
    b.labels.push_back(s < T(-0.4) ? 0 : s < T(0.4) ? 1 : 2);
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

std::vector<ArrayT<double>> values(const ModelT<double>& m) {
  std::vector<ArrayT<double>> v;
  for (const auto& p : m.parameters()) v.push_back(p.value());
  return v;
}

double max_diff(const std::vector<ArrayT<double>>& a, const std::vector<ArrayT<double>>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, double(xt::amax(xt::abs(a[i] - b[i]))()));
  return d;
}

}  // namespace

TEST_CASE("private trainer: q and the expected batch come from the sampler; sigma is calibrated with the sensitivity") {
  FastRng init(1), data(2);
  const BatchT<double> train = separable<double>(1000, data);
  for (std::string strategy : {"ghost", "microbatch"}) {
    CAPTURE(strategy);
    auto model = make_mlp<double>({8, 3}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainingConfigT<double> c;
    c.target_epsilon = 2;
    c.delta = 1e-5;
    c.epochs = 3;
    c.batch_size = 50;
    c.clipping = strategy == "ghost" ? clipping::ghost<double>() : clipping::microbatch<double>(10, 50);
    PrivateTrainerT<double> t(*model, sgd, train, c);
    CHECK(t.sampling_rate() == doctest::Approx(0.05));
    CHECK(t.expected_batch_size() == doctest::Approx(50));
    CHECK(t.total_steps() == 60);
    CHECK(t.accountant_name() == "pld");
    CHECK(t.calibrated());
    // the run as a whole spends the target, not more (and not much less)
    CHECK(t.final_epsilon() <= 2.0);
    CHECK(t.final_epsilon() > 1.95);
    // the accountant saw sigma / sensitivity: microbatch's sigma is twice vanilla's
    auto a = privacy::make_accountant("pld");
    a->step(0.05, t.noise_multiplier() / c.clipping->sensitivity(), 60);
    CHECK(privacy::grid_noise_epsilon(*a, 1e-5, double(model->parameter_count())) ==
          doctest::Approx(t.final_epsilon()).epsilon(1e-9));
    CHECK(t.epsilon() == 0.0);  // nothing spent yet
    t.step();
    CHECK(t.epsilon() > 0);
    CHECK(t.accountant()->total_steps() == 1);
  }
}

TEST_CASE("private trainer: mismatches and traps are refused before any step, parameters untouched") {
  FastRng init(3), data(4);
  const BatchT<double> train = separable<double>(200, data);
  auto model = make_mlp<double>({8, 3}, Activation::relu, init);
  const auto before = values(*model);
  SgdT<double> sgd(model->parameters(), 0.1);
  auto make = [&](auto edit) {
    PrivateTrainingConfigT<double> c;
    c.noise_multiplier = 1.0;
    c.batch_size = 20;
    edit(c);
    PrivateTrainerT<double> t(*model, sgd, train, c);
  };
  test::check_error<std::invalid_argument>([&] { make([](auto& c) { c.clipping = clipping::jl<double>(3); c.accounting = Accounting::rdp; }); },
                                           {"rdp accountant cannot analyse jl:3"});
  test::check_error<std::invalid_argument>([&] { make([](auto& c) { c.accounting = Accounting::wor; }); },
                                           {"does not analyse poisson"});
  test::check_error<std::invalid_argument>([] { accounting_from_string("gdp"); }, {"approximation"});
  test::check_error<std::invalid_argument>([] { accounting_from_string("foo"); }, {"unknown accountant 'foo'"});
  CHECK(accounting_from_string("") == Accounting::automatic);
  test::check_error<std::invalid_argument>([&] { make([](auto& c) { c.noise_multiplier = 0.0; }); }, {"NOT private"});
  test::check_error<std::invalid_argument>([&] { make([](auto& c) { c.noise_multiplier.reset(); }); },
                                           {"noise_multiplier or a target_epsilon"});
  test::check_error<std::invalid_argument>([&] { make([](auto& c) { c.batch_size = 201; }); }, {"batch_size must be in [1, 200]"});
  test::check_error<std::invalid_argument>([&] { make([](auto& c) { c.delta = 1.0; }); }, {"delta must be in (0, 1)"});
  test::check_error<std::invalid_argument>([&] { make([](auto& c) { c.noise_multiplier = 1e-300; }); },
                                           {"proves no finite epsilon"});
  test::check_error<std::invalid_argument>(
      [&] { make([](auto& c) { c.clipping = clipping::jl<double>(2); c.physical_batch_size = 5; }); },
      {"physical batches", "jl:2"});
  CHECK(max_diff(values(*model), before) == 0);
  // an empty training set, and the default delta of a tiny one
  BatchT<double> one = separable<double>(1, data);
  test::check_error<std::invalid_argument>([&] {
    PrivateTrainingConfigT<double> c;
    c.noise_multiplier = 1.0;
    c.batch_size = 1;
    c.delta = 0.5;
    c.epochs = 1;
    PrivateTrainerT<double> t(*model, sgd, one, c);
    CHECK(t.delta() == 0.5);
    throw std::invalid_argument("reached");
  }, {"reached"});
}

TEST_CASE("private trainer: under an MPI launcher, a run without a communicator is refused (each copy would train alone)") {
  if (launched_by_mpi_launcher()) return;  // the variable below must be this test's alone
  FastRng init(3), data(4);
  const BatchT<double> train = separable<double>(50, data);
  auto model = make_mlp<double>({8, 3}, Activation::relu, init);
  SgdT<double> sgd(model->parameters(), 0.1);
  PrivateTrainingConfigT<double> c;
  c.noise_multiplier = 1.0;
  c.batch_size = 10;
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);  // what mpirun puts in each process's environment
  std::string error;
  try {
    PrivateTrainerT<double> t(*model, sgd, train, c);
  } catch (const std::invalid_argument& e) {
    error = e.what();
  }
  c.alone_under_launcher = true;  // each process's run its own: accepted
  CHECK_NOTHROW(PrivateTrainerT<double>(*model, sgd, train, c));
  unsetenv("OMPI_COMM_WORLD_SIZE");
  CHECK(error.find("an MPI launcher started this process, and the run has no communicator") != std::string::npos);
  c.alone_under_launcher = false;
  CHECK_NOTHROW(PrivateTrainerT<double>(*model, sgd, train, c));
}

TEST_CASE("private trainer: with a noise multiplier and a target, the run stops before exceeding the target") {
  FastRng init(5), data(6);
  const BatchT<double> train = separable<double>(2000, data);
  auto model = make_mlp<double>({8, 3}, Activation::relu, init);
  SgdT<double> sgd(model->parameters(), 0.1);
  PrivateTrainingConfigT<double> c;
  c.noise_multiplier = 1.0;
  c.target_epsilon = 1.0;
  c.delta = 1e-5;
  c.epochs = 20;
  c.batch_size = 20;
  c.reproducible_noise = true;  // deterministic test: NOT private
  PrivateTrainerT<double> t(*model, sgd, train, c);
  CHECK(t.steps_cut_for_budget() > 0);
  CHECK(t.total_steps() + t.steps_cut_for_budget() == 2000);
  CHECK(t.final_epsilon() <= 1.0);
  CHECK_FALSE(t.is_private());  // the named opt-in
  const TrainResult r = t.train();
  CHECK(t.done());
  // the result says the budget cut the run short, and by how much
  CHECK(r.status == RunStatus::stopped_by_budget);
  CHECK(to_string(r.status) == "stopped by the privacy budget");
  CHECK(r.steps == t.total_steps());
  CHECK(r.planned_steps == 2000);
  CHECK(r.message.find("stopped by the privacy budget after " + std::to_string(r.steps) + " of 2000") !=
        std::string::npos);
  CHECK(t.epsilon() <= 1.0);
  CHECK(t.epsilon() == doctest::Approx(t.final_epsilon()));
  // one step more would have crossed the target
  auto more = t.accountant()->clone();
  more->step(t.sampling_rate(), 1.0, 1);
  CHECK(privacy::grid_noise_epsilon(*more, 1e-5, double(model->parameter_count())) > 1.0);
  CHECK_THROWS_AS(t.step(), std::logic_error);
}

TEST_CASE("private trainer: a resumed run ends where an uninterrupted one does") {
  FastRng data(8);
  const BatchT<double> train = separable<double>(300, data);
  test::TempDir dir("dpgrad-trainer");
  PrivateTrainingConfigT<double> c;
  c.noise_multiplier = 1.1;
  c.epochs = 2;
  c.batch_size = 30;
  c.ema = 0.9;
  c.reproducible_noise = true;
  c.seed = 11;
  auto run = [&](bool interrupt) {
    FastRng init(7);
    auto model = make_mlp<double>({8, 4, 3}, Activation::tanh, init);
    SgdT<double> sgd(model->parameters(), 0.2, 0.9);
    {
      PrivateTrainerT<double> t(*model, sgd, train, c);
      if (!interrupt) {
        t.train();
        return std::make_pair(values(*model), t.evaluate(train).loss);
      }
      for (int i = 0; i < 7; ++i) t.step();
      t.save(dir.path, {{"note", "seven steps"}});
    }
    FastRng other(99);  // the resumed process starts from other parameters
    auto again = make_mlp<double>({8, 4, 3}, Activation::tanh, other);
    SgdT<double> sgd2(again->parameters(), 0.2, 0.9);
    PrivateTrainerT<double> t(*again, sgd2, train, c, dir.path);
    CHECK(t.steps_done() == 7);
    CHECK(t.accountant()->total_steps() == 7);
    CHECK(t.resumed_extra()["note"] == "seven steps");
    t.train();
    return std::make_pair(values(*again), t.evaluate(train).loss);
  };
  const auto whole = run(false), resumed = run(true);
  CHECK(max_diff(whole.first, resumed.first) == 0);
  CHECK(whole.second == resumed.second);
}

TEST_CASE("private trainer: a release before training is in the ledger, the calibration, the epsilon and the resume") {
  FastRng data(21);
  const BatchT<double> train = separable<double>(1000, data);
  test::TempDir dir("dpgrad-prior");
  // a release of 24 values: each record's 8 features, three times over
  std::vector<ArrayT<double>> seen;
  auto release = [&](double sigma, std::size_t dimension = 24) {
    return private_feature_mean<double>(
        dimension, 1.0, sigma,
        [dimension](const BatchT<double>& r) {
          ArrayT<double> rows = ArrayT<double>::from_shape({r.examples(), dimension});
          for (std::size_t i = 0; i < r.examples(); ++i)
            for (std::size_t k = 0; k < dimension; ++k) rows(i, k) = r.inputs(i, k % 8);
          return rows;
        },
        [&seen](const ArrayT<double>& m) { seen.push_back(m); });
  };
  auto config = [](std::vector<ReleaseBeforeTrainingT<double>> before) {
    PrivateTrainingConfigT<double> c;
    c.target_epsilon = 2;
    c.delta = 1e-5;
    c.epochs = 3;
    c.batch_size = 50;
    c.reproducible_noise = true;
    c.seed = 5;
    c.releases = std::move(before);
    return c;
  };
  const auto mean_release = release(4.0);
  FastRng init_a(22), init_b(22);
  auto plain_model = make_mlp<double>({8, 3}, Activation::relu, init_a);
  auto model = make_mlp<double>({8, 3}, Activation::relu, init_b);
  SgdT<double> sgd_a(plain_model->parameters(), 0.1), sgd_b(model->parameters(), 0.1);
  PrivateTrainerT<double> plain(*plain_model, sgd_a, train, config({}));
  auto t = std::make_unique<PrivateTrainerT<double>>(*model, sgd_b, train, config({mean_release}));
  // the same target with a release already made: more noise, and the whole still within the target
  CHECK(t->noise_multiplier() > plain.noise_multiplier());
  CHECK(t->final_epsilon() <= 2.0);
  CHECK(t->final_epsilon() > 1.95);
  // before any step the ledger holds the release alone: one Gaussian step (q = 1) at its multiplier
  REQUIRE(t->accountant()->ledger().size() == 1);
  CHECK(t->accountant()->ledger()[0] == privacy::Step{1.0, 4.0, 1, 0});
  CHECK(t->epsilon() > 0);
  // an independent count: the release and 60 steps in one accountant, the grid charged for every draw
  auto a = privacy::make_accountant("pld");
  a->step(1.0, 4.0, 1);
  a->step(0.05, t->noise_multiplier(), 60);
  CHECK(privacy::grid_noise_epsilon_of_draws(*a, 1e-5, 24 + 60.0 * double(model->parameter_count())) ==
        doctest::Approx(t->final_epsilon()).epsilon(1e-9));
  // more than the same steps at the same sigma without it
  auto b = privacy::make_accountant("pld");
  b->step(0.05, t->noise_multiplier(), 60);
  CHECK(privacy::grid_noise_epsilon(*b, 1e-5, double(model->parameter_count())) < t->final_epsilon());
  for (int i = 0; i < 5; ++i) t->step();
  CHECK(t->accountant()->total_steps() == 6);
  t->save(dir.path, nlohmann::json::object());
  // the release was handed to its user once, and is the noisy mean of the rows
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].size() == 24);
  const ArrayT<double> released = seen[0];
  const double epsilon = t->epsilon();
  t.reset();  // the run's process ends (it held the run's key): another may continue it
  {  // resumes with the same release: the ledger is taken as it is, not added to
    FastRng init(23);
    auto again = make_mlp<double>({8, 3}, Activation::relu, init);
    SgdT<double> sgd(again->parameters(), 0.1);
    PrivateTrainerT<double> r(*again, sgd, train, config({mean_release}), dir.path);
    CHECK(r.steps_done() == 5);
    CHECK(r.accountant()->total_steps() == 6);
    CHECK(r.epsilon() == doctest::Approx(epsilon).epsilon(1e-12));
    // taken from the checkpoint, not computed again
    REQUIRE(seen.size() == 2);
    CHECK(seen[1] == released);
  }
  for (const std::vector<ReleaseBeforeTrainingT<double>>& other :
       {std::vector<ReleaseBeforeTrainingT<double>>{}, {release(8.0)}, {release(4.0, 16)}}) {
    FastRng init(24);
    auto again = make_mlp<double>({8, 3}, Activation::relu, init);
    SgdT<double> sgd(again->parameters(), 0.1);
    CHECK_THROWS_WITH_AS(PrivateTrainerT<double>(*again, sgd, train, config(other), dir.path),
                         doctest::Contains("releases_before"), std::invalid_argument);
  }
  // refused: a bad release, a run without a ledger, an accountant that cannot compose it
  auto refused = [&](PrivateTrainingConfigT<double> c, const char* why) {
    FastRng init(25);
    auto m = make_mlp<double>({8, 3}, Activation::relu, init);
    SgdT<double> sgd(m->parameters(), 0.1);
    CHECK_THROWS_WITH_AS(PrivateTrainerT<double>(*m, sgd, train, c), doctest::Contains(why), std::invalid_argument);
  };
  refused(config({release(0.0)}), "noise multiplier > 0");
  refused(config({release(4.0, 0)}), "at least one draw");
  refused(config({mean_release, mean_release}), "two releases before training are called");
  PrivateTrainingConfigT<double> non_private;
  non_private.non_private = true;
  non_private.releases = {mean_release};
  refused(non_private, "non-private run");
  PrivateTrainingConfigT<double> fixed = config({mean_release});
  fixed.sampling = Sampling::fixed;
  refused(fixed, "Poisson sampling's accountants");
}

TEST_CASE("private trainer: a logical batch clipped in physical chunks gives the one-chunk step") {
  FastRng data(10);
  const BatchT<double> train = separable<double>(400, data);
  for (std::string strategy : {"ghost", "vanilla", "naive"}) {
    CAPTURE(strategy);
    auto run = [&](std::size_t chunk) {
      FastRng init(9);
      auto model = make_mlp<double>({8, 6, 3}, Activation::tanh, init);
      AdamT<double> adam(model->parameters(), 1e-2);
      PrivateTrainingConfigT<double> c;
      c.noise_multiplier = 1.0;
      c.batch_size = 100;
      c.max_steps = 3;
      c.physical_batch_size = chunk;
      c.clipping = strategy == "ghost" ? clipping::ghost<double>() : strategy == "vanilla" ? clipping::vanilla<double>()
                                                                                          : clipping::naive<double>();
      c.reproducible_noise = true;
      PrivateTrainerT<double> t(*model, adam, train, c);
      t.train();
      CHECK(t.accountant()->total_steps() == 3);  // accounted once per logical batch
      return values(*model);
    };
    const auto whole = run(0), chunked = run(16);
    CHECK(max_diff(whole, chunked) < 1e-9);
    CHECK(max_diff(whole, run(7)) < 1e-9);
  }
}

TEST_CASE("private trainer: non-private runs and evaluation") {
  FastRng init(12), data(13);
  const BatchT<double> train = separable<double>(600, data), test = separable<double>(300, data);
  auto model = make_mlp<double>({8, 16, 3}, Activation::tanh, init);
  SgdT<double> sgd(model->parameters(), 0.05, 0.5);
  PrivateTrainingConfigT<double> c;
  c.non_private = true;
  c.epochs = 15;
  c.batch_size = 30;
  PrivateTrainerT<double> t(*model, sgd, train, c);
  CHECK_FALSE(t.is_private());
  CHECK(std::isinf(t.epsilon()));
  const Evaluation before = t.evaluate(test);
  long epochs = 0;
  TrainHooksT<double> hooks;
  hooks.on_epoch = [&](const EpochReport& e) { epochs = e.epoch; };
  const TrainResult r = t.train(hooks);
  CHECK(epochs == 15);
  CHECK(r.status == RunStatus::complete);
  const Evaluation after = t.evaluate(test);
  CAPTURE(before.loss);
  CAPTURE(after.loss);
  CAPTURE(after.accuracy);
  CHECK(after.examples == 300);
  CHECK(after.loss < before.loss);
  CHECK(after.accuracy > 0.9);
}

TEST_CASE("private trainer: the privacy statement rounds epsilon up and says what is not private") {
  FastRng init(21), data(22);
  const BatchT<double> train = separable<double>(400, data);
  auto model = make_mlp<double>({8, 4, 3}, Activation::tanh, init);
  SgdT<double> sgd(model->parameters(), 0.05, 0.5);
  PrivateTrainingConfigT<double> c;
  c.epochs = 1;
  c.batch_size = 40;
  c.noise_multiplier = 1.0;
  c.delta = 1e-4;
  PrivateTrainerT<double> t(*model, sgd, train, c);
  // 1.00001 shows as 1.0001, never 1.0000; the accountant's epsilon itself is stated rounded up
  CHECK(t.privacy_statement(1.00001) == "epsilon 1.0001 (delta 0.0001, pld accountant, add/remove-one neighbours)");
  CHECK(t.privacy_statement(INFINITY).rfind("epsilon inf (", 0) == 0);
  CHECK(t.privacy_statement() == "epsilon " + privacy::format_epsilon(t.epsilon()) +
                                     " (delta 0.0001, pld accountant, add/remove-one neighbours)");
  CHECK(std::stod(t.privacy_statement().substr(8)) >= t.epsilon());
  const auto j = t.privacy_json(2.5);
  CHECK(j["private"] == true);
  CHECK(j["epsilon"] == 2.5);
  CHECK(j["neighbouring"] == "add/remove-one");
  CHECK_FALSE(j.contains("privacy_note"));
  CHECK(t.privacy_json(INFINITY)["epsilon"] == "inf");
  const std::vector<std::string> lines = t.describe();
  REQUIRE_FALSE(lines.empty());
  CHECK(lines[0].find("neighbours; noise, sampling and directions: secure") != std::string::npos);

  c.reproducible_noise = true;  // by name: not private, and every statement says so
  auto m2 = make_mlp<double>({8, 4, 3}, Activation::tanh, init);
  SgdT<double> sgd2(m2->parameters(), 0.05, 0.5);
  PrivateTrainerT<double> r(*m2, sgd2, train, c);
  CHECK(r.privacy_statement().find(std::string("(") + kNotPrivateReproducible + ")") != std::string::npos);
  CHECK(r.privacy_json()["private"] == false);
  CHECK(r.privacy_json()["privacy_note"] == kNotPrivateReproducible);

  c.reproducible_noise = false;  // no noise: no epsilon at all
  c.noise_multiplier = 0.0;
  c.allow_no_noise = true;
  auto m3 = make_mlp<double>({8, 4, 3}, Activation::tanh, init);
  SgdT<double> sgd3(m3->parameters(), 0.05, 0.5);
  PrivateTrainerT<double> z(*m3, sgd3, train, c);
  CHECK(z.privacy_statement() == "NOT private: no noise");
  CHECK_FALSE(z.privacy_json().contains("epsilon"));

  PrivateTrainingConfigT<double> np;  // non-private
  np.non_private = true;
  np.epochs = 1;
  np.batch_size = 40;
  np.ema = 0.5;
  np.lr_final = 0.01;
  auto m4 = make_mlp<double>({8, 4, 3}, Activation::tanh, init);
  SgdT<double> sgd4(m4->parameters(), 0.05, 0.5);
  sgd4.set_lr_scale(0, 2.0);
  sgd4.set_lr_scale(2, 2.0);
  PrivateTrainerT<double> n(*m4, sgd4, train, np);
  CHECK(n.privacy_statement() == "non-private");
  const std::vector<std::string> plain = n.describe();
  CHECK(plain.front().rfind("non-private training", 0) == 0);
  // what is done with the gradients: the optimizer, its schedule and scales, the average
  const auto has = [&](const std::string& text) {
    return std::any_of(plain.begin(), plain.end(), [&](const std::string& l) { return l == text; });
  };
  CHECK(has("optimizer momentum at lr 0.05, cosine down to 0.01; lr x2 for " + m4->parameters()[0].name() + ", " +
            m4->parameters()[2].name()));
  CHECK(has("evaluating the parameters' moving average (decay 0.5; no privacy cost)"));
  CHECK(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l == "optimizer momentum at lr 0.05 (post-processing: no privacy cost)";
  }));
}

TEST_CASE("losses: closed forms, and every strategy agrees with the loop under MSE and BCE") {
  FastRng init(14), data(15);
  BatchT<double> b;
  b.inputs = randn<double>({4, 5}, data);
  b.targets = randn<double>({4, 3}, data);
  auto model = make_mlp<double>({5, 7, 3}, Activation::tanh, init);
  model->set_loss(mse_loss<double>());
  {
    const TensorT<double> out = model->forward(b);
    const ArrayT<double> l = model->row_losses(out, b).value();
    for (std::size_t i = 0; i < 4; ++i) {
      double want = 0;
      for (std::size_t j = 0; j < 3; ++j) want += std::pow(out.value()(i, j) - b.targets(i, j), 2) / 3;
      CHECK(l(i) == doctest::Approx(want).epsilon(1e-12));
    }
  }
  PerSampleCheck mse = check_per_sample(*model, b);
  INFO(mse.str());
  CHECK(mse.agrees(1e-9));
  // BCE with logits: targets in [0, 1]; large logits stay finite
  for (auto& v : b.targets) v = v > 0 ? 1.0 : 0.25;
  model->set_loss(bce_with_logits_loss<double>());
  {
    const TensorT<double> out = model->forward(b);
    const ArrayT<double> l = model->row_losses(out, b).value();
    for (std::size_t i = 0; i < 4; ++i) {
      double want = 0;
      for (std::size_t j = 0; j < 3; ++j) {
        const double z = out.value()(i, j), y = b.targets(i, j), s = 1 / (1 + std::exp(-z));
        want += (-y * std::log(s) - (1 - y) * std::log(1 - s)) / 3;
      }
      CHECK(l(i) == doctest::Approx(want).epsilon(1e-10));
    }
    BatchT<double> huge = b;
    TensorT<double> z = constant<double>(ArrayT<double>(xt::xarray<double>({{800.0, -800.0, 0.0}})));
    huge.targets = xt::xarray<double>({{1.0, 0.0, 0.5}});
    huge.inputs = randn<double>({1, 5}, data);
    const double v = model->row_losses(z, huge).value()(0);
    CHECK(std::isfinite(v));
    CHECK(v == doctest::Approx(std::log(2.0) / 3).epsilon(1e-12));
  }
  PerSampleCheck bce = check_per_sample(*model, b);
  INFO(bce.str());
  CHECK(bce.agrees(1e-9));
  // wrong targets are named
  BatchT<double> bad = b;
  bad.targets = randn<double>({4, 2}, data);
  test::check_error<std::invalid_argument>([&] { model->row_losses(model->forward(bad), bad); }, {"targets of shape"});
  bad.targets(0, 0) = 2.0;
  model->set_loss(nullptr);
  BatchT<double> unlabelled = b;
  test::check_error<std::invalid_argument>([&] { model->row_losses(model->forward(unlabelled), unlabelled); },
                                           {"no class labels"});
}

TEST_CASE("private trainer: the default delta keeps delta N <= 0.6; a delta of 1/N or more only when asked for") {
  FastRng init(41), data(42);
  auto model = make_mlp<double>({8, 3}, Activation::relu, init);
  SgdT<double> sgd(model->parameters(), 0.1);
  auto trainer_delta = [&](std::size_t n, std::optional<double> delta, bool allow) {
    const BatchT<double> train = separable<double>(n, data);
    PrivateTrainingConfigT<double> c;
    c.noise_multiplier = 2.0;
    c.batch_size = 5;
    c.delta = delta;
    c.allow_large_delta = allow;
    PrivateTrainerT<double> t(*model, sgd, train, c);
    return std::pair{t.delta(), t.warnings()};
  };
  CHECK(trainer_delta(999, {}, false).first == doctest::Approx(1e-4));  // not 1e-3: 0.999 records
  CHECK(trainer_delta(600, {}, false).first == doctest::Approx(1e-3));
  CHECK(trainer_delta(601, {}, false).first == doctest::Approx(1e-4));
  CHECK(trainer_delta(100, {}, false).second.empty());
  // Fashion-MNIST's size keeps the conventional 1e-5 (6e4 x 1e-5 = 0.6)
  CHECK(default_delta_for(60000) == doctest::Approx(1e-5));
  CHECK(default_delta_for(60001) == doctest::Approx(1e-6));
  test::check_error<std::invalid_argument>([&] { trainer_delta(100, 0.99, false); },
                                           {"delta 0.99 is at least 1/N for N = 100", "allow_large_delta"});
  test::check_error<std::invalid_argument>([&] { trainer_delta(100, 0.01, false); }, {"at least 1/N"});
  const auto [d, warnings] = trainer_delta(100, 0.01, true);
  CHECK(d == 0.01);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("published exactly") != std::string::npos);
  CHECK(trainer_delta(100, 0.0099, false).second.empty());
}

TEST_CASE("private trainer: evaluate() reports the metrics that fit the loss, and the user's") {
  FastRng init(21), data(22);
  BatchT<double> train = separable<double>(300, data);
  PrivateTrainingConfigT<double> c;
  c.non_private = true;
  c.epochs = 1;
  c.batch_size = 50;
  BatchT<double> test = separable<double>(120, data);
  auto outputs_of = [](PrivateTrainerT<double>& t, const BatchT<double>& b) { return t.predict(b); };
  SUBCASE("cross-entropy: accuracy, as before") {
    auto model = make_mlp<double>({8, 3}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainerT<double> t(*model, sgd, train, c);
    const Evaluation e = t.evaluate(test, 7);
    REQUIRE(e.metrics.size() == 1);
    CHECK(e.metrics[0].first == "accuracy");
    CHECK(e.metric("accuracy") == e.accuracy);
    CHECK(e.accuracy >= 0);
    CHECK(e.str().find("accuracy ") != std::string::npos);
    test::check_error<std::out_of_range>([&] { e.metric("auc"); }, {"no metric 'auc'", "there are: accuracy"});
  }
  SUBCASE("BCE with logits: accuracy at 0.5 and AUC, against a direct count") {
    auto model = make_mlp<double>({8, 2}, Activation::relu, init);
    model->set_loss(bce_with_logits_loss<double>());
    CHECK(model->loss_name() == "bce_with_logits");
    auto targets = [](const BatchT<double>& b) {
      ArrayT<double> y = xt::zeros<double>({b.examples(), std::size_t(2)});
      for (std::size_t i = 0; i < b.examples(); ++i) y(i, 0) = b.labels[i] == 2, y(i, 1) = b.labels[i] == 0 ? 0.75 : 0.25;
      return y;
    };
    train.targets = targets(train);
    test.targets = targets(test);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainerT<double> t(*model, sgd, train, c);
    t.train();
    const Evaluation e = t.evaluate(test, 7);
    REQUIRE(e.metrics.size() == 2);
    const ArrayT<double> z = outputs_of(t, test);
    double hits = 0, pairs = 0, wins = 0;
    std::vector<std::pair<double, bool>> all;
    for (std::size_t i = 0; i < z.size(); ++i) {
      const bool pos = test.targets.data()[i] >= 0.5;
      hits += (1 / (1 + std::exp(-z.data()[i])) > 0.5) == pos;
      all.emplace_back(z.data()[i], pos);
    }
    for (const auto& [zp, p] : all)  // every (positive, negative) pair: 1 when ordered, 1/2 when tied
      for (const auto& [zn, q] : all)
        if (p && !q) pairs += 1, wins += zp > zn ? 1.0 : zp == zn ? 0.5 : 0.0;
    CHECK(e.metric("accuracy@0.5") == doctest::Approx(hits / double(z.size())));
    CHECK(e.accuracy == e.metric("accuracy@0.5"));
    CHECK(e.metric("auc") == doctest::Approx(wins / pairs));
    // one class only: no AUC to give, said as NaN
    BatchT<double> one = test;
    one.targets = xt::ones<double>({test.examples(), std::size_t(2)});
    CHECK(std::isnan(t.evaluate(one).metric("auc")));
  }
  SUBCASE("MSE: mse and mae over every output; no accuracy") {
    auto model = make_mlp<double>({8, 3}, Activation::relu, init);
    model->set_loss(mse_loss<double>());
    train.targets = randn<double>({300, 3}, data);
    test.targets = randn<double>({120, 3}, data);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainerT<double> t(*model, sgd, train, c);
    const Evaluation e = t.evaluate(test, 7);
    const ArrayT<double> z = outputs_of(t, test);
    const ArrayT<double> d = z - test.targets;
    CHECK(e.metric("mse") == doctest::Approx(double(xt::mean(d * d)())));
    CHECK(e.metric("mae") == doctest::Approx(double(xt::mean(xt::abs(d))())));
    CHECK(e.loss == doctest::Approx(e.metric("mse")));  // the loss is the row mean of the same squares
    CHECK(std::isnan(e.accuracy));
    CHECK_FALSE(e.has("accuracy"));
  }
  SUBCASE("the user's metrics, after the built-in ones; bad names refused") {
    auto model = make_mlp<double>({8, 3}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainerT<double> t(*model, sgd, train, c);
    std::size_t rows_seen = 0;
    t.add_metric("largest output", [&](const ArrayT<double>& out, const BatchT<double>& b) {
      rows_seen = out.shape()[0];
      CHECK(b.examples() == 120);
      return double(xt::amax(out)());
    });
    const Evaluation e = t.evaluate(test, 7);  // chunks of 7: the metric sees them joined
    REQUIRE(e.metrics.size() == 2);
    CHECK(e.metrics[1].first == "largest output");
    CHECK(rows_seen == 120);
    CHECK(e.metric("largest output") == double(xt::amax(t.predict(test))()));
    test::check_error<std::invalid_argument>([&] { t.add_metric("auc", [](const auto&, const auto&) { return 0.0; }); },
                                             {"'auc' is a built-in metric's name"});
    test::check_error<std::invalid_argument>(
        [&] { t.add_metric("largest output", [](const auto&, const auto&) { return 0.0; }); }, {"added already"});
    test::check_error<std::invalid_argument>([&] { t.add_metric("", [](const auto&, const auto&) { return 0.0; }); },
                                             {"needs a name"});
    test::check_error<std::invalid_argument>([&] { t.add_metric("x", nullptr); }, {"has no function"});
  }
}
