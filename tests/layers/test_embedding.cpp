// Embedding: shapes, initialisation, padding (zero rows, no gradient), gradients
// with respect to the table, the recorded per-sample use, and bad ids.
#include <cmath>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/embedding.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;
using Ids = ArrayT<std::int32_t>;

TEST_CASE("Embedding: shape, N(0, 1) initialisation, zero padding row") {
  FastRng rng(51);
  EmbeddingT<double> emb(1000, 16, rng, "embedding", 0);
  const A& w = emb.weight().value();
  CHECK(shape_of(w) == Shape{1000, 16});
  CHECK(emb.weight().name() == "embedding.weight");
  CHECK(emb.parameter_count() == 16000);
  CHECK(xt::sum(xt::abs(xt::view(w, 0)))() == 0.0);
  // the other 15,984 entries: mean 0 and variance 1 within loose bounds (fixed seed)
  A rest = xt::view(w, xt::range(1, 1000));
  double mean = xt::mean(rest)(), var = xt::variance(rest)();
  CHECK(std::abs(mean) < 0.05);
  CHECK(std::abs(var - 1.0) < 0.05);

  NoRecordScope<double> none;
  Ids ids = {{3, 7, 0, 0}, {999, 0, 1, 3}};
  A y = emb.forward(ids).value();
  REQUIRE(shape_of(y) == Shape{2, 4, 16});
  for (std::size_t j = 0; j < 16; ++j) {
    CHECK(y(0, 0, j) == w(3, j));
    CHECK(y(1, 3, j) == w(3, j));
    CHECK(y(1, 0, j) == w(999, j));
    CHECK(y(0, 2, j) == 0.0);
    CHECK(y(1, 1, j) == 0.0);
  }
  // no padding: row 0 is an ordinary row
  EmbeddingT<double> plain(10, 4, rng, "plain", -1);
  CHECK(xt::sum(xt::abs(xt::view(plain.weight().value(), 0)))() > 0.0);
}

TEST_CASE("Embedding: gradients reach the used rows, never the padding row") {
  FastRng rng(52);
  EmbeddingT<double> emb(6, 3, rng, "embedding", 0);
  Ids ids = {{1, 5, 5, 0}, {2, 0, 4, 1}};
  A u = randn<double>({2, 4, 3}, rng);
  TapeT<double> tape;
  tape.record_uses(true);
  {
    RecordScope<double> scope(tape);
    D y = emb.forward(ids);
    tape.backward(y, u);
  }
  // expected: row r gets the sum of u at the positions holding r, padding excluded
  A want = xt::zeros<double>({6, 3});
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t t = 0; t < 4; ++t)
      if (ids(b, t) != 0)
        for (std::size_t j = 0; j < 3; ++j) want(std::size_t(ids(b, t)), j) += u(b, t, j);
  DPGRAD_CHECK_CLOSE(emb.weight().grad(), want, 1e-15);
  CHECK(xt::sum(xt::abs(xt::view(emb.weight().grad(), 0)))() == 0.0);
  // one gather use of the table, for the per-sample rules
  REQUIRE(tape.uses().size() == 1);
  REQUIRE(tape.uses()[0].uses.size() == 1);
  CHECK(tape.uses()[0].param.get() == emb.weight().node());
  CHECK(tape.uses()[0].uses[0]->kind == UseKind::gather);
  CHECK(tape.uses()[0].uses[0]->ids->size() == 8);

  // gradient check of the lookup as a function of the table (same ids and padding as the layer)
  A table = emb.weight().value();
  DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return gather(v[0], ids, emb.padding_id()); }, {table}));
  // and a downstream composite: the gradient with respect to the table flows through
  DPGRAD_CHECK_GRADS(gradcheck(
      [&](const std::vector<D>& v) { return sum(tanh(gather(v[0], ids, emb.padding_id())), {1}); }, {table}));
}

TEST_CASE("Embedding: bad ids and sizes throw") {
  FastRng rng(53);
  EmbeddingT<double> emb(5, 2, rng);
  NoRecordScope<double> none;
  CHECK_THROWS_AS(emb.forward(Ids{{1, 5}}), std::invalid_argument);   // id == vocab
  CHECK_THROWS_AS(emb.forward(Ids{{1, -2}}), std::invalid_argument);  // negative
  CHECK_THROWS_AS(emb.forward(Ids{1, 2}), std::invalid_argument);     // not (B, L)
  CHECK_THROWS_AS(EmbeddingT<double>(5, 2, rng, "e", 5), std::invalid_argument);
  CHECK_THROWS_AS(EmbeddingT<double>(0, 2, rng), std::invalid_argument);
  CHECK_THROWS_AS(EmbeddingT<double>(5, 0, rng), std::invalid_argument);
}
