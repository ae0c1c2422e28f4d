// dpgrad-account: the privacy calculator. Given a DP-SGD run (N, L, sigma,
// epochs or steps) it prints the (epsilon, delta) of any accountant, or, with
// --target-epsilon, the smallest noise multiplier that reaches that epsilon, or,
// with --curve, the epsilon after each epoch 1..E (privacy curves, Bu et al. 2021 Fig. 3).
// Figures that are not upper bounds (gdp, the JL paper's pair) appear only labelled,
// beside a sound one: "epsilon" is always the sound figure. Exit status: 0 ok, 2 invalid
// input (message on stderr), 1 internal error or output that could not be written.
#include <algorithm>
#include <chrono>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <exception>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "programs/account/options.hpp"
#include "programs/cli.hpp"
#include "privacy/accountant.hpp"
#include "privacy/calibration.hpp"
#include "privacy/gdp.hpp"
#include "privacy/rdp.hpp"
#include "privacy/schedule.hpp"
#include "privacy/shuffle.hpp"

#include "privacy/pld.hpp"

namespace {

using namespace dpgrad::privacy;
using namespace dpgrad::account;

/// error_bound = upper - lower of the PLD accountant; nullopt for the others.
std::optional<double> pld_error_bound(const Accountant& a, double delta) {
  if (const auto* p = dynamic_cast<const PldAccountant*>(&a)) {
    const auto [lower, upper] = p->epsilon_bounds(delta);
    if (!std::isfinite(upper)) return std::nullopt;  // nothing finite to bound
    return upper - lower;
  }
  return std::nullopt;
}

nlohmann::json number_or_inf(double x) {
  if (std::isfinite(x)) return x;
  return x > 0 ? "inf" : "-inf";
}

std::string fmt_eps(double x) { return format_epsilon(x); }

using Factory = std::function<std::unique_ptr<Accountant>()>;

/// A figure printed beside the run's own: the sound pld figure beside gdp, or the JL
/// paper's pair (not an upper bound) beside the sound JL figure.
struct Companion {
  Factory make;
  std::string key;    // JSON field
  std::string label;  // for people
};

const char* describe(const std::string& name) {
  if (name == "rdp") return "Renyi DP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019)";
  if (name == "pld") return "privacy loss distribution, numerical (upper bound)";
  if (name == "gdp") return "Gaussian DP by the central limit theorem (Bu, Dong, Long, Su 2019): an approximation, not an upper bound";
  if (name == "wor") return "Renyi DP, batches without replacement (Wang, Balle, Kasiviswanathan 2019)";
  return "Renyi DP, shuffled passes stopped at a fraction f (Berthier et al. 2019)";
}

/// The epsilon a plain run of `steps` steps prints: a fresh accountant, one ledger entry.
double account_once(const Factory& make, double q, double sigma, long steps, int jl_dim, double delta) {
  auto acc = make();
  acc->step(q, sigma, steps, jl_dim);
  return acc->epsilon(delta);
}

/// epsilon after each of steps[0..E-1] (the epochs' cumulative step counts, increasing).
/// Each epoch is accounted from scratch, exactly as a plain run of that many steps
/// (the accountants expose no prefix of a composition), on every core at once.
/// Then, going back from the last epoch, eps[e] = min(eps[e], eps[e+1]): the true
/// epsilon never decreases with more steps (the first e epochs' output is a
/// post-processing of the first e+1's), so min_{e' >= e} of upper bounds at e' is an
/// upper bound at e; the curve is non-decreasing and ends at the plain run's value.
/// If the first and last epochs prove no finite epsilon, every epoch is printed inf
/// without being computed (inf is always a valid bound; this skips the slowest case,
/// DP-SGD-JL with K = 1).
std::vector<double> epsilon_curve(const Factory& make, double q, double sigma, const std::vector<long>& steps,
                                  int jl_dim, double delta) {
  const std::size_t epochs = steps.size();
  std::vector<double> eps(epochs, std::numeric_limits<double>::infinity());
  // Runs the epochs in `todo` (indices into steps) on up to hardware_concurrency threads.
  auto run_all = [&](const std::vector<std::size_t>& todo) {
    const std::size_t workers = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, todo.size());
    std::atomic<std::size_t> next{0};
    std::vector<std::exception_ptr> errors(workers);
    auto work = [&](std::size_t w) {
      try {
        for (std::size_t i; (i = next++) < todo.size();)
          eps[todo[i]] = account_once(make, q, sigma, steps[todo[i]], jl_dim, delta);
      } catch (...) {
        errors[w] = std::current_exception();
        next = todo.size();
      }
    };
    std::vector<std::thread> pool;
    for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(work, w);
    work(0);
    for (auto& t : pool) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  };
  const auto t0 = std::chrono::steady_clock::now();
  run_all(epochs == 1 ? std::vector<std::size_t>{0} : std::vector<std::size_t>{epochs - 1, 0});
  if (epochs > 2 && !(std::isinf(eps.front()) && std::isinf(eps.back()))) {
    // the rest costs at most as much per epoch as the last epoch did: refuse a curve of hours
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double threads = std::max(1u, std::thread::hardware_concurrency());
    const double estimate = seconds / 2 * double(epochs - 2) / threads;
    constexpr double kMaxSeconds = 600;
    if (estimate > kMaxSeconds)
      throw InvalidInput(fmt::format("--curve would take about {:.0f} minutes ({} epochs, {:.2f} s for the first and "
                                     "last); ask for fewer --epochs, or --accountant rdp, which is faster",
                                     estimate / 60, epochs, seconds));
    std::vector<std::size_t> middle;  // latest first: later epochs take longest
    for (std::size_t e = epochs - 1; e-- > 1;) middle.push_back(e);
    run_all(middle);
  }
  for (std::size_t e = epochs - 1; e-- > 0;) eps[e] = std::min(eps[e], eps[e + 1]);
  return eps;
}

