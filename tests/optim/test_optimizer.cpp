// Base optimizers: exact first steps against the update formulas, convergence
// on a quadratic, state round trips and argument checks.
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
