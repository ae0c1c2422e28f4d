// Parameter averaging: the exponential moving average follows its recurrence,
// including the warm-up decay, and swapping it in and out restores the iterate.
#include <doctest/doctest.h>

#include "optim/averaging.hpp"
#include "support/check.hpp"

using namespace dpgrad;

TEST_CASE("parameter average: recurrence with warm-up, swap in and out") {
  auto p = make_parameter<double>("w", ArrayT<double>{1.0, -2.0});
  ParameterAverageT<double> avg({p}, 0.9);
  // step t uses min(0.9, (1 + t) / (10 + t)): 0.1, 2/11, 3/12 ...
  double expect0 = 1.0, expect1 = -2.0;
  for (int t = 0; t < 30; ++t) {
    p.mutable_value() = ArrayT<double>{double(t), 2.0 * t};
    avg.update();
    double d = std::min(0.9, (1.0 + t) / (10.0 + t));
    expect0 = d * expect0 + (1 - d) * t;
    expect1 = d * expect1 + (1 - d) * 2.0 * t;
  }
  CHECK(avg.updates() == 30);
  CHECK(avg.averages()[0](0) == doctest::Approx(expect0).epsilon(1e-14));
  CHECK(avg.averages()[0](1) == doctest::Approx(expect1).epsilon(1e-14));
  {
    AveragedScopeT<double> scope(&avg);
    CHECK(p.value()(0) == doctest::Approx(expect0).epsilon(1e-14));
  }
  CHECK(p.value()(0) == 29.0);
  CHECK(p.value()(1) == 58.0);
  AveragedScopeT<double> none(nullptr);  // no average: nothing happens
  CHECK(p.value()(0) == 29.0);
  CHECK_THROWS_AS(ParameterAverageT<double>({p}, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(ParameterAverageT<double>({p}, 0.0), std::invalid_argument);
}
