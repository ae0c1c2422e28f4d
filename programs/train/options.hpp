// dpgrad-train's options: the flags, what a run's identity is (what a checkpoint
// stores and a resumed run may not contradict), and their parsing.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dpgrad::train {

using json = nlohmann::json;

struct Options {
  std::string model = "mlp", dataset = "fashion-mnist", activation = "relu";
  std::string vocab_file;  // text: a public token list (empty: feature hashing)
  std::size_t vocabulary = 8185;  // text, feature hashing: token ids, padding and unknown included
  bool frozen_embedding = false;  // transformer: the embedding table is not trained
  std::string freeze;       // onnx:PATH models: parameters kept constant (a regular expression on their names)
  std::string export_onnx;  // onnx:PATH models: write the trained model here
  double centre_features = 0;    // scatter models: noise multiplier of the private feature centre (0: off)
  std::string optimizer = "sgd", strategy = "ghost", sampler = "poisson", accountant;  // accountant "": the sampler's default
  std::string schedule = "constant";
  std::vector<int> classes;  // keep only these classes, relabelled 0, 1, ... in this order
  std::vector<double> normalize;  // {mean, std}: inputs become (x - mean) / std
  std::optional<double> lr;  // default: the base optimizer's own (sgd, momentum 0.1; adam 0.001)
  double momentum = 0.9, weight_decay = 0.0, ema = 0.0, sat_rho = 0.0;
  double lr_final = 0.0;  // cosine: the learning rate it ends at
  std::string lr_scale;   // LAYER=FACTOR,...: per-layer learning-rate factors
  double adambc_floor = 1e-8;  // gamma' of dp-adambc
  double epochs = 2;
  std::size_t batch = 256;
  std::size_t physical_batch = 0;  // > 0: clip in chunks of at most this many examples (memory, cache)
  double clip_norm = 1.0;
  std::optional<double> noise_multiplier, target_epsilon, delta;
  double epoch_fraction = 1.0;
  bool reproducible_noise = false, json_out = false, demo = false, allow_no_noise = false, layer_snr = false;
  bool allow_large_delta = false;  // accept a delta of 1/N or more (warned)
  bool report_train_loss = false;  // private runs: show the un-noised training loss (not covered by epsilon)
  std::uint64_t seed = 42;
  long max_steps = 0;
  std::size_t train_limit = 0, test_limit = 0;
  int threads = 0;
  std::size_t hidden = 256;
  std::size_t augment_views = 0;  // augmentation multiplicity: random views per training example (0: off)
  int augment_shift = 2;
  bool augment_no_flip = false;
  // checkpoints and output of this invocation (not part of the run's identity)
  std::string checkpoint_dir, plot;
  long checkpoint_every = 0;
  bool resume = false;
  bool show_record_counts = false;  // --classes: print how many records the kept classes hold (private counts)
};

/// Calls f(flag, field) for every option that defines a run: what a checkpoint
/// stores and a resumed run must not contradict.
template <class O, class F>
void for_each_run_option(O& o, F&& f) {
  f("model", o.model);
  f("dataset", o.dataset);
  f("vocab-file", o.vocab_file);
  f("vocabulary", o.vocabulary);
  f("frozen-embedding", o.frozen_embedding);
  f("freeze", o.freeze);
  f("centre-features", o.centre_features);
  f("classes", o.classes);
  f("normalize", o.normalize);
  f("augment-views", o.augment_views);
  f("augment-shift", o.augment_shift);
  f("augment-no-flip", o.augment_no_flip);
  f("activation", o.activation);
  f("hidden", o.hidden);
  f("optimizer", o.optimizer);
  f("lr", o.lr);
  f("lr-schedule", o.schedule);
  f("lr-final", o.lr_final);
  f("lr-scale", o.lr_scale);
  f("momentum", o.momentum);
  f("weight-decay", o.weight_decay);
  f("adambc-floor", o.adambc_floor);
  f("ema", o.ema);
  f("sat-rho", o.sat_rho);
  f("epochs", o.epochs);
  f("batch-size", o.batch);
  f("physical-batch-size", o.physical_batch);
  f("max-steps", o.max_steps);
  f("clip-strategy", o.strategy);
  f("clip-norm", o.clip_norm);
  f("noise-multiplier", o.noise_multiplier);
  f("target-epsilon", o.target_epsilon);
  f("delta", o.delta);
  f("accountant", o.accountant);
  f("sampler", o.sampler);
  f("epoch-fraction", o.epoch_fraction);
  f("reproducible-noise", o.reproducible_noise);
  f("report-train-loss", o.report_train_loss);
  f("allow-no-noise", o.allow_no_noise);
  f("allow-large-delta", o.allow_large_delta);
  f("seed", o.seed);
  f("train-limit", o.train_limit);
  f("test-limit", o.test_limit);
  f("checkpoint-every", o.checkpoint_every);
  f("threads", o.threads);
}

template <class V>
json option_json(const V& v) {
  return json(v);
}
template <class V>
json option_json(const std::optional<V>& v) {
  return v ? json(*v) : json();
}
template <class V>
void option_from_json(const json& j, V& v) {
  v = j.get<V>();
}
template <class V>
void option_from_json(const json& j, std::optional<V>& v) {
  if (j.is_null()) v.reset();
  else v = j.get<V>();
}

/// The run-defining options as JSON (flag name -> value).
json run_options_json(const Options& o);

/// True for the dp-* optimizers.
bool is_dp(const std::string& optimizer);

/// A parsed command line: the options, the run-defining flags that were given,
/// and, when the program should stop at once, its exit code (--help: 0; a bad
/// flag: 2, with CLI11's message printed).
struct ParsedOptions {
  Options options;
  std::set<std::string> given;
  std::optional<int> exit_code;
};
/// Parses dpgrad-train's flags (and applies --demo's preset). Never exits the process.
ParsedOptions parse_train_options(int argc, const char* const* argv);

/// Checks the options' own rules that need no data (fills in the default
/// learning rate): flags that go together, flags a run would ignore (--clip-norm
/// in a non-private run, say: `given` holds the run-defining flags on the command
/// line), names. The settings of the run itself are the library's to check
/// (training_config, check_training_config). Throws std::invalid_argument naming the problem.
void check_train_options(Options& o, const std::set<std::string>& given = {});

/// --resume: from the checkpoint's extra JSON `resumed` (read and verified by the
/// caller), checks that no given flag contradicts the stored run, and takes the
/// stored options. Throws std::invalid_argument naming the problem.
json restore_run_options(Options& o, const std::set<std::string>& given, json resumed);

}  // namespace dpgrad::train
