// Tests of the GRU and BiGRU layers: gradchecks (both modes) of the recurrence
// with respect to every input and of the layers' own parameters, padding
// invariance, the reverse direction against a reversed input, two steps against
// PyTorch's formulas, the uses recorded for per-sample rules, sizes and errors.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/gru.hpp"
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
  A w_ih, w_hh, b_ih, b_hh;  // (d, 3H), (H, 3H), (3H), (3H)
};

Weights random_weights(std::size_t d, std::size_t h, Rng& rng) {
  return {randn<double>({d, 3 * h}, rng, 0.6), randn<double>({h, 3 * h}, rng, 0.6), randn<double>({3 * h}, rng, 0.3),
          randn<double>({3 * h}, rng, 0.3)};
}

double sig(double z) { return 1 / (1 + std::exp(-z)); }

}  // namespace

TEST_CASE("GRU: gradchecks of the recurrence (vjp, jvp) w.r.t. every input, forward and reverse, padded batches") {
  FastRng rng(201);
  struct Case {
    std::size_t b, l;
    Lengths lengths;
  };
  using Sizes = std::pair<std::size_t, std::size_t>;  // (d, H): both non-square ways
  for (const Sizes& size : {Sizes{3, 2}, Sizes{2, 3}}) {
    const std::size_t d = size.first, h = size.second;
    for (const auto& c : {Case{1, 1, {1}}, Case{1, 4, {4}}, Case{1, 4, {2}}, Case{3, 1, {1, 1, 1}},
                          Case{3, 4, {4, 1, 3}}, Case{3, 4, {2, 3, 1}}}) {
      Weights w = random_weights(d, h, rng);
      A x = randn<double>({c.b, c.l, d}, rng);
      for (bool reverse : {false, true}) {
        CAPTURE(d);
        CAPTURE(h);
        CAPTURE(c.b);
        CAPTURE(c.l);
        CAPTURE(c.lengths[0]);
        CAPTURE(reverse);
        auto f = [&](const std::vector<D>& v) {
          return flat(gru_sequence(v[0], v[1], v[2], v[3], v[4], c.lengths, reverse));
        };
        DPGRAD_CHECK_GRADS(gradcheck(f, {x, w.w_ih, w.w_hh, w.b_ih, w.b_hh}));
      }
    }
  }
}

TEST_CASE("GRU: the layer's derivatives with respect to its own parameters and input") {
  FastRng rng(202);
  GruT<double> gru(3, 2, rng);
  A x = randn<double>({3, 4, 3}, rng);
  Lengths lengths = {3, 4, 1};
  for (bool reverse : {false, true}) {
    CAPTURE(reverse);
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return flat(gru.forward(v[0], lengths, reverse)); }, {x}));
    check_parameter_derivatives(gru.parameters(), [&] { return flat(gru.forward(D(x), lengths, reverse)); }, 17);
  }
}

TEST_CASE("BiGRU: output is [forward, backward] of the two directions") {
  FastRng rng(204);
  BiGruT<double> bi(3, 2, rng);
  auto p = bi.parameters();
  REQUIRE(p.size() == 8);  // {w_ih, w_hh, b_ih, b_hh} forward, then backward
  auto direction = [&](const D& x, const Lengths& l, bool reverse) {
    const std::size_t k = reverse ? 4 : 0;
    return gru_sequence(x, p[k], p[k + 1], p[k + 2], p[k + 3], l, reverse);
  };
  check_bidirectional_joins_directions([&](const D& x, const Lengths& l) { return bi.forward(x, l); }, direction, 3, 2,
                                       rng);
}

TEST_CASE("GRU: padding invariance (junk in padded positions, extra padded steps)") {
  FastRng rng(205);
  GruT<double> gru(3, 2, rng);
  BiGruT<double> bi(3, 2, rng);
  check_padding_invariance([&](const D& x, const Lengths& l, bool reverse) { return gru.forward(x, l, reverse); },
                           [&](const D& x, const Lengths& l) { return bi.forward(x, l); }, 3, 2, rng);
}

TEST_CASE("GRU: the reverse direction equals the forward one on each sequence reversed within its length") {
  FastRng rng(206);
  GruT<double> gru(3, 2, rng);
  check_reverse_is_forward_reversed(
      [&](const D& x, const Lengths& l, bool reverse) { return gru.forward(x, l, reverse); }, 3, 2, rng);
}

