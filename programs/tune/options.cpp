// dpgrad-tune's options (programs/tune/options.hpp).
#include "programs/tune/options.hpp"

#include <stdexcept>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "engine/check.hpp"
#include "layers/registry.hpp"
#include "optim/clipping/clip_spec.hpp"
#include "optim/optimizer.hpp"
#include "privacy/selection.hpp"
#include "programs/cli.hpp"

namespace dpgrad::tune_cli {

/// "LO:HI" or one value (a fixed setting).
std::pair<double, double> parse_range(const std::string& text, const char* flag) {
  const auto colon = text.find(':');
  const std::string lo = text.substr(0, colon), hi = colon == std::string::npos ? lo : text.substr(colon + 1);
  for (const std::string& part : {lo, hi})
    require(real_number_problem(part).empty(),
            std::string("--") + flag + " '" + text + "': expected LO:HI or one number (" + real_number_problem(part) + ")");
  return {std::stod(lo), std::stod(hi)};
}

/// Refuses a value given twice in one of the search's lists: a trial's settings
/// are read back from its saved search by value (docs/tuning.md).
template <class V>
void require_distinct(const std::vector<V>& values, const char* flag) {
  for (std::size_t i = 0; i < values.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      require(values[i] != values[j], fmt::format("--{} {}: {} is given twice (each value once)", flag,
                                                  fmt::join(values, ","), values[i]));
}

std::optional<int> parse_tune_options(int argc, const char* const* argv, Options& o) {
  CLI::App app{"dpgrad-tune: private hyperparameter search; only the best trial is released, and the epsilon covers "
               "the whole search (docs/tuning.md)"};
  name_cli_errors(app, "dpgrad-tune");
  app.add_option("--dataset", o.dataset, "fashion-mnist, mnist, idx:PATH, text:PATH, spamassassin, synthetic, "
                 "synthetic-text")->capture_default_str();
  app.add_option("--model", o.model, "one of:\n" + model_help())->capture_default_str();
  app.add_option("--activation", o.activation, "relu, tanh, sigmoid (mlp and CNNs)")->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "the trials' base optimizer: sgd, adam, ...")->capture_default_str();
  app.add_option("--momentum", o.momentum, "sgd's momentum")->capture_default_str();
  app.add_option("--lr-scale", o.lr_scale, "LAYER=FACTOR,...: every trial's learning rate of these layers times FACTOR")
      ->check(non_empty("a list of LAYER=FACTOR"));
  app.add_option("--ema", o.ema, "every trial's model is the exponential moving average of its parameters with this "
                 "decay, e.g. 0.97 (post-processing, no privacy cost; 0: off)");
  app.add_option("--clip-strategy", o.strategy, "naive, vanilla, ghost, microbatch:M (exact norms; not jl:K); per "
                 "layer: ghost+layers, ghost+layers:size, ghost+layers:adaptive (with --clip-quantile)")
      ->capture_default_str();
  app.add_option("--target-epsilon", o.target_epsilon, "epsilon of the whole search (required)")->required();
  app.add_option("--delta", o.delta, "default: the largest power of ten with delta N <= 0.6");
  app.add_option("--trials", o.trials, "how many trials, a secret random number: tnb:ETA,GAMMA (truncated negative "
                 "binomial; tnb:1,G is geometric with mean 1/G) or poisson:MU")->capture_default_str();
  app.add_option("--lr", o.lr, "learning rates, LO:HI (log-uniform) or one value")->capture_default_str();
  app.add_option("--clip-norm", o.clip_norm, "clip norms C, LO:HI (log-uniform) or one value")->capture_default_str();
  app.add_option("--clip-quantile", o.clip_quantile, "adaptive clipping: quantiles LO:HI (uniform) or one value; "
                 "--clip-norm is then the first step's C")->check(non_empty("a quantile range"));
  app.add_option("--batch-size", o.batch_sizes, "expected batch sizes to draw from, e.g. 1024,4096")->delimiter(',')
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "epoch counts to draw from, e.g. 5,10")->delimiter(',')->capture_default_str();
  app.add_option("--physical-batch-size", o.physical_batch, "clip in chunks of at most this many examples (memory)");
  app.add_option("--validation-fraction", o.validation_fraction, "share of the training records held out to score "
                 "the trials")->capture_default_str();
  app.add_option("--score-noise", o.score_noise, "noise std of each trial's released validation accuracy")
      ->capture_default_str();
  app.add_option("--normalize", o.normalize, "MEAN,STD: feed (x - MEAN) / STD, constants fixed in advance")
      ->delimiter(',')->expected(2);
  app.add_option("--train-limit", o.train_limit, "only the first this many training records (0: all)");
  app.add_option("--test-limit", o.test_limit, "only the first this many test records (0: all)");
  app.add_option("--search-dir", o.search_dir, "where the search keeps its state and its trials' checkpoints, as "
                 "secret as the data (required)")->required();
  app.add_flag("--resume", o.resume, "continue the search in --search-dir");
  app.add_option("--export-onnx", o.export_onnx, "write the best trial's model to this ONNX file")
      ->check(non_empty("a file name"));
  app.add_option("--seed", o.seed, "seed of the synthetic data (and of everything with --reproducible-noise)");
  app.add_flag("--reproducible-noise", o.reproducible, "seeded trial count, settings and noise: NOT private");
  app.add_option("--threads", o.threads, "threads (0: all cores)");
  app.add_flag("--json", o.json_out, "one JSON object on stdout");
  if (const auto code = parse_arguments(app, argc, argv)) return code;
  require_distinct(o.batch_sizes, "batch-size");
  require_distinct(o.epochs, "epochs");
  privacy::TrialCount::parse(o.trials);
  parse_range(o.lr, "lr");
  parse_range(o.clip_norm, "clip-norm");
  if (!o.clip_quantile.empty()) parse_range(o.clip_quantile, "clip-quantile");
  require(parse_clip_spec(o.strategy).layers != ClipSpec::Layers::adaptive || !o.clip_quantile.empty(),
          "--clip-strategy " + o.strategy + " moves each layer's clip norm towards a quantile of its norms: give "
          "--clip-quantile");
  parse_lr_scales(o.lr_scale);
  require(o.ema == 0 || (o.ema > 0 && o.ema < 1), "--ema must be in (0, 1) (0: off)");
  return std::nullopt;
}


}  // namespace dpgrad::tune_cli
