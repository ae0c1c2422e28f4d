// DP optimizer and samplers: noise of the right size, released on its grid,
// explicit-only zero noise, the accountant ledger it writes, DP-SAT's perturbed
// gradients, sampling frequencies, and bad hyperparameters.
#include <cmath>
#include <set>

#include <doctest/doctest.h>

#include "engine/grid_noise.hpp"
#include "engine/random.hpp"
#include "layers/dense.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/sampling/sampler.hpp"
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

/// Four random examples of tiny_model's input, ids 0..3.
BatchT<double> four_examples(Rng& rng) {
  BatchT<double> b;
  b.inputs = test::randn<double>({4, 50}, rng);
  b.labels = {0, 1, 2, 3};
  b.ids = {0, 1, 2, 3};
  return b;
}

/// A sampler that reports any rate and batch size (draws nothing): what a user's sampler might claim.
struct ClaimedRate final : Sampler {
  double q, L;
  ClaimedRate(double q_, double L_) : q(q_), L(L_) {}
  std::string name() const override { return "claimed"; }
  long steps_per_epoch() const override { return 1; }
  double sampling_rate() const override { return q; }
  double expected_batch_size() const override { return L; }
  std::vector<std::string> accountants() const override { return {"rdp", "pld"}; }

 protected:
  std::vector<std::size_t> draw(Rng&) override { return {}; }
};
}  // namespace

TEST_CASE("dp optimizer: the noise has standard deviation sigma * C (divided by L)") {
  FastRng init(1);
  ReproducibleRng noise(2), aux(3);
  auto model = tiny_model(init);
  auto before = model->parameters()[0].value();
  SgdT<double> sgd(model->parameters(), 1.0);
  auto strategy = make_clip_strategy<double>("ghost");
  DPConfig cfg{0.7, 1.3};
  auto sampler = make_sampler("poisson", 1000, 10);  // q 0.01, L 10
  DPOptimizerT<double> dp(*model, sgd, *strategy, cfg, *sampler, noise, aux, nullptr);
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
  FastRng init(11), data(14);
  ReproducibleRng noise(12), aux(13);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 1.0);  // lr 1, no momentum: the step is the gradient
  auto strategy = make_clip_strategy<double>("ghost");
  auto sampler = make_sampler("poisson", 1000, 10);
  DPOptimizerT<double> dp(*model, sgd, *strategy, DPConfig{0.7, 1.3}, *sampler, noise, aux, nullptr);
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
  DPOptimizerT<double> silent(*model, sgd, *strategy, DPConfig{0.7, 0.0, true}, *sampler, noise, aux, nullptr);
  silent.step(batch);
  CHECK(silent.gradient_energy()[0].noise == 0.0);
  CHECK(silent.gradient_energy()[0].noised > 0.0);
  CHECK(std::isnan(silent.gradient_energy()[0].snr()));
}

