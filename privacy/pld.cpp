// PLD accountant, part 4: the accountant. Each ledger entry's pair (remove and
// add direction; DP-SGD-JL: a mixture of pairs over cells of its chi-square
// factor) is discretised (pld_discretise), composed by FFT (pld_compose), and
// delta/epsilon are read off with all slack added.
#include "privacy/pld.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "privacy/pld_compose.hpp"
#include "privacy/pld_discretise.hpp"

namespace dpgrad::privacy {

using namespace pld_detail;

// ------------------------------------------------------------------ accountant

struct PldAccountant::Composed {
  std::vector<Step> ledger;
  double budget = 0;  // truncation budget the composition was built with
  bool has_lower = false;
  double grid_spacing = 0;
  long total_steps = 0;
  std::array<DiscretePld, 2> upper, lower;
  std::array<double, 2> extra_upper{0, 0};  // FFT error bound + cell-mass slack
  std::array<double, 2> extra_lower{0, 0};
};

namespace {

void check_options(const PldAccountant::Options& o) {
  auto bad = [](const std::string& what, double v, const std::string& need) {
    throw std::invalid_argument("PldAccountant: " + what + " must be " + need + ", got " + format_number(v));
  };
  if (!(o.grid_spacing > 0 && o.grid_spacing <= 1)) bad("grid_spacing", o.grid_spacing, "in (0, 1]");
  if (!(o.tail_fraction > 0 && o.tail_fraction <= 0.5)) bad("tail_fraction", o.tail_fraction, "in (0, 0.5]");
  if (!(o.max_grid_points >= 1024 && o.max_grid_points <= (1L << 26)))
    bad("max_grid_points", static_cast<double>(o.max_grid_points), "in [1024, 2^26]");
  if (!(o.max_loss >= 1 && o.max_loss <= 1e6)) bad("max_loss", o.max_loss, "in [1, 1e6]");
  if (!(o.relative_cell_width > 0 && o.relative_cell_width <= 0.1))
    bad("relative_cell_width", o.relative_cell_width, "in (0, 0.1]");
  if (!(o.jl_cell_ratio >= 1e-5 && o.jl_cell_ratio <= 0.5)) bad("jl_cell_ratio", o.jl_cell_ratio, "in [1e-5, 0.5]");
}

/// Mean and variance of the finite part of a PLD.
std::pair<double, double> moments(const DiscretePld& d) {
  double m0 = 0, m1 = 0, m2 = 0;
  for (std::size_t k = 0; k < d.mass.size(); ++k) {
    const double l = static_cast<double>(d.offset + static_cast<long>(k)) * d.grid_spacing;
    m0 += d.mass[k];
    m1 += d.mass[k] * l;
  }
  if (!(m0 > 0)) return {0, 0};
  const double mean = m1 / m0;
  for (std::size_t k = 0; k < d.mass.size(); ++k) {
    const double l = static_cast<double>(d.offset + static_cast<long>(k)) * d.grid_spacing - mean;
    m2 += d.mass[k] * l * l;
  }
  return {mean, m2 / m0};
}

}  // namespace

PldAccountant::PldAccountant() : PldAccountant(Options{}) {}

PldAccountant::PldAccountant(Options options) : options_(options) { check_options(options_); }

PldAccountant::PldAccountant(const PldAccountant& other) : Accountant(other), options_(other.options_) {
  std::lock_guard<std::mutex> lock(other.mutex_);
  cache_ = other.cache_;
}

std::string PldAccountant::name() const { return "pld"; }
Neighbouring PldAccountant::neighbouring() const { return Neighbouring::add_remove; }
bool PldAccountant::supports_jl() const { return true; }
bool PldAccountant::upper_bound() const { return !options_.jl_paper_pair; }

std::unique_ptr<Accountant> PldAccountant::clone() const { return std::make_unique<PldAccountant>(*this); }

double PldAccountant::last_grid_spacing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_ ? cache_->grid_spacing : 0.0;
}

