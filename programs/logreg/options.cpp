// dpgrad-logreg's options (programs/logreg/options.hpp).
#include "programs/logreg/options.hpp"

#include <cmath>
#include <stdexcept>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "engine/check.hpp"
#include "programs/cli.hpp"

namespace dpgrad::logreg {

namespace {

void check(const Options& o) {
  require(o.dataset == "fashion-mnist" || o.dataset == "synthetic",
          "unknown --dataset '" + o.dataset + "' (expected fashion-mnist or synthetic)");
  require(o.lambda > 0.0 && std::isfinite(o.lambda), fmt::format("--lambda must be > 0, got {}", o.lambda));
  require(!o.epsilons.empty(), "--epsilons needs at least one value");
  for (double e : o.epsilons)
    require(e > 0.0 && std::isfinite(e), fmt::format("every epsilon must be > 0 and finite, got {}", e));
  require(o.repeats >= 1, fmt::format("--repeats must be >= 1, got {}", o.repeats));
  require(std::isfinite(o.bias), "--bias must be finite");
  require(o.grad_tol >= 1e-13 && o.grad_tol <= 0.1,   // below 1e-13 rounding can stall Newton
          fmt::format("--grad-tol must be in [1e-13, 0.1], got {}", o.grad_tol));
  require(o.classes.size() == 2, fmt::format("--classes takes two labels A,B, got {}", o.classes.size()));

  if (o.dataset == "synthetic") {
    // Newton stores a (d, d) Hessian and the data (n, d) twice: keep both in memory.
    require(o.dim >= 1 && o.dim <= 4096, fmt::format("--dim must be in [1, 4096], got {}", o.dim));
    require(o.size >= 1 && o.size <= 10000000, fmt::format("--size must be in [1, 10^7], got {}", o.size));
    require(o.test_size >= 1 && o.test_size <= 10000000,
            fmt::format("--test-size must be in [1, 10^7], got {}", o.test_size));
    require((o.size + o.test_size) * o.dim <= 100000000,
            fmt::format("--dim times (--size + --test-size) must be <= 10^8, got {}", (o.size + o.test_size) * o.dim));
    require(o.separation >= 0.0 && std::isfinite(o.separation),
            fmt::format("--separation must be >= 0, got {}", o.separation));
  }
}

}  // namespace

Parsed parse_logreg_options(int argc, const char* const* argv) {
  Parsed p;
  Options& o = p.options;
  CLI::App app{"dpgrad-logreg: epsilon-DP logistic regression by output perturbation (Chaudhuri et al. 2011)"};
  name_cli_errors(app, "dpgrad-logreg");
  app.add_option("--dataset", o.dataset, "fashion-mnist or synthetic")->capture_default_str();
  app.add_option("--classes", o.classes, "fashion-mnist: classes A,B (A -> +1, B -> -1); 0,9: T-shirt vs ankle boot")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--dim", o.dim, "synthetic: dimension")->check(whole_number())->capture_default_str();
  app.add_option("--size", o.size, "synthetic: training examples")->check(whole_number())->capture_default_str();
  app.add_option("--test-size", o.test_size, "synthetic: test examples")->check(whole_number())->capture_default_str();
  app.add_option("--separation", o.separation, "synthetic: ||mu||, class means +-mu")->check(real_number())->capture_default_str();
  app.add_option("--lambda", o.lambda, "L2 regularisation (Delta = 2 / (N lambda))")->check(real_number())->capture_default_str();
  app.add_option("--bias", o.bias, "value of the constant feature (0: no offset)")->check(real_number())->capture_default_str();
  app.add_option("--grad-tol", o.grad_tol, "solver stops at ||grad|| below this")->check(real_number())->capture_default_str();
  app.add_option("--epsilons", o.epsilons, "comma-separated epsilons")->delimiter(',')->capture_default_str();
  app.add_option("--repeats", o.repeats, "noise draws per epsilon")->check(whole_number())->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the fast generator and of synthetic data")
      ->check(whole_number())
      ->capture_default_str();
  app.add_flag("--reproducible-noise", o.reproducible_noise,
               "noise from a generator seeded by --seed, so that results repeat: NOT private (the noise can be "
               "recomputed from the seed); default: the secure generator");
  app.add_flag("--show-non-private", o.show_non_private,
               "also show what is computed from the unnoised solution w*: its objective J(w*), the solver's "
               "iterations and gradient norm, its train and test accuracy, and the noise's measured norm; all NOT "
               "private and NOT covered by epsilon (labelled so)");
  app.add_flag("--json", o.json_out, "print one JSON object");
  p.exit_code = parse_arguments(app, argc, argv);
  if (p.exit_code) return p;
  // options of the other dataset would be ignored: refused
  const bool synthetic = o.dataset == "synthetic";
  for (const char* flag : {"--dim", "--size", "--test-size", "--separation"})
    require(synthetic || app.count(flag) == 0, std::string(flag) + " applies to --dataset synthetic only");
  require(!synthetic || app.count("--classes") == 0,
          "--classes picks two Fashion-MNIST classes: synthetic data has its own two (leave --classes out)");
  check(o);
  return p;
}

}  // namespace dpgrad::logreg
