// Tests of private logistic regression by output perturbation: the Newton solver
// against 1-d minimisers found independently, the 2 / (N lambda) sensitivity on
// neighbouring data sets, the unit-ball projection, the noise norm law, the
// accuracy of the whole pipeline on synthetic data, and input checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "engine/random.hpp"
#include "programs/logreg/logreg.hpp"

using namespace dpgrad;
using namespace dpgrad::logreg;

namespace {

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

double dist(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

/// n rows in R^d with random norms in [0, 1.5] before projection, random labels.
Problem random_problem(std::size_t n, std::size_t d, Rng& rng, double label_noise = 0.2) {
  std::vector<double> raw(n * d), y(n);
  std::vector<double> dir(d);
  for (double& v : dir) v = rng.normal();
  for (std::size_t i = 0; i < n; ++i) {
    double s = 0;
    for (std::size_t j = 0; j < d; ++j) {
      raw[i * d + j] = rng.normal();
      s += raw[i * d + j] * dir[j];
    }
    y[i] = (s >= 0) != rng.bernoulli(label_noise) ? 1.0 : -1.0;
  }
  Problem p = make_problem(raw, n, d, y, 1.0 / std::sqrt(double(d)), 0.0);
  return p;
}

/// Minimiser of a 1-d J by bisection on J' (J' is increasing: J is strongly convex).
double bisect_minimiser(const Problem& p, double lambda) {
  double lo = -1e3, hi = 1e3;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    const double g = gradient(p, std::vector<double>{mid}, lambda)[0];
    (g > 0 ? hi : lo) = mid;
  }
  return 0.5 * (lo + hi);
}

data::ImageDataset fake_images(const std::vector<std::int32_t>& labels) {
  data::ImageDataset ds;
  const std::size_t n = labels.size();
  ds.images = xt::zeros<float>(Shape{n, 1, 2, 2});
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < 4; ++k) ds.images.data()[i * 4 + k] = float((i + k) % 5) / 4.0f;
  ds.labels = labels;
  ds.classes = 10;
  return ds;
}

}  // namespace

TEST_CASE("logreg: solver hits a 1-d minimiser with a closed-form lambda") {
  // One example x = a, y = +1: J'(w) = -a sigma(-a w) + lambda w = 0 at w0 when
  // lambda = a sigma(-a w0) / w0.
  const double a = 0.8, w0 = 2.0;
  const double lambda = a / (1.0 + std::exp(a * w0)) / w0;
  Problem p;
  p.n = 1;
  p.d = 1;
  p.x = {a};
  p.y = {1.0};
  const Solution s = train(p, lambda, {1e-13, 100});
  CHECK(s.grad_norm < 1e-13);
  CHECK(s.w[0] == doctest::Approx(w0).epsilon(1e-11));
}

TEST_CASE("logreg: solver agrees with bisection on random 1-d problems") {
  ReproducibleRng rng(7);
  for (double lambda : {1.0, 1e-2, 1e-4}) {
    for (int rep = 0; rep < 3; ++rep) {
      Problem p = random_problem(40, 1, rng, 0.3);
      const Solution s = train(p, lambda, {1e-12, 100});
      const double w_ref = bisect_minimiser(p, lambda);
      INFO("lambda " << lambda << " newton " << s.w[0] << " bisection " << w_ref);
      CHECK(s.grad_norm < 1e-12);
      // |w - w*| <= ||grad|| / lambda.
      CHECK(std::abs(s.w[0] - w_ref) <= 1e-12 / lambda + 1e-10);
    }
  }
}

