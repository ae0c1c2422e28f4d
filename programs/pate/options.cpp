// dpgrad-pate's options (programs/pate/options.hpp).
#include "programs/pate/options.hpp"

#include <cmath>
#include <stdexcept>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "engine/check.hpp"
#include "layers/models.hpp"
#include "programs/cli.hpp"

namespace dpgrad::pate {

namespace {

void check_model(const std::string& option, const std::string& name) {
  require(!model_reads_tokens(name), option + " " + name + " reads text; PATE here trains image classifiers");
  bool known = name == "logreg";
  for (const auto& m : model_names()) known = known || m == name;
  require(known, fmt::format("unknown {} '{}'", option, name));
}

void check(const Options& o) {
  require(o.dataset == "fashion-mnist" || o.dataset == "mnist" || o.dataset == "synthetic" ||
              o.dataset.rfind("idx:", 0) == 0,
          "unknown --dataset '" + o.dataset + "' (expected fashion-mnist, mnist, idx:PATH or synthetic)");
  require(o.teachers >= 1 && o.teachers <= 100000, fmt::format("--teachers must be in [1, 100000], got {}", o.teachers));
  require(o.pool >= 1, fmt::format("--pool must be >= 1, got {}", o.pool));
  require(o.queries >= 1 && o.queries <= o.pool,
          fmt::format("--queries must be in [1, --pool = {}], got {}", o.pool, o.queries));
  require(o.max_answers >= 1, fmt::format("--max-answers must be >= 1, got {}", o.max_answers));
  require(std::isfinite(o.threshold) && o.threshold >= 0,
          fmt::format("--threshold must be >= 0 and finite, got {}", o.threshold));
  require(o.threshold <= double(o.teachers),
          fmt::format("--threshold {} is above the number of teachers ({}): no vote count can reach it", o.threshold,
                      o.teachers));
  // the noise grid takes standard deviations in [2^-900, 2^900] (docs/noise.md); like --sigma, below 1e6
  require(o.sigma1 == 0 || (o.sigma1 >= 1e-6 && o.sigma1 < 1e6),
          fmt::format("--sigma1 must be 0 (no threshold test) or in [1e-6, 1e6), got {}", o.sigma1));
  require(o.sigma.has_value() != o.target_epsilon.has_value(),
          "give one of --sigma (GNMax's noise) and --target-epsilon (calibrates it), not both");
  if (o.sigma)
    require(std::isfinite(*o.sigma) && *o.sigma > 0 && *o.sigma < 1e6,
            fmt::format("--sigma must be > 0 and below 1e6 (PATE always adds noise), got {}", *o.sigma));
  if (o.target_epsilon)
    require(std::isfinite(*o.target_epsilon) && *o.target_epsilon > 0,
            fmt::format("--target-epsilon must be > 0 and finite, got {}", *o.target_epsilon));
  require(o.delta > 0 && o.delta < 1, fmt::format("--delta must be in (0, 1), got {}", o.delta));
  check_model("--teacher-model", o.teacher_model);
  check_model("--student-model", o.student_model);
  for (auto [name, v] : {std::pair{"--teacher-epochs", o.teacher_epochs}, std::pair{"--student-epochs", o.student_epochs}})
    require(std::isfinite(v) && v > 0 && v <= 10000, fmt::format("{} must be in (0, 10000], got {}", name, v));
  for (auto [name, v] : {std::pair{"--teacher-lr", o.teacher_lr}, std::pair{"--student-lr", o.student_lr}})
    require(std::isfinite(v) && v > 0, fmt::format("{} must be > 0 and finite, got {}", name, v));
  for (auto [name, v] : {std::pair{"--teacher-batch", o.teacher_batch}, std::pair{"--student-batch", o.student_batch}})
    require(v >= 1 && v <= 65536, fmt::format("{} must be in [1, 65536], got {}", name, v));
  require(o.pseudo_confidence == 0 || (o.pseudo_confidence > 0 && o.pseudo_confidence <= 1),
          fmt::format("--pseudo-confidence must be in (0, 1], or 0 for none, got {}", o.pseudo_confidence));
}

}  // namespace

Parsed parse_pate_options(int argc, const char* const* argv) {
  Parsed p;
  Options& o = p.options;
  double sigma = 0, target = 0;
  CLI::App app{"dpgrad-pate: private aggregation of teacher ensembles (Papernot et al. 2017, 2018): teachers trained "
               "on disjoint parts of the private data label a public pool through Confident-GNMax, and a student "
               "learns from those labels"};
  name_cli_errors(app, "dpgrad-pate");
  app.add_option("--dataset", o.dataset, "fashion-mnist, mnist, idx:PATH or synthetic: its training set is private, "
                                         "its test set the public pool then the evaluation images")
      ->capture_default_str();
  app.add_option("--teachers", o.teachers, "teachers, each on its own part of the private data")
      ->check(whole_number())->capture_default_str();
  app.add_option("--pool", o.pool, "the first POOL test images are the public, unlabelled pool; the rest evaluate the student")
      ->check(whole_number())->capture_default_str();
  app.add_option("--queries", o.queries, "pool images the teachers are asked about")
      ->check(whole_number())->capture_default_str();
  app.add_option("--max-answers", o.max_answers,
                 "answering stops after this many answers; epsilon is charged for this many (at most --queries)")
      ->check(whole_number())->capture_default_str();
  app.add_option("--threshold", o.threshold, "T: a query is answered only if its top vote count plus N(0, sigma1^2) reaches T")
      ->check(real_number())->capture_default_str();
  app.add_option("--sigma1", o.sigma1, "noise of the threshold test (0: plain GNMax, every query answered)")
      ->check(real_number())->capture_default_str();
  auto* sigma_opt = app.add_option("--sigma", sigma, "GNMax's noise on each vote count (sigma2)")->check(real_number());
  auto* target_opt = app.add_option("--target-epsilon", target,
                                    "calibrate --sigma so that epsilon stays below this even if every query is answered (default 3)")
                         ->check(real_number());
  app.add_option("--delta", o.delta, "delta of the reported epsilon")->check(real_number())->capture_default_str();
  app.add_option("--teacher-model", o.teacher_model, "model of each teacher")->capture_default_str();
  app.add_option("--student-model", o.student_model, "model of the student")->capture_default_str();
  app.add_option("--teacher-epochs", o.teacher_epochs, "epochs over each teacher's part")->check(real_number())->capture_default_str();
  app.add_option("--teacher-lr", o.teacher_lr, "teachers' SGD learning rate (momentum 0.9)")->check(real_number())->capture_default_str();
  app.add_option("--teacher-batch", o.teacher_batch, "teachers' batch size")->check(whole_number())->capture_default_str();
  app.add_option("--student-epochs", o.student_epochs, "student's epochs")->check(real_number())->capture_default_str();
  app.add_option("--student-lr", o.student_lr, "student's SGD learning rate (momentum 0.9)")->check(real_number())->capture_default_str();
  app.add_option("--student-batch", o.student_batch, "student's batch size")->check(whole_number())->capture_default_str();
  app.add_option("--pseudo-confidence", o.pseudo_confidence,
                 "the student labels the unanswered pool images it predicts with at least this probability, then "
                 "trains again (public images: no privacy cost); 0: off")
      ->check(real_number())->capture_default_str();
  app.add_option("--seed", o.seed, "seed of initialisation and data order (public randomness)")
      ->check(whole_number())->capture_default_str();
  app.add_flag("--reproducible-noise", o.reproducible_noise,
               "aggregation noise and the teachers' partition key from --seed, so that results repeat: NOT private "
               "(the noise can be recomputed from the seed); default: the secure generator");
  app.add_flag("--show-data-dependent-epsilon", o.show_data_dependent,
               "also print the data-dependent epsilon of Papernot et al. 2018: it is computed from the teachers' "
               "private vote counts, so showing it LEAKS information about the private data that no epsilon covers "
               "(for research on the analysis only)");
  app.add_flag("--json", o.json_out, "print one JSON object");
  p.exit_code = parse_arguments(app, argc, argv);
  if (p.exit_code) return p;
  if (sigma_opt->count()) o.sigma = sigma;
  if (target_opt->count()) o.target_epsilon = target;
  if (!o.sigma && !o.target_epsilon) o.target_epsilon = 3.0;
  check(o);
  return p;
}

}  // namespace dpgrad::pate
