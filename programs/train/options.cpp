// dpgrad-train's options (programs/train/options.hpp).
#include "programs/train/options.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "engine/check.hpp"
#include "layers/registry.hpp"
#include "optim/optimizer.hpp"
#include "optim/run/plan.hpp"
#include "optim/clipping/clip_spec.hpp"
#include "programs/cli.hpp"

namespace dpgrad::train {

namespace {

/// Whether a flag defines the run (stored in its checkpoints; a resumed run may
/// repeat it, not change it) or belongs to one invocation.
enum Role { kRun, kSession };

/// Calls f(flag, field, help, role) for every flag, in --help order: the one
/// list that the parser, a run's identity and --resume read.
template <class O, class F>
void for_each_option(O& o, F&& f) {
  f("model", o.model, "one of:\n" + model_help() + "  onnx:PATH: an ONNX file's model (docs/onnx.md)", kRun);
  f("freeze", o.freeze, "onnx:PATH: keep the parameters whose name (or initializer's name) matches this regular "
    "expression constant: no gradient, no clipping, no noise", kRun);
  f("onnx-max-bytes-per-example", o.onnx_max_bytes_per_example, "onnx:PATH: refuse at load a model whose forward "
    "pass needs more than this many bytes for one example (docs/onnx.md, 'Bad input')", kSession);
  f("export-onnx", o.export_onnx, "write the trained model to this ONNX file at the end (onnx:PATH, and the built-in "
    "mlp, logreg, cnn26k and cnn17m)", kSession);
  f("dataset", o.dataset, "fashion-mnist, mnist, idx:PATH, text:PATH, spamassassin, synthetic, synthetic-text", kRun);
  f("vocab-file", o.vocab_file, "text: token ids from this public token list (one token per line) instead of "
    "feature hashing", kRun);
  f("vocabulary", o.vocabulary, "text, feature hashing: the number of token ids (padding and unknown included); the "
    "transformer's embedding has this many rows, the other text models need 8185", kRun);
  f("frozen-embedding", o.frozen_embedding, "transformer: keep the embedding table at its random initialisation "
    "(drawn from --seed, so it costs no privacy); only the layers after it train, are clipped and are noised", kRun);
  f("centre-features", o.centre_features, "scatter-linear, scatter-cnn, private: take from every sample a private "
    "estimate of the mean of its normalised features, a Gaussian release of this noise multiplier accounted with the "
    "run (0: off)", kRun);
  f("classes", o.classes, "keep only these classes, e.g. 0,9 (relabelled 0, 1, ...)", kRun);
  f("show-record-counts", o.show_record_counts, "with --classes: print how many training and test records the kept "
    "classes hold; those counts are computed from the private labels and are NOT covered by epsilon "
    "(docs/what-epsilon-covers.md)", kSession);
  f("normalize", o.normalize, "MEAN,STD: feed (x - MEAN) / STD (pixels in [0, 1]); constants fixed in advance, not "
    "computed from the private data", kRun);
  f("augment-views", o.augment_views, "K: train on K random views of each example (flips, shifts), its "
    "loss the mean over them, so one clipped gradient per example (augmentation multiplicity; images only; 0: off)", kRun);
  f("augment-shift", o.augment_shift, "largest shift of a view, in pixels along each axis", kRun);
  f("augment-no-flip", o.augment_no_flip, "views are not mirrored left-right", kRun);
  f("activation", o.activation, "relu, tanh, sigmoid (mlp and CNNs)", kRun);
  f("hidden", o.hidden, "hidden units of mlp", kRun);
  f("optimizer", o.optimizer, "sgd, momentum, adam, dp-sgd, dp-momentum, dp-adam, dp-adambc (DP-Adam with its second "
    "moment corrected for the noise); left out with --noise-multiplier or --target-epsilon: dp-sgd", kRun);
  f("lr", o.lr, "learning rate (default: 0.1 for sgd and momentum, 0.001 for adam, their dp- versions alike)", kRun);
  f("lr-schedule", o.schedule, "constant or cosine", kRun);
  f("lr-final", o.lr_final, "cosine: the learning rate at the last step", kRun);
  f("lr-scale", o.lr_scale, "LAYER=FACTOR,...: that layer's parameters (or one parameter, e.g. conv1.bias) move with "
    "lr * FACTOR", kRun);
  f("momentum", o.momentum, "momentum of momentum / dp-momentum", kRun);
  f("weight-decay", o.weight_decay, "L2 weight decay", kRun);
  f("adambc-floor", o.adambc_floor, "dp-adambc: floor of the corrected second moment, max(v_hat - noise variance, "
    "floor)", kRun);
  f("ema", o.run.ema, "evaluate an exponential moving average of the parameters with this decay (0: off)", kRun);
  f("sat-rho", o.run.sat_rho, "DP-SAT: take the gradients at a step of this length towards the previous noised gradient "
    "(0: off)", kRun);
  f("epochs", o.run.epochs, "epochs (may be fractional)", kRun);
  f("batch-size", o.run.batch_size, "batch size (expected size under Poisson sampling)", kRun);
  f("physical-batch-size", o.run.physical_batch_size, "clip each batch in chunks of at most this many examples, noised and "
    "accounted once (0: one piece; naive, vanilla, ghost)", kRun);
  f("max-steps", o.run.max_steps, "stop after this many steps (0: no limit)", kRun);
  f("clip-strategy", o.strategy, "naive, vanilla, ghost, jl:K, microbatch:M; per layer (each layer's part clipped to "
    "its share of C, the shares' squares summing to 1): ghost+layers (equal shares), ghost+layers:size (by the "
    "layers' sizes), ghost+layers:adaptive (each layer's C_g follows --clip-quantile on its own), likewise vanilla "
    "and naive", kRun);
  f("clip-norm", o.run.clip_norm, "per-sample clipping norm C (with --clip-quantile: the first step's)", kRun);
  f("clip-quantile", o.clip_quantile, "GAMMA in [0, 1]: adaptive clipping, C follows this quantile of the per-sample "
    "norms through a noised count each step, accounted with the gradient (docs/adaptive-clipping.md)", kRun);
  f("clip-count-noise", o.clip_count_noise, "--clip-quantile: noise std of each step's count, above half the noise "
    "multiplier (0: batch size / 20)", kRun);
  f("clip-lr", o.clip_lr, "--clip-quantile: C <- C exp(-clip-lr (unclipped fraction - GAMMA))", kRun);
  f("clip-no-normalise", o.clip_no_normalise, "--clip-quantile: do not divide the noised sum by C (by default the "
    "learning rate applies to contributions in units of C, so that it means the same at every C)", kRun);
  f("noise-multiplier", o.run.noise_multiplier, "sigma: noise std / C", kRun);
  f("target-epsilon", o.run.target_epsilon, "calibrate sigma for this epsilon (or stop at it)", kRun);
  f("delta", o.run.delta, "delta (default: the largest power of ten with delta N <= 0.6, 1e-5 for 60,000 records); 1/N "
    "or more only with --allow-large-delta", kRun);
  f("allow-large-delta", o.run.allow_large_delta, "accept a --delta of 1/N or more, which allows publishing about delta N "
    "records in full (a warning says so)", kRun);
  f("accountant", o.accountant, "default: pld (poisson), wor (fixed), shuffle (shuffle); also rdp (poisson)", kRun);
  f("sampler", o.sampler, "poisson, shuffle, fixed", kRun);
  f("epoch-fraction", o.run.epoch_fraction, "shuffle: stop each pass after this fraction of the data", kRun);
  f("reproducible-noise", o.run.reproducible_noise, "draw noise, sampling and JL directions from a generator seeded by "
    "--seed, so that the run can be repeated: NOT private (the noise can be recomputed from the seed); default: the "
    "secure generator", kRun);
  f("report-train-loss", o.report_train_loss, "private runs: also report the training loss, which is computed from "
    "the private data without noise and is NOT covered by epsilon (labelled so wherever it appears)", kRun);
  f("allow-no-noise", o.run.allow_no_noise, "accept --noise-multiplier 0 (NOT private)", kRun);
  f("seed", o.run.seed, "seed of the initialisation (and of the data order of non-private runs, and of the noise with "
    "--reproducible-noise)", kRun);
  f("train-limit", o.train_limit, "use only the first N training examples (0: all)", kRun);
  f("test-limit", o.test_limit, "use only the first N test examples (0: all)", kRun);
  f("threads", o.threads, "engine threads (0: every core, or DPGRAD_THREADS)", kRun);
  f("layer-snr", o.layer_snr, "print each layer's signal-to-noise ratio per coordinate of the noised gradient every "
    "epoch (from the released gradients: no privacy cost); a guide for --lr-scale", kSession);
  f("json", o.json_out, "one JSON object per epoch and a final summary on stdout", kSession);
  f("checkpoint-dir", o.checkpoint_dir, "write checkpoints here (at each epoch's end and every --checkpoint-every "
    "steps)", kSession);
  f("checkpoint-every", o.run.checkpoints.every_steps, "also checkpoint every N steps (0: at epoch ends only)", kRun);
  f("resume", o.resume, "continue the run checkpointed in --checkpoint-dir (same settings, same ledger)", kSession);
  f("plot", o.plot, "write test accuracy and epsilon against epochs to this PNG (gnuplot)", kSession);
  f("demo", o.demo, "the demo run of ./dev demo (private cnn26k on Fashion-MNIST, epsilon 3); flags given replace "
    "its settings", kSession);
}

template <class V> struct is_list : std::false_type {};
template <class V> struct is_list<std::vector<V>> : std::true_type {};
template <class V> struct is_optional : std::false_type {};
template <class V> struct is_optional<std::optional<V>> : std::true_type {};

template <class V>
json option_json(const V& v) {
  if constexpr (is_optional<V>::value) return v ? json(*v) : json();
  else return json(v);
}
template <class V>
void option_from_json(const json& j, V& v) {
  if constexpr (is_optional<V>::value) v = j.is_null() ? V() : V(j.get<typename V::value_type>());
  else v = j.get<V>();
}

}  // namespace

json run_options_json(const Options& o) {
  json j = json::object();
  for_each_option(o, [&](const char* flag, const auto& v, const std::string&, Role role) {
    if (role == kRun) j[flag] = option_json(v);
  });
  return j;
}

std::string in_train_flags(const std::string& message) {
  std::vector<std::string> flags;
  const Options defaults;
  for_each_option(defaults, [&](const char* flag, const auto&, const std::string&, Role) { flags.push_back(flag); });
  return in_flag_words(message, flags, {{"adaptive_clipping", "--clip-quantile"},
                                        {"checkpoints.every_steps", "--checkpoint-every"},
                                        {"checkpoints.dir", "--checkpoint-dir"}});
}

bool is_dp(const std::string& opt) { return opt.rfind("dp-", 0) == 0; }

void check_train_options(Options& o, const std::set<std::string>& given) {
  // a noise multiplier or a target epsilon asks for a private run: without --optimizer, the default's private form
  if (!given.count("optimizer") && !is_dp(o.optimizer) && (o.run.noise_multiplier || o.run.target_epsilon))
    o.optimizer = "dp-" + o.optimizer;
  const bool dp = is_dp(o.optimizer);
  const std::string base = dp ? o.optimizer.substr(3) : o.optimizer;
  const std::vector<std::string> names = optimizer_names();
  require(std::find(names.begin(), names.end(), base) != names.end() && (dp || base != "adambc"),
          "unknown --optimizer '" + o.optimizer + "' (sgd, momentum, adam, dp-sgd, dp-momentum, dp-adam, dp-adambc)");
  if (!o.lr) o.lr = default_lr(base);
  const bool onnx_model = o.model.rfind("onnx:", 0) == 0;
  // an imported model takes none of the built-in models' settings (docs/onnx.md)
  static const ModelEntry imported{"onnx:PATH", "", ModelInput::images, false, false, false, false};
  const ModelEntry& model = onnx_model ? imported : find_model(o.model);
  require(o.vocabulary >= 3 && o.vocabulary <= 10000000,
          fmt::format("--vocabulary must be in [3, 10^7] (padding, unknown and at least one word), got {}", o.vocabulary));
  require(o.centre_features >= 0 && std::isfinite(o.centre_features),
          fmt::format("--centre-features must be a noise multiplier >= 0 (0: off), got {}", o.centre_features));
  require(o.centre_features == 0 || model.takes_centre,
          "--centre-features applies to scatter-linear and scatter-cnn, not " + o.model);
  require(o.centre_features == 0 || dp,
          "--centre-features belongs to private runs (a non-private run can centre on the exact mean itself)");
  require(o.augment_views == 0 || model.input != ModelInput::scattering,
          "--augment-views does not apply to " + o.model + ": its features are computed once");
  require(!o.frozen_embedding || model.takes_frozen_embedding,
          "--frozen-embedding: only the transformer's embedding can be frozen, not " + o.model + "'s");
  require(!onnx_model || o.model.size() > 5, "--model onnx:PATH needs the path of an ONNX file");
  require(o.freeze.empty() || onnx_model, "--freeze applies to --model onnx:PATH (the built-in models: see --frozen-embedding)");
  require(o.export_onnx.empty() || o.run.ema == 0,
          "--export-onnx writes the trained parameters, --ema evaluates their average: use one of them");
  require(o.schedule == "constant" || o.schedule == "cosine", "--lr-schedule must be constant or cosine");
  require(o.lr_final == 0 || o.schedule == "cosine", "--lr-final needs --lr-schedule cosine");
  require(o.adambc_floor > 0 && std::isfinite(o.adambc_floor),
          fmt::format("--adambc-floor must be > 0, got {}", o.adambc_floor));
  if (dp) {
    parse_clip_spec(o.strategy);  // throws on an unknown one
  } else {
    require(!o.run.noise_multiplier && !o.run.target_epsilon, "--noise-multiplier/--target-epsilon need a dp-* optimizer");
    // settings of the private mechanism that a non-private run would ignore
    const std::string why = " has no effect in a non-private run (--optimizer " + o.optimizer +
                            ": no clipping, no noise, no accountant, batches shuffled); leave it out, or use a dp-* "
                            "optimizer";
    for (const char* flag : {"clip-norm", "delta", "accountant", "epoch-fraction"})
      require(given.count(flag) == 0, std::string("--") + flag + why);
    require(given.count("clip-strategy") == 0 || o.strategy == "none", "--clip-strategy " + o.strategy + why);
    require(given.count("sampler") == 0 || o.sampler == "shuffle", "--sampler " + o.sampler + why);
    o.strategy = "none";
  }
  sampling_from_string(o.sampler);  // throws on an unknown one
  require(o.run.epoch_fraction == 1.0 || o.sampler == "shuffle",
          "--epoch-fraction applies to --sampler shuffle only (this run samples " + o.sampler + ")");
  require(!o.clip_quantile || dp, "--clip-quantile adapts a private run's clip norm: it needs a dp-* optimizer");
  for (const char* flag : {"clip-count-noise", "clip-lr", "clip-no-normalise"})
    require(given.count(flag) == 0 || o.clip_quantile,
            std::string("--") + flag + " tunes adaptive clipping, which is off: give --clip-quantile GAMMA");
  require(!o.clip_quantile || o.optimizer != "dp-adambc",
          "--clip-quantile with dp-adambc: DP-AdamBC subtracts a fixed noise variance, and adaptive clipping changes "
          "it every step");
  require(!o.run.reproducible_noise || dp, "--reproducible-noise is for dp-* optimizers (non-private runs use --seed)");
  require(!o.report_train_loss || dp, "--report-train-loss is for dp-* optimizers (non-private runs report it anyway)");
  require(!o.layer_snr || (dp && !(o.run.noise_multiplier && *o.run.noise_multiplier == 0)),
          "--layer-snr compares the gradient with its noise: it needs a private run with noise");
  require(o.normalize.empty() || o.normalize.size() == 2, "--normalize needs MEAN,STD");
  for (const char* flag : {"augment-shift", "augment-no-flip"})
    require(given.count(flag) == 0 || o.augment_views > 0,
            std::string("--") + flag + " shapes the views of --augment-views, which is off: give --augment-views K");
}
ParsedOptions parse_train_options(int argc, const char* const* argv) {
  ParsedOptions r;
  Options& o = r.options;
  CLI::App app{"dpgrad-train: train a network, privately (DP-SGD / DP-Adam) or not, and report accuracy and epsilon"};
  dpgrad::name_cli_errors(app, "dpgrad-train");
  for_each_option(o, [&](const char* flag, auto& v, const std::string& help, Role) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, bool>) {
      app.add_flag(std::string("--") + flag, v, help);
    } else {
      CLI::Option* opt = app.add_option(std::string("--") + flag, v, help);
      if constexpr (is_list<V>::value) opt->delimiter(',');
      else if constexpr (!is_optional<V>::value) opt->capture_default_str();
    }
  });
  app.get_option("--augment-views")->check(CLI::Range(0, 256));
  app.get_option("--augment-shift")->check(CLI::Range(0, 64));
  app.get_option("--threads")->check(CLI::Range(0, 1024));
  for (const char* flag : {"--export-onnx", "--plot", "--vocab-file"})
    app.get_option(flag)->check(non_empty("a file name"));
  app.get_option("--lr-scale")->check(non_empty("a list of LAYER=FACTOR"));
  app.get_option("--checkpoint-dir")->check(CLI::Validator(
      [](std::string& v) { return v.empty() ? std::string("must name a directory") : std::string(); }, "DIR"));
  r.exit_code = parse_arguments(app, argc, argv);
  if (r.exit_code) return r;
  // --demo: private cnn26k on Fashion-MNIST at epsilon 3 (PLD), the README's recipe; flags given win
  static const json demo = {{"model", "cnn26k"}, {"activation", "tanh"}, {"optimizer", "dp-momentum"},
                            {"momentum", 0.9}, {"lr", 0.5}, {"lr-scale", "conv1=2,dense2=2"}, {"batch-size", 4096},
                            {"epochs", 70.0}, {"clip-strategy", "ghost"}, {"clip-norm", 1.0}, {"ema", 0.97},
                            {"target-epsilon", 3.0}, {"delta", 1e-5}, {"accountant", "pld"}};
  for_each_option(o, [&](const char* flag, auto& v, const std::string&, Role) {
    if (app.count(std::string("--") + flag) > 0) r.given.insert(flag);
    else if (o.demo && demo.contains(flag)) option_from_json(demo[flag], v);
  });
  return r;
}