std::shared_ptr<const PldAccountant::Composed> PldAccountant::composed(double budget,
                                                                       bool with_lower) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cache_ && cache_->ledger == ledger_ && cache_->budget <= budget &&
      (cache_->has_lower || !with_lower))
    return cache_;
  auto c = std::make_shared<Composed>();
  c->ledger = ledger_;
  c->budget = budget;
  c->has_lower = with_lower;
  long total = 0;
  for (const Step& s : ledger_) total += s.count;
  c->total_steps = total;
  // Half the budget for the single steps' +infinity atoms (composed: <= their sum), half
  // for the truncations during composition. Mass cut from a distribution of m steps is
  // carried into the +infinity atom of every later composition, so it counts about T/m
  // times: over the squarings and products of all entries that is <= (2T + entries) times.
  const double tail_step = 0.5 * budget / static_cast<double>(std::max<long>(total, 1));
  const double tail_conv =
      0.5 * budget / static_cast<double>(2 * std::max<long>(total, 1) + static_cast<long>(ledger_.size()));
  const Options& o = options_;

  // Each entry's single step, both directions.
  std::vector<std::array<std::unique_ptr<StepModel>, 2>> models(ledger_.size());
  for (std::size_t i = 0; i < ledger_.size(); ++i)
    for (int d = 0; d < 2; ++d)
      models[i][d] = std::make_unique<StepModel>(ledger_[i], d == 0 ? PldDirection::remove : PldDirection::add,
                                                 tail_step, o);
  // Grid spacing: the composed distribution must fit in max_grid_points. Its extent is
  // estimated from a coarse discretisation (mean and spread of the sum) plus the
  // widest single-step range (heavy tails reach that far).
  double extent = 0;
  for (int d = 0; d < 2; ++d) {
    double mean = 0, var = 0, lo = kInf, hi = -kInf;
    for (std::size_t i = 0; i < ledger_.size(); ++i) {
      const StepModel& sm = *models[i][d];
      const double h0 = std::max(o.grid_spacing, (sm.loss_hi() - sm.loss_lo()) / 1000.0);
      const StepPld coarse = sm.discretise(h0, std::max(o.relative_cell_width, 0.02), false);
      const auto [m, v] = moments(coarse.upper);
      mean += static_cast<double>(ledger_[i].count) * m;
      var += static_cast<double>(ledger_[i].count) * v;
      lo = std::min(lo, sm.loss_lo());
      hi = std::max(hi, sm.loss_hi());
    }
    extent = std::max(extent, (hi - lo) + std::abs(mean) + 16.0 * std::sqrt(var));
  }
  const double h = std::max(o.grid_spacing, extent / (0.45 * static_cast<double>(o.max_grid_points)));
  c->grid_spacing = h;

  for (int d = 0; d < 2; ++d) {
    DiscretePld up, lw;
    bool first = true;
    double err_up = 0, err_lw = 0, slack = 0;
    for (std::size_t i = 0; i < ledger_.size(); ++i) {
      const StepPld one = models[i][d]->discretise(h, o.relative_cell_width, with_lower);
      slack += static_cast<double>(ledger_[i].count) * one.slack;
      DiscretePld pu = power(one.upper, ledger_[i].count, true, tail_conv, o.max_grid_points, err_up);
      up = first ? std::move(pu) : compose(up, pu, true, tail_conv, o.max_grid_points, err_up);
      if (with_lower) {
        DiscretePld pl = power(one.lower, ledger_[i].count, false, tail_conv, o.max_grid_points, err_lw);
        lw = first ? std::move(pl) : compose(lw, pl, false, tail_conv, o.max_grid_points, err_lw);
      }
      first = false;
    }
    c->upper[d] = std::move(up);
    c->extra_upper[d] = err_up + slack;
    if (with_lower) {
      c->lower[d] = std::move(lw);
      c->extra_lower[d] = err_lw + slack;
    }
  }
  cache_ = c;
  return c;
}

namespace {
void check_delta(double delta) {
  if (!(delta > 0 && delta < 1))
    throw std::invalid_argument("PldAccountant: delta must be in (0, 1), got " + format_number(delta));
}
/// A few ulps upwards, so that rounding in the last arithmetic never under-reports.
double round_up(double eps) {
  if (!std::isfinite(eps)) return eps;
  return std::max(0.0, eps + 1e-12 * (1 + std::abs(eps)));
}
}  // namespace

double PldAccountant::epsilon(double delta) const {
  check_delta(delta);
  if (ledger_.empty()) return 0.0;
  const auto c = composed(options_.tail_fraction * delta, false);
  double eps = 0;
  for (int d = 0; d < 2; ++d) eps = std::max(eps, pld_epsilon(c->upper[d], delta, c->extra_upper[d]));
  return round_up(eps);
}

