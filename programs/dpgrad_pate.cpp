// dpgrad-pate: PATE end to end (docs/pate.md). Teachers trained non-privately
// on disjoint parts of the private training set vote on a public, unlabelled
// pool (the first --pool test images); Confident-GNMax answers some queries;
// a student learns from the answers and is evaluated on the remaining test
// images. The released epsilon is data-independent; the data-dependent one of
// Papernot et al. 2018 is computed from the private votes and shown only when
// asked for by name (--show-data-dependent-epsilon), labelled as leaking.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <numeric>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "data/datasets.hpp"
#include "data/idx.hpp"
#include "engine/check.hpp"
#include "engine/communicator.hpp"
#include "engine/random.hpp"
#include "engine/runtime.hpp"
#include "layers/models.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/pate/teachers.hpp"
#include "optim/run/private_trainer.hpp"
#include "privacy/accountant.hpp"
#include "privacy/pate.hpp"
#include "programs/cli.hpp"
#include "programs/pate/options.hpp"

using namespace dpgrad;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::vector<std::size_t> range(std::size_t begin, std::size_t end) {
  std::vector<std::size_t> r(end - begin);
  std::iota(r.begin(), r.end(), begin);
  return r;
}

/// A model by name for images of `in` values and `classes` classes.
std::unique_ptr<ModelT<float>> image_model(const std::string& name, std::size_t in, std::size_t classes, Rng& rng) {
  if (name == "logreg") return make_mlp<float>({in, classes}, Activation::relu, rng);
  if (name == "mlp") return make_mlp<float>({in, 256, classes}, Activation::relu, rng);
  if (name == "scatter-linear") return make_scatter_linear<float>(rng, classes);
  if (name == "scatter-cnn") return make_scatter_cnn<float>(Activation::tanh, rng, classes);
  return make_model<float>(name, rng);
}

