// Clipping strategies against the per-example loop: vanilla and ghost give the
// naive clipped sum to 1e-9 relative; jl:K follows its chi2_K law and converges
// to the exact sum; microbatch:1 is the naive loop; microbatch:M clips the means
// of groups fixed per example by a keyed hash of its id, which removing another
// example does not change; empty batches work.
#include <algorithm>
#include <cmath>
#include <set>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "layers/dense.hpp"
#include "layers/models.hpp"
#include "optim/clipping/clipping.hpp"
#include "support/check.hpp"
#include "support/jl.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

std::unique_ptr<ModelT<double>> small_mlp(Rng& rng, Activation act = Activation::tanh) {
  SequentialT<double> net;
  net.emplace<DenseT<double>>(5, 4, rng, "d1");
  net.emplace<ActivationT<double>>(act);
  net.emplace<DenseT<double>>(4, 3, rng, "d2");
  return std::make_unique<FeatureModelT<double>>("mlp", std::move(net));
}

/// A weight used at several positions and twice in a row: x (B, 3, 4).
class SharedWeightModel final : public ModelT<double> {
 public:
  explicit SharedWeightModel(Rng& rng)
      : w1_(make_parameter<double>("w1", randn<double>({4, 4}, rng, 0.5))),
        b1_(make_parameter<double>("b1", randn<double>({4}, rng, 0.5))),
        w2_(make_parameter<double>("w2", randn<double>({4, 3}, rng, 0.5))),
        b2_(make_parameter<double>("b2", randn<double>({3}, rng, 0.5))) {}
  D forward(const BatchT<double>& b) override {
    D h = tanh(linear(per_sample_input(b.inputs), w1_, b1_));
    D h2 = tanh(linear(h, w1_));
    return linear(sum(h2, {1}), w2_, b2_);
  }
  std::vector<D> parameters() const override { return {w1_, b1_, w2_, b2_}; }
  std::string name() const override { return "shared"; }

 private:
  D w1_, b1_, w2_, b2_;
};

/// x W + exp(b): b reaches the output through exp, an op that records no use,
/// so no per-sample rule sees it. x (B, 5).
class ExpBiasModel final : public ModelT<double> {
 public:
  explicit ExpBiasModel(Rng& rng)
      : w_(make_parameter<double>("w", randn<double>({5, 3}, rng, 0.5))),
        b_(make_parameter<double>("b", randn<double>({3}, rng, 0.5))) {}
  D forward(const BatchT<double>& b) override { return add(linear(per_sample_input(b.inputs), w_), exp(b_)); }
  std::vector<D> parameters() const override { return {w_, b_}; }
  std::string name() const override { return "exp-bias"; }

 private:
  D w_, b_;
};

BatchT<double> make_batch(const Shape& s, std::size_t classes, Rng& rng, double outlier = 1.0) {
  BatchT<double> b;
  b.inputs = randn<double>(s, rng);
  for (std::size_t i = 0; i < s[0]; ++i) {
    b.labels.push_back(std::int32_t(rng.below(classes)));
    b.ids.push_back(std::int64_t(i));
  }
  if (outlier != 1.0 && s[0] > 0) {  // scale sample 0's inputs: a much larger gradient
    std::size_t n = b.inputs.size() / s[0];
    for (std::size_t k = 0; k < n; ++k) b.inputs.data()[k] *= outlier;
  }
  return b;
}

double total_norm(const std::vector<A>& g) {
  double s = 0;
  for (const auto& a : g) s += xt::sum(a * a)();
  return std::sqrt(s);
}

void check_same_sum(const ClipResult<double>& x, const ClipResult<double>& y, double rtol) {
  REQUIRE(x.sum.size() == y.sum.size());
  for (std::size_t j = 0; j < x.sum.size(); ++j) {
    CAPTURE(j);
    std::string diff = test::mismatch(x.sum[j], y.sum[j], rtol, 1e-9);
    INFO(diff);
    CHECK(diff.empty());
  }
}

