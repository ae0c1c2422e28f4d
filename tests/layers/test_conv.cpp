// Conv2d, MaxPool2d, Reshape and Dropout layers: output shapes, gradients with
// respect to inputs and parameters, a tiny CNN end to end, and bad input.
#include <cmath>
#include <numeric>

#include <doctest/doctest.h>

#include "engine/conv.hpp"
#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/conv.hpp"
#include "layers/dense.hpp"
#include "layers/dropout.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

/// Reverse-mode gradients of <u, f()> with respect to the layer's own parameters
/// against central differences along a random direction of each parameter.
template <class F>
void check_param_grads(F&& f, const std::vector<D>& params, Rng& rng) {
  A u;
  {
    NoRecordScope<double> none;
    u = randn<double>(f().shape(), rng);
  }
  auto loss = [&] {
    NoRecordScope<double> none;
    return xt::sum(f().value() * u)();
  };
  for (D p : params) p.zero_grad();  // earlier passes (gradcheck's) may have accumulated into them
  TapeT<double> tape;
  {
    RecordScope<double> scope(tape);
    D y = f();
    tape.backward(y, u);
  }
  for (D p : params) {
    CAPTURE(p.name());
    A v = randn<double>(p.shape(), rng);
    double analytic = xt::sum(p.grad() * v)();
    const double h = 1e-6;
    A saved = p.value();
    p.mutable_value() = saved + h * v;
    double up = loss();
    p.mutable_value() = saved - h * v;
    double down = loss();
    p.mutable_value() = saved;
    double fd = (up - down) / (2 * h);
    CHECK(analytic == doctest::Approx(fd).epsilon(1e-6));
    p.zero_grad();
  }
}

A distinct_values(const Shape& s, Rng& rng) { return test::distinct_values<double>(s, rng); }

}  // namespace

TEST_CASE("Conv2d: output shapes for 'same', 'valid' and explicit padding") {
  FastRng rng(41);
  NoRecordScope<double> none;
  Conv2dT<double> c1(1, 16, 8, 8, 2, Padding::same(), rng, "conv1");
  CHECK(c1.output_shape({2, 28, 28, 1}) == Shape{2, 14, 14, 16});
  CHECK(c1.forward(D(A::from_shape({2, 28, 28, 1}))).shape() == Shape{2, 14, 14, 16});
  Conv2dT<double> c2(16, 32, 4, 4, 2, Padding::valid(), rng, "conv2");
  CHECK(c2.output_shape({3, 13, 13, 16}) == Shape{3, 5, 5, 32});
  CHECK(c2.forward(D(A::from_shape({3, 13, 13, 16}))).shape() == Shape{3, 5, 5, 32});
  Conv2dT<double> c3(2, 3, 3, 2, 3, Padding::same(), rng, "conv3");
  CHECK(c3.output_shape({1, 7, 5, 2}) == Shape{1, 3, 2, 3});  // ceil(7/3), ceil(5/3)
  Conv2dT<double> c4(2, 3, 3, 2, 1, Padding::explicit_pads(1, 0, 2, 1), rng, "conv4");
  CHECK(c4.output_shape({1, 7, 5, 2}) == Shape{1, 6, 7, 3});  // (7+1-3)+1, (5+3-2)+1
  CHECK(c4.forward(D(A::from_shape({1, 7, 5, 2}))).shape() == Shape{1, 6, 7, 3});
  // weight in the GEMM's orientation, fan-in uniform initialisation
  CHECK(c2.weight().shape() == Shape{4 * 4 * 16, 32});
  CHECK(c2.bias().shape() == Shape{32});
  CHECK(c2.weight().name() == "conv2.weight");
  CHECK(c2.bias().name() == "conv2.bias");
  CHECK(c2.parameter_count() == 8224);
  double bound = 1 / std::sqrt(256.0);
  CHECK(xt::amax(xt::abs(c2.weight().value()))() <= bound);
  CHECK(xt::amax(xt::abs(c2.weight().value()))() > 0.9 * bound);
  MaxPool2dT<double> pool(2, 1);
  CHECK(pool.forward(D(A::from_shape({2, 14, 14, 16}))).shape() == Shape{2, 13, 13, 16});
  CHECK(pool.parameters().empty());
}

