// Self-attention and the transformer: padding that attention ignores, a
// gradcheck through a block, every exact per-sample route against the
// per-example loop (sequences of different lengths), and jl:K's chi2 law.
#include <algorithm>
#include <cmath>
#include <map>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "data/datasets.hpp"
#include "layers/attention.hpp"
#include "layers/models.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "optim/clipping/clipping.hpp"
#include "support/check.hpp"
#include "support/jl.hpp"
#include "support/reference_ops.hpp"

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

/// b sequences of 1 to len tokens drawn from ids 1 to vocab - 1 (0 pads).
BatchT<double> sequences(std::size_t b, std::size_t len, Rng& rng, std::size_t vocab = 13) {
  BatchT<double> batch;
  batch.tokens = xt::zeros<std::int32_t>({b, len});
  for (std::size_t i = 0; i < b; ++i) {
    const std::size_t n = 1 + rng.below(len);
    for (std::size_t t = 0; t < n; ++t) batch.tokens(i, t) = std::int32_t(1 + rng.below(vocab - 1));
    batch.lengths.push_back(std::int32_t(n));
    batch.labels.push_back(std::int32_t(rng.below(3)));
    batch.ids.push_back(std::int64_t(i));
  }
  return batch;
}

/// The transformer classifier as layers/models.cpp composed it before the fused
/// ops, on the model's own parameters (by name): the reference its outputs and
/// gradients must match up to rounding.
template <class T>
TensorT<T> reference_transformer(const ModelT<T>& model, const BatchT<T>& batch, const TransformerOptions& o) {
  std::map<std::string, TensorT<T>> p;
  for (const auto& t : model.parameters()) p[t.name()] = t;
  auto dense = [&](const TensorT<T>& x, const std::string& n) { return linear(x, p.at(n + ".weight"), p.at(n + ".bias")); };
  auto norm = [&](const TensorT<T>& x, const std::string& n) {
    return test::reference_layer_norm(x, p.at(n + ".gain"), p.at(n + ".shift"), 1e-5);
  };
  const std::size_t b = batch.tokens.shape()[0], len = batch.tokens.shape()[1];
  const ArrayT<T> mask = key_padding_mask<T>(batch.lengths, len);
  TensorT<T> h = add(gather(p.at("embedding.weight"), batch.tokens, 0), p.at("positions.table"));
  for (std::size_t i = 1; i <= o.blocks; ++i) {
    const std::string n = "block" + std::to_string(i);
    const TensorT<T> y = norm(h, n + ".norm1");
    const TensorT<T> a = test::reference_attention(dense(y, n + ".attention.query"), dense(y, n + ".attention.key"),
                                                   dense(y, n + ".attention.value"), o.heads, mask);
    h = add(h, dense(a, n + ".attention.out"));
    h = add(h, dense(gelu(dense(norm(h, n + ".norm2"), n + ".mlp1")), n + ".mlp2"));
  }
  h = norm(h, "final_norm");
  ArrayT<T> weights = xt::zeros<T>({b, len, std::size_t(1)});
  for (std::size_t i = 0; i < b; ++i)
    for (std::int32_t t = 0; t < batch.lengths[i]; ++t) weights(i, std::size_t(t), 0) = T(1) / T(batch.lengths[i]);
  return dense(sum(mul(h, constant(std::move(weights))), {1}), "dense");
}

}  // namespace

TEST_CASE("attention: the transformer's outputs and gradients are the old composition's up to rounding") {
  FastRng init(20), data(21);
  const TransformerOptions o = small();
  auto model = make_transformer<double>(init, o);
  BatchT<double> batch = sequences(4, 6, data);
  batch.lengths[1] = 6;
  const A u = randn<double>({4, 3}, data);
  auto run = [&](bool reference) {
    for (auto p : model->parameters()) p.zero_grad();
    TapeT<double> tape;
    RecordScope<double> scope(tape);
    const D logits = reference ? reference_transformer(*model, batch, o) : model->forward(batch);
    tape.backward(logits, u);
    std::vector<A> r{logits.value()};
    for (const auto& p : model->parameters()) r.push_back(p.grad());
    return r;
  };
  const auto fused = run(false), composed = run(true);
  REQUIRE(fused.size() == composed.size());
  for (std::size_t i = 0; i < fused.size(); ++i) {
    CAPTURE(i);
    // floor 1e-6: the key bias's gradient is 0 in exact arithmetic (softmax ignores a
    // shift shared by a row's scores) and rounding leaves about 1e-17 in both
    const std::string diff = test::mismatch(fused[i], composed[i], 1e-10, 1e-6);
    INFO(diff);
    CHECK(diff.empty());
  }
  // float, the bench's transformer on two sequences (one padded): outputs to float rounding
  FastRng finit(22), fdata(23);
  auto big = make_transformer<float>(finit);
  BatchT<float> fb = data::synthetic_tokens(2, 150, 8185, 24);
  fb.lengths[1] = 97;
  NoRecordScope<float> none;
  CHECK(test::mismatch(big->forward(fb).value(), reference_transformer(*big, fb, TransformerOptions{}).value(), 1e-4,
                       1e-4)
            .empty());
}

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

TEST_CASE("attention: per-sample routes agree with the loop when the table's rows are split among threads") {
  // 1,200 rows: the embedding's weighted sums go to two threads by row ranges (256 rows or more
  // each), and ids 3 and 700, in every sample, fall on either side of the split
  TransformerOptions o = small();
  o.vocab = 1200;
  FastRng init(15), data(16);
  auto model = make_transformer<double>(init, o);
  BatchT<double> batch = sequences(6, 6, data, o.vocab);
  for (std::size_t i = 0; i < 6; ++i) {
    batch.tokens(i, 0) = 3;
    batch.tokens(i, std::size_t(batch.lengths[i]) - 1) = 700;
  }
  const PerSampleCheck c = check_per_sample(*model, batch);
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