TEST_CASE("dp optimizer: zero noise only when asked for, and bad hyperparameters") {
  FastRng init(4);
  ReproducibleRng noise(5), aux(6);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  auto strategy = make_clip_strategy<double>("vanilla");
  ClaimedRate sampler(0.1, 5);
  auto make = [&](DPConfig c, const Sampler& s) {
    return DPOptimizerT<double>(*model, sgd, *strategy, c, s, noise, aux, nullptr);
  };
  CHECK_THROWS_WITH_AS(make({1.0, 0.0}, sampler), doctest::Contains("NOT private"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({0.0, 1.0}, sampler), doctest::Contains("clip norm"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({-1.0, 1.0}, sampler), doctest::Contains("clip norm"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({1.0, -0.5}, sampler), doctest::Contains("noise multiplier"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({1.0, 1.0}, ClaimedRate(0.0, 5)), doctest::Contains("sampling rate"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({1.0, 1.0}, ClaimedRate(1.5, 5)), doctest::Contains("sampling rate"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make({1.0, 1.0}, ClaimedRate(0.1, 0)), doctest::Contains("expected batch"), std::invalid_argument);
  DPConfig none{1.0, 0.0, true};
  auto dp = make(none, sampler);
  CHECK_FALSE(dp.is_private());
  CHECK(dp.noise_variance() == 0.0);
  auto before = model->parameters()[0].value();
  BatchT<double> empty;
  empty.inputs = xt::zeros<double>({0, 50});
  dp.step(empty);
  CHECK(xt::amax(xt::abs(before - model->parameters()[0].value()))() == 0.0);
}

TEST_CASE("dp optimizer: each step is reported to the accountant with the accounted sigma") {
  FastRng init(7), data(10);
  ReproducibleRng noise(8), aux(9);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  const BatchT<double> b = four_examples(data);
  struct Case { std::string strategy; double sigma; int jl; };
  for (auto c : {Case{"ghost", 1.1, 0}, Case{"microbatch:2", 0.55, 0}, Case{"jl:3", 1.1, 3}}) {
    CAPTURE(c.strategy);
    auto acc = privacy::make_accountant("pld");
    auto strategy = make_clip_strategy<double>(c.strategy, 4);
    auto sampler = make_sampler("poisson", 1000, 4);  // q 0.004: the rate the ledger must show
    DPOptimizerT<double> dp(*model, sgd, *strategy, {1.0, 1.1}, *sampler, noise, aux, acc.get());
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
  FastRng init(11), data(14);
  ReproducibleRng noise(12), aux(13);
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
  // (the noise: the sum clipped to C less the grid's allowance, rounded to the grid, plus grid * k)
  ReproducibleRng noise_ref(12), aux_ref(13);
  const NoiseGrid grid = noise_grid(1.2 * clip);
  const double grid_clip = clip - grid.grid * (std::sqrt(2040.0) + 1);
  auto noised = [&](const std::vector<A>& at) {
    set_params(at);
    ClipResult<double> r = strategy->clipped_sum(*model, b, grid_clip, aux_ref);
    std::vector<A> g;
    auto step = noise_ref.split();  // each array (one noise block here) from its own split of the step's
    for (auto& s : r.sum) {
      A n = s;
      add_grid_noise(*step->split(), grid, n.data(), n.size());
      g.push_back(n / 6.0);
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
  ClaimedRate sampler(0.01, 6);
  DPOptimizerT<double> dp(*model, sgd, *strategy, {clip, 1.2, false, rho}, sampler, noise, aux, nullptr);
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
  DPOptimizerT<double> plain(*model, sgd, *strategy, {clip, 1.2}, sampler, noise, aux, nullptr);
  CHECK(plain.sat_direction().empty());
  auto make = [&](double r) {
    return DPOptimizerT<double>(*model, sgd, *strategy, {clip, 1.2, false, r}, sampler, noise, aux, nullptr);
  };
  CHECK_THROWS_WITH_AS(make(-0.1), doctest::Contains("rho"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make(INFINITY), doctest::Contains("rho"), std::invalid_argument);
}

TEST_CASE("samplers: Poisson frequencies match q") {
  ReproducibleRng rng(11);
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
  ReproducibleRng rng(12);
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

TEST_CASE("privacy by default: noise, directions and sampling refuse a seeded generator unless asked for by name") {
  FastRng init(21), seeded(22);
  ReproducibleRng named(23);
  SecureRng secure, secure2;
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  auto strategy = make_clip_strategy<double>("ghost");
  auto sampler = make_sampler("poisson", 1000, 10);
  auto make = [&](Rng& noise, Rng& aux) {
    return DPOptimizerT<double>(*model, sgd, *strategy, {1.0, 1.0}, *sampler, noise, aux, nullptr);
  };
  CHECK_THROWS_WITH_AS(make(seeded, secure), doctest::Contains("noise generator"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make(secure, seeded), doctest::Contains("direction"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sampler->next(seeded), doctest::Contains("sampling generator"), std::invalid_argument);
  // the secure generator: private
  auto dp = make(secure, secure2);
  CHECK(dp.is_private());
  CHECK_FALSE(dp.noise_reproducible());
  CHECK_NOTHROW(sampler->next(secure));
  // the named opt-in: accepted, the mechanism still runs and is accounted, but the run is not private
  auto rep = make(named, secure);
  CHECK(rep.adds_noise());
  CHECK_FALSE(rep.is_private());
  CHECK(rep.noise_reproducible());
  CHECK_NOTHROW(sampler->next(named));
  CHECK(named.describe().find(kNotPrivateReproducible) != std::string::npos);
  // and the library's default for privacy randomness is the secure generator
  CHECK(make_private_rng(false, 1)->secure());
  CHECK(make_private_rng(true, 1)->reproducible_opt_in());
}

TEST_CASE("privacy by default: two secure runs draw different noise; two named reproducible runs the same") {
  auto final_params = [](Rng& noise, Rng& aux) {
    FastRng init(31);
    auto model = tiny_model(init);
    SgdT<double> sgd(model->parameters(), 1.0);
    auto strategy = make_clip_strategy<double>("ghost");
    auto sampler = make_sampler("poisson", 1000, 10);
    DPOptimizerT<double> dp(*model, sgd, *strategy, {1.0, 1.0}, *sampler, noise, aux, nullptr);
    BatchT<double> empty;
    empty.inputs = xt::zeros<double>({0, 50});
    for (int t = 0; t < 3; ++t) dp.step(empty);
    return A(model->parameters()[0].value());
  };
  SecureRng s1, s2, s3, s4;
  CHECK(xt::amax(xt::abs(final_params(s1, s2) - final_params(s3, s4)))() > 0.0);
  ReproducibleRng r1(5), r2(6), r3(5), r4(6);
  CHECK(xt::amax(xt::abs(final_params(r1, r2) - final_params(r3, r4)))() == 0.0);
}

TEST_CASE("dp optimizer: the accountant must analyse the sampler that draws the batches") {
  FastRng init(41);
  ReproducibleRng noise(42), aux(43);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  auto ghost = make_clip_strategy<double>("ghost");
  auto fixed = make_sampler("fixed", 1000, 10);
  auto rdp = privacy::make_accountant("rdp");
  CHECK_THROWS_WITH_AS(DPOptimizerT<double>(*model, sgd, *ghost, {1.0, 1.0}, *fixed, noise, aux, rdp.get()),
                       doctest::Contains("fixed"), std::invalid_argument);
  auto poisson = make_sampler("poisson", 1000, 10);
  auto jl = make_clip_strategy<double>("jl:2");
  CHECK_THROWS_WITH_AS(DPOptimizerT<double>(*model, sgd, *jl, {1.0, 1.0}, *poisson, noise, aux, rdp.get()),
                       doctest::Contains("jl"), std::invalid_argument);
  CHECK_NOTHROW(DPOptimizerT<double>(*model, sgd, *ghost, {1.0, 1.0}, *poisson, noise, aux, rdp.get()));
  // an approximation (the CLT's gdp) is no upper bound: it cannot account a private optimizer
  auto gdp = privacy::make_accountant("gdp");
  CHECK_THROWS_WITH_AS(DPOptimizerT<double>(*model, sgd, *ghost, {1.0, 1.0}, *poisson, noise, aux, gdp.get()),
                       doctest::Contains("not an upper bound"), std::invalid_argument);
}

TEST_CASE("dp optimizer: the released gradient is the clipped sum rounded to the noise grid plus grid * k") {
  // 2040 coordinates: one noise block; 127,440: the first layer's 70,000 weights in two blocks, five in all
  for (std::size_t hidden : {std::size_t(0), std::size_t(1400)}) {
    CAPTURE(hidden);
    FastRng init(21), data(24);
    ReproducibleRng noise(22), aux(23);
    std::unique_ptr<ModelT<double>> model;
    if (hidden == 0) {
      model = tiny_model(init);
    } else {
      SequentialT<double> net;
      net.emplace<DenseT<double>>(50, hidden, init, "d1");
      net.emplace<DenseT<double>>(hidden, 40, init, "d2");
      model = std::make_unique<FeatureModelT<double>>("wide", std::move(net));
    }
    const std::size_t P = model->parameter_count();
    BatchT<double> b;
    b.inputs = test::randn<double>({5, 50}, data, 3.0);
    b.labels = {0, 1, 2, 3, 4};
    b.ids = {0, 1, 2, 3, 4};
    const double clip = 0.6, sigma = 1.1, expected_batch = 4;  // a power of two: dividing by it is exact
    auto params = model->parameters();
    SgdT<double> sgd(params, 0.1);
    auto strategy = make_clip_strategy<double>("ghost");
    ClaimedRate sampler(0.01, expected_batch);
    DPOptimizerT<double> dp(*model, sgd, *strategy, {clip, sigma, false, 0.5}, sampler, noise, aux, nullptr);
    // the grid's allowance: C - grid (sqrt(P) + 1)
    const NoiseGrid grid = noise_grid(sigma * clip);
    CHECK(dp.grid_clip_norm() == clip - grid.grid * (std::sqrt(double(P)) + 1));
    CHECK(dp.grid_clip_norm() < clip);
    CHECK(dp.grid_clip_norm() > clip * (1 - 1e-4));
    ReproducibleRng aux_copy(23), noise_copy(22);
    ClipResult<double> sum = strategy->clipped_sum(*model, b, dp.grid_clip_norm(), aux_copy);
    StepStats st = dp.step(b);
    CHECK(st.noise_std == double(grid.scale) * grid.grid);
    // the draws the optimizer should have made: per block of at most 2^16 coordinates within an
    // array, each block from its own generator, split in order off one split of the noise generator
    std::vector<std::int64_t> k;
    const GridNoiseSampler sampler_k(grid.scale);
    auto draw = [&](Rng& g, std::size_t n) {
      std::vector<std::int64_t> part(n);
      sampler_k.fill(g, part.data(), n);
      k.insert(k.end(), part.begin(), part.end());
    };
    auto step = noise_copy.split();
    for (const auto& p : params)
      for (std::size_t at = 0; at < p.value().size(); at += 65536)
        draw(*step->split(), std::min<std::size_t>(65536, p.value().size() - at));
    std::size_t off_grid = 0, not_k = 0, coords = 0;
    for (std::size_t j = 0; j < params.size(); ++j) {
      const A released = dp.sat_direction()[j] * expected_batch;  // exact: L is a power of two
      for (std::size_t i = 0; i < released.size(); ++i, ++coords) {
        const double steps = released.data()[i] / grid.grid;
        off_grid += steps != std::nearbyint(steps);
        const double m = std::nearbyint(sum.sum[j].data()[i] / grid.grid);
        not_k += steps - m != double(k[coords]);
      }
    }
    CHECK(coords == P);
    CHECK(off_grid == 0);
    CHECK(not_k == 0);
  }
}

TEST_CASE("dp optimizer: a noise multiplier too large for the grid's allowance is refused") {
  FastRng init(31);
  ReproducibleRng noise(32), aux(33);
  ClaimedRate sampler(0.01, 4);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  auto strategy = make_clip_strategy<double>("ghost");
  // grid ~ sigma C 2^-24.5: grid sqrt(2040) reaches C / 2 near sigma = 2^24.5 / (2 sqrt(2040))
  CHECK_NOTHROW(DPOptimizerT<double>(*model, sgd, *strategy, {1.0, 1e4}, sampler, noise, aux, nullptr));
  CHECK_THROWS_WITH_AS(DPOptimizerT<double>(*model, sgd, *strategy, {1.0, 1e6}, sampler, noise, aux, nullptr),
                       doctest::Contains("too large for the noise grid"), std::invalid_argument);
}

TEST_CASE("dp optimizer: noise the grid cannot hold is refused naming clip norm and noise multiplier") {
  FastRng init(34);
  ReproducibleRng noise(35), aux(36);
  ClaimedRate sampler(0.01, 4);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  auto strategy = make_clip_strategy<double>("ghost");
  // sigma C below the grid's 2^-900: named by its two factors, not as the grid's internals
  CHECK_THROWS_WITH_AS(DPOptimizerT<double>(*model, sgd, *strategy, {1e-300, 1.0}, sampler, noise, aux, nullptr),
                       doctest::Contains("noise multiplier 1 times clip norm 1e-300"), std::invalid_argument);
  // a batch of about 4 contributions needs sigma >= 4 * 4 * 2^-27 on the grid; 1e-9 used to fail in the first step
  CHECK_THROWS_WITH_AS(DPOptimizerT<double>(*model, sgd, *strategy, {1.0, 1e-9}, sampler, noise, aux, nullptr),
                       doctest::Contains("too small for the noise grid"), std::invalid_argument);
  CHECK_NOTHROW(DPOptimizerT<double>(*model, sgd, *strategy, {1.0, 1e-6}, sampler, noise, aux, nullptr));
}

TEST_CASE("dp optimizer: parameters that explode stop the run after the step is accounted") {
  FastRng init(37), data(38);
  ReproducibleRng noise(39), aux(40);
  auto model = tiny_model(init);
  const BatchT<double> b = four_examples(data);
  auto sampler = make_sampler("poisson", 1000, 4);
  auto strategy = make_clip_strategy<double>("ghost");
  for (const double lr : {1e20, 1e308}) {  // huge, and (lr times a gradient) infinite
    CAPTURE(lr);
    auto acc = privacy::make_accountant("pld");
    SgdT<double> sgd(model->parameters(), lr);
    DPOptimizerT<double> dp(*model, sgd, *strategy, {1.0, 1.0}, *sampler, noise, aux, acc.get());
    CHECK_THROWS_WITH_AS(dp.step(b), doctest::Contains("the parameters diverged: d."), DivergedError);
    REQUIRE(acc->ledger().size() == 1);  // the step was taken: it counts
    CHECK(acc->ledger()[0].count == 1);
  }
  // non-private training too; a bound of the caller's choosing; infinity: only non-finite values stop
  FastRng again(37);
  auto fresh = tiny_model(again);
  auto none = make_clip_strategy<double>("none");
  SgdT<double> big(fresh->parameters(), 1e3);
  DPConfig tight{1.0, 1.0};
  tight.max_parameter = 1e-3;
  DPOptimizerT<double> strict(*fresh, big, *none, tight, *sampler, noise, aux, nullptr);
  CHECK_THROWS_AS(strict.step(b), DivergedError);
  FastRng third(37);
  auto relaxed_model = tiny_model(third);
  SgdT<double> sgd(relaxed_model->parameters(), 1e20);
  DPConfig relaxed{1.0, 1.0};
  relaxed.max_parameter = INFINITY;
  DPOptimizerT<double> loose(*relaxed_model, sgd, *none, relaxed, *sampler, noise, aux, nullptr);
  CHECK_NOTHROW(loose.step(b));
  DPConfig zero{1.0, 1.0};
  zero.max_parameter = 0;
  CHECK_THROWS_AS(DPOptimizerT<double>(*relaxed_model, sgd, *none, zero, *sampler, noise, aux, nullptr),
                  std::invalid_argument);
}

TEST_CASE("dp optimizer: microbatches count their 2C once, under add/remove and replace-one alike") {
  // add/remove (rdp, pld): vanilla C, microbatch 2C, so sigma / 2. replace-one (wor, shuffle):
  // 2C for both, already inside the accountants' formula, so sigma itself (not sigma / 2).
  FastRng init(7), data(10);
  ReproducibleRng noise(8), aux(9);
  auto model = tiny_model(init);
  SgdT<double> sgd(model->parameters(), 0.1);
  const BatchT<double> b = four_examples(data);
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
    const std::string sampling = c.accountant == "wor" ? "fixed" : c.accountant == "shuffle" ? "shuffle" : "poisson";
    auto sampler = make_sampler(sampling, 1000, 4, 0.5);
    DPOptimizerT<double> dp(*model, sgd, *strategy, {1.0, 1.1}, *sampler, noise, aux, acc.get());
    dp.step(b);
    REQUIRE(acc->ledger().size() == 1);
    CHECK(acc->ledger()[0].noise_multiplier == doctest::Approx(c.sigma));
    CHECK(dp.accounted_noise_multiplier() == doctest::Approx(c.sigma));
  }
}