TEST_CASE("Conv2d: forward matches the conv2d composite; gradients for x and parameters") {
  FastRng rng(42);
  struct Case { std::size_t cin, cout, kh, kw, stride; Padding pad; Shape x; };
  for (auto c : {Case{1, 2, 3, 3, 1, Padding::same(), {1, 4, 4, 1}}, Case{2, 3, 3, 2, 2, Padding::same(), {3, 5, 4, 2}},
                 Case{3, 2, 2, 2, 2, Padding::valid(), {3, 5, 5, 3}},
                 Case{2, 2, 2, 3, 1, Padding::explicit_pads(0, 1, 1, 0), {1, 3, 4, 2}}}) {
    CAPTURE(c.x[0]);
    CAPTURE(c.kh);
    Conv2dT<double> conv(c.cin, c.cout, c.kh, c.kw, c.stride, c.pad, rng, "conv");
    A x = randn<double>(c.x, rng);
    {
      NoRecordScope<double> none;
      Pad2d p = resolve_padding(c.pad, c.x[1], c.x[2], c.kh, c.kw, c.stride, c.stride);
      A want = conv2d(D(x), conv.weight(), conv.bias(), c.kh, c.kw, c.stride, c.stride, p).value();
      DPGRAD_CHECK_CLOSE(conv.forward(D(x)).value(), want, 0.0);
    }
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return conv.forward(v[0]); }, {x}));
    check_param_grads([&] { return conv.forward(D(x)); }, conv.parameters(), rng);
  }
}

TEST_CASE("MaxPool2d and Reshape layers: gradient checks") {
  FastRng rng(43);
  MaxPool2dT<double> pool(2, 1);
  for (Shape s : {Shape{1, 4, 4, 1}, Shape{3, 5, 4, 2}}) {
    A x = distinct_values(s, rng);
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return pool.forward(v[0]); }, {x}));
  }
  MaxPool2dT<double> pool2(2, 2);
  A x = distinct_values({3, 6, 5, 2}, rng);
  DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return pool2.forward(v[0]); }, {x}));
  ReshapeT<double> to_nhwc({4, 3, 1});
  A img = randn<double>({2, 1, 4, 3}, rng);
  DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return to_nhwc.forward(v[0]); }, {img}));
  NoRecordScope<double> none;
  CHECK(to_nhwc.forward(D(img)).shape() == Shape{2, 4, 3, 1});
  CHECK_THROWS_AS(to_nhwc.forward(D(A::from_shape({2, 1, 4, 4}))), std::invalid_argument);
}

TEST_CASE("a tiny CNN end to end: gradients for the input and every weight") {
  FastRng rng(44);
  // x (2, 6, 5, 2) -> conv 3x3 same (3) tanh -> maxpool 2/1 -> conv 2x2 s2 valid (2) -> flatten -> dense (3) -> CE
  std::size_t B = 2;
  A x = randn<double>({B, 6, 5, 2}, rng);
  A w1 = randn<double>({18, 3}, rng, 0.5), b1 = randn<double>({3}, rng, 0.1);
  A w2 = randn<double>({12, 2}, rng, 0.5), b2 = randn<double>({2}, rng, 0.1);
  A w3 = randn<double>({8, 3}, rng, 0.5), b3 = randn<double>({3}, rng, 0.1);
  std::vector<std::int32_t> labels = {2, 0};
  Pad2d same = resolve_padding(Padding::same(), 6, 5, 3, 3, 1, 1);
  auto net = [&](const std::vector<D>& v) {
    D h = tanh(conv2d(v[0], v[1], v[2], 3, 3, 1, 1, same));  // (B, 6, 5, 3)
    h = max_pool2d(h, 2, 1);                                  // (B, 5, 4, 3)
    h = conv2d(h, v[3], v[4], 2, 2, 2, 2);                    // (B, 2, 2, 2)
    h = reshape(h, {B, 8});
    return mean_cross_entropy(linear(h, v[5], v[6]), labels);
  };
  DPGRAD_CHECK_GRADS(gradcheck(net, {x, w1, b1, w2, b2, w3, b3}));
  auto logits = [&](const std::vector<D>& v) {
    D h = max_pool2d(tanh(conv2d(v[0], v[1], v[2], 3, 3, 1, 1, same)), 2, 1);
    return linear(reshape(conv2d(h, v[3], v[4], 2, 2, 2, 2), {B, 8}), v[5], v[6]);
  };
  DPGRAD_CHECK_GRADS(gradcheck(logits, {x, w1, b1, w2, b2, w3, b3}));
}

