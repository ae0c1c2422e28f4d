// dpgrad-train: trains a model on real or synthetic data, privately (DP-SGD,
// DP-momentum, DP-Adam with any clipping strategy) or not, and reports test
// accuracy and the privacy spent with the chosen accountant.
#include <spawn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "engine/blas.hpp"
#include "engine/communicator.hpp"
#include "engine/random.hpp"
#include "engine/runtime.hpp"
#include "engine/tape.hpp"
#include "programs/cli.hpp"
#include "examples/train/options.hpp"
#include "examples/train/plot.hpp"
#include "examples/train/report.hpp"
#include "data/augment.hpp"
#include "data/datasets.hpp"
#include "layers/models.hpp"
#if DPGRAD_HAVE_ONNX
#include "onnx/onnx.hpp"
#endif
#include "optim/averaging.hpp"
#include "optim/checkpoint.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/private_trainer.hpp"
#include "optim/sampler.hpp"
#include "privacy/accountant.hpp"
#include "privacy/calibration.hpp"
#include "privacy/mechanisms.hpp"
#include "privacy/schedule.hpp"

using namespace dpgrad;
using namespace dpgrad::train;
using json = nlohmann::json;

namespace {

/// Raises all-or-nothing argument problems as std::invalid_argument.
void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

/// The examples of the given classes, relabelled 0, 1, ... in the order given.
BatchT<float> keep_classes(const BatchT<float>& b, const std::vector<int>& classes) {
  std::vector<std::size_t> rows;
  for (std::size_t i = 0; i < b.size(); ++i)
    if (std::find(classes.begin(), classes.end(), b.labels[i]) != classes.end()) rows.push_back(i);
  BatchT<float> r = b.select(rows);
  for (auto& y : r.labels) y = std::int32_t(std::find(classes.begin(), classes.end(), y) - classes.begin());
  return r;
}

/// Applies --lr-scale's LAYER=FACTOR,... to the optimizer; returns the pairs as given.
std::vector<std::string> apply_lr_scale(OptimizerT<float>& opt, const std::string& spec) {
  std::vector<std::string> applied, names;
  std::size_t pos = 0;
  while (pos < spec.size()) {
    std::size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    require(eq != std::string::npos && eq > 0 && eq + 1 < item.size(),
            "--lr-scale: '" + item + "' is not LAYER=FACTOR");
    const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
    require(std::find(names.begin(), names.end(), name) == names.end(), "--lr-scale: '" + name + "' is given twice");
    char* rest = nullptr;
    const double factor = std::strtod(value.c_str(), &rest);
    require(rest && *rest == '\0' && std::isfinite(factor) && factor >= 0,
            "--lr-scale: the factor of '" + name + "' must be a number >= 0, got '" + value + "'");
    opt.set_lr_scale(name, factor);
    names.push_back(name);
    applied.push_back(item);
    pos = end + 1;
  }
  return applied;
}

/// Ranks other than 0 print nothing of the run: their standard output goes to
/// /dev/null, and so does standard error except error messages (QuietRank::err).
struct QuietRank {
  QuietRank() {
    std::fflush(stdout);
    std::fflush(stderr);
    saved_err = ::dup(2);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::close(null);
    }
  }
  ~QuietRank() {
    std::fflush(stderr);
    if (saved_err >= 0) ::dup2(saved_err, 2);
  }
  int saved_err = -1;
};

BatchT<float> limit(const BatchT<float>& b, std::size_t n) {
  if (n == 0 || n >= b.size()) return b;
  std::vector<std::size_t> rows(n);
  for (std::size_t i = 0; i < n; ++i) rows[i] = i;
  BatchT<float> r = b.select(rows);
  return r;
}

/// Engine threads per process when MPI started several on one machine and none
/// were asked for: the cores shared among the machine's ranks (0: leave as is).
int threads_per_rank(const Communicator* comm, int asked) {
  if (asked > 0 || !comm || comm->size() == 1 || std::getenv("DPGRAD_THREADS")) return asked;
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks_here = local ? std::max(1, std::atoi(local)) : comm->size();
  return std::max(1, int(std::thread::hardware_concurrency()) / ranks_here);
}

