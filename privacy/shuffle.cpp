// Shuffled cyclic passes stopped at fraction f (Berthier et al. 2019, Thm. 3.1
// with the without-replacement bound of Wang, Balle, Kasiviswanathan 2019):
// composes rate-gamma_t steps over the positions within each pass and over passes.
#include "privacy/accountant.hpp"
#include "privacy/shuffle.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "privacy/wor.hpp"

namespace dpgrad::privacy {
namespace {

long checked_steps_per_epoch(long n, long b, double f) {
  if (n < 1) throw std::invalid_argument("shuffle accountant: dataset size n must be >= 1, got " + std::to_string(n));
  if (b < 1 || b > n)
    throw std::invalid_argument("shuffle accountant: batch size b must be in [1, n = " + std::to_string(n) +
                                "], got " + std::to_string(b));
  if (!(f > 0.0 && f < 1.0))
    throw std::invalid_argument("shuffle accountant: epoch fraction f must be in (0, 1), got " + format_number(f));
  // floor(f n / b) steps; at least one (its rate b/n is always valid).
  const long m = static_cast<long>(std::floor(f * static_cast<double>(n) / static_cast<double>(b)));
  return std::max(1L, m);
}

}  // namespace

ShuffleAccountant::ShuffleAccountant(long n, long b, double f, std::vector<double> orders)
    : RdpCurveAccountant(orders.empty() ? default_integer_rdp_orders() : std::move(orders), true),
      n_(n), b_(b), f_(f), steps_per_epoch_(checked_steps_per_epoch(n, b, f)) {}

double ShuffleAccountant::sampling_rate_at(long t) const {
  if (t < 1 || t > steps_per_epoch_)
    throw std::invalid_argument("shuffle accountant: step position must be in [1, " +
                                std::to_string(steps_per_epoch_) + "], got " + std::to_string(t));
  // Berthier et al. 2019: a point not yet used is picked with probability at most b / (n - (t-1) b).
  return static_cast<double>(b_) / static_cast<double>(n_ - (t - 1) * b_);
}

void ShuffleAccountant::validate(const Step& s) const {
  Accountant::validate(s);
  const double nominal = static_cast<double>(b_) / static_cast<double>(n_);
  if (std::abs(s.sampling_rate - nominal) > 1e-9 * nominal)
    throw std::invalid_argument("shuffle accountant: sampling rate must be b/n = " + format_number(nominal) +
                                " (the rates of a pass follow from n, b, f), got " + format_number(s.sampling_rate));
}

std::vector<double> ShuffleAccountant::rdp() const {
  std::vector<double> total(orders_.size(), 0.0);
  const long m = steps_per_epoch_;
  long start = 0;  // global index of the entry's first step
  std::vector<long> hits(static_cast<std::size_t>(m));
  for (const Step& s : ledger_) {
    // How often each position t of a pass occurs among this entry's steps.
    const long full = s.count / m, rem = s.count % m, p0 = start % m;
    std::fill(hits.begin(), hits.end(), full);
    for (long k = 0; k < rem; ++k) ++hits[static_cast<std::size_t>((p0 + k) % m)];
    for (long p = 0; p < m; ++p) {
      const long h = hits[static_cast<std::size_t>(p)];
      if (h == 0) continue;
      const double gamma = sampling_rate_at(p + 1);
      for (std::size_t i = 0; i < orders_.size(); ++i)
        total[i] += static_cast<double>(h) *
                    rdp_wor_gaussian(gamma, s.noise_multiplier, static_cast<int>(orders_[i]));
    }
    start = (p0 + s.count % m) % m;  // only the position within a pass matters
  }
  return total;
}

nlohmann::json ShuffleAccountant::to_json() const {
  nlohmann::json j = RdpCurveAccountant::to_json();
  j["dataset_size"] = n_;
  j["batch_size"] = b_;
  j["epoch_fraction"] = f_;
  j["steps_per_epoch"] = steps_per_epoch_;
  return j;
}

std::unique_ptr<Accountant> ShuffleAccountant::clone() const {
  return std::make_unique<ShuffleAccountant>(*this);
}

std::unique_ptr<ShuffleAccountant> ShuffleAccountant::from_json(const nlohmann::json& j) {
  std::vector<double> orders;
  if (j.contains("orders")) orders = j.at("orders").get<std::vector<double>>();
  constexpr long kMax = long(1) << 50;
  auto a = std::make_unique<ShuffleAccountant>(json_whole_number(j, "dataset_size", 1, kMax),
                                               json_whole_number(j, "batch_size", 1, kMax),
                                               j.at("epoch_fraction").get<double>(), std::move(orders));
  replay_ledger(*a, j);
  return a;
}

}  // namespace dpgrad::privacy
