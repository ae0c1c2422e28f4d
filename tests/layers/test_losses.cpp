// The per-sample losses as functions of the outputs: gradient checks in both
// modes, and the derivatives in closed form, at logits of exactly 0 too.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/losses.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

BatchT<double> with_targets(A targets) {
  BatchT<double> b;
  b.targets = std::move(targets);
  return b;
}

/// The gradient of the summed row losses at the outputs z, by reverse mode.
A loss_gradient(const LossFnT<double>& loss, const A& z, const BatchT<double>& b) {
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D t(z, true);
  tape.backward(sum(loss(t, b)));
  return t.grad();
}

}  // namespace

TEST_CASE("losses: mse and bce with logits pass gradcheck on (R, C) and (R, L, C) outputs") {
  FastRng rng(81);
  for (Shape s : {Shape{4, 3}, Shape{2, 3, 2}}) {
    CAPTURE(shape_str(s));
    const A z = randn<double>(s, rng, 2.0);
    const BatchT<double> real = with_targets(randn<double>(s, rng));
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return mse_loss<double>()(v[0], real); }, {z}));
    A y = A::from_shape(s);
    for (auto& v : y) v = rng.uniform();
    const BatchT<double> probs = with_targets(y);
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return bce_with_logits_loss<double>()(v[0], probs); }, {z}));
  }
}

TEST_CASE("losses: bce with logits has the gradient (s(z) - y) / C everywhere, z = 0 included") {
  // a zero-initialised output layer gives logits of exactly 0 at the first step
  const A z = {{0.0, 0.0, 0.0}, {2.0, -30.0, 30.0}, {-800.0, 800.0, 0.0}};
  const A y = {{0.0, 1.0, 0.25}, {1.0, 0.0, 0.0}, {0.0, 1.0, 0.5}};
  const BatchT<double> b = with_targets(y);
  const auto loss = bce_with_logits_loss<double>();
  const A s = 1.0 / (1.0 + xt::exp(-z));
  const A want = (s - y) / 3.0;
  DPGRAD_CHECK_CLOSE(loss_gradient(loss, z, b), want, 1e-12);
  // forward mode: the tangent along e_ij is the same derivative
  NoRecordScope<double> none;
  D t(z);
  A seed = xt::zeros<double>({std::size_t(9), std::size_t(3), std::size_t(3)});
  for (std::size_t i = 0; i < 9; ++i) seed(i, i / 3, i % 3) = 1.0;
  t.set_tangent(seed);
  const A tangent = loss(t, b).tangent();  // (9, 3)
  for (std::size_t i = 0; i < 9; ++i) {
    CAPTURE(i);
    CHECK(tangent(i, i / 3) == doctest::Approx(want(i / 3, i % 3)).epsilon(1e-12));
  }
  // values: log 2 per coordinate at z = 0 whatever y; huge logits finite
  const A l = loss(D(z), b).value();
  CHECK(l(0) == doctest::Approx(std::log(2.0)).epsilon(1e-15));
  CHECK(std::isfinite(l(2)));
  CHECK(l(2) == doctest::Approx(std::log(2.0) / 3).epsilon(1e-12));
}