TEST_CASE("Conv2d and MaxPool2d: bad input throws") {
  FastRng rng(45);
  NoRecordScope<double> none;
  Conv2dT<double> conv(3, 4, 3, 3, 1, Padding::valid(), rng, "conv");
  CHECK_THROWS_AS(conv.forward(D(A::from_shape({2, 5, 5, 2}))), std::invalid_argument);  // wrong channels
  CHECK_THROWS_AS(conv.forward(D(A::from_shape({2, 5, 3}))), std::invalid_argument);     // not (B, H, W, C)
  CHECK_THROWS_AS(conv.forward(D(A::from_shape({2, 2, 5, 3}))), std::invalid_argument);  // image smaller than kernel
  CHECK_THROWS_AS(Conv2dT<double>(0, 4, 3, 3, 1, Padding::same(), rng), std::invalid_argument);
  CHECK_THROWS_AS(Conv2dT<double>(3, 4, 3, 0, 1, Padding::same(), rng), std::invalid_argument);
  CHECK_THROWS_AS(Conv2dT<double>(3, 4, 3, 3, 0, Padding::same(), rng), std::invalid_argument);
  CHECK_THROWS_AS(MaxPool2dT<double>(0, 1), std::invalid_argument);
  CHECK_THROWS_AS(MaxPool2dT<double>(2, 0), std::invalid_argument);
  MaxPool2dT<double> pool(3, 1);
  CHECK_THROWS_AS(pool.forward(D(A::from_shape({1, 2, 5, 1}))), std::invalid_argument);
  CHECK_THROWS_AS(pool.forward(D(A::from_shape({1, 5, 5}))), std::invalid_argument);
}

TEST_CASE("Dropout: training masks, evaluation identity, gradients") {
  FastRng rng(46);
  A x = randn<double>({4, 250}, rng);
  for (double p : {0.0, 0.25, 0.5}) {
    CAPTURE(p);
    DropoutT<double> drop(p, 7);
    NoRecordScope<double> none;
    A y = drop.forward(D(x)).value();
    std::size_t zeros = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      double a = x.data()[i], b = y.data()[i];
      if (b == 0.0) ++zeros;
      else CHECK(b == doctest::Approx(a / (1 - p)).epsilon(1e-14));
    }
    // 1000 Bernoulli(p) draws: within 5 standard deviations of p (fixed seed, deterministic)
    double sd = std::sqrt(p * (1 - p) / 1000.0);
    CHECK(std::abs(double(zeros) / 1000.0 - p) <= 5 * sd + 1e-12);
    // a fresh mask each call in training mode
    if (p > 0) CHECK(xt::any(xt::not_equal(drop.forward(D(x)).value(), y)));
    drop.set_training(false);
    DPGRAD_CHECK_CLOSE(drop.forward(D(x)).value(), x, 0.0);
  }
  // training-mode gradients: a layer seeded the same way draws the same mask on each call
  A small = randn<double>({3, 4}, rng);
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return DropoutT<double>(0.5, 3).forward(v[0]); }, {small}));
  // evaluation mode: the gradient is the identity
  DPGRAD_CHECK_GRADS(gradcheck(
      [](const std::vector<D>& v) {
        DropoutT<double> d(0.5, 3);
        d.set_training(false);
        return d.forward(v[0]);
      },
      {small}));
  // reverse mode passes gradients only through kept elements, scaled
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D t(small, true);
  DropoutT<double> d(0.5, 3);
  D y = d.forward(t);
  tape.backward(sum(y));
  for (std::size_t i = 0; i < small.size(); ++i)
    CHECK(t.grad().data()[i] == (y.value().data()[i] == 0.0 ? 0.0 : 2.0));
  CHECK_THROWS_AS(DropoutT<double>(1.0), std::invalid_argument);
  CHECK_THROWS_AS(DropoutT<double>(-0.1), std::invalid_argument);
  CHECK_THROWS_AS(DropoutT<double>(std::nan("")), std::invalid_argument);
}