TEST_CASE("GRU: two steps against PyTorch's formulas with known weights (gate order r, z, n)") {
  FastRng rng(208);
  const std::size_t d = 2, h = 2;
  GruT<double> gru(d, h, rng);
  auto p = gru.parameters();
  // w_ih (2, 6), w_hh (2, 6), b_ih (6), b_hh (6): column blocks [r | z | n], H = 2 each
  A w_ih = {{0.1, -0.2, 0.3, 0.4, -0.5, 0.6}, {0.2, 0.1, -0.3, 0.5, 0.4, -0.6}};
  A w_hh = {{0.5, -0.1, 0.2, 0.3, 0.6, -0.4}, {-0.3, 0.4, 0.1, -0.2, 0.2, 0.5}};
  A b_ih = {0.05, -0.1, 0.2, 0.0, -0.05, 0.1};
  A b_hh = {0.1, 0.2, -0.1, 0.3, 0.25, -0.15};
  D(p[0]).mutable_value() = w_ih;
  D(p[1]).mutable_value() = w_hh;
  D(p[2]).mutable_value() = b_ih;
  D(p[3]).mutable_value() = b_hh;
  A x = {{{1.0, -0.5}, {0.3, 2.0}}};  // (1, 2, 2)

  // reference: torch.nn.GRU's equations, one scalar at a time
  double hs[2] = {0, 0};
  A expect_states = xt::zeros<double>({std::size_t(1), std::size_t(2), h});
  for (std::size_t t = 0; t < 2; ++t) {
    double gi[6], gh[6];  // x W_ih + b_ih, h W_hh + b_hh
    for (std::size_t j = 0; j < 6; ++j) {
      gi[j] = b_ih(j);
      gh[j] = b_hh(j);
      for (std::size_t k = 0; k < d; ++k) gi[j] += x(0, t, k) * w_ih(k, j);
      for (std::size_t k = 0; k < h; ++k) gh[j] += hs[k] * w_hh(k, j);
    }
    double next[2];
    for (std::size_t u = 0; u < h; ++u) {
      double r = sig(gi[u] + gh[u]), z = sig(gi[h + u] + gh[h + u]);
      double n = std::tanh(gi[2 * h + u] + r * gh[2 * h + u]);
      next[u] = (1 - z) * n + z * hs[u];
    }
    for (std::size_t u = 0; u < h; ++u) expect_states(0, t, u) = hs[u] = next[u];
  }
  NoRecordScope<double> none;
  auto out = gru.forward(D(x), {2});
  DPGRAD_CHECK_CLOSE(out.states.value(), expect_states, 1e-14);
  DPGRAD_CHECK_CLOSE(out.final.value(), (A{{hs[0], hs[1]}}), 1e-14);
  // first step by hand for unit 0 (h_0 = 0, so h W_hh + b_hh = b_hh):
  // a_r = 0.05 + 1*0.1 - 0.5*0.2 = 0.05, r = s(0.05 + 0.1);
  // a_z = 0.2 + 1*0.3 - 0.5*(-0.3) = 0.65, z = s(0.65 - 0.1);
  // a_n = -0.05 + 1*(-0.5) - 0.5*0.4 = -0.75, n = tanh(-0.75 + r * 0.25); h = (1 - z) n
  const double r0 = sig(0.15), z0 = sig(0.55);
  CHECK(out.states.value()(0, 0, 0) == doctest::Approx((1 - z0) * std::tanh(-0.75 + r0 * 0.25)).epsilon(1e-14));
  // b_hn sits inside the reset gate (not tanh(a_n + b_hn + r * h W_hn)): the two differ here
  CHECK(std::abs(out.states.value()(0, 0, 0) - (1 - z0) * std::tanh(-0.75 + 0.25)) > 1e-3);
}

