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

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "engine/communicator.hpp"
#include "engine/random.hpp"
#include "data/idx.hpp"
#include "programs/logreg/logreg.hpp"
#include "programs/logreg/options.hpp"

using namespace dpgrad;
using json = nlohmann::json;

namespace {

using logreg::Options;

int run(const Options& o) {
  logreg::Split split;
  if (o.dataset == "fashion-mnist") {
    split = logreg::fashion_mnist_pair(o.classes[0], o.classes[1], o.bias);
  } else {
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
  try {
    require_single_process();
    const logreg::Parsed parsed = logreg::parse_logreg_options(argc, argv);
    if (parsed.exit_code) return *parsed.exit_code;
    return run(parsed.options);
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
