// Logistic regression by damped Newton's method (GEMMs through OpenBLAS, our
// own Cholesky), the unit-ball feature map, the two-class data sets, and output
// perturbation (Chaudhuri, Monteleoni, Sarwate 2011) with a run over epsilons.
#include "programs/logreg/logreg.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "engine/blas.hpp"
#include "privacy/mechanisms.hpp"

namespace dpgrad::logreg {

namespace {

/// log(1 + exp(-z)) without overflow.
double softplus_neg(double z) { return z >= 0 ? std::log1p(std::exp(-z)) : -z + std::log1p(std::exp(z)); }

/// 1 / (1 + exp(-z)) without overflow.
double sigmoid(double z) {
  if (z >= 0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

double norm2(std::span<const double> v) {
  double s = 0.0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

double dot(std::span<const double> a, std::span<const double> b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

void check_problem(const Problem& prob, std::span<const double> w, const char* who) {
  if (prob.x.size() != prob.n * prob.d || prob.y.size() != prob.n)
    throw std::invalid_argument(std::string(who) + ": problem arrays do not match n = " + std::to_string(prob.n) +
                                ", d = " + std::to_string(prob.d));
  if (w.size() != prob.d)
    throw std::invalid_argument(std::string(who) + ": w has " + std::to_string(w.size()) + " entries, expected d = " +
                                std::to_string(prob.d));
}

void require_lambda(double lambda, const char* who) {
  if (!(lambda > 0.0 && std::isfinite(lambda)))
    throw std::invalid_argument(std::string(who) + ": lambda must be > 0 and finite, got " + std::to_string(lambda));
}

/// margins m = X w. x: (n, d), w: (d) -> (n)
std::vector<double> margins(const Problem& prob, std::span<const double> w) {
  std::vector<double> m(prob.n, 0.0);
  if (prob.n == 0) return m;
  blas::gemm<double>(false, false, prob.n, 1, prob.d, 1.0, prob.x.data(), w.data(), 0.0, m.data());
  return m;
}

double objective_from_margins(const Problem& prob, const std::vector<double>& m, std::span<const double> w,
                              double lambda) {
  double loss = 0.0;
  for (std::size_t i = 0; i < prob.n; ++i) loss += softplus_neg(prob.y[i] * m[i]);
  return loss / static_cast<double>(prob.n) + 0.5 * lambda * dot(w, w);
}

std::vector<double> gradient_from_margins(const Problem& prob, const std::vector<double>& m,
                                          std::span<const double> w, double lambda) {
  // r_i = d/dm_i log(1 + exp(-y_i m_i)) = -y_i sigma(-y_i m_i)
  std::vector<double> r(prob.n);
  for (std::size_t i = 0; i < prob.n; ++i) r[i] = -prob.y[i] * sigmoid(-prob.y[i] * m[i]);
  std::vector<double> g(w.begin(), w.end());
  // g = (1/n) X^T r + lambda w
  blas::gemm<double>(true, false, prob.d, 1, prob.n, 1.0 / static_cast<double>(prob.n), prob.x.data(), r.data(),
                     lambda, g.data());
  return g;
}

/// In-place Cholesky H = L L^T of a symmetric positive definite (d, d) row-major
/// matrix (lower triangle overwritten with L); then solves L L^T p = b in place.
void cholesky_solve(std::vector<double>& h, std::size_t d, std::vector<double>& b) {
  for (std::size_t j = 0; j < d; ++j) {
    double* hj = h.data() + j * d;
    double s = hj[j];
    for (std::size_t k = 0; k < j; ++k) s -= hj[k] * hj[k];
    if (!(s > 0.0)) throw std::runtime_error("logreg::train: Hessian is not positive definite (numerical breakdown)");
    const double ljj = std::sqrt(s);
    hj[j] = ljj;
    for (std::size_t i = j + 1; i < d; ++i) {
      double* hi = h.data() + i * d;
      double t = hi[j];
      for (std::size_t k = 0; k < j; ++k) t -= hi[k] * hj[k];
      hi[j] = t / ljj;
    }
  }
  for (std::size_t i = 0; i < d; ++i) {   // L z = b
    const double* hi = h.data() + i * d;
    double t = b[i];
    for (std::size_t k = 0; k < i; ++k) t -= hi[k] * b[k];
    b[i] = t / hi[i];
  }
  for (std::size_t i = d; i-- > 0;) {     // L^T p = z
    double t = b[i];
    for (std::size_t k = i + 1; k < d; ++k) t -= h[k * d + i] * b[k];
    b[i] = t / h[i * d + i];
  }
}

}  // namespace

void project_rows_to_unit_ball(std::span<double> x, std::size_t n, std::size_t d) {
  if (x.size() != n * d)
    throw std::invalid_argument("project_rows_to_unit_ball: " + std::to_string(x.size()) + " values for (" +
                                std::to_string(n) + ", " + std::to_string(d) + ")");
  for (std::size_t i = 0; i < n; ++i) {
    std::span<double> row = x.subspan(i * d, d);
    const double nrm = norm2(row);
    if (nrm > 1.0)
      for (double& v : row) v /= nrm;
  }
}

Problem make_problem(std::span<const double> raw, std::size_t n, std::size_t p, std::span<const double> labels,
                     double scale, double bias) {
  if (raw.size() != n * p)
    throw std::invalid_argument("make_problem: " + std::to_string(raw.size()) + " values for (" + std::to_string(n) +
                                ", " + std::to_string(p) + ")");
  if (labels.size() != n)
    throw std::invalid_argument("make_problem: " + std::to_string(labels.size()) + " labels for " +
                                std::to_string(n) + " rows");
  if (!(scale > 0.0 && std::isfinite(scale)) || !std::isfinite(bias))
    throw std::invalid_argument("make_problem: scale must be > 0 and bias finite");
  Problem prob;
  prob.n = n;
  prob.d = p + (bias != 0.0 ? 1 : 0);
  if (prob.d == 0) throw std::invalid_argument("make_problem: no features (p = 0 and bias = 0)");
  prob.x.resize(n * prob.d);
  prob.y.assign(labels.begin(), labels.end());
  for (std::size_t i = 0; i < n; ++i) {
    if (prob.y[i] != 1.0 && prob.y[i] != -1.0)
      throw std::invalid_argument("make_problem: label " + std::to_string(prob.y[i]) + " of row " +
                                  std::to_string(i) + " is not -1 or +1");
    double* row = prob.x.data() + i * prob.d;
    for (std::size_t j = 0; j < p; ++j) {
      const double v = raw[i * p + j];
      if (!std::isfinite(v))
        throw std::invalid_argument("make_problem: non-finite feature in row " + std::to_string(i));
      row[j] = scale * v;
    }
    if (bias != 0.0) row[p] = bias;
  }
  project_rows_to_unit_ball(prob.x, n, prob.d);
  return prob;
}

double objective(const Problem& prob, std::span<const double> w, double lambda) {
  check_problem(prob, w, "logreg::objective");
  if (prob.n == 0) throw std::invalid_argument("logreg::objective: empty problem");
  return objective_from_margins(prob, margins(prob, w), w, lambda);
}

std::vector<double> gradient(const Problem& prob, std::span<const double> w, double lambda) {
  check_problem(prob, w, "logreg::gradient");
  if (prob.n == 0) throw std::invalid_argument("logreg::gradient: empty problem");
  return gradient_from_margins(prob, margins(prob, w), w, lambda);
}

double accuracy(const Problem& prob, std::span<const double> w) {
  check_problem(prob, w, "logreg::accuracy");
  if (prob.n == 0) throw std::invalid_argument("logreg::accuracy: empty problem");
  const std::vector<double> m = margins(prob, w);
  std::size_t right = 0;
  for (std::size_t i = 0; i < prob.n; ++i) right += (m[i] >= 0.0 ? 1.0 : -1.0) == prob.y[i];
  return static_cast<double>(right) / static_cast<double>(prob.n);
}

Solution train(const Problem& prob, double lambda, const SolverOptions& opts) {
  require_lambda(lambda, "logreg::train");
  if (prob.n == 0 || prob.d == 0) throw std::invalid_argument("logreg::train: empty problem");
  if (!(opts.grad_tol > 0.0) || opts.max_iterations < 1)
    throw std::invalid_argument("logreg::train: grad_tol must be > 0 and max_iterations >= 1");
  const std::size_t n = prob.n, d = prob.d;
  const double inv_n = 1.0 / static_cast<double>(n);
  Solution sol;
  sol.w.assign(d, 0.0);
  check_problem(prob, sol.w, "logreg::train");
  std::vector<double> m = margins(prob, sol.w);
  double f = objective_from_margins(prob, m, sol.w, lambda);
  std::vector<double> g = gradient_from_margins(prob, m, sol.w, lambda);
  std::vector<double> xs(n * d), h(d * d), w_new(d);
  for (int it = 0;; ++it) {
    sol.grad_norm = norm2(g);
    sol.objective = f;
    sol.iterations = it;
    if (sol.grad_norm < opts.grad_tol) return sol;
    if (it == opts.max_iterations)
      throw std::runtime_error("logreg::train: ||grad|| = " + std::to_string(sol.grad_norm) + " after " +
                               std::to_string(it) + " Newton steps (tolerance " + std::to_string(opts.grad_tol) + ")");
    // H = (1/n) X^T diag(D) X + lambda I, D_i = sigma(m_i) sigma(-m_i): rows scaled by sqrt(D_i).
    for (std::size_t i = 0; i < n; ++i) {
      const double s = std::sqrt(sigmoid(m[i]) * sigmoid(-m[i]));
      const double* xi = prob.x.data() + i * d;
      double* out = xs.data() + i * d;
      for (std::size_t j = 0; j < d; ++j) out[j] = s * xi[j];
    }
    blas::gemm<double>(true, false, d, d, n, inv_n, xs.data(), xs.data(), 0.0, h.data());
    for (std::size_t j = 0; j < d; ++j) h[j * d + j] += lambda;
    std::vector<double> step(g);
    cholesky_solve(h, d, step);
    for (double& v : step) v = -v;   // p = -H^{-1} g
    const double slope = dot(g, step);   // -(Newton decrement)^2 < 0
    // Armijo backtracking; with decrement^2 below 1e-12 the step is inside the
    // quadratic region and J cannot resolve the decrease, so take it whole.
    double t = 1.0;
    for (;;) {
      for (std::size_t j = 0; j < d; ++j) w_new[j] = sol.w[j] + t * step[j];
      std::vector<double> m_new = margins(prob, w_new);
      const double f_new = objective_from_margins(prob, m_new, w_new, lambda);
      if (-slope < 1e-12 || f_new <= f + 1e-4 * t * slope) {
        sol.w.swap(w_new);
        m.swap(m_new);
        f = f_new;
        break;
      }
      t *= 0.5;
      if (t < 1e-20) throw std::runtime_error("logreg::train: line search failed (numerical breakdown)");
    }
    g = gradient_from_margins(prob, m, sol.w, lambda);
  }
}

double release_sensitivity(std::size_t n, double lambda, double grad_tol) {
  require_lambda(lambda, "logreg::release_sensitivity");
  if (!(grad_tol >= 0.0)) throw std::invalid_argument("logreg::release_sensitivity: grad_tol must be >= 0");
  return privacy::logistic_regression_sensitivity(static_cast<long>(n), lambda) + 2.0 * grad_tol / lambda;
}

std::vector<double> privatize(std::span<const double> w, double sensitivity, double epsilon, Rng& rng) {
  return privacy::output_perturbation(w, sensitivity, epsilon, rng);
}

namespace {

Problem image_subset(const data::ImageDataset& ds, int class_a, int class_b, double bias, const char* split) {
  const std::size_t count = ds.labels.size();
  if (count == 0 || ds.images.size() % count != 0)
    throw std::invalid_argument(std::string("two_class_subset: the ") + split + " split has " +
                                std::to_string(count) + " labels for " + std::to_string(ds.images.size()) + " pixels");
  const std::size_t p = ds.images.size() / count;
  std::vector<double> raw, labels;
  std::size_t na = 0, nb = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const int c = ds.labels[i];
    if (c != class_a && c != class_b) continue;
    (c == class_a ? na : nb) += 1;
    labels.push_back(c == class_a ? 1.0 : -1.0);
    const float* px = ds.images.data() + i * p;
    raw.insert(raw.end(), px, px + p);
  }
  if (na == 0 || nb == 0)
    throw std::invalid_argument(std::string("two_class_subset: the ") + split + " split has no image of class " +
                                std::to_string(na == 0 ? class_a : class_b));
  // Pixels in [0, 1]: ||x|| <= sqrt(p), so x / sqrt(p) is in the unit ball already.
  return make_problem(raw, labels.size(), p, labels, 1.0 / std::sqrt(static_cast<double>(p)), bias);
}

}  // namespace

Split two_class_subset(const data::ImageDataset& train, const data::ImageDataset& test, int class_a, int class_b,
                       double bias) {
  const auto classes = static_cast<int>(std::min(train.classes, test.classes));
  for (int c : {class_a, class_b})
    if (c < 0 || c >= classes)
      throw std::invalid_argument("two_class_subset: class " + std::to_string(c) + " is not in [0, " +
                                  std::to_string(classes) + ")");
  if (class_a == class_b)
    throw std::invalid_argument("two_class_subset: the two classes must differ, got " + std::to_string(class_a) +
                                " twice");
  Split s;
  s.train = image_subset(train, class_a, class_b, bias, "training");
  s.test = image_subset(test, class_a, class_b, bias, "test");
  return s;
}

Split fashion_mnist_pair(int class_a, int class_b, double bias) {
  // Check the classes before the (slower) load so that a typo fails fast.
  for (int c : {class_a, class_b})
    if (c < 0 || c >= 10)
      throw std::invalid_argument("fashion_mnist_pair: class " + std::to_string(c) + " is not in [0, 10)");
  Split s = two_class_subset(data::load_fashion_mnist(true), data::load_fashion_mnist(false), class_a, class_b, bias);
  static const char* names[10] = {"T-shirt/top", "trouser", "pullover", "dress", "coat",
                                  "sandal",      "shirt",   "sneaker",  "bag",   "ankle boot"};
  s.description = "Fashion-MNIST, class " + std::to_string(class_a) + " (" + names[class_a] + ", +1) vs class " +
                  std::to_string(class_b) + " (" + names[class_b] + ", -1)";
  return s;
}

Split synthetic(std::size_t dim, std::size_t train_size, std::size_t test_size, double separation, double bias,
                std::uint64_t seed) {
  if (dim == 0 || train_size == 0 || test_size == 0)
    throw std::invalid_argument("synthetic: dim, size and test size must be >= 1");
  if (!(separation >= 0.0 && std::isfinite(separation)))
    throw std::invalid_argument("synthetic: separation must be >= 0, got " + std::to_string(separation));
  FastRng rng(seed ^ 0x9e3779b97f4a7c15ULL);   // not the stream of a noise generator seeded with `seed`
  std::vector<double> mu(dim);
  double nrm = 0.0;
  while (!(nrm > 0.0)) {
    for (double& v : mu) v = rng.normal();
    nrm = norm2(mu);
  }
  for (double& v : mu) v *= separation / nrm;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim) + separation * separation);
  auto draw = [&](std::size_t n) {
    std::vector<double> raw(n * dim), labels(n);
    for (std::size_t i = 0; i < n; ++i) {
      labels[i] = rng.bernoulli(0.5) ? 1.0 : -1.0;
      for (std::size_t j = 0; j < dim; ++j) raw[i * dim + j] = labels[i] * mu[j] + rng.normal();
    }
    return make_problem(raw, n, dim, labels, scale, bias);
  };
  Split s;
  s.train = draw(train_size);
  s.test = draw(test_size);
  char sep[32];
  std::snprintf(sep, sizeof sep, "%g", separation);
  s.description = "synthetic: two Gaussians N(+-mu, I) in " + std::to_string(dim) + " dimensions, ||mu|| = " + sep +
                  ", seed " + std::to_string(seed);
  return s;
}

double checked_noise_norm(std::size_t n, std::size_t d, const ExperimentOptions& opts) {
  require_lambda(opts.lambda, "checked_noise_norm");
  if (opts.epsilons.empty()) throw std::invalid_argument("checked_noise_norm: no epsilon given");
  const double smallest = *std::min_element(opts.epsilons.begin(), opts.epsilons.end());
  const double sensitivity = release_sensitivity(n, opts.lambda, opts.solver.grad_tol);
  const double norm = static_cast<double>(d) * sensitivity / smallest;
  if (!(norm <= 1e150)) {
    char text[240];
    std::snprintf(text, sizeof text,
                  "lambda %g makes the noise's expected norm %.3g at epsilon %g (sensitivity %.3g for N = %zu): too "
                  "large to compute with (beyond 1e150); use a larger lambda",
                  opts.lambda, norm, smallest, sensitivity, n);
    throw std::invalid_argument(text);
  }
  return norm;
}

ExperimentResult run_experiment(const Split& split, const ExperimentOptions& opts, Rng& rng) {
  require_lambda(opts.lambda, "run_experiment");
  if (opts.epsilons.empty()) throw std::invalid_argument("run_experiment: no epsilon given");
  for (double e : opts.epsilons)
    if (!(e > 0.0 && std::isfinite(e)))
      throw std::invalid_argument("run_experiment: every epsilon must be > 0 and finite, got " + std::to_string(e));
  if (opts.repeats < 1)
    throw std::invalid_argument("run_experiment: repeats must be >= 1, got " + std::to_string(opts.repeats));
  if (split.train.d != split.test.d)
    throw std::invalid_argument("run_experiment: train and test have different feature counts");
  checked_noise_norm(split.train.n, split.train.d, opts);
  ExperimentResult res;
  const auto t0 = std::chrono::steady_clock::now();
  res.solution = train(split.train, opts.lambda, opts.solver);
  res.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.train_accuracy = accuracy(split.train, res.solution.w);
  res.test_accuracy = accuracy(split.test, res.solution.w);
  const double delta_l2 = release_sensitivity(split.train.n, opts.lambda, opts.solver.grad_tol);
  const double d = static_cast<double>(split.train.d);
  for (double eps : opts.epsilons) {
    EpsilonResult r;
    r.epsilon = eps;
    r.sensitivity = delta_l2;
    r.expected_noise_norm = d * delta_l2 / eps;
    double sum = 0.0, sum_sq = 0.0, noise = 0.0;
    for (int k = 0; k < opts.repeats; ++k) {
      const std::vector<double> w = privatize(res.solution.w, delta_l2, eps, rng);
      double e2 = 0.0;
      for (std::size_t j = 0; j < w.size(); ++j) e2 += (w[j] - res.solution.w[j]) * (w[j] - res.solution.w[j]);
      noise += std::sqrt(e2);
      const double a = accuracy(split.test, w);
      sum += a;
      sum_sq += a * a;
    }
    const double R = opts.repeats;
    r.accuracy_mean = sum / R;
    r.accuracy_std = opts.repeats > 1 ? std::sqrt(std::max(0.0, (sum_sq - R * r.accuracy_mean * r.accuracy_mean) /
                                                                    (R - 1.0)))
                                      : 0.0;
    r.mean_noise_norm = noise / R;
    res.results.push_back(r);
    res.epsilon_total += R * eps;
    res.releases += opts.repeats;
  }
  return res;
}

}  // namespace dpgrad::logreg