/// This rank's positions among `examples`: rank, rank + size, ... (data-parallel runs).
std::vector<std::size_t> shard_positions(std::size_t examples, const Communicator& comm) {
  std::vector<std::size_t> rows;
  for (std::size_t i = std::size_t(comm.rank()); i < examples; i += std::size_t(comm.size())) rows.push_back(i);
  return rows;
}

int run(Options o, const json* resumed, const std::shared_ptr<Communicator>& comm) {
  auto t0 = std::chrono::steady_clock::now();
  const bool dp = is_dp(o.optimizer);
  o.threads = threads_per_rank(comm.get(), o.threads);
  if (o.threads > 0) blas::set_threads(o.threads);
  auto say = [&](const std::string& s) {
    if (!o.json_out) fmt::print("{}\n", s);
    else fmt::print(stderr, "{}\n", s);
  };

  // ---- arguments that do not need data
  check_train_options(o);
  const std::string base_name = dp ? o.optimizer.substr(3) : o.optimizer;
  require(o.checkpoint_dir.empty() || resumed || !CheckpointDir(o.checkpoint_dir).has_checkpoint(),
          "--checkpoint-dir " + o.checkpoint_dir +
              " already holds a checkpoint: add --resume to continue that run, or choose another directory");
  if (!o.plot.empty()) {
    require_gnuplot();
    require_writable_file(o.plot, "--plot");
  }
  // the checkpoint directory is claimed now: unwritable, or used by another run, fails before any work
  std::optional<CheckpointLock> checkpoint_lock;  // rank 0 writes a data-parallel run's checkpoints
  if (!o.checkpoint_dir.empty() && (!comm || comm->rank() == 0)) checkpoint_lock.emplace(o.checkpoint_dir);

  // ---- data and model
  data::DatasetOptions dopts;
  dopts.seed = o.seed;
  dopts.vocab_file = o.vocab_file;
  dopts.vocabulary = o.vocabulary;
  data::DataSplit data = data::load_dataset(o.dataset, dopts);
  if (!o.classes.empty()) {
    require(o.classes.size() >= 2, "--classes needs at least two classes");
    for (std::size_t i = 0; i < o.classes.size(); ++i) {
      require(o.classes[i] >= 0 && std::size_t(o.classes[i]) < data.classes,
              fmt::format("--classes: class {} does not exist (the dataset has {})", o.classes[i], data.classes));
      for (std::size_t j = 0; j < i; ++j) require(o.classes[i] != o.classes[j], "--classes: a class is repeated");
    }
    data.train = keep_classes(data.train, o.classes);
    data.test = keep_classes(data.test, o.classes);
    data.classes = o.classes.size();
    data.description += fmt::format("; classes {}: {} train, {} test", fmt::join(o.classes, ","), data.train.size(),
                                    data.test.size());
  }
  if (!o.normalize.empty()) {
    require(o.normalize.size() == 2 && o.normalize[1] > 0 && std::isfinite(o.normalize[0]) && std::isfinite(o.normalize[1]),
            "--normalize needs MEAN,STD with STD > 0 (Fashion-MNIST's published values: 0.2860,0.3530)");
    require(!data.tokens, "--normalize applies to image datasets only");
    const float mean = float(o.normalize[0]), inv = float(1.0 / o.normalize[1]);
    for (auto* b : {&data.train, &data.test})
      for (auto& v : b->inputs) v = (v - mean) * inv;
  }
  data.train = limit(data.train, o.train_limit);
  data.test = limit(data.test, o.test_limit);
  require(data.train.size() > 0, "the training set is empty");
  require(data.test.size() > 0, "the test set is empty");
  {
    std::set<std::int32_t> seen_labels(data.train.labels.begin(), data.train.labels.end());
    require(seen_labels.size() >= 2, fmt::format("the training set has {} class ({} examples): a classifier needs at "
                                                 "least two", seen_labels.size(), data.train.size()));
  }
  if (!data.tokens) {
    Shape train_shape = shape_of(data.train.inputs), test_shape = shape_of(data.test.inputs);
    train_shape.erase(train_shape.begin());
    test_shape.erase(test_shape.begin());
    require(train_shape == test_shape, fmt::format("training images are {} and test images {}: they must be the same "
                                                   "size", shape_str(train_shape), shape_str(test_shape)));
  }
  // a data-parallel run: each rank keeps its shard of the training and test sets
  // (records keep their ids, which key the rules fixed per record; positions only place them)
  const std::size_t whole_train = data.train.examples();
  std::vector<std::size_t> train_positions;
  if (comm) {
    train_positions = shard_positions(whole_train, *comm);
    data.train = data.train.select(train_positions);
    data.test = data.test.select(shard_positions(data.test.examples(), *comm));
  }
  if (model_reads_scattering(o.model)) {
    require(!data.tokens, o.model + " needs an image dataset (its input is the images' scattering transform)");
    require(o.augment_views == 0, "--augment-views does not apply to " + o.model +
                                      ": its features are computed once from the images, before training");
    // the transform is fixed and data-independent: computing it once is the same model, and costs no privacy
    const auto t_features = std::chrono::steady_clock::now();
    auto progress = [&](std::size_t done, std::size_t total) {
      if (!o.json_out && (done == total || done % 8192 < 128))
        fmt::print(stderr, "  scattering features: {} / {} images\n", done, total);
    };
    data.train.inputs = scattering_inputs(data.train.inputs, progress);
    data.test.inputs = scattering_inputs(data.test.inputs, progress);
    say(fmt::format("scattering features (J = 2, L = 8): {} train and {} test images to {} in {:.0f} s",
                    data.train.size(), data.test.size(), shape_str(shape_of(data.train.inputs)),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t_features).count()));
  }
  // ---- a private centre for the scattering features (docs/feature-centring.md): one Gaussian release,
  // made once and kept in the checkpoint; the trainer's ledger starts with it
  std::optional<ArrayT<float>> centre;
  std::vector<PriorRelease> released_before;
  if (o.centre_features > 0) {
    require(model_reads_scattering(o.model), "--centre-features applies to scatter-linear and scatter-cnn, not " + o.model);
    require(dp, "--centre-features belongs to private runs (a non-private run can centre on the exact mean itself)");
    const std::size_t dim = 7 * 7 * 81;
    if (resumed) {
      require(resumed->contains("feature_centre") && (*resumed)["feature_centre"].is_array() &&
                  (*resumed)["feature_centre"].size() == dim,
              "the checkpoint does not hold the run's feature centre (" + std::to_string(dim) + " values)");
      centre = ArrayT<float>::from_shape({7, 7, 81});
      for (std::size_t k = 0; k < dim; ++k) centre->data()[k] = (*resumed)["feature_centre"][k].get<float>();
    } else {
      const ArrayT<float> normalised = scattering_normalised(data.train.inputs);
      auto rng = make_private_rng(o.reproducible_noise, o.seed + 5);
      if (comm) share_generator(*comm, *rng);  // the ranks' rows are summed, then noised once, the same on every rank
      const std::vector<double> sum =
          privacy::noisy_clipped_sum(std::span<const float>(normalised.data(), normalised.size()), dim,
                                     std::sqrt(double(dim)), o.centre_features, *rng, comm.get());
      centre = ArrayT<float>::from_shape({7, 7, 81});
      for (std::size_t k = 0; k < dim; ++k) centre->data()[k] = float(sum[k] / double(whole_train));
      say(fmt::format("feature centre: the mean of the normalised features over {} images, noise multiplier {} "
                      "(accounted with the run)", whole_train, o.centre_features));
    }
    released_before.push_back({o.centre_features, double(dim)});
  }
  FastRng init_rng(o.seed);
  Activation act = parse_activation(o.activation);
  std::unique_ptr<ModelT<float>> model;
  if (o.model.rfind("onnx:", 0) == 0) {  // an imported model: its input and output shapes must fit the data
#if DPGRAD_HAVE_ONNX
    onnx::LoadOptions lo;
    lo.freeze = o.freeze;
    lo.dropout_seed = o.seed;
    auto m = onnx::load<float>(o.model.substr(5), lo);
    const onnx::InputSpec& in = m->input();
    Shape data_shape = data.tokens ? shape_of(data.train.tokens) : shape_of(data.train.inputs);
    data_shape.erase(data_shape.begin());
    require(in.tokens == data.tokens,
            fmt::format("{} reads {} but {} holds {}", o.model, in.tokens ? "token ids" : "float inputs", o.dataset,
                        data.tokens ? "token ids" : "images"));
    require(data_shape == in.sample_shape,
            fmt::format("{} reads examples of shape {} (input '{}'), {} gives {}{}", o.model, shape_str(in.sample_shape),
                        in.name, o.dataset, shape_str(data_shape),
                        data.tokens ? " (sequences of that length: export the model for it)" : ""));
    require(m->output_classes() == data.classes,
            fmt::format("{} outputs {} classes, {} has {} (select classes with --classes)", o.model, m->output_classes(),
                        o.dataset, data.classes));
    std::size_t frozen = 0;
    for (const auto& p : m->parameter_info()) frozen += p.frozen;
    say(fmt::format("{}: {} parameters ({} tensors), {} frozen tensors{}", o.model, m->parameter_count(),
                    m->parameters().size(), frozen, o.freeze.empty() ? "" : " (--freeze " + o.freeze + ")"));
    for (const auto& u : m->inexact_uses()) say("  no exact per-sample rule: " + u + " (naive and jl:K run it)");
    model = std::move(m);
#else
    throw std::invalid_argument("--model " + o.model + ": this dpgrad was built without ONNX (-Donnx)");
#endif
  } else if (model_reads_tokens(o.model)) {
    require(data.tokens, o.model + " needs a text dataset (spamassassin, text:PATH, synthetic-text)");
    // the output layer has one unit per class of the data
    if (o.model == "transformer") {
      TransformerOptions to;
      to.length = data.train.tokens.shape()[1];
      to.vocab = o.vocabulary;
      to.classes = data.classes;
      to.train_embedding = !o.frozen_embedding;
      model = make_transformer<float>(init_rng, to);
    } else {
      require(o.vocabulary == 8185, fmt::format("--vocabulary {}: {} has an embedding of 8185 rows; only the "
                                                "transformer takes another size", o.vocabulary, o.model));
      model = o.model == "bilstm598k" ? make_bilstm598k<float>(init_rng, data.classes)
              : o.model == "bigru"    ? make_bigru<float>(init_rng, 8185, 64, 64, data.classes)
                                      : make_model<float>(o.model, init_rng, act);
    }
  } else {
    require(!data.tokens, o.model + " needs an image dataset; use bilstm598k or bigru for text");
    std::size_t in = data.train.inputs.size() / data.train.size();
    if (o.model == "logreg") model = make_mlp<float>({in, data.classes}, act, init_rng);
    else if (o.model == "mlp") model = make_mlp<float>({in, o.hidden, data.classes}, act, init_rng);
    else if (o.model == "scatter-linear") model = make_scatter_linear<float>(init_rng, data.classes, centre ? &*centre : nullptr);
    else if (o.model == "scatter-cnn") model = make_scatter_cnn<float>(act, init_rng, data.classes, centre ? &*centre : nullptr);
    else model = make_model<float>(o.model, init_rng, act);
  }
  const std::size_t n = whole_train;
  require(o.batch >= 1 && o.batch <= n, fmt::format("--batch-size must be in [1, {}], got {}", n, o.batch));
  data::ImageAugment augment;
  if (o.augment_views > 0) {
    require(!data.tokens && data.train.inputs.dimension() >= 3,
            "--augment-views needs an image dataset (its views are flipped and shifted images)");
    augment.views = o.augment_views;
    augment.shift = o.augment_shift;
    augment.flip = !o.augment_no_flip;
    augment.key = dp && !o.reproducible_noise ? data::random_hash_key() : data::hash_key_from_seed(o.seed);
    if (comm) comm->broadcast(augment.key.data(), augment.key.size(), 0);  // one key for the run
  }

  // ---- the run: sampler, accountant, calibration, budget stop, generators, checkpoints (PrivateTrainer)
  auto params = model->parameters();
  std::unique_ptr<OptimizerT<float>> base;
  AdamT<float>* adam = nullptr;
  if (base_name == "adam" || base_name == "adambc") {
    auto a = std::make_unique<AdamT<float>>(params, *o.lr, 0.9, 0.999, 1e-8, o.weight_decay);
    adam = a.get();
    base = std::move(a);
  } else {
    base = std::make_unique<SgdT<float>>(params, *o.lr, base_name == "momentum" ? o.momentum : 0.0, o.weight_decay);
  }
  const auto lr_scales = apply_lr_scale(*base, o.lr_scale);
  PrivateTrainingConfigT<float> cfg;
  cfg.non_private = !dp;
  cfg.clip_norm = o.clip_norm;
  cfg.noise_multiplier = o.noise_multiplier;
  cfg.target_epsilon = o.target_epsilon;
  cfg.delta = o.delta;
  cfg.allow_no_noise = o.allow_no_noise;
  cfg.epochs = o.epochs;
  cfg.max_steps = std::max(0L, o.max_steps);
  cfg.batch_size = o.batch;
  cfg.physical_batch_size = o.physical_batch;
  if (dp) {
    cfg.sampling = o.sampler == "poisson" ? Sampling::poisson
                   : o.sampler == "shuffle" ? Sampling::shuffle
                   : o.sampler == "fixed"   ? Sampling::fixed
                                            : throw std::invalid_argument("unknown --sampler '" + o.sampler +
                                                                          "' (poisson, shuffle, fixed)");
    cfg.epoch_fraction = o.epoch_fraction;
    cfg.clipping = make_clip_strategy<float>(o.strategy, double(o.batch));
    cfg.accounting = accounting_from_string(o.accountant);
  }
  cfg.sat_rho = o.sat_rho;
  cfg.ema = o.ema;
  cfg.lr_final = o.schedule == "cosine" ? o.lr_final : -1.0;
  if (o.augment_views > 0)
    cfg.transform = [&augment](const BatchT<float>& b, long step) {
      return data::augment_images(b, augment, std::uint64_t(step));
    };
  cfg.reproducible_noise = o.reproducible_noise;
  cfg.seed = o.seed;
  cfg.communicator = comm;
  cfg.positions = std::move(train_positions);
  cfg.released_before = released_before;
  if (!resumed && dp && !o.noise_multiplier)
    say(fmt::format("calibrating the noise multiplier for epsilon {} ({})...", *o.target_epsilon,
                    o.accountant.empty() ? privacy::default_accountant(o.sampler) : o.accountant));
  std::optional<std::filesystem::path> resume_from;
  if (resumed) resume_from = o.checkpoint_dir;
  PrivateTrainerT<float> trainer(*model, *base, data.train, cfg, resume_from);
  DPOptimizerT<float>& opt = trainer.dp_optimizer();
  const Sampler& sampler = trainer.sampler();
  const double q = trainer.sampling_rate(), sigma = trainer.noise_multiplier(), delta = trainer.delta();
  const long per_epoch = trainer.steps_per_epoch(), total_steps = trainer.total_steps();
  if (dp) o.accountant = trainer.accountant_name();
  const privacy::Accountant* accountant = trainer.accountant();
  const ClipStrategyT<float>& strategy = trainer.clipping();
  if (trainer.steps_cut_for_budget() > 0)
    say(fmt::format("training stops after {} of {} steps: more would exceed epsilon {}", total_steps,
                    total_steps + trainer.steps_cut_for_budget(), *o.target_epsilon));
  // what is shown of the run: only what epsilon covers, unless asked (and then labelled)
  const bool is_private = dp && trainer.is_private();
  const bool show_loss = !dp || o.report_train_loss;
  const std::string loss_key = dp ? "train_loss_not_covered_by_epsilon" : "train_loss";
  const std::string loss_label = dp ? " (not covered by epsilon)" : "";
  const std::string not_private_note =
      dp && sigma > 0 && opt.noise_reproducible() ? fmt::format(" ({})", kNotPrivateReproducible) : "";
  if (base_name == "adambc") adam->correct_noise(opt.noise_variance(), o.adambc_floor);

  // ---- header
  say(fmt::format("dpgrad-train: {} ({} parameters) on {}", model->name(), model->parameter_count(), data.description));
  const std::string schedule =
      o.schedule == "cosine" ? fmt::format("cosine down to {}", o.lr_final) : o.schedule;
  say(fmt::format("  optimizer {} lr {} ({}), batch {} ({} sampling, q = {:.6g}), {} steps ({} per epoch)", o.optimizer,
                  *o.lr, schedule, o.batch, sampler.name(), q, total_steps, per_epoch));
  if (dp) {
    say(fmt::format("  clipping {} at C = {}, noise multiplier {:.6g}{}, accountant {} ({} neighbours), delta {:g}",
                    strategy.name(), o.clip_norm, sigma, trainer.calibrated() ? " (calibrated)" : "", o.accountant,
                    privacy::to_string(accountant->neighbouring()), delta));
    if (sigma == 0) say("  WARNING: noise multiplier 0: this run is NOT private; no epsilon is reported");
    say(fmt::format("  noise, sampling and directions: {}", trainer.noise_generator()));
    if (opt.noise_reproducible())
      say(fmt::format("  WARNING: --reproducible-noise: this run is {}", kNotPrivateReproducible));
    if (o.report_train_loss)
      say("  the training loss is reported: it is computed from the private data without noise and is NOT covered "
          "by epsilon");
  } else {
    say("  non-private training: no clipping, no noise, no privacy guarantee");
  }
  if (comm)
    say(fmt::format("  data-parallel: {}, {} engine thread{} each; each clips its shard of every batch, each "
                    "coordinate is noised once (docs/distributed.md)", comm->describe(), blas::threads(),
                    blas::threads() == 1 ? "" : "s"));
  if (o.augment_views > 0)
    say(fmt::format("  augmentation multiplicity: {} random views per example (shifts up to {} px{}), each example's "
                    "loss the mean over its views, one clipped gradient per example", augment.views, augment.shift,
                    augment.flip ? ", left-right flips" : ""));
  if (base_name == "adambc")
    say(fmt::format("  Adam's second moment less the noise's variance {:.4g} per coordinate (DP-AdamBC, floor {:g}; "
                    "post-processing, no privacy cost)", opt.noise_variance(), o.adambc_floor));
  if (!lr_scales.empty())
    say(fmt::format("  learning rate per layer: {} (lr times these factors; no privacy cost)", fmt::join(lr_scales, ", ")));
  if (o.ema > 0)
    say(fmt::format("  evaluating the exponential moving average of the parameters (decay {}; post-processing, "
                    "no privacy cost)", o.ema));
  if (o.sat_rho > 0)
    say(fmt::format("  sharpness-aware (DP-SAT): gradients taken {} along the previous step's noised gradient "
                    "(post-processing, no privacy cost)", o.sat_rho));

  // ---- checkpoints: the trainer's state, and the program's history beside it
  long step = trainer.steps_done();
  double loss_sum = 0, seconds_before = 0, communication = 0, waiting = 0, stepping = 0;
  std::size_t seen = 0;
  json history = json::array();
  if (resumed) {
    loss_sum = resumed->at("epoch_loss_sum").get<double>();
    seen = resumed->at("epoch_seen").get<std::size_t>();
    history = resumed->at("history");
    seconds_before = resumed->at("seconds").get<double>();
    say(fmt::format("  resumed from {} at step {} of {}{}", o.checkpoint_dir, step, total_steps,
                    dp && sigma > 0 ? ", epsilon so far " + fmt_eps(trainer.epsilon()) : std::string()));
  }
  auto elapsed = [&] { return seconds_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto save = [&] {
    if (o.checkpoint_dir.empty()) return;
    json extra = {{"options", run_options_json(o)}, {"epoch_loss_sum", loss_sum}, {"epoch_seen", seen},
                  {"history", history}, {"seconds", elapsed()}};
    if (dp) extra["private"] = is_private;
    if (centre) extra["feature_centre"] = std::vector<float>(centre->begin(), centre->end());
    if (!not_private_note.empty()) extra["privacy_note"] = kNotPrivateReproducible;
    trainer.save(o.checkpoint_dir, extra);
  };

  // ---- training
  Progress progress(o.json_out);
  double eps = dp && sigma > 0 ? trainer.epsilon() : INFINITY;
  json summary = history.empty() ? json::object() : history.back();
  const long epochs_total = (total_steps + per_epoch - 1) / per_epoch;
  for (long epoch = step / per_epoch + 1; step < total_steps; ++epoch) {
    auto te = std::chrono::steady_clock::now();
    const long first = step - (epoch - 1) * per_epoch;  // > 0 when resuming inside an epoch
    long in_epoch = std::min(per_epoch, total_steps - (epoch - 1) * per_epoch);
    for (long s = first; s < in_epoch; ++s) {
      const auto ts = std::chrono::steady_clock::now();
      StepStats st = trainer.step();
      stepping += std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
      communication += st.communication_seconds;
      waiting += st.wait_seconds;
      ++step;
      if (show_loss) loss_sum += st.loss * double(st.batch);
      // counts and throughput of a private run use the expected batch size: the real one is private
      seen += dp ? std::size_t(std::llround(trainer.expected_batch_size())) : st.batch;
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - te).count();
      progress.update(s + 1, in_epoch, show_loss && seen ? std::optional<double>(loss_sum / double(seen)) : std::nullopt,
                      loss_label, double(seen) / std::max(secs, 1e-9) * double(s + 1 - first) / double(s + 1),
                      secs / double(s + 1 - first) * double(in_epoch - s - 1), epoch);
      // periodic checkpoints inside an epoch; the epoch's last step is saved after its evaluation
      if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0 && s + 1 < in_epoch) save();
    }
    const double acc = trainer.evaluate_sharded(data.test).accuracy;
    if (dp && sigma > 0) eps = trainer.epsilon();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - te).count();
    json row = {{"epoch", epoch}, {"steps", step}, {"test_accuracy", acc}, {"seconds", secs}};
    if (show_loss) row[loss_key] = seen ? loss_sum / double(seen) : 0.0;
    loss_sum = 0;
    seen = 0;
    if (dp) {
      row["private"] = is_private;
      if (!not_private_note.empty()) row["privacy_note"] = kNotPrivateReproducible;
      row["epsilon"] = eps_json(eps);
      row["delta"] = delta;
      row["accountant"] = o.accountant;
      row["neighbouring"] = privacy::to_string(accountant->neighbouring());
    }
    std::vector<std::pair<std::string, double>> snr;
    if (o.layer_snr) {
      snr = layer_snr(opt.gradient_energy());
      opt.reset_gradient_energy();
      row["layer_snr"] = json::object();
      for (const auto& [layer, r] : snr) row["layer_snr"][layer] = r;
    }
    summary = row;
    history.push_back(row);
    // Checkpoint before anything of this epoch is released: a resumed run re-draws the steps after its checkpoint
    // with fresh noise, so none of them may have been shown (docs/privacy-by-default.md).
    save();
    if (o.json_out) fmt::print("{}\n", row.dump());
    else
      fmt::print("epoch {}/{}: {}test accuracy {:.2f}%{}{}, {:.1f}s\n", epoch, epochs_total,
                 show_loss ? fmt::format("train loss{} {:.4f}, ", loss_label, row[loss_key].get<double>()) : "",
                 100 * acc,
                 dp ? fmt::format(", epsilon {} (delta {:g}, {}, {})", fmt_eps(eps), delta, o.accountant,
                                  privacy::to_string(accountant->neighbouring()))
                    : "",
                 not_private_note, secs);
    if (o.layer_snr && !o.json_out) {
      std::vector<std::string> parts;
      for (const auto& [layer, r] : snr) parts.push_back(fmt::format("{} {:.3g}", layer, r));
      fmt::print("  signal/noise per coordinate of the noised gradient: {}\n", fmt::join(parts, ", "));
    }
    std::fflush(stdout);
  }
  double total_s = elapsed();
  summary["final"] = true;
  summary["model"] = model->name();
  summary["optimizer"] = o.optimizer;
  summary["private"] = is_private;
  if (!not_private_note.empty()) summary["privacy_note"] = kNotPrivateReproducible;
  summary["total_seconds"] = total_s;
  summary["processes"] = trainer.processes();
  summary["threads"] = blas::threads();
  summary["step_seconds"] = stepping;  // in trainer.step(), this session
  if (comm) {
    summary["communication_seconds"] = communication;  // summing and sending gradients
    summary["wait_seconds"] = waiting;                 // waiting for the slowest rank to finish clipping
  }
  if (dp) {
    summary["clip_strategy"] = strategy.name();
    summary["noise_multiplier"] = sigma;
    summary["sampling_rate"] = q;
    summary["noise_generator"] = trainer.noise_generator();
    if (centre) summary["centre_noise_multiplier"] = o.centre_features;  // the release before training
  }
  if (!o.checkpoint_dir.empty()) summary["checkpoint"] = CheckpointDir(o.checkpoint_dir).latest_step();
  if (!o.plot.empty()) {
    std::string title = fmt::format("{} on {}, {}", model->name(), o.dataset, o.optimizer);
    if (dp && sigma > 0)
      title += fmt::format(" ({}, sigma {:.4g}); epsilon: {} at delta {:g}, {}", strategy.name(), sigma, o.accountant,
                           delta, privacy::to_string(accountant->neighbouring()));
    plot_history(o.plot, history, dp && sigma > 0, title);
    say("plot written to " + o.plot);
  }
