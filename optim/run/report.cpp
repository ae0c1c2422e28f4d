// What a training run shows (optim/run/report.hpp).
#include "optim/run/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "engine/blas.hpp"
#include "engine/communicator.hpp"
#include "engine/progress.hpp"
#include "privacy/accountant.hpp"  // format_number

namespace dpgrad {

using json = nlohmann::json;

template <class T>
json epoch_record(PrivateTrainerT<T>& t, const EpochReport& e, const ReportOptions& o) {
  const bool dp = t.plan().is_private();
  json row = {{"epoch", e.epoch}, {"steps", e.steps},
              {"test_accuracy", e.evaluation ? json(e.evaluation->accuracy) : json()}, {"seconds", e.seconds}};
  if (!dp) row["train_loss"] = e.train_loss;
  if (dp && o.train_loss) row["train_loss_not_covered_by_epsilon"] = e.train_loss;
  if (dp) row.update(t.privacy_json(e.epsilon));
  if (t.config().adaptive_clipping) row["clip_norm"] = e.clip_norm;  // the next step's C
  if (o.layer_snr) {
    DPOptimizerT<T>& opt = t.dp_optimizer();
    row["layer_snr"] = json::object();
    for (const auto& l : opt.gradient_energy_by_layer()) row["layer_snr"][l.name] = l.snr();
    opt.reset_gradient_energy();
  }
  row["step_seconds"] = e.step_seconds;
  if (t.config().communicator) row["communication_seconds"] = e.communication_seconds, row["wait_seconds"] = e.wait_seconds;
  return row;
}

namespace {

/// x with `decimals` decimals.
std::string fixed(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}
using privacy::format_number;

/// "test accuracy 81.20%" of a record, or "not evaluated".
std::string accuracy_text(const json& row) {
  const json& a = row.value("test_accuracy", json());
  return a.is_number() ? "test accuracy " + fixed(100 * a.get<double>(), 2) + "%" : "not evaluated";
}

/// A layer -> number object as "conv1 0.52, dense1 1.3" (`digits` significant digits).
std::string by_layer(const json& values, int digits) {
  std::string text;
  for (const auto& [layer, v] : values.items()) text += (text.empty() ? "" : ", ") + layer + " " + format_number(v.get<double>(), digits);
  return text;
}

/// The epsilon of a record's privacy fields (a number, or "inf" when nothing is proven).
double record_epsilon(const json& row) {
  const json& e = row.at("epsilon");
  return e.is_number() ? e.get<double>() : std::numeric_limits<double>::infinity();
}

}  // namespace

template <class T>
std::string epoch_text(const PrivateTrainerT<T>& t, const json& row) {
  const bool dp = t.plan().is_private();
  const long per = t.steps_per_epoch(), epochs = (t.total_steps() + per - 1) / per;
  std::string text = "epoch " + std::to_string(row.at("epoch").get<long>()) + "/" + std::to_string(epochs) + ": ";
  for (const char* key : {"train_loss", "train_loss_not_covered_by_epsilon"})
    if (row.contains(key))
      text += std::string("train loss") + (dp ? " (not covered by epsilon) " : " ") + fixed(row[key].get<double>(), 4) + ", ";
  text += accuracy_text(row);
  if (dp) text += ", " + t.privacy_statement(row.contains("epsilon") ? std::optional(record_epsilon(row)) : std::nullopt);
  if (row.contains("clip_norm")) text += ", clip norm now " + format_number(row["clip_norm"].get<double>(), 4);
  text += ", " + fixed(row.at("seconds").get<double>(), 1) + "s";
  if (row.contains("layer_snr"))
    text += "\n  signal/noise per coordinate of the noised gradient: " + by_layer(row["layer_snr"], 3);
  return text;
}

template <class T>
json summary_record(PrivateTrainerT<T>& t, const TrainResult& r, const json& last_epoch, double seconds) {
  json s = last_epoch.is_object() ? last_epoch : json::object();
  s.update({{"final", true}, {"status", to_string(r.status)}, {"steps", t.steps_done()},
            {"planned_steps", t.total_steps() + t.steps_cut_for_budget()}, {"total_seconds", seconds},
            {"processes", t.processes()}, {"threads", blas::threads()}, {"step_seconds", r.step_seconds}});
  s.update(t.privacy_json());  // a non-private run's says so ("private": false)
  if (t.config().communicator) s["communication_seconds"] = r.communication_seconds, s["wait_seconds"] = r.wait_seconds;
  if (t.plan().is_private())
    s.update({{"clip_strategy", t.clipping().name()}, {"noise_multiplier", t.noise_multiplier()},
              {"sampling_rate", t.sampling_rate()}, {"noise_generator", t.noise_generator()}});
  if (t.config().adaptive_clipping) s["clip_norm"] = t.dp_optimizer().clip_norm();  // where C ended
  for (const auto& [layer, c] : t.dp_optimizer().layer_clip_norms()) s["layer_clip_norms"][layer] = c;
  for (const auto& release : t.config().releases)
    s["releases_before_training"][release.name] = release.noise_multiplier;
  if (!t.config().checkpoints.dir.empty()) s["checkpoint"] = t.steps_done();
  if (!t.extension().empty()) s["extended"] = t.extension();  // went on under a larger budget
  return s;
}

template <class T>
std::string summary_text(const PrivateTrainerT<T>& t, const json& s) {
  std::string text = "final: " + accuracy_text(s) +
                     (t.adds_noise() ? " at " + t.privacy_statement() : " (" + t.privacy_statement() + ")") + " after " +
                     std::to_string(t.steps_done()) + " steps in " + fixed(s.at("total_seconds").get<double>(), 1) + "s";
  if (s.at("status") != "complete")
    text += " (" + s["status"].get<std::string>() + ": " + std::to_string(t.steps_done()) + " of " +
            std::to_string(s.at("planned_steps").get<long>()) + " steps)";
  if (const Communicator* comm = t.config().communicator.get())
    text += " on " + comm->describe() + " (" + fixed(s.at("communication_seconds").get<double>(), 1) +
            "s of it summing and sending gradients, " + fixed(s.at("wait_seconds").get<double>(), 1) +
            "s waiting for the slowest rank)";
  if (s.contains("layer_clip_norms")) text += "\neach layer's clip norm now: " + by_layer(s["layer_clip_norms"], 4);
  return text;
}

template <class T>
std::function<void(long, long)> epoch_progress(const PrivateTrainerT<T>& t, bool quiet) {
  auto bar = std::make_shared<Progress>("step", quiet);
  return [&t, bar](long done, long total) {
    const long per = t.steps_per_epoch(), epoch = (done - 1) / per;
    std::string label = std::to_string(epoch + 1);
    bar->update(done - epoch * per, std::min(per, total - epoch * per),
                "epoch " + std::string(label.size() < 3 ? 3 - label.size() : 0, ' ') + label);
  };
}

template <class T>
std::string diverged_message(const PrivateTrainerT<T>& t, const std::exception& e) {
  return "step " + std::to_string(t.steps_done()) + ": " + e.what() + "; the run stops and releases nothing of it" +
         (t.adds_noise() ? "; epsilon spent, that step included: " + t.privacy_statement() : std::string());
}

template <class T>
json diverged_record(const PrivateTrainerT<T>& t, const std::string& message) {
  json row = {{"final", true}, {"diverged", true}, {"error", message}, {"steps", t.steps_done()}};
  if (t.plan().is_private()) row.update(t.privacy_json());
  return row;
}

template <class T>
std::string plot_title(const PrivateTrainerT<T>& t, const std::string& model, const std::string& data,
                       const std::string& optimizer) {
  std::string title = model + " on " + data + ", " + optimizer;
  if (t.adds_noise())
    title += " (" + t.clipping().name() + ", sigma " + format_number(t.noise_multiplier(), 4) + "); " + t.privacy_statement();
  return title;
}

#define DPGRAD_REPORT(T)                                                                                       \
  template json epoch_record(PrivateTrainerT<T>&, const EpochReport&, const ReportOptions&);                  \
  template std::string epoch_text(const PrivateTrainerT<T>&, const json&);                                     \
  template json summary_record(PrivateTrainerT<T>&, const TrainResult&, const json&, double);                  \
  template std::string summary_text(const PrivateTrainerT<T>&, const json&);                                   \
  template std::function<void(long, long)> epoch_progress(const PrivateTrainerT<T>&, bool);                   \
  template std::string diverged_message(const PrivateTrainerT<T>&, const std::exception&);                     \
  template json diverged_record(const PrivateTrainerT<T>&, const std::string&);                                \
  template std::string plot_title(const PrivateTrainerT<T>&, const std::string&, const std::string&, const std::string&);
DPGRAD_REPORT(float)
DPGRAD_REPORT(double)
#undef DPGRAD_REPORT

}  // namespace dpgrad
