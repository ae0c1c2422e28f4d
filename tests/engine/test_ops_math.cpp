// The newer elementwise maps and div (engine/ops/elementwise.cpp), softmax.cpp and batched.cpp: values
// against closed forms, and gradchecks of their vjp and jvp in double.
#include <cmath>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

A positive(const Shape& s, Rng& rng) {
  A a = randn<double>(s, rng);
  for (auto& v : a) v = 0.5 + std::abs(v);
  return a;
}

A away_from_zero(const Shape& s, Rng& rng) {
  A a = randn<double>(s, rng);
  for (auto& v : a) v += v >= 0 ? 0.2 : -0.2;
  return a;
}


}  // namespace

TEST_CASE("ops math: values against closed forms") {
  NoRecordScope<double> none;
  const A x{0.25, 1.0, 4.0};
  DPGRAD_CHECK_CLOSE(sqrt(D(x)).value(), (A{0.5, 1.0, 2.0}), 1e-15);
  DPGRAD_CHECK_CLOSE(rsqrt(D(x)).value(), (A{2.0, 1.0, 0.5}), 1e-15);
  DPGRAD_CHECK_CLOSE(pow(D(x), 1.5).value(), (A{0.125, 1.0, 8.0}), 1e-15);
  DPGRAD_CHECK_CLOSE(abs(D(A{-2.0, 0.0, 3.0})).value(), (A{2.0, 0.0, 3.0}), 0.0);
  DPGRAD_CHECK_CLOSE(gelu(D(A{0.0, 1.0, -1.0})).value(), (A{0.0, 0.8413447460685429, -0.15865525393145707}), 1e-15);
  DPGRAD_CHECK_CLOSE(div(D(A{{1.0, 2.0}, {3.0, 4.0}}), D(A{2.0, 4.0})).value(), (A{{0.5, 0.5}, {1.5, 1.0}}), 1e-15);
  // softmax sums to 1, equals exp(x) / sum exp(x), and does not overflow
  const A s = softmax(D(A{{1.0, 2.0, 3.0}, {1000.0, 1000.0, -1000.0}}), 1).value();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  DPGRAD_CHECK_CLOSE(s, (A{{std::exp(1.0) / z, std::exp(2.0) / z, std::exp(3.0) / z}, {0.5, 0.5, 0.0}}), 1e-15);
  const A ls = log_softmax(D(A{1000.0, 1000.0}), 0).value();
  DPGRAD_CHECK_CLOSE(ls, (A{-std::log(2.0), -std::log(2.0)}), 1e-15);
  // softmax along axis 0 of (2, 3): each column
  const A s0 = softmax(D(A{{0.0, 1.0, 2.0}, {0.0, 1.0, 3.0}}), 0).value();
  CHECK(s0(0, 0) == doctest::Approx(0.5));
  CHECK(s0(0, 2) == doctest::Approx(1.0 / (1.0 + std::exp(1.0))));
  // max over an axis, and the first maximal element takes the derivative
  DPGRAD_CHECK_CLOSE(max(D(A{{1.0, 5.0, 5.0}, {-1.0, -3.0, -2.0}}), 1).value(), (A{5.0, -1.0}), 0.0);
  CHECK(max(D(A{{1.0, 5.0}}), 1, true).shape() == Shape{1, 1});
  CHECK_THROWS_WITH_AS(softmax(D(A{1.0}), 1), doctest::Contains("axis 1"), std::invalid_argument);
}

TEST_CASE("ops math: the tie rule of max, and the modulus-like kinks") {
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D x(A{{1.0, 5.0, 5.0}}, true);
  tape.backward(sum(max(x, 1)));
  DPGRAD_CHECK_CLOSE(x.grad(), (A{{0.0, 1.0, 0.0}}), 0.0);
  D y(A{-1.0, 0.0, 2.0}, true);
  tape.backward(sum(abs(y)));
  DPGRAD_CHECK_CLOSE(y.grad(), (A{-1.0, 0.0, 1.0}), 0.0);
}

