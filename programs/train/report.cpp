// dpgrad-train's output (programs/train/report.hpp).
#include "programs/train/report.hpp"

#include <cmath>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "engine/blas.hpp"
#include "engine/communicator.hpp"

namespace dpgrad::train {

using json = nlohmann::json;

void print_header(const RunFacts& f, const std::function<void(const std::string&)>& say) {
  const Options& o = *f.options;
  PrivateTrainer& t = *f.trainer;
  say(fmt::format("dpgrad-train: {} ({} parameters) on {}", f.model, f.parameters, f.data));
  say(fmt::format("  optimizer {} lr {} ({}), {}", o.optimizer, *o.lr,
                  o.schedule == "cosine" ? fmt::format("cosine down to {}", o.lr_final) : o.schedule, t.plan().describe()));
  for (const std::string& line : t.describe()) say("  " + line);  // the library's facts of the run
  if (o.report_train_loss)
    say("  the training loss is reported: it is computed from the private data without noise and is NOT covered "
        "by epsilon");
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
}

json epoch_row(const RunFacts& f, const EpochReport& e) {
  const bool dp = is_dp(f.options->optimizer);
  json row = {{"epoch", e.epoch}, {"steps", e.steps}, {"test_accuracy", e.evaluation->accuracy}, {"seconds", e.seconds}};
  if (!dp) row["train_loss"] = e.train_loss;
  if (dp && f.options->report_train_loss) row["train_loss_not_covered_by_epsilon"] = e.train_loss;
  if (dp) row.update(f.trainer->privacy_json(e.epsilon));
  if (f.options->clip_quantile) row["clip_norm"] = e.clip_norm;  // adaptive: the next step's C
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

void print_epoch(const RunFacts& f, const json& row, double epsilon) {
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
             is_dp(o.optimizer) ? ", " + f.trainer->privacy_statement(epsilon) : "",
             row.contains("clip_norm") ? fmt::format(", clip norm now {:.4g}", row["clip_norm"].get<double>()) : "",
             row["seconds"].get<double>());
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
  s.update({{"final", true}, {"status", to_string(r.status)}, {"steps", t.steps_done()},
            {"planned_steps", t.total_steps() + t.steps_cut_for_budget()}, {"model", f.model},
            {"optimizer", o.optimizer}, {"total_seconds", seconds}, {"processes", t.processes()},
            {"threads", blas::threads()}, {"step_seconds", r.step_seconds}});  // step_seconds: in step(), this session
  s.update(t.privacy_json());
  if (f.comm) s["communication_seconds"] = r.communication_seconds, s["wait_seconds"] = r.wait_seconds;
  if (is_dp(o.optimizer))
    s.update({{"clip_strategy", t.clipping().name()}, {"noise_multiplier", t.noise_multiplier()},
              {"sampling_rate", t.sampling_rate()}, {"noise_generator", t.noise_generator()}});
  if (o.clip_quantile) s["clip_norm"] = t.dp_optimizer().clip_norm();  // adaptive: where C ended
  for (const auto& [layer, c] : t.dp_optimizer().layer_clip_norms()) s["layer_clip_norms"][layer] = c;  // per layer
  if (o.centre_features > 0) s["centre_noise_multiplier"] = o.centre_features;  // the release before training
  if (!o.checkpoint_dir.empty()) s["checkpoint"] = t.steps_done();
  if (!t.extension().empty()) s["extended"] = t.extension();  // this session went on under a larger budget
  return s;
}

void print_summary(const RunFacts& f, const json& s) {
  if (f.options->json_out) return fmt::print("{}\n", s.dump());
  PrivateTrainer& t = *f.trainer;
  const std::string privacy = t.adds_noise() ? " at " + t.privacy_statement() : " (" + t.privacy_statement() + ")";
  fmt::print("final: test accuracy {:.2f}%{} after {} steps in {:.1f}s{}{}\n",
             100 * s.value("test_accuracy", std::nan("")), privacy, t.steps_done(), s["total_seconds"].get<double>(),
             s["status"] == "complete" ? "" : fmt::format(" ({}: {} of {} steps)", s["status"].get<std::string>(),
                                                         t.steps_done(), s["planned_steps"].get<long>()),
             f.comm ? fmt::format(" on {} ({:.1f}s of it summing and sending gradients, {:.1f}s waiting for the slowest "
                                  "rank)", f.comm->describe(), s["communication_seconds"].get<double>(),
                                  s["wait_seconds"].get<double>())
                    : "");
  if (s.contains("layer_clip_norms")) {
    std::string layers;
    for (const auto& [layer, c] : s["layer_clip_norms"].items())
      layers += fmt::format("{}{} {:.4g}", layers.empty() ? "" : ", ", layer, c.get<double>());
    fmt::print("each layer's clip norm now: {}\n", layers);
  }
}

std::string plot_title(const RunFacts& f) {
  const Options& o = *f.options;
  PrivateTrainer& t = *f.trainer;
  std::string title = fmt::format("{} on {}, {}", f.model, o.dataset, o.optimizer);
  if (t.adds_noise()) title += fmt::format(" ({}, sigma {:.4g}); {}", t.clipping().name(), t.noise_multiplier(),
                                           t.privacy_statement());
  return title;
}

void report_diverged(const RunFacts& f, const std::exception& e) {
  PrivateTrainer& t = *f.trainer;
  const std::string message =
      fmt::format("step {}: {}; the run stops and releases nothing of it{}", t.steps_done(), e.what(),
                  t.adds_noise() ? "; epsilon spent, that step included: " + t.privacy_statement() : std::string());
  if (f.options->json_out) {
    json row = {{"final", true}, {"diverged", true}, {"error", message}, {"steps", t.steps_done()}};
    if (is_dp(f.options->optimizer)) row.update(t.privacy_json());
    fmt::print("{}\n", row.dump());
  }
  throw std::runtime_error(message);
}

}  // namespace dpgrad::train
