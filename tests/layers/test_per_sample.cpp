// Per-sample rules on whole models, in double precision, against a per-example
// loop: materialised per-sample gradients (dense, and as vanilla keeps them),
// ghost norms (and the materialised route to the same norms), and the
// book-keeping weighted sum.
#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/per_sample.hpp"
#include "engine/tape.hpp"
#include "layers/models.hpp"
#include "support/batches.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

BatchT<double> token_batch(std::size_t b, std::size_t len, Rng& rng) {
  BatchT<double> batch;
  batch.tokens = xt::zeros<std::int32_t>({b, len});
  for (std::size_t i = 0; i < b; ++i) {
    std::size_t n = 1 + rng.below(len);
    for (std::size_t t = 0; t < n; ++t) batch.tokens(i, t) = std::int32_t(1 + rng.below(12));  // repeats likely
    batch.lengths.push_back(std::int32_t(n));
    batch.labels.push_back(std::int32_t(rng.below(2)));
  }
  return batch;
}

/// Gradients of example i alone (batch-1 backward), one per parameter.
std::vector<A> loop_gradient(ModelT<double>& model, const BatchT<double>& batch, std::size_t i) {
  auto ps = model.parameters();
  for (auto& p : ps) p.zero_grad();
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  tape.backward(sum(cross_entropy(model.forward(batch.select({i})), {batch.labels[i]})));
  std::vector<A> g;
  for (auto& p : ps) g.push_back(p.grad());
  for (auto& p : ps) p.zero_grad();
  return g;
}

void check_model(ModelT<double>& model, const BatchT<double>& batch) {
  const std::size_t b = batch.size();
  auto ps = model.parameters();
  std::vector<std::vector<A>> loop;
  for (std::size_t i = 0; i < b; ++i) loop.push_back(loop_gradient(model, batch, i));

  TapeT<double> tape;
  tape.record_uses(true, false);
  {
    RecordScope<double> scope(tape);
    tape.backward(sum(cross_entropy(model.forward(batch), batch.labels)));
  }
  std::unordered_map<const Node<double>*, const ParamUses<double>*> groups;
  for (const auto& g : tape.uses()) groups[g.param.get()] = &g;
  A c = xt::zeros<double>({b});
  for (std::size_t i = 0; i < b; ++i) c(i) = 0.3 + 0.5 * double(i);
  for (std::size_t j = 0; j < ps.size(); ++j) {
    CAPTURE(ps[j].name());
    REQUIRE(groups.count(ps[j].node()));
    const auto& g = *groups[ps[j].node()];
    A per = per_sample_gradients(g, b);
    A ghost = per_sample_norms_squared(g, b, NormMethod::ghost);
    A mat = per_sample_norms_squared(g, b, NormMethod::materialise);
    PerSampleGradients<double> kept = materialise_per_sample_gradients(g, b);  // sparse for the embedding
    A kept_norms = kept.norms_squared();
    A expected_sum = xt::zeros<double>(ps[j].value().shape());
    for (std::size_t i = 0; i < b; ++i) {
      CAPTURE(i);
      A gi = xt::view(per, i);
      DPGRAD_CHECK_CLOSE(gi, loop[i][j], 1e-9);
      double n2 = xt::sum(loop[i][j] * loop[i][j])();
      CHECK(ghost(i) == doctest::Approx(n2).epsilon(1e-9));
      CHECK(mat(i) == doctest::Approx(n2).epsilon(1e-9));
      CHECK(kept_norms(i) == doctest::Approx(n2).epsilon(1e-9));
      expected_sum += c(i) * loop[i][j];
    }
    std::string diff = test::mismatch(weighted_gradient_sum(g, c), expected_sum, 1e-9, 1e-12);
    INFO(diff);
    CHECK(diff.empty());
    std::string kept_diff = test::mismatch(kept.weighted_sum(c), expected_sum, 1e-9, 1e-12);
    INFO(kept_diff);
    CHECK(kept_diff.empty());
  }
}

}  // namespace

TEST_CASE("per-sample rules: a small MLP") {
  FastRng init(1), data(2);
  auto model = make_mlp<double>({784, 16, 10}, Activation::tanh, init);
  check_model(*model, test::image_batch(3, data));
}

TEST_CASE("per-sample rules: cnn26k (convolution uses grouped over positions)") {
  FastRng init(3), data(4);
  auto model = make_cnn26k<double>(Activation::tanh, init);
  check_model(*model, test::image_batch(3, data));
}

TEST_CASE("per-sample rules: bilstm598k (weights used at every step, repeated tokens, padding)") {
  FastRng init(5), data(6);
  auto model = make_bilstm598k<double>(init);
  check_model(*model, token_batch(3, 7, data));
}

TEST_CASE("per-sample rules: a small BiGRU classifier (a layer built only from ops, no rule of its own)") {
  FastRng init(9), data(10);
  // Embedding(16, 5) -> BiGRU(4) -> Dense(8 -> 3): every weight through linear or gather
  auto model = make_bigru<double>(init, 16, 5, 4, 3);
  BatchT<double> batch = token_batch(4, 6, data);
  batch.lengths[1] = 1;  // a sequence of one token: one step of w_hh, from h_0 = 0
  for (std::size_t t = 1; t < 6; ++t) batch.tokens(1, t) = 0;
  for (auto& y : batch.labels) y = std::int32_t(data.below(3));
  check_model(*model, batch);
}

TEST_CASE("per-sample rules: bigru (full size)") {
  FastRng init(11), data(12);
  auto model = make_model<double>("bigru", init);
  check_model(*model, token_batch(3, 7, data));
}

TEST_CASE("per-sample rules: batch of one equals the plain gradient") {
  FastRng init(7), data(8);
  auto model = make_cnn26k<double>(Activation::relu, init);
  check_model(*model, test::image_batch(1, data));
}

TEST_CASE("per-sample rules: which parameters have per-sample gradients small enough to keep") {
  // At most half of what the uses hold. cnn26k: conv1's kernel (1,024 values per
  // sample against 196 positions of 64 + 16) and both convolutions' biases; not
  // conv2's kernel (8,192 against 25 positions of 256 + 32), nor any dense layer
  // (one position). bilstm598k over 7 steps: the LSTM biases (256 values against
  // 7 steps of 1 + 256), not its weights (16,384 against 7 of 64 + 256).
  auto small_set = [](ModelT<double>& model, const BatchT<double>& batch) {
    TapeT<double> tape;
    tape.record_uses(true, false);
    {
      RecordScope<double> scope(tape);
      tape.backward(sum(cross_entropy(model.forward(batch), batch.labels)));
    }
    std::vector<std::string> names;
    for (const auto& g : tape.uses())
      if (per_sample_gradients_are_small(g, batch.size())) names.push_back(g.param->name);
    std::sort(names.begin(), names.end());
    return names;
  };
  FastRng init(13), data(14);
  auto cnn = make_cnn26k<double>(Activation::tanh, init);
  CHECK(small_set(*cnn, test::image_batch(2, data)) == std::vector<std::string>{"conv1.bias", "conv1.weight", "conv2.bias"});
  auto lstm = make_bilstm598k<double>(init);
  CHECK(small_set(*lstm, token_batch(2, 7, data)) ==
        std::vector<std::string>{"bilstm.backward.bias", "bilstm.forward.bias"});
}