TEST_CASE("ops math: gradchecks of the elementwise maps and div") {
  FastRng rng(1);
  const Shape s{3, 4};
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return sqrt(v[0]); }, {positive(s, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return rsqrt(v[0]); }, {positive(s, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return pow(v[0], 2.5); }, {positive(s, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return pow(v[0], 3.0); }, {randn<double>(s, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return abs(v[0]); }, {away_from_zero(s, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return gelu(v[0]); }, {randn<double>(s, rng)}));
  // div, same shapes and broadcast both ways
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return div(v[0], v[1]); },
                               {randn<double>(s, rng), away_from_zero(s, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return div(v[0], v[1]); },
                               {randn<double>({2, 3, 4}, rng), away_from_zero({4}, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return div(v[0], v[1]); },
                               {randn<double>({3, 1}, rng), away_from_zero({3, 4}, rng)}));
}

TEST_CASE("ops math: gradchecks of softmax, log-softmax and max along each axis") {
  FastRng rng(2);
  for (std::size_t axis : {0, 1, 2}) {
    CAPTURE(axis);
    DPGRAD_CHECK_GRADS(
        gradcheck([axis](const std::vector<D>& v) { return softmax(v[0], axis); }, {randn<double>({2, 3, 4}, rng)}));
    DPGRAD_CHECK_GRADS(gradcheck([axis](const std::vector<D>& v) { return log_softmax(v[0], axis); },
                                 {randn<double>({2, 3, 4}, rng)}));
    for (bool keep : {false, true})
      DPGRAD_CHECK_GRADS(gradcheck([axis, keep](const std::vector<D>& v) { return max(v[0], axis, keep); },
                                   {randn<double>({2, 3, 4}, rng)}));
  }
}

TEST_CASE("ops math: batched matmul against a loop, its gradchecks, and masked_fill") {
  FastRng rng(3);
  const A a = randn<double>({2, 3, 4, 5}, rng), b = randn<double>({2, 3, 5, 2}, rng), bt = randn<double>({2, 3, 2, 5}, rng);
  {
    NoRecordScope<double> none;
    const A c = matmul(D(a), D(b)).value(), ct = matmul(D(a), D(bt), true).value();
    REQUIRE(shape_of(c) == Shape{2, 3, 4, 2});
    double worst = 0;
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t h = 0; h < 3; ++h)
        for (std::size_t r = 0; r < 4; ++r)
          for (std::size_t q = 0; q < 2; ++q) {
            double want = 0, want_t = 0;
            for (std::size_t k = 0; k < 5; ++k) {
              want += a(i, h, r, k) * b(i, h, k, q);
              want_t += a(i, h, r, k) * bt(i, h, q, k);
            }
            worst = std::max({worst, std::abs(c(i, h, r, q) - want), std::abs(ct(i, h, r, q) - want_t)});
          }
    CHECK(worst < 1e-13);
    CHECK_THROWS_WITH_AS(matmul(D(a), D(bt)), doctest::Contains("do not multiply"), std::invalid_argument);
  }
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return matmul(v[0], v[1]); }, {a, b}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return matmul(v[0], v[1], true); }, {a, bt}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return matmul(v[0], v[1]); },
                               {randn<double>({3, 4}, rng), randn<double>({4, 2}, rng)}));

  // masked_fill: values, and no gradient where masked
  const A mask{{0.0, 1.0, 0.0}};  // broadcast over rows
  const A x = randn<double>({2, 3}, rng);
  {
    NoRecordScope<double> none;
    const A y = masked_fill(D(x), mask, -1e9).value();
    CHECK(y(0, 1) == -1e9);
    CHECK(y(1, 1) == -1e9);
    CHECK(y(1, 2) == x(1, 2));
  }
  DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return masked_fill(v[0], mask, 0.5); }, {x}));
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D xt(x, true);
  tape.backward(sum(masked_fill(xt, mask, 3.0)));
  DPGRAD_CHECK_CLOSE(xt.grad(), (A{{1.0, 0.0, 1.0}, {1.0, 0.0, 1.0}}), 0.0);
  // softmax of masked scores gives the masked positions no weight
  NoRecordScope<double> none;
  const A w = softmax(masked_fill(D(A{{1.0, 2.0, 3.0}}), mask, -1e9), 1).value();
  CHECK(w(0, 1) == 0.0);
  CHECK(w(0, 0) + w(0, 2) == doctest::Approx(1.0));
}