TEST_CASE("logreg: solver reaches the minimiser in several dimensions") {
  ReproducibleRng rng(11);
  for (std::size_t d : {std::size_t(2), std::size_t(10), std::size_t(40)}) {
    const Problem p = random_problem(300, d, rng);
    const double lambda = 1e-3;
    const Solution s = train(p, lambda);
    CHECK(s.grad_norm < 1e-9);
    CHECK(norm(gradient(p, s.w, lambda)) < 1e-9);
    CHECK(s.iterations < 30);
    // No random nearby point is lower.
    for (int k = 0; k < 20; ++k) {
      std::vector<double> v(s.w);
      for (double& x : v) x += 1e-3 * rng.normal();
      CHECK(objective(p, v, lambda) >= s.objective);
    }
    // The gradient is the derivative of the objective (central differences, dot-product test).
    std::vector<double> w(d), u(d);
    for (std::size_t j = 0; j < d; ++j) {
      w[j] = rng.normal();
      u[j] = rng.normal();
    }
    const double e = 1e-5;
    std::vector<double> wp(w), wm(w);
    for (std::size_t j = 0; j < d; ++j) {
      wp[j] += e * u[j];
      wm[j] -= e * u[j];
    }
    const double fd = (objective(p, wp, lambda) - objective(p, wm, lambda)) / (2 * e);
    const std::vector<double> g = gradient(p, w, lambda);
    double gu = 0;
    for (std::size_t j = 0; j < d; ++j) gu += g[j] * u[j];
    CHECK(fd == doctest::Approx(gu).epsilon(1e-7));
  }
}

TEST_CASE("logreg: projection keeps norms <= 1 and leaves short rows alone") {
  ReproducibleRng rng(3);
  const std::size_t n = 200, d = 7;
  std::vector<double> x(n * d);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < d; ++j) x[i * d + j] = (0.05 + 0.02 * double(i)) * rng.normal();
  const std::vector<double> before(x);
  project_rows_to_unit_ball(x, n, d);
  int shortened = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> r0(before.begin() + i * d, before.begin() + (i + 1) * d);
    std::vector<double> r1(x.begin() + i * d, x.begin() + (i + 1) * d);
    const double n0 = norm(r0), n1 = norm(r1);
    CHECK(n1 <= 1.0 + 1e-15);
    if (n0 <= 1.0) {
      CHECK(r1 == r0);
    } else {
      ++shortened;
      CHECK(n1 == doctest::Approx(1.0).epsilon(1e-14));
      for (std::size_t j = 0; j < d; ++j) CHECK(r1[j] * n0 == doctest::Approx(r0[j]).epsilon(1e-12));
    }
  }
  CHECK(shortened > 50);   // both branches exercised
  CHECK(shortened < 190);

  // make_problem with a constant feature: rows still in the unit ball, bias last.
  std::vector<double> raw{3.0, 4.0, 0.1, 0.2};
  const Problem p = make_problem(raw, 2, 2, std::vector<double>{1.0, -1.0}, 1.0, 1.0);
  REQUIRE(p.d == 3);
  CHECK(p.x[0] == doctest::Approx(3.0 / std::sqrt(26.0)));
  CHECK(p.x[2] == doctest::Approx(1.0 / std::sqrt(26.0)));
  CHECK(p.x[3] == doctest::Approx(0.1 / std::sqrt(1.05)));   // ||(0.1, 0.2, 1)|| > 1 too: scaled
  CHECK(norm({p.x[3], p.x[4], p.x[5]}) == doctest::Approx(1.0));
}