std::pair<double, double> PldAccountant::epsilon_bounds(double delta) const {
  check_delta(delta);
  if (ledger_.empty()) return {0.0, 0.0};
  const auto c = composed(options_.tail_fraction * delta, true);
  double upper = 0, lower = 0;
  // Hoeffding: each step's rounding error is mean zero given its coarse loss and lies in an
  // interval of width h, so the sum exceeds s with probability <= eta = exp(-2 s^2 / (T h^2));
  // hence delta_true(eps) >= delta_lower(eps + s) - eta (Gopi, Lee, Wutschitz 2021, §5).
  const double eta = 1e-3 * delta;
  const double s = c->grid_spacing * std::sqrt(0.5 * static_cast<double>(c->total_steps) * std::log(1 / eta));
  for (int d = 0; d < 2; ++d) {
    upper = std::max(upper, pld_epsilon(c->upper[d], delta, c->extra_upper[d]));
    lower = std::max(lower, pld_epsilon(c->lower[d], delta + eta + c->extra_lower[d], 0.0) - s);
  }
  return {std::max(0.0, lower), round_up(upper)};
}

double PldAccountant::delta(double epsilon) const {
  if (!(epsilon >= 0)) throw std::invalid_argument("PldAccountant: epsilon must be >= 0, got " + format_number(epsilon));
  if (ledger_.empty()) return 0.0;
  double budget = 1e-10;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cache_ && cache_->ledger == ledger_) budget = cache_->budget;
  }
  double result = 1.0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const auto c = composed(budget, false);
    result = 0;
    for (int d = 0; d < 2; ++d)
      result = std::max(result, pld_delta(c->upper[d], epsilon) + c->extra_upper[d]);
    // The truncation budget must be small against the answer.
    if (budget <= options_.tail_fraction * result || budget <= 1e-20) break;
    budget = std::max(1e-20, options_.tail_fraction * result);
  }
  return std::min(1.0, result);
}

nlohmann::json PldAccountant::to_json() const {
  nlohmann::json j = Accountant::to_json();
  j["options"] = {{"grid_spacing", options_.grid_spacing},
                  {"tail_fraction", options_.tail_fraction},
                  {"max_grid_points", options_.max_grid_points},
                  {"max_loss", options_.max_loss},
                  {"relative_cell_width", options_.relative_cell_width},
                  {"jl_cell_ratio", options_.jl_cell_ratio},
                  {"jl_paper_pair", options_.jl_paper_pair}};
  if (options_.jl_paper_pair) j["not_an_upper_bound"] = "DP-SGD-JL accounted with the paper pair (comparison only)";
  return j;
}

std::unique_ptr<PldAccountant> PldAccountant::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("PldAccountant::from_json: expected an object");
  if (j.contains("accountant") && j["accountant"] != "pld")
    throw std::invalid_argument("PldAccountant::from_json: accountant is " + j["accountant"].dump() +
                                ", expected \"pld\"");
  Options o;
  if (j.contains("options")) {
    const auto& jo = j["options"];
    auto get = [&](const char* key, auto& field) {
      if (!jo.contains(key)) return;
      if (!jo[key].is_number())
        throw std::invalid_argument(std::string("PldAccountant::from_json: option ") + key +
                                    " is not a number: " + jo[key].dump());
      field = jo[key].get<std::decay_t<decltype(field)>>();
    };
    get("grid_spacing", o.grid_spacing);
    get("tail_fraction", o.tail_fraction);
    get("max_grid_points", o.max_grid_points);
    get("max_loss", o.max_loss);
    get("relative_cell_width", o.relative_cell_width);
    get("jl_cell_ratio", o.jl_cell_ratio);
    if (jo.contains("jl_paper_pair")) {
      if (!jo["jl_paper_pair"].is_boolean())
        throw std::invalid_argument("PldAccountant::from_json: option jl_paper_pair is not a boolean: " +
                                    jo["jl_paper_pair"].dump());
      o.jl_paper_pair = jo["jl_paper_pair"].get<bool>();
    }
  }
  auto acc = std::make_unique<PldAccountant>(o);
  try {
    replay_ledger(*acc, j);  // the same checks as every accountant's ledger
  } catch (const nlohmann::json::exception& ex) {
    throw std::invalid_argument(std::string("PldAccountant::from_json: bad ledger: ") + ex.what());
  }
  return acc;
}

}  // namespace dpgrad::privacy