int run(const pate::Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto say = line_printer(o.json_out);

  // ---- data: the private training set, the public pool and the evaluation images
  data::DataSplit data = data::load_dataset(o.dataset);
  require(!data.tokens, "dpgrad-pate needs an image dataset");
  const std::size_t n_train = data.train.examples(), n_test = data.test.examples();
  require(n_train > 0, "the training set is empty");
  require(std::size_t(o.teachers) <= n_train,
          fmt::format("--teachers {} is more than the {} training records: every teacher needs records of its own",
                      o.teachers, n_train));
  require(std::size_t(o.pool) < n_test, fmt::format("--pool {} leaves no test images to evaluate the student (the "
                                                    "test set has {})", o.pool, n_test));
  const std::size_t classes = data.classes;
  BatchT<float> pool = data.test.select(range(0, std::size_t(o.pool)));
  BatchT<float> held_out = data.test.select(range(std::size_t(o.pool), n_test));
  BatchT<float>& train = data.train;

  // ---- partition and privacy plan, before any training
  const bool reproducible = o.reproducible_noise;
  const HashKey key = reproducible ? hash_key_from_seed(o.seed, "dpgrad-pate") : random_hash_key();
  const auto parts = pate_partition(train.ids, key, std::size_t(o.teachers));
  for (std::size_t t = 0; t < parts.size(); ++t)
    require(!parts[t].empty(), fmt::format("teacher {} got no records: use fewer teachers (--teachers {} for {} records)",
                                           t, o.teachers, n_train));
  // answers stop at the cap (all queries without a threshold test): the plan every run stays within
  const long answers_cap = o.sigma1 > 0 ? std::min(o.max_answers, o.queries) : o.queries;
  const double sigma2 = o.sigma ? *o.sigma
                                : privacy::calibrate_pate_sigma(o.sigma1, o.queries, answers_cap, classes,
                                                                *o.target_epsilon, o.delta);
  // the run's ledger holds its plan: every possible run spends at most this (privacy/pate.hpp)
  privacy::PateAccountant accountant;
  accountant.record({o.sigma1, sigma2, o.queries, answers_cap});
  // the tighter of two sound bounds on the plan's epsilon, labelled with the one that gave it (privacy/pate.hpp)
  const privacy::PateEpsilon released = privacy::pate_epsilons(accountant, classes, o.delta);
  const double epsilon = released.epsilon;
  const std::string bound = "data-independent " + released.by;
  require(std::isfinite(epsilon), fmt::format("sigma {} over {} queries proves no finite epsilon at delta {}", sigma2,
                                              o.queries, o.delta));
  // the aggregator's noise, checked before any teacher trains (docs/noise.md)
  for (const auto& [flag, s] : {std::pair{"--sigma1", o.sigma1}, std::pair{"--sigma", sigma2}})
    require(s == 0 || (s >= 0x1.0p-900 && s <= 0x1.0p900),
            fmt::format("{} {} is outside the noise grid's range [2^-900, 2^900] (docs/noise.md)", flag, s));
  say(fmt::format("dpgrad-pate: {} teachers ({}) on {}", o.teachers, o.teacher_model, data.description));
  say(fmt::format("  up to {} queries of a public pool of {} images, up to {} answers; Confident-GNMax T = {}, "
                  "sigma1 = {}, sigma2 = {:.6g}{}", o.queries, o.pool, answers_cap, o.threshold, o.sigma1, sigma2,
                  o.sigma ? "" : " (calibrated)"));
  say(fmt::format("  epsilon {} (delta {:g}, {}, add/remove-one neighbours): what any run with this plan spends at "
                  "most (RDP gives {}, PLD {})", privacy::format_epsilon(epsilon), o.delta, bound,
                  privacy::format_epsilon(released.rdp), privacy::format_epsilon(released.pld)));
  std::unique_ptr<Rng> noise = make_private_rng(reproducible, o.seed);
  say(fmt::format("  aggregation noise and partition key: {}", noise->describe()));
  if (reproducible) say(fmt::format("  WARNING: --reproducible-noise: this run is {}", kNotPrivateReproducible));

  // ---- features: the scattering transform is fixed and data-independent
  auto features = [&](const std::string& model, const BatchT<float>& b) {
    if (!model_reads_scattering(model)) return b;
    BatchT<float> f = b;
    f.inputs = scattering_inputs(b.inputs);
    return f;
  };
  const auto t_features = std::chrono::steady_clock::now();
  const BatchT<float> teacher_train = features(o.teacher_model, train);
  const BatchT<float> teacher_pool = features(o.teacher_model, pool.select(range(0, std::size_t(o.queries))));
  const BatchT<float> student_pool = features(o.student_model, pool);
  const BatchT<float> student_eval = features(o.student_model, held_out);
  if (model_reads_scattering(o.teacher_model) || model_reads_scattering(o.student_model))
    say(fmt::format("  scattering features in {:.0f} s", seconds_since(t_features)));

  // ---- teachers, one after another
  auto maker = [classes](const std::string& name, const BatchT<float>& b) {
    const std::size_t in = b.inputs.size() / std::max<std::size_t>(1, b.examples());
    return [name, in, classes](Rng& rng) { return image_model(name, in, classes, rng); };
  };
  PateTraining teacher_how{maker(o.teacher_model, teacher_train), o.teacher_epochs, std::size_t(o.teacher_batch),
                           o.teacher_lr, 0.9, o.seed};
  const auto t_teachers = std::chrono::steady_clock::now();
  const ArrayT<double> votes = pate_teacher_votes(
      teacher_how, teacher_train, parts, teacher_pool, classes, [&](std::size_t done, std::size_t total) {
        if (!o.json_out && (done == total || done % 25 == 0))
          fmt::print(stderr, "  teachers: {} / {} trained ({:.0f} s)\n", done, total, seconds_since(t_teachers));
      });
  const double teacher_seconds = seconds_since(t_teachers);

  // ---- aggregation: the only use of the private data that is released
  privacy::PateDataDependent dependent;
  std::vector<std::size_t> answered_rows;
  std::vector<std::int32_t> answers;
  std::size_t correct_answers = 0;
  std::size_t asked = 0;
  for (std::size_t i = 0; i < std::size_t(o.queries) && long(answers.size()) < answers_cap; ++i, ++asked) {
    const std::span<const double> v(votes.data() + i * classes, classes);
    const std::optional<int> label = privacy::confident_gnmax(v, o.threshold, o.sigma1, sigma2, *noise);
    if (o.show_data_dependent) dependent.add(v, o.threshold, o.sigma1, sigma2, label.has_value());
    if (!label) continue;
    answered_rows.push_back(i);
    answers.push_back(*label);
    if (*label == pool.labels[i]) ++correct_answers;
  }
  const long answered = long(answers.size());
  const double epsilon_dependent = o.show_data_dependent ? dependent.epsilon(o.delta) : NAN;
  say(fmt::format("aggregation: {} of {} queries answered{}; {:.2f}% of the answers are the true label", answered,
                  asked, answered == answers_cap && asked < std::size_t(o.queries) ? " (the cap)" : "",
                  answered ? 100.0 * double(correct_answers) / double(answered) : 0.0));

  // ---- the student: answered queries, then its own confident labels on the rest of the pool
  nlohmann::json student_json;
  double student_accuracy = std::nan("");
  std::size_t pseudo = 0;
  // A student whose parameters diverge (DivergedError) learnt from released answers only: the run stops, shows
  // nothing of that student, and says what the answers cost.
  auto stop_diverged = [&](const DivergedError& e) {
    const std::string message =
        fmt::format("the student: {}; the run stops and shows nothing of it; epsilon spent {} (delta {:g}, "
                    "{}, add/remove-one neighbours) by the {} answers released to it",
                    e.what(), privacy::format_epsilon(epsilon), o.delta, bound, answered);
    if (o.json_out) {
      nlohmann::json j = {{"program", "dpgrad-pate"}, {"diverged", true},   {"error", message},
                          {"epsilon", epsilon},       {"delta", o.delta},   {"answered", answered}};
      fmt::print("{}\n", j.dump());
    }
    throw std::runtime_error(message);
  };
  if (answered > 0) try {
    PateTraining student_how{maker(o.student_model, student_pool), o.student_epochs, std::size_t(o.student_batch),
                             o.student_lr, 0.9, o.seed + 1000003};
    BatchT<float> labelled = student_pool.select(answered_rows);
    labelled.labels = answers;
    std::vector<char> is_answered(student_pool.examples(), 0);
    for (std::size_t r : answered_rows) is_answered[r] = 1;
    BatchT<float> rest = student_pool.select([&] {
      std::vector<std::size_t> r;
      for (std::size_t i = 0; i < student_pool.examples(); ++i)
        if (!is_answered[i]) r.push_back(i);
      return r;
    }());
    BatchT<float> extended;
    pate_train(student_how, labelled, student_how.seed, [&](PrivateTrainer& trainer) {
      student_accuracy = trainer.evaluate(student_eval).accuracy;
      say(fmt::format("student on the {} answers: test accuracy {:.2f}% on {} held-out images", answered,
                      100 * student_accuracy, student_eval.examples()));
      if (o.pseudo_confidence == 0 || rest.examples() == 0) return;
      const ArrayT<float> out = trainer.predict(rest);
      std::vector<std::size_t> keep;
      std::vector<std::int32_t> labels;
      for (std::size_t i = 0; i < rest.examples(); ++i) {
        const float* z = out.data() + i * classes;
        const float top = *std::max_element(z, z + classes);
        double sum = 0;
        for (std::size_t k = 0; k < classes; ++k) sum += std::exp(double(z[k] - top));
        if (1.0 / sum >= o.pseudo_confidence) {
          keep.push_back(i);
          labels.push_back(std::int32_t(std::max_element(z, z + classes) - z));
        }
      }
      pseudo = keep.size();
      BatchT<float> more = rest.select(keep);
      more.labels = labels;
      extended = labelled;
      extended.inputs = xt::concatenate(xt::xtuple(labelled.inputs, more.inputs), 0);
      extended.labels.insert(extended.labels.end(), labels.begin(), labels.end());
      extended.ids.insert(extended.ids.end(), more.ids.begin(), more.ids.end());
    });
    if (pseudo > 0) {
      pate_train(student_how, extended, student_how.seed + 1, [&](PrivateTrainer& trainer) {
        student_accuracy = trainer.evaluate(student_eval).accuracy;
      });
      say(fmt::format("student with {} of its own labels on unanswered pool images (confidence >= {}): test accuracy "
                      "{:.2f}%", pseudo, o.pseudo_confidence, 100 * student_accuracy));
    }
  } catch (const DivergedError& e) {
    stop_diverged(e);
  }

  const double total_seconds = seconds_since(t0);
  say(fmt::format("final: student test accuracy {:.2f}% at epsilon {} (delta {:g}, {}, add/remove-one "
                  "neighbours) in {:.0f} s",
                  100 * student_accuracy, privacy::format_epsilon(epsilon), o.delta, bound, total_seconds));
  if (o.show_data_dependent)
    say(fmt::format("  data-dependent epsilon {} (Papernot et al. 2018, Theorem 6; --show-data-dependent-epsilon): "
                    "computed from the private votes, NOT releasable as it is: showing it leaks what no epsilon "
                    "covers", privacy::format_epsilon(epsilon_dependent)));
  if (reproducible) say(fmt::format("  WARNING: {}", kNotPrivateReproducible));
  if (o.json_out) {
    nlohmann::json j;
    j["program"] = "dpgrad-pate";
    j["dataset"] = data.description;
    j["teachers"] = o.teachers;
    j["teacher_model"] = o.teacher_model;
    j["student_model"] = o.student_model;
    j["queries"] = o.queries;
    j["max_answers"] = answers_cap;
    j["asked"] = asked;
    j["answered"] = answered;
    j["answer_accuracy"] = answered ? double(correct_answers) / double(answered) : 0.0;
    j["pseudo_labels"] = pseudo;
    j["student_test_accuracy"] = std::isfinite(student_accuracy) ? nlohmann::json(student_accuracy) : nlohmann::json();
    j["evaluation_images"] = student_eval.examples();
    j["threshold"] = o.threshold;
    j["sigma1"] = o.sigma1;
    j["sigma2"] = sigma2;
    j["sigma2_calibrated"] = !o.sigma.has_value();
    j["delta"] = o.delta;
    j["epsilon"] = std::isfinite(epsilon) ? nlohmann::json(epsilon) : nlohmann::json("inf");
    j["epsilon_bound"] = bound + " (released)";
    // both data-independent bounds; the released epsilon is the smaller
    j["epsilon_rdp"] = std::isfinite(released.rdp) ? nlohmann::json(released.rdp) : nlohmann::json("inf");
    j["epsilon_pld"] = std::isfinite(released.pld) ? nlohmann::json(released.pld) : nlohmann::json("inf");
    if (o.show_data_dependent) {
      j["epsilon_data_dependent"] = epsilon_dependent;
      j["epsilon_data_dependent_note"] =
          "computed from the private votes: NOT releasable as is; shown because --show-data-dependent-epsilon asked "
          "for it, it leaks what no epsilon covers";
    }
    j["neighbouring"] = "add/remove-one";
    j["private"] = !reproducible;
    j["noise_generator"] = noise->describe();
    j["accountant"] = accountant.to_json();
    j["teacher_seconds"] = teacher_seconds;
    j["seconds"] = total_seconds;
    fmt::print("{}\n", j.dump());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  use_best_blas_core("dpgrad-pate", argc, argv);
  if (const auto closed = guard_standard_output("dpgrad-pate")) return *closed;
  keep_freed_memory();  // reuse what each training step frees (docs/library.md, "Speed")
  try {
    require_single_process();
    const pate::Parsed parsed = pate::parse_pate_options(argc, argv);
    if (parsed.exit_code) return *parsed.exit_code;
    return finish_standard_output("dpgrad-pate", run(parsed.options));
  } catch (const std::invalid_argument& e) {
    std::cerr << "dpgrad-pate: " << e.what() << "\n";
    return 2;
  } catch (const data::DataError& e) {
    std::cerr << "dpgrad-pate: " << e.what() << "\n";
    return 2;
  } catch (const std::runtime_error& e) {
    std::cerr << "dpgrad-pate: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "dpgrad-pate: internal error: " << e.what() << "\n";
    return 1;
  }
}
