// Base optimizers: exact first steps against the update formulas, convergence
// on a quadratic, state round trips and argument checks.
#include <algorithm>
#include <cmath>

#include <doctest/doctest.h>

#include "optim/optimizer.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using D = TensorT<double>;
using A = ArrayT<double>;

TEST_CASE("optim: SGD and momentum follow their update rules") {
  D p = make_parameter<double>("p", A{1.0, -2.0});
  SgdT<double> sgd({p}, 0.1);
  sgd.step({A{0.5, 1.0}});
  DPGRAD_CHECK_CLOSE(p.value(), (A{0.95, -2.1}), 1e-15);
  D q = make_parameter<double>("q", A{1.0});
  SgdT<double> mom({q}, 0.1, 0.9);
  mom.step({A{1.0}});  // v = 1, q = 0.9
  mom.step({A{1.0}});  // v = 1.9, q = 0.71
  CHECK(q.value()(0) == doctest::Approx(0.71).epsilon(1e-14));
  CHECK(mom.name() == "momentum");
  CHECK(mom.steps() == 2);
}

TEST_CASE("optim: Adam's first step is lr * sign(g) and it minimises a quadratic") {
  D p = make_parameter<double>("p", A{3.0, -1.0});
  AdamT<double> adam({p}, 0.01);
  adam.step({A{4.0, -0.001}});
  // m_hat = g, v_hat = g^2: step = lr * g / (|g| + eps)
  CHECK(p.value()(0) == doctest::Approx(3.0 - 0.01 * 4.0 / (4.0 + 1e-8)).epsilon(1e-12));
  CHECK(p.value()(1) == doctest::Approx(-1.0 + 0.01 * 0.001 / (0.001 + 1e-8)).epsilon(1e-12));
  AdamT<double> fast({p}, 0.1);
  for (int i = 0; i < 500; ++i) fast.step({A(2.0 * (p.value() - A{1.0, 2.0}))});  // grad of ||p - (1,2)||^2
  DPGRAD_CHECK_CLOSE(p.value(), (A{1.0, 2.0}), 1e-3);
}

