// What a training run shows (docs/library.md, "Reports"): a JSON record and a
// line of text for each epoch, a summary at the end, what a diverged step
// spent, and a plot of the history. They hold only what epsilon covers or what
// costs no privacy, unless a figure computed from the private data without
// noise is asked for by name (ReportOptions), and then its label says so.
#pragma once

#include <exception>
#include <functional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "optim/run/private_trainer.hpp"

namespace dpgrad {

/// Figures a report leaves out unless asked for.
struct ReportOptions {
  /// Private runs: also the training loss, computed from the private data without
  /// noise and NOT covered by epsilon; recorded as "train_loss_not_covered_by_epsilon"
  /// and labelled in the text. A non-private run always reports "train_loss".
  bool train_loss = false;
  /// Each layer's signal-to-noise ratio per coordinate of the noised gradient
  /// (from the released gradients: no privacy cost). Reading it resets the
  /// optimizer's tally, so each record covers one epoch.
  bool layer_snr = false;
};

/// An epoch's record: "epoch", "steps", "test_accuracy" (null when train() was
/// given no evaluation data), "seconds"; a private run's privacy fields
/// (PrivateTrainerT::privacy_json at the epoch's epsilon); "clip_norm" (the next
/// step's C) under adaptive clipping; "layer_snr"; "step_seconds"; and, for a
/// data-parallel run, "communication_seconds" and "wait_seconds".
template <class T>
nlohmann::json epoch_record(PrivateTrainerT<T>& trainer, const EpochReport& epoch, const ReportOptions& options = {});

/// The record as text: "epoch 3/70: test accuracy 81.20%, epsilon 1.2 (...), 12.3s",
/// and a second line with the layers' SNR when the record has them.
template <class T>
std::string epoch_text(const PrivateTrainerT<T>& trainer, const nlohmann::json& record);

/// The run's summary: `last_epoch` (the last epoch's record, or an empty object)
/// updated with "final", "status", "steps", "planned_steps", "total_seconds"
/// (`seconds`), "processes", "threads", "step_seconds" (and the data-parallel
/// times), the privacy fields, and for a private run "clip_strategy",
/// "noise_multiplier", "sampling_rate", "noise_generator", the clip norms
/// adaptive clipping left ("clip_norm", "layer_clip_norms"), the releases before
/// training ("releases_before_training": name -> noise multiplier), "checkpoint"
/// (the step saved last, with a checkpoint policy) and "extended".
template <class T>
nlohmann::json summary_record(PrivateTrainerT<T>& trainer, const TrainResult& result, const nlohmann::json& last_epoch,
                              double seconds);

/// The summary as text: "final: test accuracy 87.02% at epsilon 3 (...) after 1024 steps in 812.0s", with how the
/// run ended when it was cut, the data-parallel times, and the layers' clip norms.
template <class T>
std::string summary_text(const PrivateTrainerT<T>& trainer, const nlohmann::json& summary);

/// A TrainHooksT::progress hook that shows the steps of each epoch on standard
/// error ("epoch   3 step 12/234", with speed and time left; nothing when
/// `quiet`). It reads no private figure: steps only. `trainer` must outlive it.
template <class T>
std::function<void(long, long)> epoch_progress(const PrivateTrainerT<T>& trainer, bool quiet = false);

/// A step that diverged (DivergedError: taken and accounted, nothing of it released):
/// the message that says so and what the run spent, that step included.
template <class T>
std::string diverged_message(const PrivateTrainerT<T>& trainer, const std::exception& error);
/// diverged_message's record: "final", "diverged", "error", "steps" and the privacy fields.
template <class T>
nlohmann::json diverged_record(const PrivateTrainerT<T>& trainer, const std::string& message);

/// A title for plot_history: the model, the data, the optimizer and, with noise,
/// the strategy, sigma and the privacy statement.
template <class T>
std::string plot_title(const PrivateTrainerT<T>& trainer, const std::string& model, const std::string& data,
                       const std::string& optimizer);

/// Throws std::invalid_argument when gnuplot cannot be started (check before training); `flag` names the setting.
void require_gnuplot(const std::string& flag = "plot_history");

/// The history (epoch records) as a PNG at `out`, drawn by gnuplot: test
/// accuracy; epsilon on a second axis when the records hold it; a panel of the
/// clip norm under adaptive clipping. gnuplot runs without a shell on a fixed
/// script, in a private temporary folder; the title and the paths reach it as
/// arguments, never as script text. A path that exists and is not a regular file
/// is refused (std::invalid_argument) before gnuplot runs, and never replaced; a failed drawing or write
/// throws std::runtime_error. Messages name `flag` and `out`.
void plot_history(const std::string& out, const nlohmann::json& history, const std::string& title,
                  const std::string& flag = "plot_history");

}  // namespace dpgrad
