// Tests of the LSTM and BiLSTM layers: gradchecks (both modes) on padded
// batches, padding invariance, the reverse direction against a reversed input,
// per-sample independence, one step against the formulas, sizes and errors.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/lstm.hpp"
#include "support/check.hpp"
#include "support/recurrent.hpp"

using namespace dpgrad;
using test::check_bidirectional_joins_directions;
using test::check_float_and_empty_batch;
using test::check_parameter_derivatives;
using test::check_padding_invariance;
using test::check_per_sample_independence;
using test::check_reverse_is_forward_reversed;
using test::flat;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;
using Lengths = std::vector<std::int32_t>;

namespace {

struct Weights {
  A w_ih, w_hh, b;  // (d, 4H), (H, 4H), (4H)
};

Weights random_weights(std::size_t d, std::size_t h, Rng& rng) {
  return {randn<double>({d, 4 * h}, rng, 0.6), randn<double>({h, 4 * h}, rng, 0.6), randn<double>({4 * h}, rng, 0.3)};
}

double sig(double z) { return 1 / (1 + std::exp(-z)); }

}  // namespace

TEST_CASE("LSTM: gradchecks of the recurrence (vjp, jvp), forward and reverse, padded batches") {
  FastRng rng(101);
  const std::size_t d = 3, h = 2;
  struct Case {
    std::size_t b, l;
    Lengths lengths;
  };
  for (const auto& c : {Case{1, 1, {1}}, Case{1, 4, {4}}, Case{1, 4, {2}}, Case{3, 1, {1, 1, 1}},
                        Case{3, 4, {4, 1, 3}}, Case{3, 4, {2, 3, 1}}}) {
    Weights w = random_weights(d, h, rng);
    A x = randn<double>({c.b, c.l, d}, rng);
    for (bool reverse : {false, true}) {
      CAPTURE(c.b);
      CAPTURE(c.l);
      CAPTURE(c.lengths[0]);
      CAPTURE(reverse);
      auto f = [&](const std::vector<D>& v) { return flat(lstm_sequence(v[0], v[1], v[2], v[3], c.lengths, reverse)); };
      DPGRAD_CHECK_GRADS(gradcheck(f, {x, w.w_ih, w.w_hh, w.b}));
    }
  }
}

TEST_CASE("LSTM: the layer's derivatives with respect to its own parameters and input") {
  FastRng rng(102);
  LstmT<double> lstm(3, 2, rng);
  A x = randn<double>({3, 4, 3}, rng);
  Lengths lengths = {3, 4, 1};
  for (bool reverse : {false, true}) {
    CAPTURE(reverse);
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return flat(lstm.forward(v[0], lengths, reverse)); }, {x}));
    check_parameter_derivatives(lstm.parameters(), [&] { return flat(lstm.forward(D(x), lengths, reverse)); }, 7);
  }
}

TEST_CASE("BiLSTM: output is [forward, backward] of the two directions") {
  FastRng rng(104);
  BiLstmT<double> bi(3, 2, rng);
  auto p = bi.parameters();
  REQUIRE(p.size() == 6);  // {w_ih, w_hh, b} forward, then backward
  auto direction = [&](const D& x, const Lengths& l, bool reverse) {
    const std::size_t k = reverse ? 3 : 0;
    return lstm_sequence(x, p[k], p[k + 1], p[k + 2], l, reverse);
  };
  check_bidirectional_joins_directions([&](const D& x, const Lengths& l) { return bi.forward(x, l); }, direction, 3, 2,
                                       rng);
}

TEST_CASE("LSTM: padding invariance (junk in padded positions, extra padded steps)") {
  FastRng rng(105);
  LstmT<double> lstm(3, 2, rng);
  BiLstmT<double> bi(3, 2, rng);
  check_padding_invariance([&](const D& x, const Lengths& l, bool reverse) { return lstm.forward(x, l, reverse); },
                           [&](const D& x, const Lengths& l) { return bi.forward(x, l); }, 3, 2, rng);
}

TEST_CASE("LSTM: the reverse direction equals the forward one on each sequence reversed within its length") {
  FastRng rng(106);
  LstmT<double> lstm(3, 2, rng);
  check_reverse_is_forward_reversed(
      [&](const D& x, const Lengths& l, bool reverse) { return lstm.forward(x, l, reverse); }, 3, 2, rng);
}