/// Token sequences (B, L) over ids [1, vocab) with lengths in [1, L] (0 pads).
BatchT<double> make_token_batch(std::size_t b, std::size_t len, std::size_t vocab, Rng& rng) {
  BatchT<double> batch;
  batch.tokens = xt::zeros<std::int32_t>({b, len});
  for (std::size_t i = 0; i < b; ++i) {
    std::size_t n = 1 + rng.below(len);
    for (std::size_t t = 0; t < n; ++t) batch.tokens(i, t) = std::int32_t(1 + rng.below(vocab - 1));
    batch.lengths.push_back(std::int32_t(n));
    batch.labels.push_back(std::int32_t(rng.below(2)));
    batch.ids.push_back(std::int64_t(i));
  }
  return batch;
}

/// tokens: input is (B, L) token sequences over `vocab` ids.
template <class MakeModel>
void exact_strategies_agree(MakeModel make, const Shape& input, std::size_t classes, bool tokens = false,
                            std::size_t vocab = 8185) {
  FastRng init(5), data(6), rng(7);
  auto model = make(init);
  BatchT<double> batch = tokens ? make_token_batch(input[0], input[1], vocab, data) : make_batch(input, classes, data);
  auto naive = make_clip_strategy<double>("naive")->clipped_sum(*model, batch, 1e9, rng);
  // a clip norm between the smallest and largest per-sample norms clips some and not others
  std::vector<double> ns(naive.norms.begin(), naive.norms.end());
  std::sort(ns.begin(), ns.end());
  const double middle = 0.5 * (ns[ns.size() / 2 - 1] + ns[ns.size() / 2]);  // not on a knife edge
  for (double clip : {middle, 1e9, ns.front() * 0.5}) {
    CAPTURE(clip);
    auto ref = make_clip_strategy<double>("naive")->clipped_sum(*model, batch, clip, rng);
    for (std::string s : {"vanilla", "ghost"}) {
      CAPTURE(s);
      auto got = make_clip_strategy<double>(s)->clipped_sum(*model, batch, clip, rng);
      check_same_sum(got, ref, 1e-9);
      DPGRAD_CHECK_CLOSE(got.norms, ref.norms, 1e-9);
      CHECK(got.clipped == ref.clipped);
      CHECK(got.loss_sum == doctest::Approx(ref.loss_sum).epsilon(1e-12));
    }
    if (clip == middle) {
      CHECK(ref.clipped > 0);
      CHECK(ref.clipped < batch.size());
    }
  }
}

}  // namespace

TEST_CASE("clipping: vanilla and ghost equal the naive loop on an MLP") {
  exact_strategies_agree([](Rng& r) { return small_mlp(r); }, {7, 5}, 3);
}

TEST_CASE("clipping: vanilla and ghost equal the naive loop with a weight used at many positions") {
  exact_strategies_agree([](Rng& r) { return std::make_unique<SharedWeightModel>(r); }, {6, 3, 4}, 3);
}

TEST_CASE("clipping: vanilla and ghost equal the naive loop on cnn26k") {
  exact_strategies_agree([](Rng& r) { return make_cnn26k<double>(Activation::tanh, r); }, {4, 1, 28, 28}, 10);
}

TEST_CASE("clipping: vanilla and ghost equal the naive loop on bilstm598k (variable lengths, repeated tokens)") {
  exact_strategies_agree([](Rng& r) { return make_bilstm598k<double>(r); }, {4, 9}, 2, true);
}

TEST_CASE("clipping: vanilla and ghost equal the naive loop on a small BiGRU (a layer with no rule of its own)") {
  // Embedding(12, 5) -> BiGRU(4) -> Dense(8 -> 2): few ids, so tokens repeat within and across samples
  exact_strategies_agree([](Rng& r) { return make_bigru<double>(r, 12, 5, 4, 2); }, {6, 7}, 2, true, 12);
}

