// dpgrad-train's output (programs/train/report.hpp).
#include "programs/train/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "engine/blas.hpp"
#include "engine/check.hpp"
#include "engine/communicator.hpp"
#include "engine/random.hpp"
#include "privacy/accountant.hpp"
#include "programs/cli.hpp"

namespace dpgrad::train {

using json = nlohmann::json;

namespace {
bool with_epsilon(const RunFacts& f) { return is_dp(f.options->optimizer) && f.trainer->adds_noise(); }
/// " (not private: ...)" after every epsilon of a run with seeded noise.
std::string note(const RunFacts& f) {
  return with_epsilon(f) && f.trainer->dp_optimizer().noise_reproducible()
             ? fmt::format(" ({})", kNotPrivateReproducible) : "";
}
std::string neighbours(const RunFacts& f) { return privacy::to_string(f.trainer->accountant()->neighbouring()); }
}  // namespace

void print_header(const RunFacts& f, const std::function<void(const std::string&)>& say) {
  const Options& o = *f.options;
  PrivateTrainer& t = *f.trainer;
  say(fmt::format("dpgrad-train: {} ({} parameters) on {}", f.model, f.parameters, f.data));
  say(fmt::format("  optimizer {} lr {} ({}), {}", o.optimizer, *o.lr,
                  o.schedule == "cosine" ? fmt::format("cosine down to {}", o.lr_final) : o.schedule, t.plan().describe()));
  if (t.steps_cut_for_budget() > 0)
    say(fmt::format("  training stops after {} of {} steps: more would exceed epsilon {}", t.total_steps(),
                    t.total_steps() + t.steps_cut_for_budget(), *o.target_epsilon));
  if (is_dp(o.optimizer)) {
    say(fmt::format("  {} neighbours; noise, sampling and directions: {}", neighbours(f), t.noise_generator()));
    if (t.noise_multiplier() == 0) say("  WARNING: noise multiplier 0: this run is NOT private; no epsilon is reported");
    for (const std::string& w : t.warnings()) say("  WARNING: " + w);
    if (t.self_check_seconds() > 0)
      say(fmt::format("  structural self-check of {} on 4 synthetic records: passed in {:.3f} s (docs/per-sample.md)",
                      t.clipping().name(), t.self_check_seconds()));
    if (t.dp_optimizer().noise_reproducible())
      say(fmt::format("  WARNING: --reproducible-noise: this run is {}", kNotPrivateReproducible));
    if (o.report_train_loss)
      say("  the training loss is reported: it is computed from the private data without noise and is NOT covered "
          "by epsilon");
    if (o.centre_features > 0)
      say(fmt::format("  feature centre: a private mean of the normalised features, noise multiplier {} (accounted "
                      "with the run{})", o.centre_features, t.resumed() ? "; kept in the checkpoint" : ""));
  } else {
    say("  non-private training: no clipping, no noise, no privacy guarantee");
  }
  if (f.comm)
    say(fmt::format("  data-parallel: {}, {} engine threads each; each clips its shard of every batch, each coordinate "
                    "is noised once (docs/distributed.md)", f.comm->describe(), blas::threads()));
  if (o.augment_views > 0)
    say(fmt::format("  augmentation multiplicity: {} views per example (shifts up to {} px{}), one clipped gradient "
                    "per example", o.augment_views, o.augment_shift, o.augment_no_flip ? "" : ", flips"));
  if (o.optimizer == "dp-adambc")
    say(fmt::format("  Adam's second moment less the noise's variance {:.4g} (DP-AdamBC, floor {:g}; no privacy cost)",
                    t.dp_optimizer().noise_variance(), o.adambc_floor));
  if (!f.lr_scales.empty())
    say(fmt::format("  learning rate per layer: {} (no privacy cost)", fmt::join(f.lr_scales, ", ")));
  if (o.ema > 0) say(fmt::format("  evaluating the parameters' moving average (decay {}; no privacy cost)", o.ema));
  if (o.sat_rho > 0) say(fmt::format("  DP-SAT: gradients taken {} along the last noised gradient (no privacy cost)", o.sat_rho));
  if (t.resumed())
    say(fmt::format("  resumed from {} at step {} of {}{}", o.checkpoint_dir, t.steps_done(), t.total_steps(),
                    with_epsilon(f) ? ", epsilon so far " + fmt_eps(t.epsilon()) : std::string()));
  if (!t.extension().empty())
    say(fmt::format("  going on longer under a larger budget: {} (the run's noise multiplier {:.4f}; the ledger "
                    "continues)", t.extension(), t.noise_multiplier()));
}

json epoch_row(const RunFacts& f, const EpochReport& e) {
  const bool dp = is_dp(f.options->optimizer);
  json row = {{"epoch", e.epoch}, {"steps", e.steps}, {"test_accuracy", e.evaluation->accuracy}, {"seconds", e.seconds}};
  if (!dp) row["train_loss"] = e.train_loss;
  if (dp && f.options->report_train_loss) row["train_loss_not_covered_by_epsilon"] = e.train_loss;
  if (dp) {
    row["private"] = f.trainer->is_private();
    if (!note(f).empty()) row["privacy_note"] = kNotPrivateReproducible;
    row["epsilon"] = eps_json(e.epsilon);
    row["delta"] = f.trainer->delta();
    row["accountant"] = f.trainer->accountant_name();
    row["neighbouring"] = neighbours(f);
  }
  if (f.options->layer_snr) {
    DPOptimizer& opt = f.trainer->dp_optimizer();
    row["layer_snr"] = json::object();
    for (const auto& l : opt.gradient_energy_by_layer()) row["layer_snr"][l.name] = l.snr();
    opt.reset_gradient_energy();
  }
  row["step_seconds"] = e.step_seconds;
  if (f.comm) row["communication_seconds"] = e.communication_seconds, row["wait_seconds"] = e.wait_seconds;
  return row;
}

void print_epoch(const RunFacts& f, const json& row) {
  const Options& o = *f.options;
  if (o.json_out) return fmt::print("{}\n", row.dump());
  const long per = f.trainer->steps_per_epoch(), epochs = (f.trainer->total_steps() + per - 1) / per;
  std::string loss;
  for (const char* key : {"train_loss", "train_loss_not_covered_by_epsilon"})
    if (row.contains(key))
      loss = fmt::format("train loss{} {:.4f}, ", is_dp(o.optimizer) ? " (not covered by epsilon)" : "",
                         row[key].get<double>());
  fmt::print("epoch {}/{}: {}test accuracy {:.2f}%{}{}, {:.1f}s\n", row["epoch"].get<long>(), epochs, loss,
             100 * row["test_accuracy"].get<double>(),
             is_dp(o.optimizer) ? fmt::format(", epsilon {} (delta {:g}, {}, {})", row["epsilon"].is_number()
                                                  ? fmt_eps(row["epsilon"].get<double>()) : "inf",
                                              f.trainer->delta(), f.trainer->accountant_name(), neighbours(f))
                                : "",
             note(f), row["seconds"].get<double>());
  if (row.contains("layer_snr")) {
    std::vector<std::string> parts;
    for (const auto& [layer, r] : row["layer_snr"].items()) parts.push_back(fmt::format("{} {:.3g}", layer, r.get<double>()));
    fmt::print("  signal/noise per coordinate of the noised gradient: {}\n", fmt::join(parts, ", "));
  }
}

json summary_row(const RunFacts& f, const TrainResult& r, json last, double seconds) {
  const Options& o = *f.options;
  PrivateTrainer& t = *f.trainer;
  json s = std::move(last);
  s["final"] = true;
  s["status"] = to_string(r.status);
  s["steps"] = t.steps_done();
  s["planned_steps"] = t.total_steps() + t.steps_cut_for_budget();
  s["model"] = f.model;
  s["optimizer"] = o.optimizer;
  s["private"] = is_dp(o.optimizer) && t.is_private();
  if (!note(f).empty()) s["privacy_note"] = kNotPrivateReproducible;
  s["total_seconds"] = seconds;
  s["processes"] = t.processes();
  s["threads"] = blas::threads();
  s["step_seconds"] = r.step_seconds;  // in trainer.step(), this session
  if (f.comm) s["communication_seconds"] = r.communication_seconds, s["wait_seconds"] = r.wait_seconds;
  if (is_dp(o.optimizer)) {
    s["clip_strategy"] = t.clipping().name();
    s["noise_multiplier"] = t.noise_multiplier();
    s["sampling_rate"] = t.sampling_rate();
    s["noise_generator"] = t.noise_generator();
    if (o.centre_features > 0) s["centre_noise_multiplier"] = o.centre_features;  // the release before training
    if (with_epsilon(f)) s["epsilon"] = eps_json(t.epsilon());
  }
  if (!o.checkpoint_dir.empty()) s["checkpoint"] = t.steps_done();
  if (!t.extension().empty()) s["extended"] = t.extension();  // this session went on under a larger budget
  return s;
}

void print_summary(const RunFacts& f, const json& s) {
  const Options& o = *f.options;
  if (o.json_out) return fmt::print("{}\n", s.dump());
  PrivateTrainer& t = *f.trainer;
  const std::string privacy =
      !is_dp(o.optimizer) ? " (non-private)"
      : !with_epsilon(f)  ? " (NOT private: no noise)"
                          : fmt::format(" at epsilon {} (delta {:g}, {} accountant, {} neighbours){}", fmt_eps(t.epsilon()),
                                        t.delta(), t.accountant_name(), neighbours(f), note(f));
  fmt::print("final: test accuracy {:.2f}%{} after {} steps in {:.1f}s{}{}\n",
             100 * s.value("test_accuracy", std::nan("")), privacy, t.steps_done(), s["total_seconds"].get<double>(),
             s["status"] == "complete" ? "" : fmt::format(" ({}: {} of {} steps)", s["status"].get<std::string>(),
                                                         t.steps_done(), s["planned_steps"].get<long>()),
             f.comm ? fmt::format(" on {} ({:.1f}s of it summing and sending gradients, {:.1f}s waiting for the slowest "
                                  "rank)", f.comm->describe(), s["communication_seconds"].get<double>(),
                                  s["wait_seconds"].get<double>())
                    : "");
}

std::string plot_title(const RunFacts& f) {
  const Options& o = *f.options;
  std::string title = fmt::format("{} on {}, {}", f.model, o.dataset, o.optimizer);
  if (with_epsilon(f))
    title += fmt::format(" ({}, sigma {:.4g}); epsilon: {} at delta {:g}, {}", f.trainer->clipping().name(),
                         f.trainer->noise_multiplier(), f.trainer->accountant_name(), f.trainer->delta(), neighbours(f));
  return title;
}

void report_diverged(const RunFacts& f, const std::exception& e) {
  const Options& o = *f.options;
  PrivateTrainer& t = *f.trainer;
  const double spent = with_epsilon(f) ? t.epsilon() : INFINITY;
  const std::string message = fmt::format(
      "step {}: {}; the run stops and releases nothing of it{}", t.steps_done(), e.what(),
      with_epsilon(f) ? fmt::format("; epsilon spent {} (delta {:g}, {} accountant, {} neighbours), that step included",
                                    fmt_eps(spent), t.delta(), t.accountant_name(), neighbours(f))
                      : std::string());
  if (o.json_out) {
    json row = {{"final", true}, {"diverged", true}, {"error", message}, {"steps", t.steps_done()}};
    if (is_dp(o.optimizer)) row.update({{"epsilon", eps_json(spent)}, {"delta", t.delta()}, {"accountant", t.accountant_name()}});
    fmt::print("{}\n", row.dump());
  }
  throw std::runtime_error(message);
}

std::string fmt_eps(double e) { return privacy::format_epsilon(e); }
json eps_json(double e) { return std::isfinite(e) ? json(e) : json("inf"); }

}  // namespace dpgrad::train