TEST_CASE("LSTM: two steps against the formulas with known weights (gate order i, f, g, o)") {
  FastRng rng(108);
  const std::size_t d = 2, h = 2;
  LstmT<double> lstm(d, h, rng);
  auto p = lstm.parameters();
  // w_ih (2, 8), w_hh (2, 8), b (8): column blocks [i | f | g | o], H = 2 each
  A w_ih = {{0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8}, {0.2, 0.1, -0.3, 0.5, 0.4, -0.6, 0.1, 0.3}};
  A w_hh = {{0.5, -0.1, 0.2, 0.3, 0.6, -0.4, -0.2, 0.1}, {-0.3, 0.4, 0.1, -0.2, 0.2, 0.5, 0.3, -0.6}};
  A b = {0.05, -0.1, 0.2, 0.0, -0.05, 0.1, 0.15, -0.2};
  D(p[0]).mutable_value() = w_ih;
  D(p[1]).mutable_value() = w_hh;
  D(p[2]).mutable_value() = b;
  A x = {{{1.0, -0.5}, {0.3, 2.0}}};  // (1, 2, 2)

  // reference: the textbook equations, one scalar at a time
  double hs[2] = {0, 0}, cs[2] = {0, 0};
  A expect_states = xt::zeros<double>({std::size_t(1), std::size_t(2), h});
  for (std::size_t t = 0; t < 2; ++t) {
    double z[8];
    for (std::size_t j = 0; j < 8; ++j) {
      z[j] = b(j);
      for (std::size_t k = 0; k < d; ++k) z[j] += x(0, t, k) * w_ih(k, j);
      for (std::size_t k = 0; k < h; ++k) z[j] += hs[k] * w_hh(k, j);
    }
    for (std::size_t u = 0; u < h; ++u) {
      double i = sig(z[u]), f = sig(z[h + u]), g = std::tanh(z[2 * h + u]), o = sig(z[3 * h + u]);
      cs[u] = f * cs[u] + i * g;
      hs[u] = o * std::tanh(cs[u]);
      expect_states(0, t, u) = hs[u];
    }
  }
  NoRecordScope<double> none;
  auto out = lstm.forward(D(x), {2});
  DPGRAD_CHECK_CLOSE(out.states.value(), expect_states, 1e-14);
  DPGRAD_CHECK_CLOSE(out.final.value(), (A{{hs[0], hs[1]}}), 1e-14);
  // first step by hand for unit 0: z_i = 0.05 + 1*0.1 - 0.5*0.2 = 0.05, z_f = 0.2 + 0.3 + 0.15 = 0.65,
  // z_g = -0.05 - 0.5 - 0.2 = -0.75, z_o = 0.15 + 0.7 - 0.05 = 0.8; c = i g; h = o tanh(c)
  double c0 = sig(0.05) * std::tanh(-0.75);
  CHECK(out.states.value()(0, 0, 0) == doctest::Approx(sig(0.8) * std::tanh(c0)).epsilon(1e-14));
}

TEST_CASE("LSTM: parameter shapes, names, initialisation and the bilstm598k count") {
  FastRng rng(109);
  Lstm lstm(64, 64, rng);
  auto p = lstm.parameters();
  REQUIRE(p.size() == 3);
  CHECK(p[0].shape() == Shape{64, 256});
  CHECK(p[1].shape() == Shape{64, 256});
  CHECK(p[2].shape() == Shape{256});
  CHECK(p[0].name() == "lstm.weight_ih");
  CHECK(p[2].name() == "lstm.bias");
  CHECK(lstm.parameter_count() == 33024);
  const double bound = 1.0 / 8.0;  // 1 / sqrt(H)
  for (const auto& t : p) {
    CHECK(t.is_parameter());
    double m = xt::amax(xt::abs(t.value()))();
    CHECK(m <= bound);
    CHECK(m > 0.9 * bound);
  }
  BiLstm bi(64, 64, rng);
  CHECK(bi.parameter_count() == 66048);
  CHECK(bi.parameters()[3].name() == "bilstm.backward.weight_ih");
  // Embedding(8185, 64) + BiLSTM(64 -> 64) + Dense(128 -> 64) + Dense(64 -> 2)
  CHECK(8185 * 64 + bi.parameter_count() + (128 * 64 + 64) + (64 * 2 + 2) == 598274);
}

TEST_CASE("LSTM: uses recorded for per-sample gradients (w_ih and b once, w_hh once per later step)") {
  FastRng rng(110);
  LstmT<double> lstm(3, 2, rng);
  A x = randn<double>({2, 5, 3}, rng);
  TapeT<double> tape;
  tape.record_uses(true);
  RecordScope<double> scope(tape);
  auto out = lstm.forward(D(x), {3, 4});  // steps 0..3 run; step 4 is padding for both
  auto p = lstm.parameters();
  REQUIRE(tape.uses().size() == 3);
  for (const auto& group : tape.uses()) {
    if (group.param.get() == p[1].node()) CHECK(group.uses.size() == 3);  // h_0 = 0 needs no w_hh
    else CHECK(group.uses.size() == 1);
  }
}

TEST_CASE("LSTM: float instantiation and an empty batch") {
  FastRng rng(111);
  BiLstm bi(3, 4, rng);
  check_float_and_empty_batch([&](const Tensor& x, const Lengths& l) { return bi.forward(x, l); }, rng);
}

TEST_CASE("LSTM: bad input throws std::invalid_argument") {
  FastRng rng(112);
  LstmT<double> lstm(3, 2, rng);
  A x = randn<double>({2, 4, 3}, rng);
  CHECK_THROWS_AS(lstm.forward(D(x), {4}), std::invalid_argument);          // too few lengths
  CHECK_THROWS_AS(lstm.forward(D(x), {4, 4, 4}), std::invalid_argument);    // too many
  CHECK_THROWS_AS(lstm.forward(D(x), {0, 4}), std::invalid_argument);       // empty sequence
  CHECK_THROWS_AS(lstm.forward(D(x), {-1, 4}), std::invalid_argument);
  CHECK_THROWS_AS(lstm.forward(D(x), {5, 4}), std::invalid_argument);       // longer than L
  CHECK_THROWS_WITH_AS(lstm.forward(D(x), {2, 5}), doctest::Contains("outside [1, 4]"), std::invalid_argument);
  CHECK_THROWS_AS(lstm.forward(D(A(xt::zeros<double>({2, 3}))), {1, 1}), std::invalid_argument);     // not (B, L, d)
  CHECK_THROWS_AS(lstm.forward(D(A(xt::zeros<double>({2, 4, 5}))), {1, 1}), std::invalid_argument);  // wrong d
  CHECK_THROWS_AS(LstmT<double>(0, 2, rng), std::invalid_argument);
  CHECK_THROWS_AS(LstmT<double>(3, 0, rng), std::invalid_argument);
  BiLstmT<double> bi(3, 2, rng);
  CHECK_THROWS_AS(bi.forward(D(x), {1, 9}), std::invalid_argument);
}
