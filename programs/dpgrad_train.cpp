// dpgrad-train: options in, a PrivateTrainer run, a report out (docs/training.md).
// The run itself (its plan, the loop, save-before-release, releases before
// training, resume) is the library's: this program reads its options, loads
// the data, builds the model and the config, and says what happened.
#include <chrono>
#include <cmath>
#include <set>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "data/augment.hpp"
#include "data/datasets.hpp"
#include "engine/blas.hpp"
#include "engine/check.hpp"
#include "engine/communicator.hpp"
#include "engine/random.hpp"
#include "engine/runtime.hpp"
#include "layers/models.hpp"
#include "layers/norm.hpp"
#include "layers/registry.hpp"
#include "optim/checkpoint/checkpoint_key.hpp"
#include "optim/run/private_trainer.hpp"
#include "optim/run/report.hpp"
#include "programs/cli.hpp"
#include "programs/model_data.hpp"
#include "programs/train/options.hpp"
#if DPGRAD_HAVE_ONNX
#include "onnx/onnx.hpp"
#endif

using namespace dpgrad;
using namespace dpgrad::train;
using json = nlohmann::json;

namespace {

data::DatasetOptions dataset_options(const Options& o) {
  data::DatasetOptions d;
  d.seed = o.run.seed;
  d.vocab_file = o.vocab_file;
  d.vocabulary = o.vocabulary;
  d.classes = o.classes;
  if (o.normalize.size() == 2) d.normalize = std::pair(o.normalize[0], o.normalize[1]);
  d.train_limit = o.train_limit;
  d.test_limit = o.test_limit;
  return d;
}

/// The data a run trains and is tested on: this rank's shards (and their records' positions in the whole set).
data::DataSplit load_data(const Options& o, ModelInput input, const Communicator* comm,
                          std::vector<std::size_t>& positions, const std::function<void(const std::string&)>& say) {
  data::DataSplit s = data::load_dataset(o.dataset, dataset_options(o));
  if (o.show_record_counts)  // computed from the private labels: shown only when asked for by name
    s.description += fmt::format(": {} train, {} test (record counts: NOT covered by epsilon)", s.train.size(),
                                 s.test.size());
  require_model_reads(input, s, o.model, o.dataset);
  if (comm) positions = data::keep_shard(s, comm->rank(), comm->size());  // records keep their ids
  compute_model_inputs(input, s, say);
  return s;
}

/// The model's input, and for --model onnx:PATH the file's model, read and checked
/// before any data (docs/onnx.md); null for a built-in model, built once the data is known.
std::unique_ptr<ModelT<float>> import_model(const Options& o, ModelInput& input) {
  const bool imported = o.model.rfind("onnx:", 0) == 0;
  input = imported ? ModelInput::images : find_model(o.model).input;
  if (!imported) return nullptr;
#if DPGRAD_HAVE_ONNX
  onnx::LoadOptions lo;
  lo.freeze = o.freeze;
  lo.dropout_seed = o.run.seed;
  lo.max_bytes_per_example = o.onnx_max_bytes_per_example;
  auto m = onnx::load<float>(o.model.substr(5), lo);
  if (m->input().tokens) input = ModelInput::tokens;
  return m;
#else
  throw std::invalid_argument("--model " + o.model + ": this dpgrad was built without ONNX (-Donnx)");
#endif
}

/// The library's config from the options: everything but the data and the model.
PrivateTrainingConfig training_config(const Options& o, const std::shared_ptr<Communicator>& comm) {
  PrivateTrainingConfig c = o.run;  // the flags that are settings of the library's, and those derived below
  const bool dp = is_dp(o.optimizer);
  c.non_private = !dp;
  c.sampling = dp ? sampling_from_string(o.sampler) : Sampling::shuffle;
  if (dp) c.clipping = make_clip_strategy<float>(parse_clip_spec(o.strategy), double(c.batch_size));
  c.accounting = dp ? accounting_from_string(o.accountant) : Accounting::automatic;
  if (o.clip_quantile) {
    c.adaptive_clipping = AdaptiveClipping{*o.clip_quantile, o.clip_count_noise, o.clip_lr};
    c.adaptive_clipping->normalise = !o.clip_no_normalise;
  }
  c.lr_final = o.schedule == "cosine" ? o.lr_final : -1.0;
  c.checkpoints.dir = o.checkpoint_dir;
  c.checkpoints.resume = o.resume;
  c.communicator = comm;
  return c;
}

/// --export-onnx, before any data: the file can be written, and the model can be
/// written to ONNX (a built-in model built for default sizes shows its layers; the data's sizes change none).
void check_export(const Options& o) {
  require_output_file(o.export_onnx, "--export-onnx");
  if (o.model.rfind("onnx:", 0) == 0) return;
#if DPGRAD_HAVE_ONNX
  FastRng init(0);
  ModelSpec spec;
  spec.activation = parse_activation(o.activation);
  spec.hidden = o.hidden;
  const std::string problem = onnx::save_problem(*build_model<float>(o.model, spec, init));
  require(problem.empty(), "--export-onnx: " + problem);
#else
  throw std::invalid_argument("--export-onnx: this dpgrad was built without ONNX (-Donnx)");
#endif
}

/// What the run will write, before any data: its plot, its export, and the key store of
/// its checkpoints (rank 0's, which holds the run's key and writes it at the first save).
/// Refused on every rank when refused on one.
void check_outputs(const Options& o, const PrivateTrainingConfig& cfg, Communicator* comm) {
  std::string error;
  try {
    if (!o.plot.empty()) {
      require_gnuplot("--plot");
      require_output_file(o.plot, "--plot");
    }
    if (!o.export_onnx.empty()) check_export(o);
    if (!cfg.checkpoints.dir.empty() && (!comm || comm->rank() == 0))
      check_key_store(cfg.checkpoints.key_store.empty() ? default_key_store() : cfg.checkpoints.key_store);
  } catch (const std::exception& e) {
    if (!comm) throw;
    error = e.what();
  }
  if (comm) require_on_all_ranks(*comm, error.empty(), error);
}

/// The top of the output: the run, the plan, the library's facts, and what the options add.
void print_header(const Options& o, PrivateTrainer& t, const std::string& model, std::size_t parameters,
                  const std::string& data, const std::function<void(const std::string&)>& say) {
  say(fmt::format("dpgrad-train: {} ({} parameters) on {}", model, parameters, data));
  say("  " + t.plan().describe());
  for (const std::string& line : t.describe()) say("  " + line);
  if (o.report_train_loss)
    say("  the training loss is reported: it is computed from the private data without noise and is NOT covered "
        "by epsilon");
  if (o.augment_views > 0)
    say(fmt::format("  augmentation multiplicity: {} views per example (shifts up to {} px{}), one clipped gradient "
                    "per example", o.augment_views, o.augment_shift, o.augment_no_flip ? "" : ", flips"));
}

int run(Options o, const std::set<std::string>& given, const json* resumed, const std::shared_ptr<Communicator>& comm) {
  o.threads = threads_per_rank(comm.get(), o.threads);
  if (o.threads > 0) blas::set_threads(o.threads);
  const auto say = line_printer(o.json_out);
  if (comm) {  // every rank the same run, checkpoints included (docs/distributed.md), before anything else
    json same = run_options_json(o);
    same.erase("threads");
    same.update({{"checkpoint-dir", o.checkpoint_dir}, {"resume", o.resume}});
    require_same_settings_on_all_ranks(*comm, same.dump(), "options");
  }
  // ---- everything that needs no data, checked before any is read
  check_train_options(o, given);
  const bool dp = is_dp(o.optimizer);  // after the check, which makes --target-epsilon alone private (dp-sgd)
  data::check_dataset_options(dataset_options(o));
  OptimizerSpec ospec{dp ? o.optimizer.substr(3) : o.optimizer, o.lr, o.momentum, o.weight_decay};
  check_optimizer_spec(ospec);
  PrivateTrainingConfig cfg = training_config(o, comm);
  check_training_config(cfg, *o.lr);
  check_outputs(o, cfg, comm.get());
  // ---- data, model, optimizer (an imported model is read first: a bad file costs no data loading)
  ModelInput input;
  std::unique_ptr<ModelT<float>> model = import_model(o, input);
  const data::DataSplit d = load_data(o, input, comm.get(), cfg.positions, say);
  ModelSpec spec = model_spec_of(d);
  spec.vocabulary = o.vocabulary;
  spec.activation = parse_activation(o.activation);
  spec.hidden = o.hidden;
  spec.train_embedding = !o.frozen_embedding;
  spec.centred = o.centre_features > 0;
  FastRng init(o.run.seed);
#if DPGRAD_HAVE_ONNX
  if (auto* m = dynamic_cast<onnx::OnnxModelT<float>*>(model.get())) {  // its input and output against the data
    Shape shape = d.tokens ? shape_of(d.train.tokens) : shape_of(d.train.inputs);
    m->check_data(Shape(shape.begin() + 1, shape.end()), d.classes, o.dataset);
    for (const auto& line : m->describe()) say(line);
  }
#endif
  if (!model) model = build_model<float>(o.model, spec, init);
  auto base = make_optimizer<float>(ospec, model->parameters());
  for (const auto& [layer, factor] : parse_lr_scales(o.lr_scale)) base->set_lr_scale(layer, factor);
  if (o.centre_features > 0) {  // a private mean of the normalised features (docs/feature-centring.md)
    auto* centre = dynamic_cast<FeatureModelT<float>&>(*model).net().find<CentreT<float>>();
    const std::size_t n = centre->centre().size();  // rows clipped to norm sqrt(n): about one per feature
    cfg.releases.push_back(private_feature_mean<float>(
        n, std::sqrt(double(n)), o.centre_features,
        [](const BatchT<float>& r) { return scattering_normalised(r.inputs); },
        [centre](const ArrayT<float>& m) { centre->set_centre(m); }));
  }
  if (o.augment_views > 0) {  // one key for the run: secret in a private run, else from --seed
    data::ImageAugment augment{o.augment_views, !o.augment_no_flip, o.augment_shift,
                               dp && !o.run.reproducible_noise ? data::random_hash_key()
                                                               : data::hash_key_from_seed(o.run.seed)};
    data::check_augment(augment, shape_of(d.train.inputs));
    if (comm) comm->broadcast(augment.key.data(), augment.key.size(), 0);
    cfg.transform = [augment](const BatchT<float>& r, long step) { return data::augment_images(r, augment, step); };
  }
  if (!resumed && dp && !o.run.noise_multiplier)
    say(fmt::format("calibrating the noise multiplier for epsilon {}...", *o.run.target_epsilon));
  PrivateTrainer trainer(*model, *base, d.train, cfg);
  if (ospec.name == "adambc")
    dynamic_cast<Adam&>(*base).correct_noise(trainer.dp_optimizer().noise_variance(), o.adambc_floor);
  print_header(o, trainer, model->name(), model->parameter_count(), d.description, say);

  // ---- training: the trainer saves before each epoch is shown; the program keeps its history beside it
  json history = resumed ? resumed->at("history") : json::array();
  double seconds_before = resumed ? resumed->value("seconds", 0.0) : 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return seconds_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto out = [&](const json& row, const std::string& text) { fmt::print("{}\n", o.json_out ? row.dump() : text); };
  TrainHooksT<float> hooks;
  hooks.progress = epoch_progress(trainer, o.json_out);
  hooks.record_epoch = [&](const EpochReport& e) {
    history.push_back(epoch_record(trainer, e, {o.report_train_loss, o.layer_snr}));
  };
  hooks.extra = [&] {  // the classes let dpgrad-predict rebuild the model
    return json{{"options", run_options_json(o)}, {"classes", d.classes}, {"history", history}, {"seconds", elapsed()}};
  };
  hooks.on_epoch = [&](const EpochReport&) {
    out(history.back(), epoch_text(trainer, history.back()));
    check_standard_output();  // a lost epoch row stops the run (its checkpoint is on disk: --resume continues)
  };
  TrainResult result;
  try {
    result = trainer.train(hooks, &d.test);
  } catch (const DivergedError& e) {  // the step was taken and accounted; nothing of it is shown
    const std::string message = diverged_message(trainer, e);
    if (o.json_out) out(diverged_record(trainer, message), "");
    throw std::runtime_error(message);
  }
  json summary = summary_record(trainer, result, history.empty() ? json::object() : history.back(), elapsed());
  summary.update({{"model", model->name()}, {"optimizer", o.optimizer}});
#if DPGRAD_HAVE_ONNX
  if (!o.export_onnx.empty() && (!comm || comm->rank() == 0)) {
    const Shape inputs = shape_of(d.test.inputs);  // one example's shape: a built-in model reads it
    onnx::save(*model, o.export_onnx, Shape(inputs.begin() + 1, inputs.end()));
    summary["exported"] = o.export_onnx;
    say("trained model written to " + o.export_onnx +
        (dynamic_cast<onnx::OnnxModelT<float>*>(model.get()) ? " (the file's graph with the trained weights)" : ""));
  }
#endif
  if (!o.plot.empty()) {
    plot_history(o.plot, history, plot_title(trainer, model->name(), o.dataset, o.optimizer), "--plot");
    say("plot written to " + o.plot);
  }
  out(summary, summary_text(trainer, summary));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  use_best_blas_core("dpgrad-train", argc, argv);
  if (const auto closed = guard_standard_output("dpgrad-train")) return *closed;
  keep_freed_memory();
  // Under mpirun or srun: one run over every process, rank 0 printing (docs/distributed.md).
  return run_on_every_rank(
      "dpgrad-train",
      [&](const std::shared_ptr<Communicator>& comm) {
        ParsedOptions parsed = parse_train_options(argc, argv);
        // every rank agrees to go on before anything collective: one given --help must not leave the others waiting
        if (const auto stop = stop_on_all_ranks(comm.get(), parsed.exit_code)) return *stop;
        Options& o = parsed.options;
        json resumed;
        if (o.resume) {  // rank 0 reads the checkpoint's options with the run's key; the others get them from it
          require(!o.checkpoint_dir.empty(), "--resume needs --checkpoint-dir (the directory of the run to continue)");
          resumed = restore_run_options(o, parsed.given, CheckpointDir(o.checkpoint_dir).read_extra(comm.get()));
        }
        return finish_standard_output("dpgrad-train", run(o, parsed.given, o.resume ? &resumed : nullptr, comm));
      },
      "out of memory; lower --batch-size, or use --clip-strategy ghost (or microbatch), whose per-sample work takes "
      "the least memory", in_train_flags);
}
