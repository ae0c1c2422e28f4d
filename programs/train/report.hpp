// dpgrad-train's output: the header, a row per epoch and the summary, as text
// for people and JSON with --json; what a diverged run spent. Only what epsilon covers is shown unless asked for, and labelled.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/run/private_trainer.hpp"
#include "programs/train/options.hpp"

namespace dpgrad::train {

/// What the report needs of a run.
struct RunFacts {
  PrivateTrainer* trainer;
  const Options* options;
  std::string model, data;           // names, for the header
  std::size_t parameters = 0;
  std::vector<std::string> lr_scales;
  const Communicator* comm = nullptr;
};

void print_header(const RunFacts& f, const std::function<void(const std::string&)>& say);
/// The history's row of an epoch (its layer SNR read and reset here).
nlohmann::json epoch_row(const RunFacts& f, const EpochReport& e);
void print_epoch(const RunFacts& f, const nlohmann::json& row, double epsilon);
nlohmann::json summary_row(const RunFacts& f, const TrainResult& r, nlohmann::json last, double seconds);
void print_summary(const RunFacts& f, const nlohmann::json& summary);
std::string plot_title(const RunFacts& f);
/// A diverged step (DivergedError, taken and accounted): prints what the run spent
/// (a JSON row with --json) and throws the message, which ends the program.
[[noreturn]] void report_diverged(const RunFacts& f, const std::exception& e);

}  // namespace dpgrad::train
