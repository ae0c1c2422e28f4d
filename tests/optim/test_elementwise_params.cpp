// Parameters used by elementwise ops (y = x * w, x + w, x - w; w broadcast over
// the samples' axis): vanilla, ghost and the engine's rules against the
// per-example loop, in double, on each way such a parameter is used.
#include <string>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "layers/embedding.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "optim/clipping/clipping.hpp"
#include "support/batches.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;

namespace {

/// How the model below uses its elementwise parameters.
enum class Use {
  gain_shift,      // (x W) * g + s over (B, L, p): a normalisation's affine part
  subtract,        // x W - s: the parameter on the right of a subtraction
  broadcast_both,  // x (B, 1, p) * t (L, p): both operands broadcast
  mixed,           // m (1, p) used by linear and by mul (one gradient, two kinds of use)
  batch_varying,   // a (B, p)-shaped parameter "broadcast" along axis 0: refused
};

/// x (B, L, d) -> per-position linear (d, p) -> the elementwise use -> mean over
/// positions -> linear to 3 classes.
class ElementwiseModel final : public ModelT<double> {
 public:
  ElementwiseModel(Rng& rng, Use use, std::size_t batch = 4)
      : use_(use),
        w_(make_parameter<double>("w", randn<double>({5, 4}, rng, 0.5))),
        g_(make_parameter<double>("g", randn<double>({4}, rng, 0.5) + 1.0)),
        s_(make_parameter<double>("s", randn<double>({4}, rng, 0.5))),
        t_(make_parameter<double>("t", randn<double>({3, 4}, rng, 0.5))),
        v_(make_parameter<double>("v", randn<double>({batch, 1, 4}, rng, 0.5))),
        m_(make_parameter<double>("m", randn<double>({1, 4}, rng, 0.5))),
        out_(make_parameter<double>("out", randn<double>({4, 3}, rng, 0.5))) {}
  D forward(const BatchT<double>& b) override {
    D x = per_sample_input(b.inputs);  // (B, 3, 5)
    D h = linear(x, w_);               // (B, 3, 4)
    switch (use_) {
      case Use::gain_shift: h = add(mul(h, g_), s_); break;
      case Use::subtract: h = sub(tanh(h), s_); break;
      case Use::broadcast_both: h = mul(mean(h, {1}, true), t_); break;  // (B, 1, 4) * (3, 4)
      case Use::mixed: h = add(mul(h, m_), linear(mean(h, {2}, true), m_)); break;  // (B, 3, 1) (1, 4)
      case Use::batch_varying: h = mul(h, v_); break;
    }
    return linear(mean(tanh(h), {1}), out_);
  }
  std::vector<D> parameters() const override {
    switch (use_) {
      case Use::gain_shift: return {w_, g_, s_, out_};
      case Use::subtract: return {w_, s_, out_};
      case Use::broadcast_both: return {w_, t_, out_};
      case Use::mixed: return {w_, m_, out_};
      case Use::batch_varying: return {w_, v_, out_};
    }
    return {};
  }
  std::string name() const override { return "elementwise"; }

 private:
  Use use_;
  D w_, g_, s_, t_, v_, m_, out_;
};

/// Token embeddings plus a learned positional table (L, d), added by `add`.
class PositionalModel final : public ModelT<double> {
 public:
  PositionalModel(Rng& rng, std::size_t len)
      : embed_(13, 4, rng, "embed"),
        pos_(make_parameter<double>("pos", randn<double>({len, 4}, rng, 0.5))),
        out_(make_parameter<double>("out", randn<double>({4, 2}, rng, 0.5))) {}
  D forward(const BatchT<double>& b) override {
    D e = add(embed_.forward(b.tokens), pos_);  // (B, L, 4) + (L, 4)
    return linear(mean(tanh(e), {1}), out_);
  }
  std::vector<D> parameters() const override {
    auto ps = embed_.parameters();
    ps.push_back(pos_);
    ps.push_back(out_);
    return ps;
  }
  std::string name() const override { return "positional"; }