/// --curve output: epsilon after each epoch (steps[e-1] steps after epoch e), as a
/// table or as one JSON object with arrays. `acc` holds the whole run's ledger (or
/// none when sigma = 0) and is only asked for its settings.
int print_curve(const Accountant& acc, const Factory& make, const std::optional<Companion>& companion,
                const AccountantOptions& opts, double q, double sigma, int jl_dim, double delta,
                const std::vector<long>& steps, bool json) {
  const std::string name = acc.name();
  // No noise: no finite epsilon at any delta < 1 (the accountants refuse sigma = 0).
  auto curve_of = [&](const Factory& f) {
    return sigma == 0.0 ? std::vector<double>(steps.size(), std::numeric_limits<double>::infinity())
                        : epsilon_curve(f, q, sigma, steps, jl_dim, delta);
  };
  const std::vector<double> eps = curve_of(make);
  const std::vector<double> other = companion ? curve_of(companion->make) : std::vector<double>{};
  const auto* shuffle = dynamic_cast<const ShuffleAccountant*>(&acc);
  const bool gdp = dynamic_cast<const GdpAccountant*>(&acc) != nullptr;

  if (json) {
    // gdp is an approximation: "epsilon" holds the sound companion's figures, the CLT's its own key
    const std::vector<double>& sound = gdp ? other : eps;
    nlohmann::json epochs = nlohmann::json::array(), epsilon = nlohmann::json::array();
    for (std::size_t e = 0; e < steps.size(); ++e) {
      epochs.push_back(e + 1);
      epsilon.push_back(number_or_inf(sound[e]));
    }
    nlohmann::json j = {{"epochs", epochs},
                        {"steps", steps},
                        {"epsilon", epsilon},
                        {"delta", delta},
                        {"accountant", gdp ? std::string("pld") : name},
                        {"neighbouring", to_string(acc.neighbouring())},
                        {"sampling_rate", q},
                        {"noise_multiplier", sigma},
                        {"dataset_size", opts.dataset_size},
                        {"batch_size", opts.batch_size},
                        {"steps_rounded_up", true}};
    if (jl_dim > 0) j["jl_dim"] = jl_dim;
    if (shuffle) {
      j["epoch_fraction"] = opts.epoch_fraction;
      j["steps_per_epoch"] = shuffle->steps_per_epoch();
    }
    if (gdp) {
      nlohmann::json c = nlohmann::json::array();
      for (double e : eps) c.push_back(number_or_inf(e));
      j["approximate_epsilon"] = c;
      j["approximate_epsilon_label"] = std::string("gdp: ") + kGdpLabel + ", NOT an upper bound (comparison only)";
      j["epsilon_label"] = companion->label;
    } else if (companion) {
      nlohmann::json c = nlohmann::json::array();
      for (double e : other) c.push_back(number_or_inf(e));
      j[companion->key] = c;
      j[companion->key + "_label"] = companion->label;
    }
    fmt::print("{}\n", j.dump());
    return 0;
  }

  fmt::print("accountant       {}: {}\n", name, describe(name));
  fmt::print("neighbouring     {}\n", to_string(acc.neighbouring()));
  fmt::print("delta            {}\n", delta);
  fmt::print("sampling rate    {:.6g}  (q = L / N = {} / {})\n", q, opts.batch_size, opts.dataset_size);
  fmt::print("noise multiplier {:.6g}{}\n", sigma, sigma == 0.0 ? "  (no noise: no privacy)" : "");
  if (jl_dim > 0) fmt::print("jl dimension     {}\n", jl_dim);
  if (shuffle)
    fmt::print("steps            e x {} per pass after epoch e  (epoch fraction {}: floor(F N / L))\n",
               shuffle->steps_per_epoch(), opts.epoch_fraction);
  else
    fmt::print("steps            ceil(e x {} / {}) after epoch e\n", opts.dataset_size, opts.batch_size);
  if (gdp) {
    fmt::print("epsilon column   {}\n", companion->label);
    fmt::print("last column      gdp: {}, NOT an upper bound (the CLT can under-state epsilon for few steps)\n",
               kGdpLabel);
  } else if (companion) {
    fmt::print("last column      {}\n", companion->label);
  }
  const std::string last = gdp ? "approximate_epsilon" : companion ? companion->key : "";
  fmt::print("{:>6}  {:>10}  {}{}\n", "epoch", "steps", "epsilon", last.empty() ? "" : "  " + last);
  for (std::size_t e = 0; e < steps.size(); ++e)
    fmt::print("{:>6}  {:>10}  {}{}\n", e + 1, steps[e], fmt_eps(gdp ? other[e] : eps[e]),
               gdp ? "  " + fmt_eps(eps[e]) : companion ? "  " + fmt_eps(other[e]) : std::string());
  return 0;
}

