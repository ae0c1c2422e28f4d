// dpgrad-tune's options (programs/dpgrad_tune.cpp, docs/tuning.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dpgrad::tune_cli {

/// Every flag of dpgrad-tune, with its default.
struct Options {
  std::string dataset = "fashion-mnist", model = "cnn26k", optimizer = "sgd", strategy = "ghost", activation = "relu";
  std::string trials = "tnb:1,0.2", lr = "0.5:4", clip_norm = "0.1:10", clip_quantile, search_dir, export_onnx;
  std::string lr_scale;  // LAYER=FACTOR,...: per-layer learning rates of every trial
  double ema = 0;        // every trial's model: the parameters' moving average (post-processing)
  std::vector<std::size_t> batch_sizes{2048, 4096};
  std::vector<double> epochs{5, 10};
  std::optional<double> delta;
  double target_epsilon = 0, momentum = 0, validation_fraction = 0.1, score_noise = 0.01;
  std::vector<double> normalize;
  std::size_t physical_batch = 0, train_limit = 0, test_limit = 0;
  std::uint64_t seed = 0;
  int threads = 0;
  bool resume = false, reproducible = false, json_out = false;
};

/// "LO:HI" or one number (a fixed setting) as a range; throws std::invalid_argument naming `flag`.
std::pair<double, double> parse_range(const std::string& text, const char* flag);

/// Parses argv into `o` under the programs' number rules, then reads --trials
/// and the ranges (refusing what they cannot be): nullopt to go on, or the exit
/// status for --help (0) and a command-line error (2), the message printed.
std::optional<int> parse_tune_options(int argc, const char* const* argv, Options& o);

}  // namespace dpgrad::tune_cli