 private:
  EmbeddingT<double> embed_;
  D pos_, out_;
};

BatchT<double> sequences(std::size_t b, Rng& rng) {
  BatchT<double> batch;
  batch.inputs = randn<double>({b, 3, 5}, rng);
  for (std::size_t i = 0; i < b; ++i) {
    batch.labels.push_back(std::int32_t(rng.below(3)));
    batch.ids.push_back(std::int64_t(i));
  }
  return batch;
}

}  // namespace

TEST_CASE("elementwise parameters: every exact route agrees with the per-example loop") {
  FastRng init(41), data(42);
  for (Use use : {Use::gain_shift, Use::subtract, Use::broadcast_both, Use::mixed}) {
    CAPTURE(int(use));
    ElementwiseModel model(init, use);
    const PerSampleCheck c = check_per_sample(model, sequences(4, data));
    INFO(c.str());
    CHECK(c.routes.size() == 4);
    CHECK(c.agrees(1e-9));
  }
}

TEST_CASE("elementwise parameters: a learned positional table added to token embeddings") {
  FastRng init(43), data(44);
  PositionalModel model(init, 6);
  BatchT<double> batch;
  batch.tokens = xt::zeros<std::int32_t>({5, 6});
  for (std::size_t i = 0; i < 5; ++i) {
    for (std::size_t t = 0; t < 6; ++t) batch.tokens(i, t) = std::int32_t(1 + data.below(12));
    batch.lengths.push_back(6);
    batch.labels.push_back(std::int32_t(data.below(2)));
    batch.ids.push_back(std::int64_t(i));
  }
  const PerSampleCheck c = check_per_sample(model, batch);
  INFO(c.str());
  CHECK(c.agrees(1e-9));
}

TEST_CASE("elementwise parameters: the clipped sums of vanilla and ghost equal the loop's") {
  FastRng init(45), data(46), rng(47);
  ElementwiseModel model(init, Use::gain_shift, 6);
  const BatchT<double> batch = sequences(6, data);
  const auto naive = make_clip_strategy<double>("naive")->clipped_sum(model, batch, 0.3, rng);
  REQUIRE(naive.clipped > 0);
  for (std::string s : {"vanilla", "ghost"}) {
    CAPTURE(s);
    const auto r = make_clip_strategy<double>(s)->clipped_sum(model, batch, 0.3, rng);
    CHECK(r.clipped == naive.clipped);
    for (std::size_t j = 0; j < r.sum.size(); ++j)
      CHECK(xt::allclose(r.sum[j], naive.sum[j], 1e-10, 1e-12));
    CHECK(xt::allclose(r.norms, naive.norms, 1e-10, 1e-12));
  }
}

TEST_CASE("elementwise parameters: a parameter that varies along the samples' axis is refused, not guessed") {
  FastRng init(48), data(49), rng(50);
  ElementwiseModel model(init, Use::batch_varying, 4);
  const BatchT<double> batch = sequences(4, data);
  for (std::string s : {"vanilla", "ghost"}) {
    CAPTURE(s);
    CHECK_THROWS_WITH_AS(make_clip_strategy<double>(s)->clipped_sum(model, batch, 1.0, rng),
                         doctest::Contains("parameter 'v': per-sample rule: a parameter of shape (4, 1, 4) is used "
                                           "by mul along the samples' axis 0"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_clip_strategy<double>(s)->clipped_sum(model, batch, 1.0, rng),
                         doctest::Contains("must broadcast over it"), std::invalid_argument);
  }
}

TEST_CASE("elementwise parameters: check_per_sample refuses a parameter shaped like the batch in words that say so") {
  FastRng init(51), data(52);
  ElementwiseModel model(init, Use::batch_varying, 4);
  // before: the per-example loop's cross-entropy shape error, about logits and labels
  test::check_error<std::invalid_argument>(
      [&] { check_per_sample(model, sequences(4, data)); },
      {"check_per_sample: parameter 'v' of shape (4, 1, 4) is shaped like the batch (axis 0 holds 4, the batch's "
       "examples)",
       "a parameter is shared by every sample", "Give it a leading axis of 1"});
  // the same model with a gain and shift that broadcast: the check runs
  ElementwiseModel fine(init, Use::gain_shift, 4);
  CHECK(check_per_sample(fine, sequences(4, data)).agrees(1e-9));
}