#if DPGRAD_HAVE_ONNX
  if (!o.export_onnx.empty() && (!comm || comm->rank() == 0)) {
    onnx::save(*model, o.export_onnx);
    summary["exported"] = o.export_onnx;
    say("trained model written to " + o.export_onnx + " (the file's graph with the trained weights)");
  }
#endif
  if (o.json_out) fmt::print("{}\n", summary.dump());
  else
    fmt::print("final: test accuracy {:.2f}%{} after {} steps in {:.1f}s{}\n", 100 * summary["test_accuracy"].get<double>(),
               dp ? (sigma > 0 ? fmt::format(" at epsilon {} (delta {:g}, {} accountant, {} neighbours){}", fmt_eps(eps),
                                             delta, o.accountant, privacy::to_string(accountant->neighbouring()),
                                             not_private_note)
                               : std::string(" (NOT private: no noise)"))
                  : " (non-private)",
               step, total_s,
               comm ? fmt::format(" on {} ({:.1f}s of it summing and sending gradients, {:.1f}s waiting for the "
                                  "slowest rank)", comm->describe(), communication, waiting)
                    : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  std::shared_ptr<Communicator> comm;
  std::optional<QuietRank> quiet;
  // Under mpirun or srun: one run over every process, rank 0 printing (docs/distributed.md).
  // A rank that fails ends the whole job: the others would wait for it forever.
  auto fail = [&](const std::string& message) {
    quiet.reset();  // every rank's error is shown
    const std::string where = comm && comm->size() > 1 ? fmt::format(" (rank {})", comm->rank()) : "";
    fmt::print(stderr, "dpgrad-train: error{}: {}\n", where, message);
    std::fflush(stderr);
    if (comm && comm->size() > 1) comm->abort(2);
    return 2;
  };
  try {
    comm = world_communicator();
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  if (comm && comm->rank() != 0) quiet.emplace();
  ParsedOptions parsed = parse_train_options(argc, argv);
  if (parsed.exit_code) return *parsed.exit_code;
  Options& o = parsed.options;
  try {
    json resumed;
    if (o.resume) resumed = restore_run_options(o, parsed.given);
    return run(o, o.resume ? &resumed : nullptr, comm);
  } catch (const std::bad_alloc&) {
    return fail("out of memory; lower --batch-size, or use --clip-strategy ghost (or microbatch), whose per-sample "
                "work takes the least memory");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