TEST_CASE("GRU: parameter shapes, names, initialisation and counts") {
  FastRng rng(209);
  Gru gru(64, 64, rng);
  auto p = gru.parameters();
  REQUIRE(p.size() == 4);
  CHECK(p[0].shape() == Shape{64, 192});
  CHECK(p[1].shape() == Shape{64, 192});
  CHECK(p[2].shape() == Shape{192});
  CHECK(p[3].shape() == Shape{192});
  CHECK(p[0].name() == "gru.weight_ih");
  CHECK(p[1].name() == "gru.weight_hh");
  CHECK(p[2].name() == "gru.bias_ih");
  CHECK(p[3].name() == "gru.bias_hh");
  CHECK(gru.parameter_count() == 24960);  // 3 gate blocks: 64*192 + 64*192 + 192 + 192
  const double bound = 1.0 / 8.0;  // 1 / sqrt(H)
  for (const auto& t : p) {
    CHECK(t.is_parameter());
    double m = xt::amax(xt::abs(t.value()))();
    CHECK(m <= bound);
    CHECK(m > 0.9 * bound);
  }
  Gru narrow(5, 3, rng);  // the bound follows H, not the input size
  for (const auto& t : narrow.parameters()) CHECK(xt::amax(xt::abs(t.value()))() <= 1.0 / std::sqrt(3.0));
  CHECK(narrow.parameters()[0].shape() == Shape{5, 9});
  BiGru bi(64, 64, rng);
  CHECK(bi.parameter_count() == 49920);
  CHECK(bi.parameters()[4].name() == "bigru.backward.weight_ih");
  CHECK(bi.parameters()[3].name() == "bigru.forward.bias_hh");
}

TEST_CASE("GRU: uses recorded for per-sample gradients (input projection once, recurrent weights every step)") {
  FastRng rng(210);
  GruT<double> gru(3, 2, rng);
  A x = randn<double>({2, 5, 3}, rng);
  TapeT<double> tape;
  tape.record_uses(true);
  RecordScope<double> scope(tape);
  auto out = gru.forward(D(x), {3, 4});  // steps 0..3 run; step 4 is padding for both
  auto p = gru.parameters();
  REQUIRE(tape.uses().size() == 4);
  for (const auto& group : tape.uses()) {
    CAPTURE(group.param->name);
    if (group.param.get() == p[1].node() || group.param.get() == p[3].node())
      CHECK(group.uses.size() == 4);  // h_0 = 0 too: b_hh is used at the first step
    else
      CHECK(group.uses.size() == 1);
  }
}

TEST_CASE("GRU: float instantiation and an empty batch") {
  FastRng rng(211);
  BiGru bi(3, 4, rng);
  check_float_and_empty_batch([&](const Tensor& x, const Lengths& l) { return bi.forward(x, l); }, rng);
}

TEST_CASE("GRU: bad input throws std::invalid_argument") {
  FastRng rng(212);
  GruT<double> gru(3, 2, rng);
  A x = randn<double>({2, 4, 3}, rng);
  CHECK_THROWS_AS(gru.forward(D(x), {4}), std::invalid_argument);          // too few lengths
  CHECK_THROWS_AS(gru.forward(D(x), {4, 4, 4}), std::invalid_argument);    // too many
  CHECK_THROWS_AS(gru.forward(D(x), {0, 4}), std::invalid_argument);       // empty sequence
  CHECK_THROWS_AS(gru.forward(D(x), {-1, 4}), std::invalid_argument);
  CHECK_THROWS_AS(gru.forward(D(x), {5, 4}), std::invalid_argument);       // longer than L
  CHECK_THROWS_WITH_AS(gru.forward(D(x), {2, 5}), doctest::Contains("outside [1, 4]"), std::invalid_argument);
  CHECK_THROWS_AS(gru.forward(D(A(xt::zeros<double>({2, 3}))), {1, 1}), std::invalid_argument);     // not (B, L, d)
  CHECK_THROWS_AS(gru.forward(D(A(xt::zeros<double>({2, 4, 5}))), {1, 1}), std::invalid_argument);  // wrong d
  CHECK_THROWS_AS(GruT<double>(0, 2, rng), std::invalid_argument);
  CHECK_THROWS_AS(GruT<double>(3, 0, rng), std::invalid_argument);
  Weights w = random_weights(3, 2, rng);
  Lengths two = {4, 4};
  CHECK_THROWS_WITH_AS(gru_sequence(D(x), D(w.w_ih), D(A(xt::zeros<double>({2, 8}))), D(w.b_ih), D(w.b_hh), two),
                       doctest::Contains("(H, 3H)"), std::invalid_argument);  // an LSTM's (H, 4H)
  CHECK_THROWS_AS(gru_sequence(D(x), D(w.w_ih), D(w.w_hh), D(w.b_ih), D(A(xt::zeros<double>({8}))), two),
                  std::invalid_argument);  // b_hh
  CHECK_THROWS_AS(gru_sequence(D(x), D(w.w_ih), D(w.w_hh), D(w.b_ih), D(), two), std::invalid_argument);
  BiGruT<double> bi(3, 2, rng);
  CHECK_THROWS_AS(bi.forward(D(x), {1, 9}), std::invalid_argument);
}