TEST_CASE("ops math: where the samples go through matmul, softmax and max") {
  FastRng rng(4);
  NoRecordScope<double> none;
  const D x = per_sample_input(randn<double>({4, 3, 5}, rng));  // (B, L, d)
  CHECK(matmul(x, x, true).samples().on_axis(0));                // (B, L, L): one product per sample
  CHECK(softmax(x, 2).samples().on_axis(0));
  CHECK(max(x, 1).samples().on_axis(0));
  CHECK(softmax(x, 0).samples().kind == Samples::Kind::mixed);    // along the samples: mixed
  CHECK(max(x, 0).samples().kind == Samples::Kind::mixed);
  const D flat = per_sample_input(randn<double>({4, 3}, rng));    // (B, d)
  CHECK(matmul(flat, flat, true).samples().kind == Samples::Kind::mixed);  // (B, B): samples against samples
  CHECK(matmul(flat, D(randn<double>({3, 2}, rng))).samples().on_axis(0));
}

TEST_CASE("ops math: leaky_relu, erf and pad: values and gradchecks") {
  FastRng rng(5);
  {
    NoRecordScope<double> none;
    DPGRAD_CHECK_CLOSE(leaky_relu(D(A{-2.0, 0.0, 3.0}), 0.1).value(), (A{-0.2, 0.0, 3.0}), 1e-15);
    DPGRAD_CHECK_CLOSE(erf(D(A{0.0, 0.5, -1.0})).value(), (A{0.0, 0.5204998778130465, -0.8427007929497149}), 1e-15);
    const A p = pad(D(A{{1.0, 2.0}}), {1, 0}, {0, 2}, -1.0).value();  // (1, 2) -> (2, 4)
    DPGRAD_CHECK_CLOSE(p, (A{{-1.0, -1.0, -1.0, -1.0}, {1.0, 2.0, -1.0, -1.0}}), 0.0);
    CHECK(pad(D(A{1.0}), {0}, {0}).shape() == Shape{1});
    CHECK_THROWS_WITH_AS(pad(D(A{1.0}), {0, 1}, {0, 1}), doctest::Contains("pad"), std::invalid_argument);
  }
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return leaky_relu(v[0], 0.1); },
                               {away_from_zero({3, 4}, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return erf(v[0]); }, {randn<double>({3, 4}, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return pad(v[0], {1, 0, 2}, {0, 3, 1}, 0.5); },
                               {randn<double>({2, 3, 2}, rng)}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return pad(v[0], {2}, {1}); }, {randn<double>({3}, rng)}));
  // the kink of leaky_relu at 0 takes the slope
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D x(A{-1.0, 0.0, 2.0}, true);
  tape.backward(sum(leaky_relu(x, 0.25)));
  DPGRAD_CHECK_CLOSE(x.grad(), (A{0.25, 0.25, 1.0}), 0.0);
}

TEST_CASE("ops math: pad keeps the samples unless it pads their axis") {
  NoRecordScope<double> none;
  const D x = per_sample_input(A(xt::zeros<double>({2, 3})));
  CHECK(pad(x, {0, 1}, {0, 2}).samples() == Samples::at(0, 2));
  CHECK(pad(x, {1, 0}, {0, 0}).samples().kind == Samples::Kind::mixed);
  CHECK(pad(D(A(xt::zeros<double>({2, 3}))), {1, 0}, {0, 0}).samples().is_none());
}
