// dpgrad-train's options (programs/train/options.hpp).
#include "programs/train/options.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/format.h>

#include "engine/check.hpp"
#include "layers/registry.hpp"
#include "optim/optimizer.hpp"
#include "optim/run/plan.hpp"
#include "optim/clipping/clip_spec.hpp"
#include "privacy/schedule.hpp"
#include "programs/cli.hpp"

namespace dpgrad::train {

namespace {
const CLI::Validator kWholeNumber = whole_number();
}  // namespace

json run_options_json(const Options& o) {
  json j = json::object();
  for_each_run_option(o, [&](const char* flag, const auto& v) { j[flag] = option_json(v); });
  return j;
}

bool is_dp(const std::string& opt) { return opt.rfind("dp-", 0) == 0; }

void check_train_options(Options& o, const std::set<std::string>& given) {
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
  require(!o.frozen_embedding || model.takes_frozen_embedding,
          "--frozen-embedding: only the transformer's embedding can be frozen, not " + o.model + "'s");
  require(std::isfinite(o.weight_decay) && o.weight_decay >= 0,
          fmt::format("--weight-decay must be finite and >= 0, got {}", o.weight_decay));
  require(!onnx_model || o.model.size() > 5, "--model onnx:PATH needs the path of an ONNX file");
  require(o.freeze.empty() || onnx_model, "--freeze applies to --model onnx:PATH (the built-in models: see --frozen-embedding)");
  require(o.export_onnx.empty() || onnx_model, "--export-onnx applies to --model onnx:PATH");
  require(o.export_onnx.empty() || o.ema == 0,
          "--export-onnx writes the trained parameters, --ema evaluates their average: use one of them");
  require(o.schedule == "constant" || o.schedule == "cosine", "--lr-schedule must be constant or cosine");
  require(o.lr_final == 0 || o.schedule == "cosine", "--lr-final needs --lr-schedule cosine");
  require(o.adambc_floor > 0 && std::isfinite(o.adambc_floor),
          fmt::format("--adambc-floor must be > 0, got {}", o.adambc_floor));
  if (dp) {
    require(o.strategy != "none", "--clip-strategy none is not private; use a non-dp optimizer for that");
    const ClipSpec spec = parse_clip_spec(o.strategy);  // throws on an unknown one
    require(spec.kind != ClipSpec::Kind::jl || spec.directions <= 1000,
            fmt::format("--clip-strategy {}: each of the K directions is a forward pass, so a step costs about K "
                        "non-private steps (jl:1000 took 26 s a step on cnn26k); at most jl:1000 (ghost and vanilla "
                        "give exact norms faster)", o.strategy));
    // below 1e-12 the noise sigma C leaves the noise grid's range for every useful sigma (docs/noise.md)
    require(o.clip_norm >= 1e-12 && o.clip_norm <= 1e6,
            fmt::format("--clip-norm must be in [1e-12, 1e6], got {}", o.clip_norm));
    if (o.noise_multiplier && *o.noise_multiplier > 0 && std::isfinite(*o.noise_multiplier))
      require(*o.noise_multiplier * o.clip_norm <= 0x1.0p900,
              fmt::format("--noise-multiplier {} times --clip-norm {} is a noise standard deviation of {}, outside the "
                          "noise grid's range [2^-900, 2^900] (docs/noise.md)", *o.noise_multiplier, o.clip_norm,
                          *o.noise_multiplier * o.clip_norm));
    if (!o.accountant.empty() && o.accountant != "gdp") {
      accounting_from_string(o.accountant);  // throws on an unknown one
      const std::string analyses = privacy::analysed_sampler(o.accountant);
      require(analyses == o.sampler,
              "--accountant " + o.accountant + " does not fit --sampler " + o.sampler + ": it analyses " + analyses +
                  " sampling (--sampler " + o.sampler + " goes with --accountant " +
                  privacy::default_accountant(o.sampler) + (o.sampler == "poisson" ? " or rdp" : "") + ")");
    }
  } else {
    require(!o.noise_multiplier && !o.target_epsilon, "--noise-multiplier/--target-epsilon need a dp-* optimizer");
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
  require(o.epoch_fraction == 1.0 || o.sampler == "shuffle",
          "--epoch-fraction applies to --sampler shuffle only (this run samples " + o.sampler + ")");
  require(!o.allow_no_noise || (o.noise_multiplier && *o.noise_multiplier == 0 && !o.target_epsilon),
          "--allow-no-noise goes with --noise-multiplier 0 and no --target-epsilon (a run without noise has no epsilon)");
  require(!o.allow_large_delta || (dp && o.delta), "--allow-large-delta goes with a --delta of a private run");
  require(!o.reproducible_noise || dp, "--reproducible-noise is for dp-* optimizers (non-private runs use --seed)");
  require(!o.report_train_loss || dp, "--report-train-loss is for dp-* optimizers (non-private runs report it anyway)");
  require(!o.layer_snr || (dp && !(o.noise_multiplier && *o.noise_multiplier == 0)),
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
  app.add_option("--model", o.model, "one of:\n" + model_help() + "  onnx:PATH: an ONNX file's model (docs/onnx.md)")
      ->capture_default_str();
  app.add_option("--freeze", o.freeze,
                 "onnx:PATH: keep the parameters whose name (or initializer's name) matches this regular expression "
                 "constant: no gradient, no clipping, no noise");
  app.add_option("--export-onnx", o.export_onnx, "onnx:PATH: write the trained model to this ONNX file at the end");
  app.add_option("--dataset", o.dataset, "fashion-mnist, mnist, idx:PATH, text:PATH, spamassassin, synthetic, synthetic-text")
      ->capture_default_str();
  app.add_option("--vocab-file", o.vocab_file,
                 "text: token ids from this public token list (one token per line) instead of feature hashing");
  app.add_option("--vocabulary", o.vocabulary,
                 "text, feature hashing: the number of token ids (padding and unknown included); the transformer's "
                 "embedding has this many rows, the other text models need 8185")
      ->check(whole_number())->capture_default_str();
  app.add_flag("--frozen-embedding", o.frozen_embedding,
               "transformer: keep the embedding table at its random initialisation (drawn from --seed, so it "
               "costs no privacy); only the layers after it train, are clipped and are noised");
  app.add_option("--centre-features", o.centre_features,
                 "scatter-linear, scatter-cnn, private: take from every sample a private estimate of the mean of its "
                 "normalised features, a Gaussian release of this noise multiplier accounted with the run (0: off)")
      ->capture_default_str();
  app.add_option("--classes", o.classes, "keep only these classes, e.g. 0,9 (relabelled 0, 1, ...)")->delimiter(',');
  app.add_flag("--show-record-counts", o.show_record_counts,
               "with --classes: print how many training and test records the kept classes hold; those counts are "
               "computed from the private labels and are NOT covered by epsilon (docs/what-epsilon-covers.md)");
  app.add_option("--normalize", o.normalize,
                 "MEAN,STD: feed (x - MEAN) / STD (pixels in [0, 1]); constants fixed in advance, not computed from "
                 "the private data")
      ->delimiter(',');
  app.add_option("--augment-views", o.augment_views,
                 "K: train on K random views of each example (flips, shifts), its loss the mean over them, so one "
                 "clipped gradient per example (augmentation multiplicity; images only; 0: off)")
      ->check(CLI::Range(0, 256));
  app.add_option("--augment-shift", o.augment_shift, "largest shift of a view, in pixels along each axis")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_flag("--augment-no-flip", o.augment_no_flip, "views are not mirrored left-right");
  app.add_option("--activation", o.activation, "relu, tanh, sigmoid (mlp and CNNs)")->capture_default_str();
  app.add_option("--hidden", o.hidden, "hidden units of mlp")->check(kWholeNumber)->capture_default_str();
  app.add_option("--optimizer", o.optimizer,
                 "sgd, momentum, adam, dp-sgd, dp-momentum, dp-adam, dp-adambc (DP-Adam with its second moment "
                 "corrected for the noise)")->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate (default: 0.1 for sgd and momentum, 0.001 for adam, their dp- "
                               "versions alike)");
  app.add_option("--lr-schedule", o.schedule, "constant or cosine")->capture_default_str();
  app.add_option("--lr-final", o.lr_final, "cosine: the learning rate at the last step (default 0)")
      ->capture_default_str();
  app.add_option("--lr-scale", o.lr_scale,
                 "LAYER=FACTOR,...: that layer's parameters (or one parameter, e.g. conv1.bias) move with lr * FACTOR")
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "momentum of momentum / dp-momentum")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "L2 weight decay")->capture_default_str();
  app.add_option("--adambc-floor", o.adambc_floor,
                 "dp-adambc: floor of the corrected second moment, max(v_hat - noise variance, floor)")
      ->capture_default_str();
  app.add_option("--ema", o.ema, "evaluate an exponential moving average of the parameters with this decay (0: off)")
      ->capture_default_str();
  app.add_option("--sat-rho", o.sat_rho,
                 "DP-SAT: take the gradients at a step of this length towards the previous noised gradient (0: off)")
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "epochs (may be fractional)")->capture_default_str();
  app.add_option("--batch-size", o.batch, "batch size (expected size under Poisson sampling)")->check(kWholeNumber)->capture_default_str();
  app.add_option("--physical-batch-size", o.physical_batch,
                 "clip each batch in chunks of at most this many examples, noised and accounted once (0: one piece; "
                 "naive, vanilla, ghost)")
      ->check(kWholeNumber);
  app.add_option("--max-steps", o.max_steps, "stop after this many steps (0: no limit)")->check(kWholeNumber);
  app.add_option("--clip-strategy", o.strategy, "naive, vanilla, ghost, jl:K, microbatch:M")->capture_default_str();
  app.add_option("--clip-norm", o.clip_norm, "per-sample clipping norm C")->capture_default_str();
  app.add_option("--noise-multiplier", o.noise_multiplier, "sigma: noise std / C");
  app.add_option("--target-epsilon", o.target_epsilon, "calibrate sigma for this epsilon (or stop at it)");
  app.add_option("--delta", o.delta, "delta (default: the largest power of ten with delta N <= 0.6, 1e-5 for 60,000 "
                 "records); 1/N or more only with --allow-large-delta");
  app.add_flag("--allow-large-delta", o.allow_large_delta,
               "accept a --delta of 1/N or more, which allows publishing about delta N records in full (a warning "
               "says so)");
  app.add_option("--accountant", o.accountant, "default: pld (poisson), wor (fixed), shuffle (shuffle); also rdp (poisson)");
  app.add_option("--sampler", o.sampler, "poisson, shuffle, fixed")->capture_default_str();
  app.add_option("--epoch-fraction", o.epoch_fraction, "shuffle: stop each pass after this fraction of the data");
  app.add_flag("--reproducible-noise", o.reproducible_noise,
               "draw noise, sampling and JL directions from a generator seeded by --seed, so that the run can be "
               "repeated: NOT private (the noise can be recomputed from the seed); default: the secure generator");
  app.add_flag("--report-train-loss", o.report_train_loss,
               "private runs: also report the training loss, which is computed from the private data without noise "
               "and is NOT covered by epsilon (labelled so wherever it appears)");
  app.add_flag("--allow-no-noise", o.allow_no_noise, "accept --noise-multiplier 0 (NOT private)");
  app.add_option("--seed", o.seed,
                 "seed of the initialisation (and of the data order of non-private runs, and of the noise with "
                 "--reproducible-noise)")->capture_default_str()->check(kWholeNumber);
  app.add_option("--train-limit", o.train_limit, "use only the first N training examples")->check(kWholeNumber);
  app.add_option("--test-limit", o.test_limit, "use only the first N test examples")->check(kWholeNumber);
  app.add_option("--threads", o.threads, "engine threads (0: every core, or DPGRAD_THREADS)")->check(CLI::Range(0, 1024));
  app.add_flag("--layer-snr", o.layer_snr,
               "print each layer's signal-to-noise ratio per coordinate of the noised gradient every epoch (from the "
               "released gradients: no privacy cost); a guide for --lr-scale");
  app.add_flag("--json", o.json_out, "one JSON object per epoch and a final summary on stdout");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "write checkpoints here (at each epoch's end and every --checkpoint-every steps)")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must name a directory") : std::string(); },
                             "DIR"));
  app.add_option("--checkpoint-every", o.checkpoint_every, "also checkpoint every N steps (0: at epoch ends only)")->check(kWholeNumber);
  app.add_flag("--resume", o.resume, "continue the run checkpointed in --checkpoint-dir (same settings, same ledger)");
  app.add_option("--plot", o.plot, "write test accuracy and epsilon against epochs to this PNG (gnuplot)");
  app.add_flag("--demo", o.demo, "the demo run of ./dev demo (private cnn26k on Fashion-MNIST, epsilon 3)");
  r.exit_code = parse_arguments(app, argc, argv);
  if (r.exit_code) return r;
  for_each_run_option(o, [&](const char* flag, auto&) {
    if (app.count(std::string("--") + flag) > 0) r.given.insert(flag);
  });
  if (o.demo) {  // private cnn26k on Fashion-MNIST at epsilon 3 (PLD): the README's recipe, about 3 minutes on 2 cores
    o.model = "cnn26k";
    o.activation = "tanh";
    o.optimizer = "dp-momentum";
    o.momentum = 0.9;
    o.lr = 0.5;
    o.lr_scale = "conv1=2,dense2=2";
    o.batch = 4096;
    o.epochs = 70;
    o.strategy = "ghost";
    o.clip_norm = 1;
    o.ema = 0.97;
    o.target_epsilon = 3.0;
    o.delta = 1e-5;
    o.accountant = "pld";
  }
  return r;
}

json restore_run_options(Options& o, const std::set<std::string>& given, json resumed) {
  require(resumed.contains("options") && resumed["options"].is_object(),
          "the checkpoint in " + o.checkpoint_dir + " does not record its run's options");
  json& stored = resumed["options"];
  const json given_json = run_options_json(o);
  // The run keeps its settings: flags may repeat them but not change them;
  // every change is listed. The engine's threads are not the run's: a resumed
  // run may use others.
  // A run may also go on longer under a larger budget: those three flags reach the
  // library, which takes them if they lengthen the run and refuses them otherwise.
  std::vector<std::string> changed;
  for_each_run_option(o, [&](const char* flag, auto& v) {
    require(stored.contains(flag), fmt::format("the checkpoint does not record --{}", flag));
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