TEST_CASE("logreg: neighbouring minimisers differ by at most 2 / (N lambda)") {
  ReproducibleRng rng(2024);
  double worst_ratio = 0;
  for (int inst = 0; inst < 24; ++inst) {
    const std::size_t n = 20 + 10 * (inst % 4), d = 1 + inst % 6;
    const double lambda = inst % 3 == 0 ? 1.0 : (inst % 3 == 1 ? 0.1 : 0.01);
    const Problem a = random_problem(n, d, rng);
    // Replace one example by a unit-norm row with the opposite label: a large change.
    Problem b = a;
    const std::size_t k = rng.below(n);
    std::vector<double> row(d);
    for (double& v : row) v = rng.normal();
    const double r = norm(row);
    for (std::size_t j = 0; j < d; ++j) b.x[k * d + j] = row[j] / r;
    b.y[k] = -a.y[k];
    const Solution sa = train(a, lambda, {1e-12, 100});
    const Solution sb = train(b, lambda, {1e-12, 100});
    const double bound = 2.0 / (double(n) * lambda);
    const double gap = dist(sa.w, sb.w);
    INFO("instance " << inst << " n " << n << " d " << d << " lambda " << lambda << ": " << gap << " vs " << bound);
    CHECK(gap <= bound);
    CHECK(gap <= release_sensitivity(n, lambda, 1e-12));
    worst_ratio = std::max(worst_ratio, gap / bound);
  }
  CHECK(worst_ratio > 0.05);   // the instances are not trivially far from the bound
  CHECK(release_sensitivity(100, 0.5, 1e-9) == doctest::Approx(2.0 / 50.0 + 4e-9));
}

TEST_CASE("logreg: private weights approach non-private as epsilon grows (Gamma law)") {
  ReproducibleRng rng(99);
  const std::size_t d = 30;
  const double delta_l2 = 0.05;
  std::vector<double> w(d);
  for (double& x : w) x = rng.normal();
  const int draws = 4000;
  double previous = std::numeric_limits<double>::infinity();
  for (double eps : {0.5, 2.0, 8.0, 32.0, 128.0}) {
    double sum = 0;
    for (int k = 0; k < draws; ++k) sum += dist(privatize(w, delta_l2, eps, rng), w);
    const double mean = sum / draws;
    // ||eta|| ~ Gamma(d, Delta / eps): mean d Delta / eps, std sqrt(d) Delta / eps.
    const double expect = double(d) * delta_l2 / eps;
    const double se = std::sqrt(double(d)) * delta_l2 / eps / std::sqrt(double(draws));
    INFO("eps " << eps << ": mean ||eta|| " << mean << " expected " << expect << " (se " << se << ")");
    CHECK(std::abs(mean - expect) < 5 * se);
    CHECK(mean < previous);
    previous = mean;
  }
  CHECK(previous < 0.02);
}

TEST_CASE("logreg: pipeline accuracy on synthetic data (non-private, eps = 100, eps = 0.01)") {
  const Split s = synthetic(10, 4000, 4000, 2.5, 1.0, 5);
  CHECK(s.train.n == 4000);
  CHECK(s.train.d == 11);
  ExperimentOptions o;
  o.lambda = 1e-2;
  o.epsilons = {100.0, 0.01};
  o.repeats = 60;
  ReproducibleRng rng(17);
  const ExperimentResult r = run_experiment(s, o, rng);
  INFO("non-private " << r.test_accuracy << ", eps 100 " << r.results[0].accuracy_mean << ", eps 0.01 "
                      << r.results[1].accuracy_mean << " +- " << r.results[1].accuracy_std);
  CHECK(r.solution.grad_norm < 1e-9);
  CHECK(r.test_accuracy > 0.97);     // Bayes accuracy Phi(2.5) = 0.994
  CHECK(r.train_accuracy > 0.97);
  CHECK(r.results[0].accuracy_mean > r.test_accuracy - 0.01);
  CHECK(r.results[0].accuracy_std < 0.01);
  CHECK(std::abs(r.results[1].accuracy_mean - 0.5) < 0.12);   // near chance
  CHECK(r.results[1].accuracy_std > 0.05);                     // a random direction each draw
  CHECK(r.results[0].sensitivity == doctest::Approx(2.0 / (4000 * 1e-2)).epsilon(1e-6));
  // Mean of 60 Gamma(11, Delta / eps) norms: within 5 standard errors sqrt(11) (Delta / eps) / sqrt(60).
  const double se = std::sqrt(11.0) * r.results[1].sensitivity / 0.01 / std::sqrt(60.0);
  CHECK(std::abs(r.results[1].mean_noise_norm - r.results[1].expected_noise_norm) < 5 * se);
}

