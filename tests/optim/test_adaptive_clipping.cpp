// Adaptive quantile clipping (optim/dp_optimizer.hpp, docs/math.md section 8):
// the gradient's noise multiplier against the closed form, the joint
// mechanism's sensitivity in noise units, the released count's noise, C
// reaching the quantile of norms computed by the per-example loop from both a
// far too small and a far too large start, every exact strategy following the
// loop's trajectory, the refusals, and C surviving a resume.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <xtensor/xmath.hpp>
#include <xtensor/xsort.hpp>

#include "engine/random.hpp"
#include "layers/models.hpp"
#include "optim/clipping/clip_spec.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/run/private_trainer.hpp"
#include "support/batches.hpp"
#include "support/check.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
using test::randn;

namespace {

/// n examples of 8 features, labels in [0, 3) from a fixed linear rule.
BatchT<double> records(std::size_t n, std::uint64_t seed) { return test::three_class_records(n, 8, seed); }

/// The gradient's noise multiplier of Andrew et al. (2021), Theorem 1, written out here:
/// the clipped sum at noise sigma_g and the count at sigma_b (sensitivity 1/2) are one
/// Gaussian mechanism of noise multiplier sigma when sigma^-2 = sigma_g^-2 + (2 sigma_b)^-2.
double paper_sigma_g(double sigma, double sigma_b) {
  return std::pow(std::pow(sigma, -2) - std::pow(2 * sigma_b, -2), -0.5);
}

/// |a - b| / |b|: doctest::Approx's default scale of 1 would make small values pass loosely.
double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

struct Run {
  std::vector<double> clip_norms;  // C of each step
  std::vector<double> fractions;   // the released unclipped fraction of each step
  double final_clip_norm = 0;
  // "+layers:adaptive": per step, per layer, C_g (before the step) and the released fraction; at the end, the C_g
  std::vector<std::vector<double>> layer_clip_norms, layer_fractions;
  std::vector<double> final_layer_clip_norms;
};

/// The C_g of a per-layer run, in the layers' order (empty for a flat one).
std::vector<double> layer_clip_norms(const DPOptimizerT<double>& dp) {
  std::vector<double> v;
  for (const auto& [name, c_g] : dp.layer_clip_norms()) v.push_back(c_g);
  return v;
}

PrivateTrainingConfigT<double> adaptive_config(double c0, long steps, const std::string& strategy = "ghost") {
  PrivateTrainingConfigT<double> c;
  c.clip_norm = c0;
  c.noise_multiplier = 1.0;
  c.delta = 1e-5;
  c.batch_size = 200;
  c.epochs = 1000;
  c.max_steps = steps;
  c.clipping = make_clip_strategy<double>(parse_clip_spec(strategy), 200.0);
  c.reproducible_noise = true;
  c.seed = 17;
  c.adaptive_clipping = AdaptiveClipping{};  // quantile 0.5, count noise 200 / 20, lr 0.2
  return c;
}

/// A run whose parameters barely move (lr 1e-12), so that every record's norm stays put.
Run run(const BatchT<double>& data, const PrivateTrainingConfigT<double>& c) {
  FastRng init(3);
  auto model = make_mlp<double>({8, 16, 3}, Activation::tanh, init);
  SgdT<double> sgd(model->parameters(), 1e-12, 0.0);
  PrivateTrainerT<double> t(*model, sgd, data, c);
  Run r;
  while (!t.done()) {
    r.layer_clip_norms.push_back(layer_clip_norms(t.dp_optimizer()));
    const StepStats st = t.step();
    r.clip_norms.push_back(st.clip_norm);
    r.fractions.push_back(st.unclipped_fraction);
    r.layer_fractions.push_back(st.layer_unclipped_fractions);
  }
  r.final_clip_norm = t.dp_optimizer().clip_norm();
  r.final_layer_clip_norms = layer_clip_norms(t.dp_optimizer());
  return r;
}

/// The median of every record's gradient norm, from the per-example loop (naive, no clipping).
double median_norm(const BatchT<double>& data) {
  FastRng init(3), rng(1);
  auto model = make_mlp<double>({8, 16, 3}, Activation::tanh, init);
  auto naive = make_clip_strategy<double>(ClipSpec{ClipSpec::Kind::naive});
  const ArrayT<double> norms = naive->clipped_sum(*model, data, 1e300, rng).norms;
  std::vector<double> v(norms.begin(), norms.end());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Calls check(trainer) for a trainer of `strategy` at noise multiplier sigma
/// and count noise sigma_b (adaptive_config's other settings, a fixed model and data).
void with_trainer(const std::string& strategy, double sigma, double sigma_b,
                  const std::function<void(PrivateTrainerT<double>&)>& check) {
  const BatchT<double> data = records(1000, 5);
  PrivateTrainingConfigT<double> c = adaptive_config(1.0, 3, strategy);
  c.noise_multiplier = sigma;
  c.adaptive_clipping->count_noise = sigma_b;
  FastRng init(3);
  auto model = make_mlp<double>({8, 16, 3}, Activation::tanh, init);
  SgdT<double> sgd(model->parameters(), 0.1, 0.0);
  PrivateTrainerT<double> t(*model, sgd, data, c);
  check(t);
}

/// A run of `c` whole, and the same run saved after 13 steps and resumed into a
/// model of other initial values: the clip state (`clip`: C, or the C_g) moved
/// by then, and the two runs end with the same clip state, parameters and epsilon.
void check_resume(const PrivateTrainingConfigT<double>& c,
                  const std::function<std::vector<double>(const DPOptimizerT<double>&)>& clip) {
  const BatchT<double> data = records(600, 10);
  test::TempDir dir("dpgrad-adaptive");
  auto make = [](std::uint64_t seed) {
    FastRng init(seed);
    return make_mlp<double>({8, 16, 3}, Activation::tanh, init);
  };
  auto whole_model = make(3);
  SgdT<double> sgd(whole_model->parameters(), 0.1, 0.9);
  PrivateTrainerT<double> whole(*whole_model, sgd, data, c);
  const std::vector<double> first_clip = clip(whole.dp_optimizer());
  while (!whole.done()) whole.step();
  {
    auto m = make(3);
    SgdT<double> s(m->parameters(), 0.1, 0.9);
    PrivateTrainerT<double> first(*m, s, data, c);
    for (int i = 0; i < 13; ++i) first.step();
    CHECK(clip(first.dp_optimizer()) != first_clip);
    first.save(dir.path);
  }
  auto m = make(99);
  SgdT<double> s(m->parameters(), 0.1, 0.9);
  PrivateTrainerT<double> resumed(*m, s, data, c, dir.path);
  CHECK(resumed.steps_done() == 13);
  while (!resumed.done()) resumed.step();
  CHECK(clip(resumed.dp_optimizer()) == clip(whole.dp_optimizer()));
  const auto a = whole_model->parameters(), b = m->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(double(xt::amax(xt::abs(a[i].value() - b[i].value()))()) == 0);
  CHECK(resumed.epsilon() == whole.epsilon());
}

}  // namespace

TEST_CASE("adaptive clipping: the gradient's noise multiplier is the paper's, and the joint release is sigma") {
  // closed forms: sigma 1, sigma_b 1: 2 / sqrt(3); sigma 1, sigma_b 5 (m = 100, sigma_b = m / 20): 1 / sqrt(0.99)
  CHECK(relative(paper_sigma_g(1, 1), 2 / std::sqrt(3.0)) < 1e-14);
  CHECK(relative(paper_sigma_g(1, 5), 1 / std::sqrt(0.99)) < 1e-14);
  for (const auto& [sigma, sigma_b] : std::vector<std::pair<double, double>>{{1.0, 10.0}, {1.0, 0.6}, {3.0, 2.0}, {0.7, 1e6}}) {
    CAPTURE(sigma);
    CAPTURE(sigma_b);
    with_trainer("ghost", sigma, sigma_b, [&, sigma = sigma, sigma_b = sigma_b](PrivateTrainerT<double>& t) {
      const DPOptimizerT<double>& dp = t.dp_optimizer();
      const double sg = dp.gradient_noise_multiplier();
      CHECK(relative(sg, paper_sigma_g(sigma, sigma_b)) < 1e-12);
      CHECK(sg > sigma);
      if (sigma_b > 1e5) CHECK(relative(sg, sigma) < 1e-9);  // the limit: no count, sigma itself
      // a record's (clipped gradient, count share) in units of the noise's std sigma_g C: its norm
      // must be at most 1 / sigma, the accountant's sensitivity over noise
      const double C = dp.clip_norm(), noise = sg * C, share = noise / sigma_b / 2;
      const double joint = std::hypot(dp.grid_clip_norm(), share) / noise;
      CHECK(joint <= 1 / sigma);
      CHECK(joint > 0.999 / sigma);  // and the grid's allowance takes little of it
      CHECK(t.accountant() != nullptr);
      t.step();
      CHECK(t.accountant()->ledger().back().noise_multiplier == sigma);  // the accountant sees sigma itself
    });
  }
}

TEST_CASE("adaptive clipping: the released count has the count noise, and is unbiased") {
  // C far above every norm and not moving (lr 0): all contributions unclipped, so the
  // released fraction is 1 + N(0, sigma_b^2) / L with fixed batches of L = 200
  const BatchT<double> data = records(2000, 6);
  PrivateTrainingConfigT<double> c = adaptive_config(1e5, 400);
  c.sampling = Sampling::fixed;
  c.adaptive_clipping->lr = 0;
  c.adaptive_clipping->count_noise = 10;
  const Run r = run(data, c);
  double mean = 0, var = 0;
  for (double f : r.fractions) mean += f / double(r.fractions.size());
  for (double f : r.fractions) var += (f - mean) * (f - mean) / double(r.fractions.size() - 1);
  const double sd = 10.0 / 200;  // 0.05
  CHECK(std::abs(mean - 1) < 4 * sd / std::sqrt(400.0));
  CAPTURE(mean);
  CAPTURE(std::sqrt(var));
  CHECK(relative(std::sqrt(var), sd) < 0.15);
  CHECK(r.final_clip_norm == 1e5);
}

TEST_CASE("adaptive clipping: C reaches the median of the per-example loop's norms from 1/30 and 30 times it") {
  const BatchT<double> data = records(2000, 7);
  const double median = median_norm(data);
  CAPTURE(median);
  for (const double start : {median / 30, median * 30}) {
    CAPTURE(start);
    const Run r = run(data, adaptive_config(start, 300));
    // log(30) / (0.2 * 0.5) = 34 steps at least to get there; the last 100 steps hover around it
    double mean_log = 0;
    for (std::size_t i = 200; i < 300; ++i) mean_log += std::log(r.clip_norms[i]) / 100;
    CAPTURE(std::exp(mean_log));
    CHECK(relative(std::exp(mean_log), median) < 0.15);
    double fraction = 0;
    for (std::size_t i = 200; i < 300; ++i) fraction += r.fractions[i] / 100;
    CHECK(std::abs(fraction - 0.5) < 0.05);
  }
}

TEST_CASE("adaptive clipping: naive, vanilla, ghost, microbatch:1 and physical batches follow the loop's trajectory") {
  const BatchT<double> data = records(600, 8);
  const Run loop = run(data, adaptive_config(0.05, 40, "naive"));
  for (const std::string strategy : {"vanilla", "ghost", "microbatch:1"}) {
    CAPTURE(strategy);
    const Run other = run(data, adaptive_config(0.05, 40, strategy));
    REQUIRE(other.clip_norms.size() == loop.clip_norms.size());
    for (std::size_t i = 0; i < loop.clip_norms.size(); ++i) {
      CHECK(relative(other.clip_norms[i], loop.clip_norms[i]) < 1e-9);
      CHECK(relative(other.fractions[i], loop.fractions[i]) < 1e-9);
    }
  }
  PrivateTrainingConfigT<double> chunks = adaptive_config(0.05, 40, "ghost");
  chunks.physical_batch_size = 37;
  const Run chunked = run(data, chunks);
  for (std::size_t i = 0; i < loop.clip_norms.size(); ++i)
    CHECK(relative(chunked.clip_norms[i], loop.clip_norms[i]) < 1e-9);
  CHECK(loop.final_clip_norm != 0.05);  // it moved
  // microbatch:4 counts microbatches (50 per batch of 200; count noise 50 / 20): its C moves too
  PrivateTrainingConfigT<double> groups = adaptive_config(0.05, 40, "microbatch:4");
  const Run grouped = run(data, groups);
  CHECK(grouped.final_clip_norm > 0.05);
  for (const double f : grouped.fractions) CHECK(std::isfinite(f));
}

TEST_CASE("adaptive clipping: jl:K, a run without noise, a count noise of sigma / 2 and bad settings are refused") {
  const BatchT<double> data = records(400, 9);
  auto refused = [&](PrivateTrainingConfigT<double> c, const std::string& says) {
    FastRng init(3);
    auto model = make_mlp<double>({8, 16, 3}, Activation::tanh, init);
    SgdT<double> sgd(model->parameters(), 0.1, 0.0);
    CHECK_THROWS_WITH_AS(PrivateTrainerT<double>(*model, sgd, data, c), doctest::Contains(says.c_str()), std::invalid_argument);
  };
  PrivateTrainingConfigT<double> jl = adaptive_config(1, 5, "jl:4");
  jl.noise_multiplier = 4;
  jl.adaptive_clipping->count_noise = 10;
  refused(jl, "adaptive clipping cannot run with jl:4");
  PrivateTrainingConfigT<double> quiet = adaptive_config(1, 5);
  quiet.noise_multiplier = 0.0;
  quiet.allow_no_noise = true;
  refused(quiet, "it needs noise");
  PrivateTrainingConfigT<double> half = adaptive_config(1, 5);
  half.noise_multiplier = 2.0;
  half.adaptive_clipping->count_noise = 1.0;
  refused(half, "must exceed half the noise multiplier (1)");
  PrivateTrainingConfigT<double> q = adaptive_config(1, 5);
  q.adaptive_clipping->quantile = 1.5;
  refused(q, "quantile must be in [0, 1]");
  PrivateTrainingConfigT<double> range = adaptive_config(1, 5);
  range.adaptive_clipping->max_clip_norm = 0.5;
  refused(range, "1e-12 <= min <= C <= max <= 1e6");
  PrivateTrainingConfigT<double> np = adaptive_config(1, 5);
  np.non_private = true;
  np.noise_multiplier.reset();
  np.clipping = nullptr;
  refused(np, "adaptive clipping belongs to private runs");
}

TEST_CASE("adaptive clipping: C is in the checkpoint, and a resumed run ends where an uninterrupted one does") {
  check_resume(adaptive_config(0.02, 30), [](const DPOptimizerT<double>& dp) { return std::vector<double>{dp.clip_norm()}; });
}

TEST_CASE("adaptive clipping: by default the noised sum is taken in units of C, so a step's size does not follow C") {
  const BatchT<double> data = records(400, 11);
  auto first_step = [&](bool normalise) {
    PrivateTrainingConfigT<double> c = adaptive_config(0.04, 1);
    c.adaptive_clipping->normalise = normalise;
    FastRng init(3);
    auto model = make_mlp<double>({8, 16, 3}, Activation::tanh, init);
    std::vector<ArrayT<double>> before;
    for (const auto& p : model->parameters()) before.push_back(p.value());
    SgdT<double> sgd(model->parameters(), 1.0, 0.0);
    PrivateTrainerT<double> t(*model, sgd, data, c);
    const double variance = t.dp_optimizer().noise_variance();
    t.step();
    std::vector<ArrayT<double>> moved;
    for (std::size_t i = 0; i < before.size(); ++i) moved.push_back(model->parameters()[i].value() - before[i]);
    return std::make_pair(moved, variance);
  };
  const auto [scaled, scaled_variance] = first_step(true);
  const auto [raw, raw_variance] = first_step(false);
  for (std::size_t i = 0; i < raw.size(); ++i)  // the same noise, the step divided by C = 0.04
    CHECK(double(xt::amax(xt::abs(scaled[i] * 0.04 - raw[i]))()) < 1e-12 * (1 + double(xt::amax(xt::abs(raw[i]))())));
  CHECK(relative(scaled_variance * 0.04 * 0.04, raw_variance) < 1e-12);
}

// ---------------------------------------------------------------- per layer ("+layers:adaptive")

namespace {

/// Per layer (dense1, dense2), the median of the records' layer-part norms from
/// the per-example loop (naive+layers, C = 10^300: nothing clipped).
std::vector<double> layer_medians(const BatchT<double>& data) {
  FastRng init(3), rng(1);
  auto model = make_mlp<double>({8, 16, 3}, Activation::tanh, init);
  auto naive = make_clip_strategy<double>("naive+layers");
  const ArrayT<double> norms = naive->clipped_sum(*model, data, 1e300, rng).layer_norms;
  std::vector<double> medians;
  for (std::size_t g = 0; g < norms.shape(0); ++g) {
    std::vector<double> v;
    for (std::size_t i = 0; i < norms.shape(1); ++i) v.push_back(norms(g, i));
    std::sort(v.begin(), v.end());
    medians.push_back(v[v.size() / 2]);
  }
  return medians;
}

}  // namespace

TEST_CASE("per-layer adaptive clipping: G counts, the gradient's noise multiplier, and the joint release is sigma") {
  for (const auto& [sigma, sigma_b] : std::vector<std::pair<double, double>>{{1.0, 10.0}, {1.0, 0.8}, {3.0, 2.5}}) {
    CAPTURE(sigma);
    CAPTURE(sigma_b);
    const std::string per_layer = "ghost+layers:adaptive";
    with_trainer(per_layer, sigma, sigma_b, [&, sigma = sigma, sigma_b = sigma_b](PrivateTrainerT<double>& t) {
      const DPOptimizerT<double>& dp = t.dp_optimizer();
      const double G = 2;  // dense1, dense2
      REQUIRE(dp.layer_clip_norms().size() == 2);
      CHECK(dp.layer_clip_norms()[0].first == "dense1");
      // sigma^-2 = sigma_g^-2 + G (2 sigma_b)^-2, written out
      const double expected = 1 / std::sqrt(1 / (sigma * sigma) - G / (4 * sigma_b * sigma_b));
      CHECK(relative(dp.gradient_noise_multiplier(), expected) < 1e-12);
      // each layer starts at C / sqrt(G), so the total is C
      for (const auto& [name, c_g] : dp.layer_clip_norms()) CHECK(relative(c_g, 1 / std::sqrt(G)) < 1e-15);
      CHECK(relative(dp.clip_norm(), 1.0) < 1e-15);
      // a record's (clipped gradient, G count shares) in units of the noise's std: at most 1 / sigma
      const double noise = dp.gradient_noise_multiplier() * dp.clip_norm(), share = noise / sigma_b / 2;
      const double joint = std::sqrt(dp.grid_clip_norm() * dp.grid_clip_norm() + G * share * share) / noise;
      CHECK(joint <= 1 / sigma);
      CHECK(joint > 0.999 / sigma);
      // the plan charges the grid's draws for the parameters and the two counts
      CHECK(t.plan().parameters() == 8 * 16 + 16 + 16 * 3 + 3 + 2);
      const StepStats st = t.step();
      CHECK(st.layer_unclipped_fractions.size() == 2);
      CHECK(t.accountant()->ledger().back().noise_multiplier == sigma);
    });
  }
  // 2 sigma_b must exceed sqrt(G) sigma: at sigma 1, 2 * 0.7 = 1.4 < 1.414 is refused, and 0.75 is not
  CHECK_THROWS_WITH_AS(with_trainer("ghost+layers:adaptive", 1.0, 0.7, [](PrivateTrainerT<double>&) {}),
                       doctest::Contains("sqrt(layers) / 2 times"), std::invalid_argument);
  CHECK_NOTHROW(with_trainer("ghost+layers:adaptive", 1.0, 0.75, [](PrivateTrainerT<double>&) {}));
}

TEST_CASE("per-layer adaptive clipping: each C_g reaches the median of its layer's norms from the per-example loop") {
  const BatchT<double> data = records(2000, 13);
  const std::vector<double> medians = layer_medians(data);
  REQUIRE(medians.size() == 2);
  CAPTURE(medians[0]);
  CAPTURE(medians[1]);
  const double total = std::hypot(medians[0], medians[1]);
  for (const double start : {total / 30, total * 30}) {
    CAPTURE(start);
    const Run r = run(data, adaptive_config(start, 300, "ghost+layers:adaptive"));
    for (std::size_t g = 0; g < 2; ++g) {
      CAPTURE(g);
      double mean_log = 0, fraction = 0;
      for (std::size_t i = 200; i < 300; ++i) mean_log += std::log(r.layer_clip_norms[i][g]) / 100;
      for (std::size_t i = 200; i < 300; ++i) fraction += r.layer_fractions[i][g] / 100;
      CAPTURE(std::exp(mean_log));
      CHECK(relative(std::exp(mean_log), medians[g]) < 0.15);
      CHECK(std::abs(fraction - 0.5) < 0.05);
    }
  }
}

TEST_CASE("per-layer adaptive clipping: naive, vanilla, ghost and physical batches follow the loop's trajectory") {
  const BatchT<double> data = records(600, 14);
  const Run loop = run(data, adaptive_config(0.05, 40, "naive+layers:adaptive"));
  auto same = [&](const Run& other) {
    REQUIRE(other.layer_clip_norms.size() == loop.layer_clip_norms.size());
    for (std::size_t i = 0; i < loop.layer_clip_norms.size(); ++i)
      for (std::size_t g = 0; g < 2; ++g) {
        CHECK(relative(other.layer_clip_norms[i][g], loop.layer_clip_norms[i][g]) < 1e-9);
        CHECK(relative(other.layer_fractions[i][g], loop.layer_fractions[i][g]) < 1e-9);
      }
  };
  for (const std::string strategy : {"vanilla+layers:adaptive", "ghost+layers:adaptive"}) {
    CAPTURE(strategy);
    same(run(data, adaptive_config(0.05, 40, strategy)));
  }
  PrivateTrainingConfigT<double> chunks = adaptive_config(0.05, 40, "ghost+layers:adaptive");
  chunks.physical_batch_size = 37;
  same(run(data, chunks));
  // both layers moved, and not in step: each follows its own count
  CHECK(loop.final_layer_clip_norms[0] != loop.final_layer_clip_norms[1]);
  CHECK(loop.final_layer_clip_norms[0] > 0.05 / std::sqrt(2.0));
}

TEST_CASE("per-layer adaptive clipping: the C_g are in the checkpoint, and a resumed run ends where an uninterrupted one does") {
  check_resume(adaptive_config(0.02, 30, "ghost+layers:adaptive"), layer_clip_norms);
}

TEST_CASE("per-layer adaptive clipping: refused without adaptive clipping, with fixed shares, and unplanned") {
  const BatchT<double> data = records(400, 16);
  FastRng init(3);
  auto model = make_mlp<double>({8, 16, 3}, Activation::tanh, init);
  SgdT<double> sgd(model->parameters(), 0.1, 0.0);
  PrivateTrainingConfigT<double> off = adaptive_config(1, 5, "ghost+layers:adaptive");
  off.adaptive_clipping.reset();
  CHECK_THROWS_WITH_AS(PrivateTrainerT<double>(*model, sgd, data, off), doctest::Contains("it needs adaptive clipping"),
                       std::invalid_argument);
  // a plan without the model's layers cannot charge the counts' draws
  CHECK_THROWS_WITH_AS(plan_run(adaptive_config(1, 5, "ghost+layers:adaptive"), 400, 100),
                       doctest::Contains("noises a count per layer"), std::invalid_argument);
  CHECK(plan_run(adaptive_config(1, 5, "ghost+layers:adaptive"), 400, 100, 3).parameters() == 103);
  CHECK(plan_run(adaptive_config(1, 5, "ghost"), 400, 100).parameters() == 101);
  // only adaptive layers take shares; shares whose squares do not sum to 1 are refused
  CHECK_THROWS_AS(make_clip_strategy<double>("ghost+layers")->set_layer_shares({0.6, 0.8}), std::logic_error);
  auto adaptive = make_clip_strategy<double>("ghost+layers:adaptive");
  CHECK(adaptive->adapts_layers());
  CHECK_THROWS_WITH_AS(adaptive->set_layer_shares({0.5, 0.5}), doctest::Contains("squares summing to 1"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(adaptive->set_layer_shares({1.0, 0.0}), doctest::Contains("finite and > 0"), std::invalid_argument);
  adaptive->set_layer_shares({0.6, 0.8, 0.0 + 1e-300});
  FastRng rng(1);
  CHECK_THROWS_WITH_AS(adaptive->clipped_sum(*model, data, 1.0, rng), doctest::Contains("3 layer shares set for a model of 2"),
                       std::invalid_argument);
  CHECK(parse_clip_spec("vanilla+layers:adaptive").layers == ClipSpec::Layers::adaptive);
  CHECK_THROWS_WITH_AS(parse_clip_spec("jl:4+layers:adaptive"), doctest::Contains("applies to naive"), std::invalid_argument);
}
