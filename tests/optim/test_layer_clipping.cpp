// Per-layer clipping (ClipSpec::Layers; "+layers", "+layers:size"): each
// layer's part of a contribution clipped to its share of C, checked against
// clipping written out here from the per-example loop's unclipped gradients,
// for naive, vanilla and ghost; the bound C on every contribution; parsing.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "engine/random.hpp"
#include "layers/models.hpp"
#include "optim/clipping/clip_spec.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/run/private_trainer.hpp"
#include "support/batches.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;

namespace {

BatchT<double> records(std::size_t n, std::uint64_t seed) { return test::three_class_records(n, 6, seed, 2.0); }

/// The clipped sum written out: each example's unclipped gradient from the loop
/// (naive, C = 10^300, one example at a time), each layer's part scaled to at
/// most share * C, summed.
std::vector<ArrayT<double>> reference(ModelT<double>& model, const BatchT<double>& batch, double C, bool by_size) {
  auto naive = make_clip_strategy<double>(ClipSpec{ClipSpec::Kind::naive});
  FastRng rng(1);
  const auto ps = model.parameters();
  std::map<std::string, double> sizes;
  double total = 0;
  for (const auto& p : ps) {
    sizes[p.name().substr(0, p.name().rfind('.'))] += double(p.value().size());
    total += double(p.value().size());
  }
  std::vector<ArrayT<double>> sum;
  for (const auto& p : ps) sum.push_back(xt::zeros<double>(p.value().shape()));
  for (std::size_t i = 0; i < batch.examples(); ++i) {
    const std::vector<ArrayT<double>> g = naive->clipped_sum(model, batch.select({i}), 1e300, rng).sum;
    std::map<std::string, double> sq;
    for (std::size_t j = 0; j < ps.size(); ++j) sq[ps[j].name().substr(0, ps[j].name().rfind('.'))] += xt::sum(g[j] * g[j])();
    for (std::size_t j = 0; j < ps.size(); ++j) {
      const std::string layer = ps[j].name().substr(0, ps[j].name().rfind('.'));
      const double share = by_size ? std::sqrt(sizes[layer] / total) : 1 / std::sqrt(double(sizes.size()));
      sum[j] += std::min(1.0, share * C / std::sqrt(sq[layer])) * g[j];
    }
  }
  return sum;
}

double max_relative(const std::vector<ArrayT<double>>& a, const std::vector<ArrayT<double>>& b) {
  double d = 0, scale = 0;
  for (std::size_t j = 0; j < a.size(); ++j) {
    d = std::max(d, double(xt::amax(xt::abs(a[j] - b[j]))()));
    scale = std::max(scale, double(xt::amax(xt::abs(b[j]))()));
  }
  return d / scale;
}

}  // namespace

TEST_CASE("per-layer clipping: the text form, and the strategies it applies to") {
  CHECK(parse_clip_spec("ghost+layers").layers == ClipSpec::Layers::equal);
  CHECK(parse_clip_spec("vanilla+layers:size").layers == ClipSpec::Layers::size);
  CHECK(parse_clip_spec("ghost").layers == ClipSpec::Layers::flat);
  CHECK(make_clip_strategy<float>("naive+layers:size")->name() == "naive+layers:size");
  CHECK(make_clip_strategy<float>("ghost+layers")->name() == "ghost+layers");
  for (const std::string bad : {"jl:4+layers", "microbatch:2+layers", "ghost+layer", "ghost+layers:sizes", "none+layers"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_clip_spec(bad), std::invalid_argument);
  }
}

TEST_CASE("per-layer clipping: naive, vanilla and ghost equal clipping written out from the per-example loop") {
  FastRng init(4);
  auto model = make_mlp<double>({6, 12, 5, 3}, Activation::tanh, init);  // 3 layers of 84, 65 and 18 parameters
  const BatchT<double> batch = records(24, 9);
  for (const bool by_size : {false, true}) {
    for (const double C : {0.05, 0.5, 1e3}) {  // most layers clipped; some; none
      CAPTURE(by_size);
      CAPTURE(C);
      const std::vector<ArrayT<double>> want = reference(*model, batch, C, by_size);
      for (const std::string base : {"naive", "vanilla", "ghost"}) {
        CAPTURE(base);
        auto s = make_clip_strategy<double>(base + (by_size ? "+layers:size" : "+layers"));
        FastRng rng(1);
        const ClipResult<double> got = s->clipped_sum(*model, batch, C, rng);
        // the factors are rounded down by a few units in the last place (docs/noise.md section 3)
        CHECK(max_relative(got.sum, want) < 1e-12);
        CHECK(got.norms.size() == 24);
        if (C == 1e3) CHECK(got.clipped == 0);
        if (C == 0.05) CHECK(got.clipped == 24);
      }
    }
  }
}

TEST_CASE("per-layer clipping: every contribution's norm stays at most C, so the sensitivity is unchanged") {
  FastRng init(5);
  auto model = make_mlp<double>({6, 12, 5, 3}, Activation::tanh, init);
  const BatchT<double> batch = records(16, 10);
  for (const std::string spec : {"ghost+layers", "ghost+layers:size", "vanilla+layers", "naive+layers:size"}) {
    CAPTURE(spec);
    auto s = make_clip_strategy<double>(spec);
    double largest = 0;
    for (std::size_t i = 0; i < batch.examples(); ++i) {
      FastRng rng(1);
      const ClipResult<double> one = s->clipped_sum(*model, batch.select({i}), 0.3, rng);
      double sq = 0;
      for (const auto& g : one.sum) sq += xt::sum(g * g)();
      largest = std::max(largest, std::sqrt(sq));
    }
    CHECK(largest <= 0.3);
    CHECK(largest > 0.29);  // the layers' shares together reach C when every layer is clipped
  }
}

TEST_CASE("per-layer clipping: a private run with ghost+layers, with adaptive clipping of the total C too") {
  FastRng data(11);
  const BatchT<double> train = records(400, 12);
  for (const bool adaptive : {false, true}) {
    CAPTURE(adaptive);
    FastRng init(6);
    auto model = make_mlp<double>({6, 12, 5, 3}, Activation::tanh, init);
    SgdT<double> sgd(model->parameters(), 0.1, 0.9);
    PrivateTrainingConfigT<double> c;
    c.noise_multiplier = 1.0;
    c.batch_size = 40;
    c.epochs = 1;
    c.clipping = make_clip_strategy<double>("ghost+layers:size");
    if (adaptive) c.adaptive_clipping = AdaptiveClipping{0.5, 4.0, 0.2};
    PrivateTrainerT<double> t(*model, sgd, train, c);  // the structural self-check passes
    t.train();
    CHECK(t.steps_done() == 10);
    CHECK(std::isfinite(t.epsilon()));
    CHECK(t.settings()["clip_strategy"] == "ghost+layers:size");
  }
}
