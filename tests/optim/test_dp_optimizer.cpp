// DP optimizer and samplers: noise of the right size, explicit-only zero noise,
// the accountant ledger it writes, DP-SAT's perturbed gradients, sampling
// frequencies, and bad hyperparameters.
#include <cmath>
#include <set>

#include <doctest/doctest.h>

#include "layers/dense.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/sampler.hpp"
#include "privacy/accountant.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using A = ArrayT<double>;

namespace {
std::unique_ptr<ModelT<double>> tiny_model(Rng& rng) {
  SequentialT<double> net;
  net.emplace<DenseT<double>>(50, 40, rng, "d");
  return std::make_unique<FeatureModelT<double>>("tiny", std::move(net));
}
}  // namespace

TEST_CASE("dp optimizer: the noise has standard deviation sigma * C (divided by L)") {
  FastRng init(1), noise(2), aux(3);
  auto model = tiny_model(init);
  auto before = model->parameters()[0].value();
  SgdT<double> sgd(model->parameters(), 1.0);
  auto strategy = make_clip_strategy<double>("ghost");
  DPConfig cfg{0.7, 1.3, 0.01, 10.0};
  DPOptimizerT<double> dp(*model, sgd, *strategy, cfg, noise, aux, nullptr);
  BatchT<double> empty;  // the clipped sum is zero: the update is pure noise / L
  empty.inputs = xt::zeros<double>({0, 50});
  StepStats st = dp.step(empty);
  CHECK(st.noise_std == doctest::Approx(0.91));
  CHECK(dp.noise_variance() == doctest::Approx(0.091 * 0.091));  // (sigma C / L)^2, what DP-AdamBC subtracts
  A delta = (before - model->parameters()[0].value()) * 10.0;  // = noise
  double n = double(delta.size()), m = xt::mean(delta)(), var = xt::variance(delta)();
  CHECK(std::abs(m) < 4 * 0.91 / std::sqrt(n));
  // the sample variance of n = 2000 normals has relative s.e. sqrt(2/n) = 3.2%
  CHECK(std::sqrt(var) == doctest::Approx(0.91).epsilon(4 * std::sqrt(2 / n)));
}

TEST_CASE("dp optimizer: gradient energy is what the base optimizer got; pure noise has signal/noise 0") {
  FastRng init(11), noise(12), aux(13), data(14);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 1.0);  // lr 1, no momentum: the step is the gradient
  auto strategy = make_clip_strategy<double>("ghost");
  DPOptimizerT<double> dp(*model, sgd, *strategy, DPConfig{0.7, 1.3, 0.01, 10.0}, noise, aux, nullptr);
  BatchT<double> batch;
  batch.inputs = A(xt::zeros<double>({6, 50}));
  for (auto& v : batch.inputs) v = data.normal();
  batch.labels = {0, 3, 1, 7, 2, 3};
  auto ps = model->parameters();
  std::vector<A> before{ps[0].value(), ps[1].value()};
  dp.step(batch);
  auto e = dp.gradient_energy();
  REQUIRE(e.size() == 2);
  CHECK(e[0].name == "d.weight");
  CHECK(e[0].size == 2000);
  CHECK(e[1].size == 40);
  for (std::size_t i = 0; i < 2; ++i) {
    const A step = before[i] - ps[i].value();
    CHECK(e[i].noised == doctest::Approx(double(xt::sum(step * step)())).epsilon(1e-12));
    CHECK(e[i].noise == doctest::Approx(double(e[i].size) * 0.091 * 0.091));
  }
  dp.reset_gradient_energy();
  CHECK(dp.gradient_energy()[0].noised == 0.0);
  // steps without examples are pure noise: noised / noise -> 1, the ratio -> 0
  BatchT<double> empty;
  empty.inputs = xt::zeros<double>({0, 50});
  const int steps = 25;
  for (int t = 0; t < steps; ++t) dp.step(empty);
  e = dp.gradient_energy();
  // the mean of 2000 x 25 squared normals has relative s.e. sqrt(2 / 50000) = 0.63%
  CHECK(std::abs(e[0].snr()) < 4 * std::sqrt(2.0 / (2000.0 * steps)));
  CHECK(std::abs(e[1].snr()) < 4 * std::sqrt(2.0 / (40.0 * steps)));
  // without noise there is no ratio
  DPOptimizerT<double> silent(*model, sgd, *strategy, DPConfig{0.7, 0.0, 0.01, 10.0, true}, noise, aux, nullptr);
  silent.step(batch);
  CHECK(silent.gradient_energy()[0].noise == 0.0);
  CHECK(silent.gradient_energy()[0].noised > 0.0);
  CHECK(std::isnan(silent.gradient_energy()[0].snr()));
}

