// dpgrad-logreg: eps-DP logistic regression by output perturbation (Chaudhuri,
// Monteleoni, Sarwate 2011; docs/math.md section 6) on two Fashion-MNIST classes or
// synthetic Gaussians: non-private test accuracy, then the private accuracy
// (mean and std over noise draws) for each epsilon. Exit status 2 on bad input.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "engine/random.hpp"
#include "data/idx.hpp"
#include "examples/logreg/logreg.hpp"

using namespace dpgrad;
using json = nlohmann::json;

namespace {

struct Options {
  std::string dataset = "fashion-mnist";
  std::vector<int> classes{0, 9};   // T-shirt/top vs ankle boot
  long dim = 20, size = 10000, test_size = 5000;   // signed: "-3" must be an error, not 2^64 - 3
  double separation = 2.0;
  double lambda = 1e-2, bias = 1.0, grad_tol = 1e-9;
  std::vector<double> epsilons{0.1, 0.5, 1, 2, 5, 10};
  int repeats = 10;
  std::uint64_t seed = 42;
  bool reproducible_noise = false, json_out = false;
};

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

int run(const Options& o) {
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

  logreg::Split split;
  if (o.dataset == "fashion-mnist") {
    split = logreg::fashion_mnist_pair(o.classes[0], o.classes[1], o.bias);
  } else {
    // Newton stores a (d, d) Hessian and the data (n, d) twice: keep both in memory.
    require(o.dim >= 1 && o.dim <= 4096, fmt::format("--dim must be in [1, 4096], got {}", o.dim));
    require(o.size >= 1 && o.size <= 10000000, fmt::format("--size must be in [1, 10^7], got {}", o.size));
    require(o.test_size >= 1 && o.test_size <= 10000000,
            fmt::format("--test-size must be in [1, 10^7], got {}", o.test_size));
    require((o.size + o.test_size) * o.dim <= 100000000,
            fmt::format("--dim times (--size + --test-size) must be <= 10^8, got {}", (o.size + o.test_size) * o.dim));
    require(o.separation >= 0.0 && std::isfinite(o.separation),
            fmt::format("--separation must be >= 0, got {}", o.separation));
    split = logreg::synthetic(static_cast<std::size_t>(o.dim), static_cast<std::size_t>(o.size),
                              static_cast<std::size_t>(o.test_size), o.separation, o.bias, o.seed);
  }

  auto rng = make_private_rng(o.reproducible_noise, o.seed);
  const std::string rng_note = rng->describe();
  logreg::ExperimentOptions eo;
  eo.lambda = o.lambda;
  eo.epsilons = o.epsilons;
  eo.repeats = o.repeats;
  eo.solver.grad_tol = o.grad_tol;
  const logreg::ExperimentResult r = logreg::run_experiment(split, eo, *rng);
  const char* guarantee = "pure epsilon-DP (delta = 0), replace-one neighbouring data sets";
  const char* mechanism =
      "output perturbation: w* + eta, density of eta proportional to exp(-(eps / Delta) ||eta||), "
      "Delta = 2 / (N lambda) + 2 grad_tol / lambda (Chaudhuri, Monteleoni, Sarwate 2011)";

  if (o.json_out) {
    json j = {{"dataset", o.dataset},
              {"description", split.description},
              {"train_size", split.train.n},
              {"test_size", split.test.n},
              {"features", split.train.d},
              {"lambda", o.lambda},
              {"bias", o.bias},
              {"guarantee", guarantee},
              {"mechanism", mechanism},
              {"rng", rng->describe()},
              {"private", rng->secure()},
              {"repeats", o.repeats},
              {"solver", {{"method", "damped Newton"},
                          {"iterations", r.solution.iterations},
                          {"grad_norm", r.solution.grad_norm},
                          {"grad_tol", o.grad_tol},
                          {"objective", r.solution.objective},
                          {"seconds", r.solve_seconds}}},
              {"non_private", {{"train_accuracy", r.train_accuracy}, {"test_accuracy", r.test_accuracy}}}};
    if (o.dataset == "fashion-mnist") j["classes"] = o.classes;
    else {
      j["dim"] = o.dim;
      j["separation"] = o.separation;
      j["seed"] = o.seed;
    }
    json rows = json::array();
    for (const auto& e : r.results)
      rows.push_back({{"epsilon", e.epsilon},
                      {"delta", 0.0},
                      {"sensitivity", e.sensitivity},
                      {"expected_noise_norm", e.expected_noise_norm},
                      {"mean_noise_norm", e.mean_noise_norm},
                      {"accuracy_mean", e.accuracy_mean},
                      {"accuracy_std", e.accuracy_std}});
    j["private"] = rows;
    fmt::print("{}\n", j.dump());
    return 0;
  }

  fmt::print("data         {}\n", split.description);
  fmt::print("             {} train / {} test examples, {} features (rows projected onto the unit ball{})\n",
             split.train.n, split.test.n, split.train.d, o.bias != 0.0 ? ", incl. a constant feature" : "");
  fmt::print("model        L2-regularised logistic regression, lambda = {:g}\n", o.lambda);
  fmt::print("solver       damped Newton: {} steps, ||grad|| = {:.2e} < {:g}, J(w*) = {:.6f}, {:.2f}s\n",
             r.solution.iterations, r.solution.grad_norm, o.grad_tol, r.solution.objective, r.solve_seconds);
  fmt::print("non-private  train accuracy {:.2f}%, test accuracy {:.2f}%\n", 100 * r.train_accuracy,
             100 * r.test_accuracy);
  fmt::print("privacy      {}\n", guarantee);
  fmt::print("mechanism    {}\n", mechanism);
  fmt::print("generator    {}\n", rng_note);
  fmt::print("\n{:>8}  {:>12}  {:>12}  {:>12}  {:>22}\n", "epsilon", "sensitivity", "E||eta||", "mean||eta||",
             fmt::format("test acc. ({} draws)", o.repeats));
  for (const auto& e : r.results)
    fmt::print("{:>8g}  {:>12.4e}  {:>12.4g}  {:>12.4g}  {:>13.2f}% +- {:5.2f}\n", e.epsilon, e.sensitivity,
               e.expected_noise_norm, e.mean_noise_norm, 100 * e.accuracy_mean, 100 * e.accuracy_std);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"dpgrad-logreg: epsilon-DP logistic regression by output perturbation (Chaudhuri et al. 2011)"};
  app.add_option("--dataset", o.dataset, "fashion-mnist or synthetic")->capture_default_str();
  app.add_option("--classes", o.classes, "fashion-mnist: classes A,B (A -> +1, B -> -1); 0,9: T-shirt vs ankle boot")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--dim", o.dim, "synthetic: dimension")->capture_default_str();
  app.add_option("--size", o.size, "synthetic: training examples")->capture_default_str();
  app.add_option("--test-size", o.test_size, "synthetic: test examples")->capture_default_str();
  app.add_option("--separation", o.separation, "synthetic: ||mu||, class means +-mu")->capture_default_str();
  app.add_option("--lambda", o.lambda, "L2 regularisation (Delta = 2 / (N lambda))")->capture_default_str();
  app.add_option("--bias", o.bias, "value of the constant feature (0: no offset)")->capture_default_str();
  app.add_option("--grad-tol", o.grad_tol, "solver stops at ||grad|| below this")->capture_default_str();
  app.add_option("--epsilons", o.epsilons, "comma-separated epsilons")->delimiter(',')->capture_default_str();
  app.add_option("--repeats", o.repeats, "noise draws per epsilon")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the fast generator and of synthetic data")
      ->check([](const std::string& s) {
        return s.find('-') == std::string::npos ? std::string() : "must be >= 0, got " + s;
      })
      ->capture_default_str();
  app.add_flag("--reproducible-noise", o.reproducible_noise,
               "noise from a generator seeded by --seed, so that results repeat: NOT private (the noise can be "
               "recomputed from the seed); default: the secure generator");
  app.add_flag("--json", o.json_out, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "dpgrad-logreg: " << e.what() << "\n";
    return 2;
  }
  try {
    return run(o);
  } catch (const std::invalid_argument& e) {
    std::cerr << "dpgrad-logreg: " << e.what() << "\n";
    return 2;
  } catch (const data::DataError& e) {
    std::cerr << "dpgrad-logreg: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dpgrad-logreg: internal error: " << e.what() << "\n";
    return 1;
  }
}