TEST_CASE("clipping: jl:K on a small BiGRU: finite, and close to the exact clipped sum for large K") {
  FastRng init(25), data(26), rng(27);
  auto model = make_bigru<double>(init, 12, 5, 4, 2);
  BatchT<double> batch = make_token_batch(5, 6, 12, data);
  auto exact = make_clip_strategy<double>("naive")->clipped_sum(*model, batch, 1e12, rng);
  const double clip = 0.5 * xt::amax(exact.norms)();  // clips the largest, not all
  auto ref = make_clip_strategy<double>("naive")->clipped_sum(*model, batch, clip, rng);
  REQUIRE(ref.clipped > 0);
  REQUIRE(ref.clipped < batch.size());
  auto few = make_clip_strategy<double>("jl:2")->clipped_sum(*model, batch, clip, rng);
  for (const auto& a : few.sum) CHECK(xt::all(xt::isfinite(a)));
  CHECK(xt::all(xt::isfinite(few.norms)));
  CHECK(few.loss_sum == doctest::Approx(ref.loss_sum).epsilon(1e-12));
  auto jl = make_clip_strategy<double>("jl:4000")->clipped_sum(*model, batch, clip, rng);
  std::vector<A> diff;
  for (std::size_t j = 0; j < ref.sum.size(); ++j) diff.push_back(jl.sum[j] - ref.sum[j]);
  // relative error of the norm estimates is about sqrt(2/K) = 2.2%
  CHECK(total_norm(diff) < 0.05 * total_norm(ref.sum));
  for (std::size_t i = 0; i < batch.size(); ++i) {
    CAPTURE(i);
    CHECK(jl.norms(i) == doctest::Approx(exact.norms(i)).epsilon(0.08));
  }
}

TEST_CASE("clipping: a parameter used outside the parametric ops is refused by the rule-based strategies") {
  FastRng init(28), data(29), rng(30);
  ExpBiasModel model(init);
  BatchT<double> batch = make_batch({4, 5}, 3, data);
  for (std::string s : {"vanilla", "ghost"}) {
    CAPTURE(s);
    CHECK_THROWS_WITH_AS(make_clip_strategy<double>(s)->clipped_sum(model, batch, 1.0, rng),
                         doctest::Contains("parameter 'b' is used by exp, which has no per-sample rule"),
                         std::invalid_argument);
  }
  for (std::string s : {"naive", "jl:3"}) {
    CAPTURE(s);
    auto r = make_clip_strategy<double>(s)->clipped_sum(model, batch, 1.0, rng);
    CHECK(total_norm(r.sum) > 0.0);
  }
}

TEST_CASE("clipping: one huge gradient contributes at most C with exact strategies") {
  FastRng init(8), data(9), rng(10);
  auto model = small_mlp(init, Activation::relu);  // no saturation: the gradient grows with the input
  BatchT<double> batch = make_batch({6, 5}, 3, data, 1e6);
  double clip = 0.5;
  for (std::string s : {"naive", "vanilla", "ghost"}) {
    CAPTURE(s);
    auto all = make_clip_strategy<double>(s)->clipped_sum(*model, batch, clip, rng);
    auto rest = make_clip_strategy<double>(s)->clipped_sum(*model, batch.select({1, 2, 3, 4, 5}), clip, rng);
    std::vector<A> diff;
    for (std::size_t j = 0; j < all.sum.size(); ++j) diff.push_back(all.sum[j] - rest.sum[j]);
    CHECK(total_norm(diff) <= clip * (1 + 1e-9));
    CHECK(all.norms(0) > 100 * clip);
  }
}

TEST_CASE("clipping: empty batches give zero sums") {
  FastRng init(11), rng(12);
  auto model = small_mlp(init);
  BatchT<double> empty;
  empty.inputs = xt::zeros<double>({0, 5});
  for (std::string s : {"none", "naive", "vanilla", "ghost", "jl:3", "microbatch:2"}) {
    CAPTURE(s);
    auto r = make_clip_strategy<double>(s, 4)->clipped_sum(*model, empty, 1.0, rng);
    REQUIRE(r.sum.size() == model->parameters().size());
    CHECK(total_norm(r.sum) == 0.0);
    CHECK(r.clipped == 0);
  }
}