TEST_CASE("optim: DP-AdamBC subtracts the noise's variance from v_hat, floored; variance 0 is Adam") {
  // two steps by hand: m_hat and v_hat as in Adam, then lr m_hat / (sqrt(max(v_hat - phi, floor)) + eps)
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, phi = 0.25, floor = 1e-4;
  const A g1{2.0, 0.3}, g2{1.0, -0.2};
  D p = make_parameter<double>("p", A{1.0, 1.0});
  AdamT<double> bc({p}, lr, b1, b2, eps);
  bc.correct_noise(phi, floor);
  CHECK(bc.name() == "adambc");
  bc.step({g1});
  bc.step({g2});
  A want{1.0, 1.0}, m{0.0, 0.0}, v{0.0, 0.0};
  for (int t = 1; t <= 2; ++t) {
    const A& g = t == 1 ? g1 : g2;
    for (std::size_t k = 0; k < 2; ++k) {
      m(k) = b1 * m(k) + (1 - b1) * g(k);
      v(k) = b2 * v(k) + (1 - b2) * g(k) * g(k);
      const double mh = m(k) / (1 - std::pow(b1, t)), vh = v(k) / (1 - std::pow(b2, t));
      want(k) -= lr * mh / (std::sqrt(std::max(vh - phi, floor)) + eps);
    }
  }
  // the second coordinate's v_hat (0.09, then about 0.064) is below phi: it sits on the floor
  DPGRAD_CHECK_CLOSE(p.value(), want, 1e-12);
  // variance 0: plain Adam, step for step
  D q = make_parameter<double>("q", A{1.0, 1.0}), r = make_parameter<double>("r", A{1.0, 1.0});
  AdamT<double> plain({q}, lr), zero({r}, lr);
  zero.correct_noise(0.0, floor);
  CHECK(zero.name() == "adam");
  for (const A& g : {g1, g2}) {
    plain.step({g});
    zero.step({g});
  }
  DPGRAD_CHECK_CLOSE(r.value(), q.value(), 0.0);
  CHECK_THROWS_AS(zero.correct_noise(-1.0, floor), std::invalid_argument);
  CHECK_THROWS_AS(zero.correct_noise(0.1, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(zero.correct_noise(NAN, floor), std::invalid_argument);
}

TEST_CASE("optim: with noisy gradients DP-AdamBC steps like Adam on the clean ones, plain Adam far less") {
  // g = 0.01 + N(0, 0.1^2) per coordinate: Adam's v_hat is about 0.01, so it steps about lr * 0.01 / 0.1;
  // with phi = 0.01 subtracted, v_hat - phi estimates g^2 and the mean step is of the order of lr
  const std::size_t n = 2000;
  FastRng rng(9);
  D a = make_parameter<double>("a", A(xt::zeros<double>({n}))), b = make_parameter<double>("b", A(xt::zeros<double>({n})));
  AdamT<double> plain({a}, 1e-3), bc({b}, 1e-3);
  bc.correct_noise(0.01, 1e-6);
  for (int t = 0; t < 2000; ++t) {
    A g = 0.01 + test::randn<double>({n}, rng, 0.1);
    plain.step({g});
    bc.step({g});
  }
  const double plain_step = -xt::mean(a.value())() / 2000, bc_step = -xt::mean(b.value())() / 2000;
  CHECK(plain_step == doctest::Approx(1e-4).epsilon(0.3));  // lr * g / sqrt(g^2 + phi), about lr / 10
  CHECK(bc_step > 4 * plain_step);
}

TEST_CASE("optim: state round trip resumes identically") {
  auto run = [](bool interrupt) {
    D p = make_parameter<double>("p", A{1.0, 1.0});
    auto opt = std::make_unique<AdamT<double>>(std::vector<D>{p}, 0.05);
    for (int i = 0; i < 10; ++i) {
      if (interrupt && i == 5) {
        auto state = opt->state();
        long t = opt->steps();
        opt = std::make_unique<AdamT<double>>(std::vector<D>{p}, 0.05);
        opt->load_state(state, t);
      }
      opt->step({A(p.value() * p.value() - 0.5)});
    }
    return A(p.value());
  };
  DPGRAD_CHECK_CLOSE(run(true), run(false), 0.0);
  D p = make_parameter<double>("p", A{1.0});
  SgdT<double> m({p}, 0.1, 0.5);
  CHECK_THROWS_WITH_AS(m.load_state({}, 3), doctest::Contains("velocity"), std::invalid_argument);
}

TEST_CASE("optim: bad hyperparameters and gradients are rejected") {
  D p = make_parameter<double>("p", A{1.0});
  CHECK_THROWS_AS(SgdT<double>({p}, -1.0), std::invalid_argument);
  CHECK_THROWS_AS(SgdT<double>({p}, NAN), std::invalid_argument);
  CHECK_THROWS_AS(SgdT<double>({p}, 0.1, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(AdamT<double>({p}, 0.1, 1.0), std::invalid_argument);
  SgdT<double> s({p}, 0.1);
  CHECK_THROWS_WITH_AS(s.step({A{1.0, 2.0}}), doctest::Contains("does not match"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(s.step(std::vector<A>{}), doctest::Contains("0 gradients"), std::invalid_argument);
}

TEST_CASE("optim: cosine_lr runs from start to end through the midpoint, never rising") {
  CHECK(cosine_lr(0.8, 0.1, 0, 100) == doctest::Approx(0.8));
  CHECK(cosine_lr(0.8, 0.1, 50, 100) == doctest::Approx(0.45));
  CHECK(cosine_lr(0.8, 0.1, 100, 100) == doctest::Approx(0.1));
  CHECK(cosine_lr(1.0, 0.0, 25, 100) == doctest::Approx(0.5 + 0.5 * std::sqrt(0.5)));  // (1 + cos(pi / 4)) / 2
  for (long t = 1; t <= 100; ++t) CHECK(cosine_lr(0.8, 0.1, t, 100) <= cosine_lr(0.8, 0.1, t - 1, 100));
  CHECK_THROWS_AS(cosine_lr(0.8, 0.1, 101, 100), std::invalid_argument);
  CHECK_THROWS_AS(cosine_lr(0.8, 0.1, 0, 0), std::invalid_argument);
}

TEST_CASE("optim: a learning-rate scale multiplies one layer's steps, in SGD, momentum and Adam") {
  auto params = [] {
    return std::vector<D>{make_parameter<double>("conv1.weight", A{1.0}), make_parameter<double>("conv1.bias", A{1.0}),
                          make_parameter<double>("conv10.weight", A{1.0}), make_parameter<double>("dense.weight", A{1.0})};
  };
  const std::vector<A> g(4, A{1.0});
  SUBCASE("sgd and momentum") {
    auto ps = params();
    SgdT<double> sgd(ps, 0.1, 0.5);
    CHECK(sgd.set_lr_scale("conv1", 4.0) == 2);  // conv1.* only: not conv10
    CHECK(sgd.set_lr_scale("dense.weight", 0.0) == 1);
    CHECK(sgd.lr_scale(2) == 1.0);
    sgd.step(g);  // v = 1
    sgd.step(g);  // v = 1.5
    CHECK(ps[0].value()(0) == doctest::Approx(1.0 - 0.4 * 2.5).epsilon(1e-14));
    CHECK(ps[1].value()(0) == doctest::Approx(1.0 - 0.4 * 2.5).epsilon(1e-14));
    CHECK(ps[2].value()(0) == doctest::Approx(1.0 - 0.1 * 2.5).epsilon(1e-14));
    CHECK(ps[3].value()(0) == 1.0);
  }
  SUBCASE("adam: the first step is lr * scale * sign(g)") {
    auto ps = params();
    AdamT<double> adam(ps, 0.01);
    adam.set_lr_scale(1, 3.0);
    adam.step(g);
    CHECK(ps[0].value()(0) == doctest::Approx(1.0 - 0.01).epsilon(1e-7));
    CHECK(ps[1].value()(0) == doctest::Approx(1.0 - 0.03).epsilon(1e-7));
  }
  SUBCASE("unknown names and bad factors are refused") {
    auto ps = params();
    SgdT<double> sgd(ps, 0.1);
    CHECK_THROWS_WITH_AS(sgd.set_lr_scale("conv", 2.0), doctest::Contains("no parameter or layer 'conv'"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sgd.set_lr_scale("conv1", -1.0), doctest::Contains(">= 0"), std::invalid_argument);
    CHECK_THROWS_AS(sgd.set_lr_scale("conv1", NAN), std::invalid_argument);
    CHECK_THROWS_AS(sgd.set_lr_scale(4, 1.0), std::invalid_argument);
    CHECK(sgd.lr_scale(0) == 1.0);  // a refused scale changes nothing
  }
}
