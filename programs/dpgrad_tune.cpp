// dpgrad-tune: private hyperparameter search over a bundled model
// (docs/tuning.md). Options in, the library's tune() run, the best trial out:
// its settings, its noised validation score, the search's epsilon, and the
// released model's accuracy on the test split. The number of trials and the
// other trials' scores are never shown: the search's bound needs them secret.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "data/datasets.hpp"
#include "engine/blas.hpp"
#include "engine/check.hpp"
#include "engine/random.hpp"
#include "engine/runtime.hpp"
#include "layers/models.hpp"
#include "layers/registry.hpp"
#include "optim/clipping/clip_spec.hpp"
#include "optim/checkpoint/checkpoint_key.hpp"
#include "optim/optimizer.hpp"
#include "optim/run/tune.hpp"
#include "programs/cli.hpp"
#include "programs/model_data.hpp"
#include "programs/tune/options.hpp"
#if DPGRAD_HAVE_ONNX
#include "onnx/onnx.hpp"
#endif

using namespace dpgrad;
using namespace dpgrad::tune_cli;
using json = nlohmann::json;

namespace {

/// --export-onnx, before any data: the file can be written, and the model can be
/// written to ONNX (a model built for default sizes shows its layers; the data's sizes change none).
void check_export(const Options& o) {
  if (o.export_onnx.empty()) return;
#if DPGRAD_HAVE_ONNX
  require_output_file(o.export_onnx, "--export-onnx");
  FastRng init(0);
  ModelSpec spec;
  spec.activation = parse_activation(o.activation);
  const std::string problem = onnx::save_problem(*build_model<float>(o.model, spec, init));
  require(problem.empty(), "--export-onnx: " + problem);
#else
  throw std::invalid_argument("--export-onnx: this dpgrad was built without ONNX (-Donnx)");
#endif
}

int run(const Options& o) {
  const auto say = line_printer(o.json_out);
  if (o.threads > 0) blas::set_threads(o.threads);
  // ---- everything that needs no data
  const ModelEntry& entry = find_model(o.model);
  data::DatasetOptions dopt;
  dopt.seed = o.seed;
  dopt.train_limit = o.train_limit;
  dopt.test_limit = o.test_limit;
  if (o.normalize.size() == 2) dopt.normalize = std::pair(o.normalize[0], o.normalize[1]);
  data::check_dataset_options(dopt);
  check_optimizer_spec(OptimizerSpec{o.optimizer, 0.1, o.momentum, 0});
  SearchConfig c;
  c.trials = privacy::TrialCount::parse(o.trials);
  c.space.lr = parse_range(o.lr, "lr");
  c.space.clip_norm = parse_range(o.clip_norm, "clip-norm");
  if (!o.clip_quantile.empty()) c.space.clip_quantile = parse_range(o.clip_quantile, "clip-quantile");
  c.space.batch_sizes = o.batch_sizes;
  c.space.epochs = o.epochs;
  c.space.check();
  c.target_epsilon = o.target_epsilon;
  c.delta = o.delta;
  c.validation_fraction = o.validation_fraction;
  c.score_noise = o.score_noise;
  c.dir = o.search_dir;
  c.resume = o.resume;
  c.reproducible = o.reproducible;
  c.seed = o.seed;
  c.trial.physical_batch_size = o.physical_batch;
  c.trial.ema = o.ema;
  c.trial.clipping = make_clip_strategy<float>(parse_clip_spec(o.strategy), double(o.batch_sizes.front()));
  check_search_settings(c);  // a target out of reach for any number of records is refused before the data is read
  check_export(o);
  check_key_store();  // the search's key is written before its first trial: its store is checked now
  // ---- data and the trials' factory
  data::DataSplit d = data::load_dataset(o.dataset, dopt);
  require_model_reads(entry.input, d, o.model, o.dataset);
  compute_model_inputs(entry.input, d, say);
  ModelSpec spec = model_spec_of(d);
  spec.activation = parse_activation(o.activation);
  const TrialFactoryT<float> factory = [&](const TrialSettings& s) {
    FastRng init(s.init_seed);
    TrialModelT<float> m;
    m.model = build_model<float>(o.model, spec, init);
    m.optimizer = make_optimizer<float>(OptimizerSpec{o.optimizer, s.lr, o.momentum, 0}, m.model->parameters());
    for (const auto& [layer, factor] : parse_lr_scales(o.lr_scale)) m.optimizer->set_lr_scale(layer, factor);
    return m;
  };
  say(fmt::format("dpgrad-tune: {} on {}, {} trials (the count stays secret), target epsilon {}", o.model,
                  d.description, c.trials.describe(), o.target_epsilon));
  say("searching; only the time is shown while it runs...");
  SearchResult r = tune<float>(factory, d.train, c, [&](double seconds) {
    if (!o.json_out) fmt::print(stderr, "\r  {:.0f} s", seconds);
  });
  if (!o.json_out) fmt::print(stderr, "\n");
  json out = {{"model", o.model}, {"dataset", d.description}, {"trials", c.trials.to_json()},
              {"search", r.plan.to_json()}, {"released", r.released},
              {"epsilon", r.plan.epsilon}, {"delta", r.plan.delta}, {"private", !o.reproducible}};
  if (o.reproducible) out["privacy_note"] = kNotPrivateReproducible;
  std::string test_line;
  if (r.released) {
    out["best"] = r.best.to_json();
    out["validation_score"] = r.score;
    // the test split is not the private training data: evaluating the released model on it costs nothing
    PrivateTrainingConfig eval;
    eval.non_private = true;
    auto opt = make_optimizer<float>(OptimizerSpec{o.optimizer, r.best.lr, o.momentum, 0}, r.model->parameters());
    PrivateTrainer evaluator(*r.model, *opt, d.test, eval);
    const Evaluation e = evaluator.evaluate(d.test);
    out["test"] = {{"loss", e.loss}, {"accuracy", e.accuracy}};
    test_line = fmt::format("test accuracy {:.2f}% (loss {:.4f}) on {} test records", 100 * e.accuracy, e.loss, e.examples);
#if DPGRAD_HAVE_ONNX
    if (!o.export_onnx.empty()) {
      const Shape inputs = shape_of(d.test.inputs);  // one example's shape: the model reads it
      onnx::save(*r.model, o.export_onnx, Shape(inputs.begin() + 1, inputs.end()));
      out["exported"] = o.export_onnx;
    }
#endif
  }
  if (o.json_out) {
    fmt::print("{}\n", out.dump());
    return 0;
  }
  say(fmt::format("trials' noise multiplier {:.4g}, the score's {:.4g}; at most {} trials (P[more] {:.2g} is charged to "
                  "delta)", r.plan.noise_multiplier, r.plan.score_noise_multiplier, r.plan.max_trials, r.plan.cap_tail));
  if (!r.released) {
    say("the search drew no trials: nothing is released (" + r.privacy_statement() + ")");
    return 0;
  }
  say("best trial: " + r.best.describe());
  say(fmt::format("its noised validation accuracy {:.2f}%", 100 * r.score));
  say(test_line);
  if (!o.export_onnx.empty()) say("its model written to " + o.export_onnx);
  say("privacy of the whole search: " + r.privacy_statement() +
      (o.reproducible ? std::string(" (") + kNotPrivateReproducible + ")" : std::string()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  use_best_blas_core("dpgrad-tune", argc, argv);
  if (const auto closed = guard_standard_output("dpgrad-tune")) return *closed;
  keep_freed_memory();
  Options o;
  try {
    if (const auto code = parse_tune_options(argc, argv, o)) return *code;
    return finish_standard_output("dpgrad-tune", run(o));
  } catch (const std::exception& e) {
    fmt::print(stderr, "dpgrad-tune: error: {}\n", e.what());
    return 2;
  }
}
