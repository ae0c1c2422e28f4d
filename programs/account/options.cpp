// dpgrad-account's options (programs/account/options.hpp).
#include "programs/account/options.hpp"

#include <cmath>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "privacy/schedule.hpp"
#include "privacy/shuffle.hpp"
#include "programs/cli.hpp"

namespace dpgrad::account {

using namespace dpgrad::privacy;

long steps_after(const Request& r, double epochs) {
  try {
    return steps_for_epochs(r.sampler, r.dataset_size, r.batch_size, epochs,
                            r.accountant == "shuffle" ? r.epoch_fraction : 1.0);
  } catch (const std::invalid_argument& ex) {
    throw InvalidInput(std::string("--epochs: ") + ex.what());
  }
}

Parsed parse_account_options(int argc, const char* const* argv) {
  Parsed parsed;
  Request& r = parsed.request;
  long &n = r.dataset_size, &batch = r.batch_size, steps_opt = 0;
  double &sigma = r.noise_multiplier, &epochs = r.epochs, &delta = r.delta, &target = r.target_epsilon,
         &fraction = r.epoch_fraction;
  std::string &accountant = r.accountant, &sampler = r.sampler;
  int& jl_dim = r.jl_dim;
  bool &json = r.json, &curve = r.curve, &paper_pair = r.paper_pair;
  CLI::App app{"dpgrad-account: the privacy (epsilon, delta) of a DP-SGD run, or the noise multiplier for a "
               "target epsilon"};
  dpgrad::name_cli_errors(app, "dpgrad-account");
  app.add_option("--dataset-size", n, "N, number of training examples")->required()->check(whole_number());
  app.add_option("--batch-size", batch, "L, expected batch size (q = L / N)")->required()->check(whole_number());
  auto* o_sigma = app.add_option("--noise-multiplier", sigma, "S, noise std / clipping norm")->check(real_number());
  auto* o_epochs = app.add_option("--epochs", epochs, "E, passes over the data (steps = ceil(E N / L))")
                       ->check(real_number());
  auto* o_steps = app.add_option("--steps", steps_opt, "T, number of steps")->check(whole_number());
  app.add_option("--delta", delta, "D, target delta in (0, 1)")->required()->check(real_number());
  auto* o_target = app.add_option("--target-epsilon", target, "X: find the smallest S with epsilon <= X")
                       ->check(real_number());
  auto* o_sampler = app.add_option("--sampler", sampler,
                                   "poisson (default), fixed or shuffle: picks the default accountant");
  auto* o_accountant = app.add_option(
      "--accountant", accountant, "pld (default for poisson), rdp, gdp (approximation), wor (fixed), shuffle");
  auto* o_jl = app.add_option("--jl-dim", jl_dim, "K: account DP-SGD-JL with K projections (pld only)")
                   ->check(whole_number());
  auto* o_paper = app.add_flag("--jl-paper-pair", paper_pair,
                               "with --jl-dim: also print the JL paper's pair (not an upper bound; comparison)");
  auto* o_frac = app.add_option("--epoch-fraction", fraction, "F in (0, 1): shuffle stops each pass after F N examples")
                     ->check(real_number());
  app.add_flag("--json", json, "print one JSON object");
  app.add_flag("--curve", curve,
               "print epsilon after each epoch 1..E (needs a whole number of --epochs; JSON: arrays)");
  o_epochs->excludes(o_steps);
  o_sigma->excludes(o_target);

  parsed.exit_code = parse_arguments(app, argc, argv);
  if (parsed.exit_code) return parsed;

  // ---- validation: every problem names the value ----
  if (o_sampler->count() && sampler != "poisson" && sampler != "fixed" && sampler != "shuffle")
    throw InvalidInput("unknown sampler '" + sampler + "' (expected poisson, fixed or shuffle)");
  if (!o_sampler->count())  // the sampler an explicit accountant analyses, else Poisson
    sampler = analysed_sampler(accountant);
  if (!o_accountant->count()) accountant = default_accountant(sampler);
  if (accountant != "rdp" && accountant != "pld" && accountant != "gdp" && accountant != "wor" &&
      accountant != "shuffle")
    throw InvalidInput("unknown accountant '" + accountant + "' (expected rdp, pld, gdp, wor or shuffle)");
  {
    const std::string needs = analysed_sampler(accountant);
    if (sampler != needs)
      throw InvalidInput("--accountant " + accountant + " analyses " + needs + " sampling, not --sampler " + sampler);
  }
  if (o_paper->count() && !(jl_dim > 0 && accountant == "pld"))
    throw InvalidInput("--jl-paper-pair needs --jl-dim K >= 1 with --accountant pld");
  if (n < 1) throw InvalidInput(fmt::format("--dataset-size must be >= 1, got {}", n));
  if (batch < 1) throw InvalidInput(fmt::format("--batch-size must be >= 1, got {}", batch));
  if (batch > n) throw InvalidInput(fmt::format("--batch-size {} is larger than --dataset-size {}", batch, n));
  if (!(delta > 0.0 && delta < 1.0)) throw InvalidInput(fmt::format("--delta must be in (0, 1), got {}", delta));
  if (o_epochs->count() + o_steps->count() != 1) throw InvalidInput("give exactly one of --epochs E or --steps T");
  if (o_epochs->count() && !(epochs > 0.0 && std::isfinite(epochs)))
    throw InvalidInput(fmt::format("--epochs must be > 0, got {}", epochs));
  if (o_steps->count() && steps_opt < 1) throw InvalidInput(fmt::format("--steps must be >= 1, got {}", steps_opt));
  const bool calibrate = o_target->count() > 0;
  if (o_sigma->count() + o_target->count() != 1)
    throw InvalidInput("give exactly one of --noise-multiplier S or --target-epsilon X");
  if (!calibrate && !(sigma >= 0.0 && std::isfinite(sigma)))
    throw InvalidInput(fmt::format("--noise-multiplier must be >= 0, got {}", sigma));
  if (calibrate && !(target > 0.0 && std::isfinite(target)))
    throw InvalidInput(fmt::format("--target-epsilon must be > 0, got {}", target));
  if (curve && !o_epochs->count())
    throw InvalidInput("--curve needs --epochs E (a whole number of epochs), not --steps");
  if (curve && !(epochs >= 1.0 && epochs <= kMaxCurveEpochs && epochs == std::floor(epochs)))
    throw InvalidInput(
        fmt::format("--curve needs a whole number of --epochs in [1, {}], got {}", kMaxCurveEpochs, epochs));
  if (curve && calibrate)
    throw InvalidInput("--curve does not combine with --target-epsilon (give --noise-multiplier S)");
  if (o_jl->count() && jl_dim < 0) throw InvalidInput(fmt::format("--jl-dim must be >= 0, got {}", jl_dim));
  if (o_frac->count() && !(fraction > 0.0 && fraction < 1.0))
    throw InvalidInput(fmt::format("--epoch-fraction must be in (0, 1), got {}", fraction));
  if (o_frac->count() && accountant != "shuffle")
    throw InvalidInput("--epoch-fraction applies only to --accountant shuffle");
  if (accountant == "shuffle" && !o_frac->count())
    throw InvalidInput("--accountant shuffle needs --epoch-fraction F in (0, 1)");

  r.epochs_given = o_epochs->count() > 0;
  r.calibrate = calibrate;
  AccountantOptions& opts = r.accountant_options;
  opts.dataset_size = n;
  opts.batch_size = batch;
  opts.epoch_fraction = fraction;
  std::unique_ptr<Accountant> acc;
  try {
    acc = make_accountant(accountant, opts);
  } catch (const std::invalid_argument& e) {
    throw InvalidInput(e.what());
  }
  if (jl_dim > 0 && !acc->supports_jl())
    throw InvalidInput(fmt::format("--jl-dim is not supported by --accountant {} (DP-SGD-JL needs pld)", accountant));

  // ---- steps and sampling rate ----
  r.sampling_rate = static_cast<double>(batch) / static_cast<double>(n);
  // One epoch of the shuffle accountant is one pass stopped at F: floor(F N / L) steps.
  const long per_pass = accountant == "shuffle" ? dynamic_cast<const ShuffleAccountant&>(*acc).steps_per_epoch() : 0;
  r.steps = steps_opt;
  if (o_epochs->count()) {
    if (accountant == "shuffle")
      r.steps_note = fmt::format("{} epochs x {} steps per pass (floor(F N / L)), rounded up", epochs, per_pass);
    else
      r.steps_note = fmt::format("{} epochs x {} / {}, rounded up", epochs, n, batch);
    r.steps = steps_after(r, epochs);
  }
  return parsed;
}

}  // namespace dpgrad::account