int run(int argc, char** argv) {
  const Parsed parsed = parse_account_options(argc, argv);
  if (parsed.exit_code) return *parsed.exit_code;
  const Request& r = parsed.request;
  const long n = r.dataset_size, batch = r.batch_size, steps = r.steps;
  const double epochs = r.epochs, delta = r.delta, target = r.target_epsilon, fraction = r.epoch_fraction,
               q = r.sampling_rate;
  double sigma = r.noise_multiplier;
  const std::string &accountant = r.accountant, &steps_note = r.steps_note;
  const int jl_dim = r.jl_dim;
  const bool json = r.json, curve = r.curve, calibrate = r.calibrate;
  const AccountantOptions& opts = r.accountant_options;
  std::unique_ptr<Accountant> acc = make_accountant(accountant, opts);
  const Factory make = [accountant, opts] { return make_accountant(accountant, opts); };
  std::optional<Companion> companion;
  if (!acc->upper_bound())
    companion = Companion{[opts] { return make_accountant("pld", opts); }, "upper_bound_epsilon",
                          "pld: privacy loss distribution, an upper bound (the figure to rely on)"};
  if (r.paper_pair) {
    PldAccountant::Options po;
    po.jl_paper_pair = true;
    companion = Companion{[po] { return std::make_unique<PldAccountant>(po); }, "paper_pair_epsilon",
                          "paper pair (N(0,1), E_X N(Z,1)) of Bu et al. 2021: NOT an upper bound, comparison only"};
  }

  if (curve) {
    // Recording the whole run checks (q, sigma, K) as a plain run does, without accounting.
    if (sigma != 0.0) {
      try {
        acc->step(q, sigma, steps, jl_dim);
      } catch (const std::invalid_argument& e) {
        throw InvalidInput(e.what());
      }
    }
    std::vector<long> curve_steps;  // after epochs 1..E
    for (long e = 1; e <= static_cast<long>(epochs); ++e) curve_steps.push_back(steps_after(r, static_cast<double>(e)));
    return print_curve(*acc, make, companion, opts, q, sigma, jl_dim, delta, curve_steps, json);
  }

  // ---- account (or calibrate) ----
  double epsilon;
  if (calibrate) {
    try {
      const Calibration c = calibrate_noise_multiplier(make, q, steps, target, delta, jl_dim);
      sigma = c.noise_multiplier;
    } catch (const std::invalid_argument& e) {
      throw InvalidInput(e.what());
    }
  }
  const bool no_noise = sigma == 0.0;
  if (!no_noise) {
    try {
      acc->step(q, sigma, steps, jl_dim);
    } catch (const std::invalid_argument& e) {
      throw InvalidInput(e.what());
    }
  }
  // No noise: no finite epsilon at any delta < 1 (the accountants refuse sigma = 0).
  std::optional<RdpEpsilon> rdp_detail;
  if (no_noise) epsilon = std::numeric_limits<double>::infinity();
  else if (const auto* r = dynamic_cast<const RdpCurveAccountant*>(acc.get())) {
    rdp_detail = r->epsilon_details(delta);
    epsilon = rdp_detail->epsilon;
  } else {
    epsilon = acc->epsilon(delta);
  }
  const auto* gdp = dynamic_cast<const GdpAccountant*>(acc.get());
  const double mu = gdp ? (no_noise ? std::numeric_limits<double>::infinity() : gdp->mu()) : 0.0;
  const std::optional<double> error_bound = no_noise ? std::nullopt : pld_error_bound(*acc, delta);
  std::optional<double> companion_eps;
  if (companion) companion_eps = no_noise ? std::numeric_limits<double>::infinity()
                                          : account_once(companion->make, q, sigma, steps, jl_dim, delta);

  // ---- output ----
  // gdp is an approximation: "epsilon" is the sound companion's (pld), the CLT's figure has its own key
  const double sound_epsilon = gdp ? *companion_eps : epsilon;
  if (json) {
    nlohmann::json j = {{"epsilon", number_or_inf(sound_epsilon)},
                        {"delta", delta},
                        {"accountant", gdp ? std::string("pld") : accountant},
                        {"neighbouring", to_string(acc->neighbouring())},
                        {"steps", steps},
                        {"sampling_rate", q},
                        {"noise_multiplier", sigma},
                        {"dataset_size", n},
                        {"batch_size", batch}};
    if (r.epochs_given) {
      j["epochs"] = epochs;
      j["steps_rounded_up"] = true;
    }
    if (calibrate) j["target_epsilon"] = target;
    if (jl_dim > 0) j["jl_dim"] = jl_dim;
    if (rdp_detail && std::isfinite(rdp_detail->epsilon) && std::isfinite(rdp_detail->order)) {
      j["order"] = rdp_detail->order;
      j["conversion"] = rdp_detail->conversion == RdpConversion::tight ? "tight" : "classic";
    }
    if (gdp) {
      j["epsilon_label"] = companion->label;
      j["approximate_epsilon"] = number_or_inf(epsilon);
      j["approximate_epsilon_label"] = std::string("gdp: ") + kGdpLabel + ", NOT an upper bound (comparison only)";
      j["mu"] = number_or_inf(mu);
    } else if (companion) {
      j[companion->key] = number_or_inf(*companion_eps);
      j[companion->key + "_label"] = companion->label;
    }
    if (error_bound) j["error_bound"] = *error_bound;
    if (accountant == "shuffle") {
      j["epoch_fraction"] = fraction;
      j["steps_per_epoch"] = dynamic_cast<const ShuffleAccountant&>(*acc).steps_per_epoch();
    }
    fmt::print("{}\n", j.dump());
    return 0;
  }

  if (calibrate)
    fmt::print("noise multiplier {:.6g}  (smallest found with epsilon <= {} at delta = {})\n", sigma, target, delta);
  fmt::print("epsilon          {}  (delta = {}){}\n", fmt_eps(sound_epsilon), delta,
             gdp ? "  -- " + companion->label : std::string());
  if (gdp)
    fmt::print("approximation    {}  -- gdp: {}, NOT an upper bound (comparison only)\n", fmt_eps(epsilon), kGdpLabel);
  else if (companion)
    fmt::print("{:<17}{}  -- {}\n", "paper pair", fmt_eps(*companion_eps), companion->label);
  fmt::print("accountant       {}: {}\n", accountant, describe(accountant));
  fmt::print("neighbouring     {}\n", to_string(acc->neighbouring()));
  if (steps_note.empty()) fmt::print("steps            {}\n", steps);
  else fmt::print("steps            {}  ({})\n", steps, steps_note);
  fmt::print("sampling rate    {:.6g}  (q = L / N = {} / {})\n", q, batch, n);
  fmt::print("noise multiplier {:.6g}{}\n", sigma, no_noise ? "  (no noise: no privacy)" : "");
  if (accountant == "shuffle")
    fmt::print("epoch fraction   {}  ({} steps per pass)\n", fraction,
               dynamic_cast<const ShuffleAccountant&>(*acc).steps_per_epoch());
  if (jl_dim > 0) fmt::print("jl dimension     {}\n", jl_dim);
  if (rdp_detail && std::isfinite(rdp_detail->order))
    fmt::print("order            {:g}  ({} conversion)\n", rdp_detail->order, to_string(rdp_detail->conversion));
  if (gdp) {
    fmt::print("mu               {}\n", std::isfinite(mu) ? fmt::format("{:.6g}", mu) : std::string("inf"));
    fmt::print("note             {}: the CLT can under-state epsilon for few steps\n", kGdpLabel);
  }
  if (error_bound) fmt::print("error bound      {:.3g}  (epsilon is the upper end)\n", *error_bound);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dpgrad::use_best_blas_core("dpgrad-account", argc, argv);
  if (const auto closed = dpgrad::guard_standard_output("dpgrad-account")) return *closed;
  try {
    return dpgrad::finish_standard_output("dpgrad-account", run(argc, argv));
  } catch (const InvalidInput& e) {
    std::cerr << "dpgrad-account: " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "dpgrad-account: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    // fmt's failed write ("cannot write to file: ...") is the output's failure, not an internal error
    const bool output = std::string(e.what()).rfind("cannot write to file", 0) == 0;
    std::cerr << "dpgrad-account: " << (output ? "error: standard output: " : "internal error: ") << e.what() << "\n";
    return 1;
  }
}