TEST_CASE("clipping: none is the plain sum and microbatch:1 is the naive loop") {
  FastRng init(13), data(14), rng(15);
  auto model = small_mlp(init);
  BatchT<double> batch = make_batch({5, 5}, 3, data);
  auto plain = make_clip_strategy<double>("none")->clipped_sum(*model, batch, 0.01, rng);
  auto unclipped = make_clip_strategy<double>("naive")->clipped_sum(*model, batch, 1e12, rng);
  check_same_sum(plain, unclipped, 1e-10);
  auto naive = make_clip_strategy<double>("naive")->clipped_sum(*model, batch, 0.3, rng);
  auto micro = make_clip_strategy<double>("microbatch:1", 5)->clipped_sum(*model, batch, 0.3, rng);
  check_same_sum(micro, naive, 1e-10);
  auto s = make_clip_strategy<double>("microbatch:2", 5);
  CHECK(s->sensitivity() == 2.0);
  CHECK(s->normaliser(5) == 3.0);  // ceil(5 / 2) microbatches
  auto m2 = s->clipped_sum(*model, batch, 0.3, rng);
  CHECK(m2.norms.size() >= 1);
  CHECK(m2.norms.size() <= 3);  // at most ceil(5 / 2) non-empty microbatches
}

namespace {

/// The microbatches microbatch:M forms on `batch` when its generator is
/// FastRng(seed), found from the strategy itself: examples i and j share one
/// iff the batch {i, j} gives one clipped contribution. Lists of example indices.
std::vector<std::vector<std::size_t>> probe_microbatches(ClipStrategyT<double>& s, ModelT<double>& model,
                                                         const BatchT<double>& batch, std::uint64_t seed) {
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < batch.examples(); ++i) {
    bool placed = false;
    for (auto& g : groups) {
      FastRng rng(seed);
      if (s.clipped_sum(model, batch.select({g.front(), i}), 1.0, rng).norms.size() == 1) {
        g.push_back(i);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({i});
  }
  return groups;
}

/// sum over groups of the mean gradient of the group's losses, clipped to C, by
/// plain summed gradients (the none strategy) scaled by hand.
std::vector<A> clipped_group_means(ModelT<double>& model, const BatchT<double>& batch,
                                   const std::vector<std::vector<std::size_t>>& groups, double clip, Rng& rng) {
  std::vector<A> total;
  auto none = make_clip_strategy<double>("none");
  for (const auto& g : groups) {
    auto r = none->clipped_sum(model, batch.select(g), clip, rng);
    for (auto& a : r.sum) a /= double(g.size());
    const double n = total_norm(r.sum), c = n > clip ? clip / n : 1.0;
    if (total.empty())
      for (auto& a : r.sum) total.push_back(c * a);
    else
      for (std::size_t j = 0; j < r.sum.size(); ++j) total[j] += c * r.sum[j];
  }
  return total;
}

}  // namespace

TEST_CASE("clipping: microbatch:M clips the mean of each microbatch, fixed per example by a keyed hash of its id") {
  FastRng init(31), data(32), other(33);
  auto model = small_mlp(init);
  BatchT<double> batch = make_batch({12, 5}, 3, data);
  for (std::size_t i = 0; i < 12; ++i) batch.ids[i] = std::int64_t(1000 + 37 * i);  // ids are labels, not positions
  auto s = make_clip_strategy<double>("microbatch:3", 12);
  REQUIRE(s->normaliser(12) == 4.0);
  const auto groups = probe_microbatches(*s, *model, batch, 40);
  CHECK(groups.size() > 1);
  CHECK(groups.size() <= 4);
  for (double clip : {0.05, 1e9}) {
    CAPTURE(clip);
    FastRng rng(40);
    auto r = s->clipped_sum(*model, batch, clip, rng);
    CHECK(r.norms.size() == groups.size());
    ClipResult<double> ref;
    ref.sum = clipped_group_means(*model, batch, groups, clip, other);
    check_same_sum(r, ref, 1e-10);
  }

  SUBCASE("removing one example changes only its own microbatch") {
    const double clip = 0.05;
    for (std::size_t removed = 0; removed < 12; ++removed) {
      CAPTURE(removed);
      std::vector<std::size_t> keep;
      for (std::size_t i = 0; i < 12; ++i)
        if (i != removed) keep.push_back(i);
      const BatchT<double> part = batch.select(keep);
      // the full batch's microbatches without `removed`, in the part's positions
      std::vector<std::vector<std::size_t>> expected;
      for (const auto& g : groups) {
        std::vector<std::size_t> h;
        for (std::size_t i : g)
          if (i != removed) h.push_back(i < removed ? i : i - 1);
        if (!h.empty()) expected.push_back(h);
      }
      auto sorted = [](std::vector<std::vector<std::size_t>> gs) {
        for (auto& g : gs) std::sort(g.begin(), g.end());
        std::sort(gs.begin(), gs.end());
        return gs;
      };
      CHECK(sorted(probe_microbatches(*s, *model, part, 40)) == sorted(expected));
      FastRng rng(40);
      auto r = s->clipped_sum(*model, part, clip, rng);
      ClipResult<double> ref;
      ref.sum = clipped_group_means(*model, part, expected, clip, other);
      check_same_sum(r, ref, 1e-10);
    }
  }

  SUBCASE("the position in the batch does not matter; the key does, and comes from the generator") {
    std::vector<std::size_t> reversed;
    for (std::size_t i = 12; i-- > 0;) reversed.push_back(i);
    FastRng r1(40), r2(40);
    check_same_sum(s->clipped_sum(*model, batch.select(reversed), 0.05, r1), s->clipped_sum(*model, batch, 0.05, r2),
                   1e-10);
    // other keys, other partitions: membership is not a public function of the id
    std::set<std::vector<std::vector<std::size_t>>> partitions;
    for (std::uint64_t seed = 40; seed < 46; ++seed) partitions.insert(probe_microbatches(*s, *model, batch, seed));
    CHECK(partitions.size() > 1);
  }
}

TEST_CASE("clipping: jl:K norm estimates follow chi2_K / K") {
  // M_i^2 / ||g_i||^2 ~ chi2_K / K (Bu et al. 2021, Prop. 2.1). Kolmogorov-Smirnov
  // against the chi2_3 CDF over 60 batches x 7 samples, with a fixed seed.
  FastRng init(16), data(17), rng(18);
  auto model = small_mlp(init);
  BatchT<double> batch = make_batch({7, 5}, 3, data);
  const test::JlLaw law = test::jl3_law(*model, batch, rng);
  CHECK(law.ks < law.critical);  // the 1% critical value
  CHECK(law.mean == doctest::Approx(1.0).epsilon(0.1));  // the mean of chi2_3 / 3 is 1
}

TEST_CASE("clipping: jl:K with large K approaches the exact clipped sum") {
  FastRng init(19), data(20), rng(21);
  auto model = small_mlp(init);
  BatchT<double> batch = make_batch({6, 5}, 3, data);
  auto ref = make_clip_strategy<double>("naive")->clipped_sum(*model, batch, 0.2, rng);
  REQUIRE(ref.clipped > 0);
  auto jl = make_clip_strategy<double>("jl:4000")->clipped_sum(*model, batch, 0.2, rng);
  std::vector<A> diff;
  for (std::size_t j = 0; j < ref.sum.size(); ++j) diff.push_back(jl.sum[j] - ref.sum[j]);
  // relative error of the norm estimates is about sqrt(2/K) = 2.2%
  CHECK(total_norm(diff) < 0.05 * total_norm(ref.sum));
  for (std::size_t i = 0; i < batch.size(); ++i) CHECK(jl.norms(i) == doctest::Approx(ref.norms(i)).epsilon(0.08));
}

TEST_CASE("clipping: bad strategy names and parameters are rejected") {
  CHECK_THROWS_WITH_AS(make_clip_strategy<double>("fast"), doctest::Contains("unknown clip strategy"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_clip_strategy<double>("jl:0"), doctest::Contains(">= 1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_clip_strategy<double>("jl:x"), doctest::Contains(">= 1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_clip_strategy<double>("microbatch:0", 10), doctest::Contains(">= 1"), std::invalid_argument);
  CHECK_THROWS_AS(make_clip_strategy<double>("microbatch:4"), std::invalid_argument);
}

TEST_CASE("clipping: a non-finite loss stops the strategy that is not private; the private ones drop its record") {
  FastRng init(22), data(23), rng(24);
  auto model = small_mlp(init);
  BatchT<double> batch = make_batch({3, 5}, 3, data);
  batch.inputs(0, 0) = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH_AS(make_clip_strategy<double>("none")->clipped_sum(*model, batch, 1.0, rng),
                       doctest::Contains("non-finite"), std::runtime_error);
  // whether a run stops must not tell whether a record was drawn (tests/optim/test_nonfinite_records.cpp)
  for (std::string s : {"naive", "vanilla", "ghost", "jl:2"}) {
    CAPTURE(s);
    const ClipResult<double> r = make_clip_strategy<double>(s)->clipped_sum(*model, batch, 1.0, rng);
    CHECK(std::isinf(double(r.norms(0))));
    CHECK(std::isfinite(r.loss_sum));
  }
}

namespace {

/// The clipped sum over examples of several views, built from its definition:
/// example i's gradient is the mean of its rows' gradients, each row's taken
/// alone as a one-view batch with the non-private strategy (an unclipped sum).
std::vector<A> clipped_sum_of_view_means(ModelT<double>& model, const BatchT<double>& batch, double clip,
                                         std::vector<double>& norms) {
  FastRng unused(0);
  std::vector<A> total;
  norms.clear();
  for (std::size_t i = 0; i < batch.examples(); ++i) {
    BatchT<double> rows = batch.select({i});
    rows.views = 1;
    auto g = make_clip_strategy<double>("none")->clipped_sum(model, rows, 0, unused).sum;
    for (auto& a : g) a /= double(batch.views);
    const double n = total_norm(g);
    norms.push_back(n);
    std::size_t coordinates = 0;
    for (const auto& a : g) coordinates += a.size();
    const double c = clip_factor<double>(n, clip, coordinates);  // min(1, C / n) with the rounding margin
    if (total.empty())
      for (auto& a : g) total.push_back(c * a);
    else
      for (std::size_t j = 0; j < g.size(); ++j) total[j] += c * g[j];
  }
  return total;
}

/// rows: (B * views, ...) features or (B * views, L) tokens.
template <class MakeModel>
void views_agree_with_definition(MakeModel make, const Shape& rows, std::size_t views, std::size_t classes,
                                 bool tokens = false, std::size_t vocab = 8185) {
  FastRng init(31), data(32), rng(33);
  auto model = make(init);
  BatchT<double> batch = tokens ? make_token_batch(rows[0], rows[1], vocab, data) : make_batch(rows, classes, data);
  batch.views = views;
  for (std::size_t r = 0; r < batch.size(); ++r) batch.ids[r] = std::int64_t(r / views);  // a view keeps its example's id
  REQUIRE(batch.examples() * views == batch.size());
  std::vector<double> norms;
  clipped_sum_of_view_means(*model, batch, 1e9, norms);
  std::vector<double> sorted = norms;
  std::sort(sorted.begin(), sorted.end());
  const double middle = 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  for (double clip : {middle, 1e9}) {
    CAPTURE(clip);
    ClipResult<double> ref;
    ref.sum = clipped_sum_of_view_means(*model, batch, clip, norms);
    for (std::string s : {"naive", "vanilla", "ghost", "microbatch:1"}) {
      CAPTURE(s);
      auto got = make_clip_strategy<double>(s, double(batch.examples()))->clipped_sum(*model, batch, clip, rng);
      check_same_sum(got, ref, 1e-9);
      if (s != "microbatch:1") {
        REQUIRE(got.norms.size() == norms.size());
        for (std::size_t i = 0; i < norms.size(); ++i) CHECK(got.norms(i) == doctest::Approx(norms[i]).epsilon(1e-9));
      }
    }
  }
}

}  // namespace

TEST_CASE("clipping: examples of several views (augmentation multiplicity): one clipped gradient per example") {
  SUBCASE("MLP") { views_agree_with_definition([](Rng& r) { return small_mlp(r); }, {12, 5}, 3, 3); }
  SUBCASE("weight used at many positions") {
    views_agree_with_definition([](Rng& r) { return std::make_unique<SharedWeightModel>(r); }, {8, 3, 4}, 2, 3);
  }
  SUBCASE("cnn26k") {
    views_agree_with_definition([](Rng& r) { return make_cnn26k<double>(Activation::tanh, r); }, {8, 1, 28, 28}, 2, 10);
  }
  SUBCASE("BiGRU over tokens") {
    views_agree_with_definition([](Rng& r) { return make_bigru<double>(r, 12, 5, 4, 2); }, {9, 7}, 3, 2, true, 12);
  }
}

TEST_CASE("clipping: jl:K over examples of several views estimates the norms of the view means") {
  FastRng init(34), data(35), rng(36);
  auto model = small_mlp(init);
  BatchT<double> batch = make_batch({12, 5}, 3, data);
  batch.views = 4;
  std::vector<double> norms;
  ClipResult<double> ref;
  ref.sum = clipped_sum_of_view_means(*model, batch, 0.2, norms);
  auto jl = make_clip_strategy<double>("jl:4000")->clipped_sum(*model, batch, 0.2, rng);
  REQUIRE(jl.norms.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(jl.norms(i) == doctest::Approx(norms[i]).epsilon(0.08));
  std::vector<A> diff;
  for (std::size_t j = 0; j < ref.sum.size(); ++j) diff.push_back(jl.sum[j] - ref.sum[j]);
  CHECK(total_norm(diff) < 0.05 * total_norm(ref.sum));
}

TEST_CASE("clipping: a batch whose rows are not whole examples is refused") {
  FastRng init(37), data(38), rng(39);
  auto model = small_mlp(init);
  BatchT<double> batch = make_batch({7, 5}, 3, data);
  batch.views = 2;
  for (std::string s : {"naive", "vanilla", "ghost", "jl:2"}) {
    CAPTURE(s);
    CHECK_THROWS_WITH_AS(make_clip_strategy<double>(s)->clipped_sum(*model, batch, 1.0, rng),
                         doctest::Contains("not whole examples"), std::invalid_argument);
  }
}

TEST_CASE("clipping: jl:K gives the same norms and sums whatever its chunks of directions") {
  FastRng init(44), data(45);
  auto model = make_cnn26k<double>(Activation::tanh, init);
  BatchT<double> batch = make_batch({5, 1, 28, 28}, 10, data);
  std::vector<ClipResult<double>> runs;
  for (std::string s : {"jl:7", "jl:7/1", "jl:7/3", "jl:7/7", "jl:7/50"}) {
    FastRng rng(46);  // the same directions for every chunking
    runs.push_back(make_clip_strategy<double>(s)->clipped_sum(*model, batch, 0.05, rng));
  }
  REQUIRE(runs[0].clipped > 0);
  for (std::size_t r = 1; r < runs.size(); ++r) {
    CAPTURE(r);
    DPGRAD_CHECK_CLOSE(runs[r].norms, runs[0].norms, 1e-10);
    check_same_sum(runs[r], runs[0], 1e-10);
  }
  CHECK(make_clip_strategy<double>("jl:7/3")->name() == "jl:7/3");
  CHECK(make_clip_strategy<double>("jl:7/3")->jl_dim() == 7);
  CHECK_THROWS_WITH_AS(make_clip_strategy<double>("jl:7/0"), doctest::Contains("jl:K/"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_clip_strategy<double>("jl:7/"), doctest::Contains("jl:K/"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_clip_strategy<double>("jl:/3"), doctest::Contains("jl:"), std::invalid_argument);
}

TEST_CASE("clipping: the clip factor keeps a float contribution's exact norm <= C, adversarial gradients") {
  // Gradients of norm just above or below C, as random directions and as equal
  // coordinates (every product rounds the same way); the contribution c g is
  // formed in float as the strategies do, its norm taken in long double (exact
  // squares of floats, the sum's relative error below P 2^-64, far inside the margin).
  FastRng rng(41);
  std::size_t checked = 0, over_without_margin = 0;
  for (double clip : {1.0, 0.37, 3e-3}) {
    for (std::size_t p : {std::size_t(7), std::size_t(1000), std::size_t(26010)}) {
      for (double rel : {-1e-6, -1e-7, -3e-8, 0.0, 1e-8, 3e-8, 1e-7, 1e-6, 1e-3, 2.0}) {
        for (int shape = 0; shape < 4; ++shape) {
          CAPTURE(clip);
          CAPTURE(p);
          CAPTURE(rel);
          CAPTURE(shape);
          std::vector<float> g(p);
          if (shape == 0) {
            const float a = float(clip / std::sqrt(double(p)) * (1 + rel));
            std::fill(g.begin(), g.end(), a);
          } else if (shape == 1) {  // the float just above: every coordinate rounded up
            const float a = float(clip / std::sqrt(double(p)) * (1 + rel));
            std::fill(g.begin(), g.end(), std::nextafter(a, 1.0f));
          } else {  // a random direction scaled to the target norm
            double sq = 0;
            std::vector<double> d(p);
            for (auto& v : d) {
              v = rng.normal() * (shape == 3 ? 1.0 : 1e-3 + rng.uniform());
              sq += v * v;
            }
            for (std::size_t j = 0; j < p; ++j) g[j] = float(d[j] / std::sqrt(sq) * clip * (1 + rel));
          }
          auto exact_norm2 = [&](float c) {
            long double s = 0;
            for (float v : g) {
              const long double x = static_cast<long double>(c * v);  // the product in float, as the strategies form it
              s += x * x;
            }
            return s;
          };
          const double n = std::sqrt(squared_norm(g.data(), p));
          const float c = clip_factor<float>(n, clip, p);
          CHECK(c > 0.0f);
          CHECK(c <= 1.0f);
          const long double bound = static_cast<long double>(clip) * static_cast<long double>(clip);
          CHECK(exact_norm2(c) <= bound);
          // a norm well inside C is left alone; one of 2C is scaled close to C
          if (rel < -1e-6) CHECK(c == 1.0f);
          if (rel == 2.0) CHECK(std::sqrt(double(exact_norm2(c))) > clip * (1 - 1e-5));
          // the old factor (norm summed in float, C / norm rounded to nearest) can exceed C
          float sum_f = 0;
          for (float v : g) sum_f += v * v;
          const double n_old = std::sqrt(double(sum_f));
          const float c_old = n_old > clip ? float(clip / n_old) : 1.0f;
          if (exact_norm2(c_old) > bound) ++over_without_margin;
          ++checked;
        }
      }
    }
  }
  CHECK(checked == 360);
  CHECK(over_without_margin > 0);  // the test can fail: without the margin some norms exceed C
  CAPTURE(over_without_margin);
  // a non-finite norm is a clear error
  CHECK_THROWS_WITH_AS(clip_factor<float>(NAN, 1.0, 3), doctest::Contains("non-finite"), std::runtime_error);
}