TEST_CASE("dp optimizer: zero noise only when asked for, and bad hyperparameters") {
  FastRng init(4), noise(5), aux(6);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  auto strategy = make_clip_strategy<double>("vanilla");
  auto make = [&](DPConfig c) { return DPOptimizerT<double>(*model, sgd, *strategy, c, noise, aux, nullptr); };
  CHECK_THROWS_WITH_AS(make({1.0, 0.0, 0.1, 5}), doctest::Contains("NOT private"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({0.0, 1.0, 0.1, 5}), doctest::Contains("clip norm"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({-1.0, 1.0, 0.1, 5}), doctest::Contains("clip norm"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({1.0, -0.5, 0.1, 5}), doctest::Contains("noise multiplier"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({1.0, 1.0, 0.0, 5}), doctest::Contains("sampling rate"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({1.0, 1.0, 1.5, 5}), doctest::Contains("sampling rate"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({1.0, 1.0, 0.1, 0}), doctest::Contains("expected batch"), std::invalid_argument);
  DPConfig none{1.0, 0.0, 0.1, 5, true};
  auto dp = make(none);
  CHECK_FALSE(dp.is_private());
  CHECK(dp.noise_variance() == 0.0);
  auto before = model->parameters()[0].value();
  BatchT<double> empty;
  empty.inputs = xt::zeros<double>({0, 50});
  dp.step(empty);
  CHECK(xt::amax(xt::abs(before - model->parameters()[0].value()))() == 0.0);
}

TEST_CASE("dp optimizer: each step is reported to the accountant with the accounted sigma") {
  FastRng init(7), noise(8), aux(9), data(10);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  BatchT<double> b;
  b.inputs = test::randn<double>({4, 50}, data);
  b.labels = {0, 1, 2, 3};
  b.ids = {0, 1, 2, 3};
  struct Case { std::string strategy; double sigma; int jl; };
  for (auto c : {Case{"ghost", 1.1, 0}, Case{"microbatch:2", 0.55, 0}, Case{"jl:3", 1.1, 3}}) {
    CAPTURE(c.strategy);
    auto acc = privacy::make_accountant("pld");
    auto strategy = make_clip_strategy<double>(c.strategy, 4);
    DPOptimizerT<double> dp(*model, sgd, *strategy, {1.0, 1.1, 0.004, 4}, noise, aux, acc.get());
    dp.step(b);
    dp.step(b);
    REQUIRE(acc->ledger().size() == 1);
    CHECK(acc->ledger()[0].count == 2);
    CHECK(acc->ledger()[0].sampling_rate == 0.004);
    CHECK(acc->ledger()[0].noise_multiplier == doctest::Approx(c.sigma));
    CHECK(acc->ledger()[0].jl_dim == c.jl);
  }
}

TEST_CASE("dp optimizer: DP-SAT takes the gradients at theta + rho g / ||g||, g the last noised gradient") {
  FastRng init(11), noise(12), aux(13), data(14);
  auto model = tiny_model(init);
  BatchT<double> b;
  b.inputs = test::randn<double>({6, 50}, data);
  b.labels = {0, 1, 2, 3, 4, 5};
  b.ids = {0, 1, 2, 3, 4, 5};
  const double lr = 0.1, rho = 0.3, clip = 0.5;
  auto params = model->parameters();
  std::vector<A> theta0;
  for (const auto& p : params) theta0.push_back(p.value());
  auto set_params = [&](const std::vector<A>& v) {
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_value() = v[i];
  };
  auto strategy = make_clip_strategy<double>("ghost");
  // the reference, step by step: g1 at theta0 (plus noise), then g2 at theta1 + rho g1 / ||g1||
  FastRng noise_ref(12), aux_ref(13);
  auto noised = [&](const std::vector<A>& at) {
    set_params(at);
    ClipResult<double> r = strategy->clipped_sum(*model, b, clip, aux_ref);
    std::vector<A> g;
    for (auto& s : r.sum) {
      A n = A::from_shape(s.shape());
      noise_ref.fill_normal(n.data(), n.size(), 1.2 * clip);
      g.push_back((s + n) / 6.0);
    }
    return g;
  };
  std::vector<A> g1 = noised(theta0), theta1, perturbed;
  double norm2 = 0;
  for (const auto& g : g1) norm2 += xt::sum(g * g)();
  for (std::size_t i = 0; i < g1.size(); ++i) {
    theta1.push_back(theta0[i] - lr * g1[i]);
    perturbed.push_back(theta1[i] + rho / std::sqrt(norm2) * g1[i]);
  }
  std::vector<A> g2 = noised(perturbed), theta2;
  for (std::size_t i = 0; i < g2.size(); ++i) theta2.push_back(theta1[i] - lr * g2[i]);

  set_params(theta0);
  SgdT<double> sgd(params, lr);
  DPOptimizerT<double> dp(*model, sgd, *strategy, {clip, 1.2, 0.01, 6, false, rho}, noise, aux, nullptr);
  REQUIRE(dp.sat_direction().size() == params.size());
  CHECK(xt::amax(xt::abs(dp.sat_direction()[0]))() == 0.0);  // no direction before the first step
  dp.step(b);  // the first step is plain DP-SGD
  for (std::size_t i = 0; i < params.size(); ++i) {
    DPGRAD_CHECK_CLOSE(params[i].value(), theta1[i], 1e-12);
    DPGRAD_CHECK_CLOSE(dp.sat_direction()[i], g1[i], 1e-12);
  }
  dp.step(b);
  for (std::size_t i = 0; i < params.size(); ++i) DPGRAD_CHECK_CLOSE(params[i].value(), theta2[i], 1e-12);

  // rho 0 keeps no direction and changes nothing; a negative or infinite rho is refused
  DPOptimizerT<double> plain(*model, sgd, *strategy, {clip, 1.2, 0.01, 6}, noise, aux, nullptr);
  CHECK(plain.sat_direction().empty());
  auto make = [&](double r) { return DPOptimizerT<double>(*model, sgd, *strategy, {clip, 1.2, 0.01, 6, false, r}, noise, aux, nullptr); };
  CHECK_THROWS_WITH_AS(make(-0.1), doctest::Contains("rho"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make(INFINITY), doctest::Contains("rho"), std::invalid_argument);
}

TEST_CASE("samplers: Poisson frequencies match q") {
  FastRng rng(11);
  auto s = make_sampler("poisson", 1000, 50);
  CHECK(s->sampling_rate() == 0.05);
  std::vector<int> hits(1000);
  double total = 0;
  const int draws = 4000;
  for (int t = 0; t < draws; ++t) {
    auto idx = s->next(rng);
    total += double(idx.size());
    std::set<std::size_t> uniq(idx.begin(), idx.end());
    REQUIRE(uniq.size() == idx.size());
    for (auto i : idx) hits[i]++;
  }
  // batch size ~ Binomial(1000, 0.05): mean 50, s.e. of the mean sqrt(47.5 / 4000)
  CHECK(std::abs(total / draws - 50) < 4 * std::sqrt(47.5 / draws));
  // every example's frequency within 5 s.e. of q (s.e. = sqrt(q(1-q)/draws) = 0.0034)
  for (int h : hits) CHECK(std::abs(double(h) / draws - 0.05) < 5 * 0.00345);
}

TEST_CASE("samplers: shuffle visits each example at most once per epoch; fixed draws distinct examples") {
  FastRng rng(12);
  auto s = make_sampler("shuffle", 100, 8, 0.5);  // floor(0.5 * 100 / 8) = 6 batches per epoch
  CHECK(s->steps_per_epoch() == 6);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::set<std::size_t> seen;
    for (int t = 0; t < 6; ++t)
      for (auto i : s->next(rng)) {
        CHECK(i < 100);
        CHECK(seen.insert(i).second);
      }
    CHECK(seen.size() == 48);
  }
  auto f = make_sampler("fixed", 20, 7);
  std::vector<int> hits(20);
  for (int t = 0; t < 3000; ++t) {
    auto idx = f->next(rng);
    std::set<std::size_t> uniq(idx.begin(), idx.end());
    CHECK(uniq.size() == 7);
    for (auto i : idx) hits.at(i)++;
  }
  for (int h : hits) CHECK(std::abs(double(h) / 3000 - 0.35) < 5 * std::sqrt(0.35 * 0.65 / 3000));
}

TEST_CASE("samplers: mismatched accountants and bad sizes are refused") {
  auto p = make_sampler("poisson", 100, 10);
  CHECK_NOTHROW(check_accountant_matches(*p, "pld"));
  CHECK_THROWS_WITH_AS(check_accountant_matches(*p, "wor"), doctest::Contains("poisson"), std::invalid_argument);
  auto f = make_sampler("fixed", 100, 10);
  CHECK_THROWS_AS(check_accountant_matches(*f, "rdp"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_sampler("poisson", 0, 1), doctest::Contains("empty"), std::invalid_argument);
  CHECK_THROWS_AS(make_sampler("poisson", 10, 11), std::invalid_argument);
  CHECK_THROWS_AS(make_sampler("shuffle", 10, 2, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(make_sampler("random", 10, 2), std::invalid_argument);
}

TEST_CASE("dp optimizer: microbatches count their 2C once, under add/remove and replace-one alike") {
  // add/remove (rdp, pld): vanilla C, microbatch 2C, so sigma / 2. replace-one (wor, shuffle):
  // 2C for both, already inside the accountants' formula, so sigma itself (not sigma / 2).
  FastRng init(7), noise(8), aux(9), data(10);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  BatchT<double> b;
  b.inputs = test::randn<double>({4, 50}, data);
  b.labels = {0, 1, 2, 3};
  b.ids = {0, 1, 2, 3};
  privacy::AccountantOptions opts;
  opts.dataset_size = 1000;
  opts.batch_size = 4;
  opts.epoch_fraction = 0.5;
  struct Case { std::string accountant, strategy; double sigma; };
  for (auto c : {Case{"rdp", "ghost", 1.1}, Case{"rdp", "microbatch:2", 0.55}, Case{"pld", "microbatch:2", 0.55},
                 Case{"wor", "ghost", 1.1}, Case{"wor", "microbatch:2", 1.1}, Case{"shuffle", "microbatch:2", 1.1}}) {
    CAPTURE(c.accountant);
    CAPTURE(c.strategy);
    auto acc = privacy::make_accountant(c.accountant, opts);
    auto strategy = make_clip_strategy<double>(c.strategy, 4);
    DPOptimizerT<double> dp(*model, sgd, *strategy, {1.0, 1.1, 0.004, 4}, noise, aux, acc.get());
    dp.step(b);
    REQUIRE(acc->ledger().size() == 1);
    CHECK(acc->ledger()[0].noise_multiplier == doctest::Approx(c.sigma));
    CHECK(dp.accounted_noise_multiplier() == doctest::Approx(c.sigma));
  }
}
