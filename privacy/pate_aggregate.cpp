// PATE's aggregation (privacy/pate.hpp, docs/pate.md): GNMax and Confident-GNMax
// on the noise grid, the epsilon a run may claim, and the calibration of sigma2.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/random.hpp"
#include "privacy/calibration.hpp"
#include "privacy/conversions.hpp"
#include "privacy/mechanisms.hpp"
#include "privacy/pate.hpp"
#include "privacy/pate_checks.hpp"
#include "privacy/pld.hpp"

namespace dpgrad::privacy {

namespace {

using namespace pate_detail;

/// Noised copies of `counts`, N(0, sigma^2) on the grid (engine/random.hpp): the
/// counts are whole numbers and the grid a power of two <= 1, so they are on it.
std::vector<double> noised(std::span<const double> counts, double sigma, Rng& rng) {
  require_private_generator(rng, "PATE noise");
  require(sigma < 0x1p20, "PATE: sigma must be below 2^20, got " + format_number(sigma));
  std::vector<double> x(counts.begin(), counts.end());
  add_grid_noise(rng, noise_grid(sigma), x.data(), x.size());
  return x;
}

}  // namespace

// ---- mechanisms ---------------------------------------------------------------

int gnmax(std::span<const double> votes, double sigma, Rng& rng) {
  check_votes(votes);
  check_sigma(sigma, "sigma2");
  const std::vector<double> x = noised(votes, sigma, rng);
  return int(argmax(x));
}

bool confident(std::span<const double> votes, double threshold, double sigma1, Rng& rng) {
  check_votes(votes);
  check_sigma(sigma1, "sigma1");
  require(std::isfinite(threshold), "PATE: the threshold must be finite");
  const double top = votes[argmax(votes)];
  return noised(std::span<const double>(&top, 1), sigma1, rng)[0] >= threshold;
}

std::optional<int> confident_gnmax(std::span<const double> votes, double threshold, double sigma1, double sigma2,
                                   Rng& rng) {
  require(sigma1 >= 0, "PATE: sigma1 must be >= 0 (0: no threshold test), got " + format_number(sigma1));
  check_sigma(sigma2, "sigma2");  // refused whether or not this query is answered
  if (sigma1 > 0 && !confident(votes, threshold, sigma1, rng)) return std::nullopt;
  return gnmax(votes, sigma2, rng);
}

namespace {

/// The run's draws on the noise grid: one per threshold test, `classes` per answer.
double pate_draws(const PateAccountant& accountant, std::size_t classes) {
  double draws = 0;
  for (const auto& q : accountant.queries()) draws += (q.sigma1 > 0 ? double(q.queries) : 0) + double(q.answers) * double(classes);
  return draws;
}

/// The accountant's ledger and queries as Gaussian steps of a PLD accountant (q = 1 for the queries).
PldAccountant as_pld(const PateAccountant& accountant) {
  PldAccountant pld;
  for (const Step& s : accountant.ledger()) pld.step(s.sampling_rate, s.noise_multiplier, s.count, s.jl_dim);
  for (const auto& q : accountant.queries()) {
    if (q.sigma1 > 0) pld.step(1.0, q.sigma1, q.queries);                  // sensitivity 1
    if (q.answers > 0) pld.step(1.0, q.sigma2 / std::sqrt(2.0), q.answers);  // sensitivity sqrt(2)
  }
  return pld;
}

}  // namespace

PateEpsilon pate_epsilons(const PateAccountant& accountant, std::size_t classes, double delta) {
  const double draws = pate_draws(accountant, classes);
  PateEpsilon e;
  e.rdp = grid_noise_epsilon_of_draws(accountant, delta, draws);
  e.pld = accountant.ledger().empty() && accountant.queries().empty()
              ? e.rdp
              : grid_noise_epsilon_of_draws(as_pld(accountant), delta, draws);
  e.by = e.pld < e.rdp ? "PLD" : "RDP";
  e.epsilon = std::min(e.rdp, e.pld);
  return e;
}

double pate_epsilon(const PateAccountant& accountant, std::size_t classes, double delta) {
  return pate_epsilons(accountant, classes, delta).epsilon;
}

double calibrate_pate_sigma(double sigma1, long queries, long answers, std::size_t classes, double target_epsilon,
                            double delta) {
  require(queries >= 1 && answers >= 1, "PATE: calibration needs at least one query and one answer");
  require(classes >= 1, "PATE: calibration needs at least one class");
  // on the RDP bound, quick to evaluate: the PLD's (pate_epsilons) is at most it, so the released epsilon meets
  // the target too
  auto epsilon_of = [&](double sigma2) {
    PateAccountant a;
    a.record({sigma1, sigma2, queries, answers});
    return grid_noise_epsilon_of_draws(a, delta, pate_draws(a, classes));
  };
  if (sigma1 > 0) {  // the threshold tests alone: GNMax with ever more noise tends to them
    PateAccountant a;
    a.record({sigma1, 1e7, queries, 0});
    const double floor = grid_noise_epsilon_of_draws(a, delta, pate_draws(a, classes));
    require(floor < target_epsilon, "PATE: the threshold tests alone (sigma1 " + format_number(sigma1, 6) + ", " +
                                        std::to_string(queries) + " queries) spend epsilon " +
                                        format_epsilon(floor) + ", over the target " + format_number(target_epsilon, 6));
  }
  return calibrate_sigma(epsilon_of, target_epsilon).noise_multiplier;
}

}  // namespace dpgrad::privacy