TEST_CASE("logreg: two-class subset keeps the two classes, labels them +-1, rows in the unit ball") {
  const auto train_ds = fake_images({0, 3, 9, 9, 1, 0, 9});
  const auto test_ds = fake_images({9, 0, 5});
  const Split s = two_class_subset(train_ds, test_ds, 0, 9, 1.0);
  CHECK(s.train.n == 5);
  CHECK(s.test.n == 2);
  CHECK(s.train.d == 5);
  CHECK(s.train.y == std::vector<double>{1, -1, -1, 1, -1});
  for (std::size_t i = 0; i < s.train.n; ++i) {
    std::vector<double> row(s.train.x.begin() + i * 5, s.train.x.begin() + (i + 1) * 5);
    CHECK(norm(row) <= 1.0 + 1e-15);
    CHECK(row[4] > 0);   // the constant feature
  }
}

TEST_CASE("logreg: bad inputs throw") {
  ReproducibleRng rng(1);
  const Problem p = random_problem(20, 3, rng);
  CHECK_THROWS_AS(train(p, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(train(p, -1.0), std::invalid_argument);
  CHECK_THROWS_AS(train(p, std::nan("")), std::invalid_argument);
  CHECK_THROWS_AS(train(Problem{}, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(release_sensitivity(10, 0.0, 1e-9), std::invalid_argument);
  const std::vector<double> w(3, 0.0);
  CHECK_THROWS_AS(privatize(w, 0.1, 0.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(privatize(w, 0.1, -1.0, rng), std::invalid_argument);
  CHECK_THROWS_AS(privatize(w, 0.0, 1.0, rng), std::invalid_argument);

  Split s;
  s.train = p;
  s.test = p;
  ExperimentOptions o;
  o.epsilons = {1.0, 0.0};
  CHECK_THROWS_AS(run_experiment(s, o, rng), std::invalid_argument);
  o.epsilons = {-2.0};
  CHECK_THROWS_AS(run_experiment(s, o, rng), std::invalid_argument);
  o.epsilons = {std::numeric_limits<double>::infinity()};
  CHECK_THROWS_AS(run_experiment(s, o, rng), std::invalid_argument);
  o.epsilons = {};
  CHECK_THROWS_AS(run_experiment(s, o, rng), std::invalid_argument);
  o.epsilons = {1.0};
  o.repeats = 0;
  CHECK_THROWS_AS(run_experiment(s, o, rng), std::invalid_argument);
  o.repeats = 1;
  o.lambda = 0.0;
  CHECK_THROWS_AS(run_experiment(s, o, rng), std::invalid_argument);

  const auto ds = fake_images({0, 9, 1});
  CHECK_THROWS_AS(two_class_subset(ds, ds, 0, 10), std::invalid_argument);     // unknown class
  CHECK_THROWS_AS(two_class_subset(ds, ds, -1, 9), std::invalid_argument);
  CHECK_THROWS_AS(two_class_subset(ds, ds, 9, 9), std::invalid_argument);      // same class twice
  CHECK_THROWS_AS(two_class_subset(ds, ds, 0, 4), std::invalid_argument);      // class 4 absent: empty
  CHECK_THROWS_AS(two_class_subset(ds, fake_images({0, 1}), 0, 9), std::invalid_argument);  // empty in test
  CHECK_THROWS_AS(fashion_mnist_pair(0, 12), std::invalid_argument);
  CHECK_THROWS_AS(synthetic(0, 10, 10, 1.0, 1.0, 0), std::invalid_argument);
  CHECK_THROWS_AS(synthetic(3, 0, 10, 1.0, 1.0, 0), std::invalid_argument);
  CHECK_THROWS_AS(make_problem(std::vector<double>{1.0}, 1, 1, std::vector<double>{0.0}, 1.0, 0.0),
                  std::invalid_argument);   // label not +-1
}
