// dpgrad-train's options: the flags, what a run's identity is (what a checkpoint
// stores and a resumed run may not contradict), and their parsing.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/run/private_trainer.hpp"

namespace dpgrad::train {

using json = nlohmann::json;

/// The flags' values (their meaning: the table in options.cpp, shown by --help).
/// Those that are the library's settings are read into `run` directly.
struct Options {
  std::string model = "mlp", dataset = "fashion-mnist", activation = "relu", vocab_file, freeze, export_onnx;
  std::size_t vocabulary = 8185, hidden = 256, augment_views = 0;
  bool frozen_embedding = false, augment_no_flip = false;
  double centre_features = 0;
  int augment_shift = 2;
  std::string optimizer = "sgd", strategy = "ghost", sampler = "poisson", accountant, schedule = "constant", lr_scale;
  std::vector<int> classes;
  std::vector<double> normalize;
  std::optional<double> lr;  // default: the base optimizer's own (default_lr)
  double momentum = 0.9, weight_decay = 0.0, lr_final = 0.0, adambc_floor = 1e-8;
  std::optional<double> clip_quantile;  // adaptive clipping's gamma (unset: C fixed)
  double clip_count_noise = 0, clip_lr = 0.2;
  bool clip_no_normalise = false, report_train_loss = false;
  std::size_t train_limit = 0, test_limit = 0;
  int threads = 0;
  // the program's defaults where they are not the library's: 2 epochs, whole shuffled passes, seed 42
  PrivateTrainingConfig run = [] { PrivateTrainingConfig c; c.epochs = 2; c.epoch_fraction = 1; c.seed = 42; return c; }();
  // this invocation's, not the run's
  std::string checkpoint_dir, plot;
  bool resume = false, json_out = false, demo = false, layer_snr = false, show_record_counts = false;
  std::size_t onnx_max_bytes_per_example = std::size_t(1) << 30;  // onnx::LoadOptions::max_bytes_per_example
};

/// The run-defining options as JSON (flag name -> value).
json run_options_json(const Options& o);

/// A message of the library's in dpgrad-train's words: the settings it names
/// (clip_norm, adaptive_clipping) become their flags (--clip-norm, --clip-quantile).
std::string in_train_flags(const std::string& message);

/// True for the dp-* optimizers.
bool is_dp(const std::string& optimizer);

/// A parsed command line: the options, the flags given (without "--"), and the exit code when the program
/// should stop at once (--help: 0; a bad flag: 2, CLI11's message printed).
struct ParsedOptions {
  Options options;
  std::set<std::string> given;
  std::optional<int> exit_code;
};
/// Parses dpgrad-train's flags (and applies --demo's preset). Never exits the process.
ParsedOptions parse_train_options(int argc, const char* const* argv);

/// Checks the rules of the options that are not the library's settings, before any data (and fills in the
/// default learning rate): flags that go together, flags a run would ignore (`given`: the flags on the command
/// line), names. Throws std::invalid_argument naming the problem; the library checks the rest.
void check_train_options(Options& o, const std::set<std::string>& given = {});

/// --resume: from the checkpoint's extra JSON `resumed` (read and verified by the
/// caller), checks that no given flag contradicts the stored run, and takes the
/// stored options. Throws std::invalid_argument naming the problem.
json restore_run_options(Options& o, const std::set<std::string>& given, json resumed);

}  // namespace dpgrad::train