json restore_run_options(Options& o, const std::set<std::string>& given, json resumed) {
  require(resumed.contains("options") && resumed["options"].is_object(),
          "the checkpoint in " + o.checkpoint_dir + " does not record its run's options");
  json& stored = resumed["options"];
  const json given_json = run_options_json(o);
  // The run keeps its settings: flags may repeat them, and every change is listed. A resumed run may use other
  // threads, and may go on longer under a larger budget: the library takes those three flags if they lengthen the
  // run, and refuses them otherwise.
  std::vector<std::string> changed;
  // a flag newer than the checkpoint is recorded as its default: the run had none of what it adds
  const json defaults = run_options_json(Options());
  for_each_option(o, [&](const char* flag, auto& v, const std::string&, Role role) {
    if (role != kRun) return;
    if (!stored.contains(flag)) stored[flag] = defaults[flag];
    const std::string f = flag;
    if ((f == "threads" || f == "epochs" || f == "max-steps" || f == "target-epsilon") && given.count(flag) > 0) return;
    if (given.count(flag) > 0 && given_json[flag] != stored[flag])
      changed.push_back(fmt::format("--{} {} (the run's: {})", flag, given_json[flag].dump(), stored[flag].dump()));
    option_from_json(stored[flag], v);
  });
  if (!changed.empty())
    throw std::invalid_argument(fmt::format(
        "{} contradict{} the checkpointed run; a resumed run keeps its settings (leave {} out)",
        fmt::join(changed, ", "), changed.size() == 1 ? "s" : "", changed.size() == 1 ? "the flag" : "the flags"));
  return resumed;
}

}  // namespace dpgrad::train
