// Self-attention and the transformer: padding that attention ignores, a
// gradcheck through a block, every exact per-sample route against the
// per-example loop (sequences of different lengths), and jl:K's chi2 law.
#include <algorithm>
#include <cmath>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/attention.hpp"
#include "layers/models.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "optim/clipping/clipping.hpp"
#include "support/check.hpp"
#include "support/jl.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

TransformerOptions small() {
  TransformerOptions o;
  o.vocab = 13;
  o.length = 6;
  o.dim = 8;
  o.heads = 2;
  o.hidden = 16;
  o.blocks = 2;
  o.classes = 3;
  return o;
}

BatchT<double> sequences(std::size_t b, std::size_t len, Rng& rng) {
  BatchT<double> batch;
  batch.tokens = xt::zeros<std::int32_t>({b, len});
  for (std::size_t i = 0; i < b; ++i) {
    const std::size_t n = 1 + rng.below(len);
    for (std::size_t t = 0; t < n; ++t) batch.tokens(i, t) = std::int32_t(1 + rng.below(12));
    batch.lengths.push_back(std::int32_t(n));
    batch.labels.push_back(std::int32_t(rng.below(3)));
    batch.ids.push_back(std::int64_t(i));
  }
  return batch;
}

}  // namespace

TEST_CASE("attention: padded positions change nothing, and the heads must divide the width") {
  FastRng init(1), data(2);
  auto model = make_transformer<double>(init, small());
  NoRecordScope<double> none;
  BatchT<double> batch = sequences(3, 6, data);
  batch.lengths = {2, 6, 4};
  const A before = model->forward(batch).value();
  // other tokens in the padding: the same outputs
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t t = std::size_t(batch.lengths[i]); t < 6; ++t) batch.tokens(i, t) = 7;
  const A after = model->forward(batch).value();
  DPGRAD_CHECK_CLOSE(after, before, 1e-12);
  CHECK(model->parameter_count() > 0);
  CHECK(make_transformer<float>(init)->parameter_count() == 633666);
  CHECK_THROWS_WITH_AS(MultiHeadAttentionT<double>(8, 3, init), doctest::Contains("do not split into 3 heads"),
                       std::invalid_argument);
  PositionalEmbeddingT<double> pos(6, 8, init);
  CHECK_THROWS_WITH_AS(pos.forward(D(randn<double>({2, 5, 8}, data))), doctest::Contains("pad the sequences"),
                       std::invalid_argument);
}

TEST_CASE("attention: gradcheck through a masked attention block and through self-attention alone") {
  FastRng init(3), data(4);
  TransformerBlockT<double> block(8, 2, 12, init, "b");
  MultiHeadAttentionT<double> attention(8, 4, init, "a");
  const A mask = key_padding_mask<double>({5, 3}, 5);
  const std::vector<A> inputs{randn<double>({2, 5, 8}, data)};
  DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return block.forward(v[0], mask); }, inputs));
  DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return attention.forward(v[0]); }, inputs));
}

TEST_CASE("attention: every exact per-sample route agrees with the per-example loop on a transformer") {
  FastRng init(5), data(6);
  auto model = make_transformer<double>(init, small());
  const PerSampleCheck c = check_per_sample(*model, sequences(5, 6, data));
  INFO(c.str());
  CHECK(c.routes.size() == 4);
  CHECK(c.agrees(1e-9));
}

TEST_CASE("attention: jl:K norm estimates on a transformer follow chi2_K / K") {
  FastRng init(7), data(8), rng(9);
  auto model = make_transformer<double>(init, small());
  const BatchT<double> batch = sequences(6, 6, data);
  const test::JlLaw law = test::jl3_law(*model, batch, rng);
  CHECK(law.ks < law.critical);
  CHECK(law.mean == doctest::Approx(1.0).epsilon(0.1));
}

TEST_CASE("attention: a frozen embedding is a constant: no parameter, no gradient, the same outputs") {
  FastRng init_a(10), init_b(10), data(11);
  auto trained = make_transformer<double>(init_a, small());
  TransformerOptions o = small();
  o.train_embedding = false;
  auto frozen = make_transformer<double>(init_b, o);
  // the same draws: only the table leaves the parameter list
  CHECK(frozen->parameter_count() == trained->parameter_count() - 13 * 8);
  for (const auto& p : frozen->parameters()) CHECK(p.name().rfind("embedding", 0) != 0);
  const BatchT<double> batch = sequences(4, 6, data);
  NoRecordScope<double> none;
  DPGRAD_CHECK_CLOSE(frozen->forward(batch).value(), trained->forward(batch).value(), 0.0);
  CHECK(make_transformer<float>(init_a, TransformerOptions{.train_embedding = false})->parameter_count() == 109826);
}

TEST_CASE("attention: every exact per-sample route agrees with the per-example loop with the embedding frozen") {
  FastRng init(12), data(13);
  TransformerOptions o = small();
  o.train_embedding = false;
  auto model = make_transformer<double>(init, o);
  const PerSampleCheck c = check_per_sample(*model, sequences(5, 6, data));
  INFO(c.str());
  CHECK(c.routes.size() == 4);
  CHECK(c.agrees(1e-9));
}
