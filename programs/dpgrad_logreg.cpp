// dpgrad-logreg: eps-DP logistic regression by output perturbation (Chaudhuri,
// Monteleoni, Sarwate 2011; docs/math.md section 6) on two Fashion-MNIST classes or
// synthetic Gaussians: the private accuracy (mean and std over the releases) for
// each epsilon, and the epsilon of all releases together; what is computed from
// the unnoised solution only with --show-non-private, labelled. Exit status 2 on
// bad input, 1 on an internal error or output that could not be written.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "data/idx.hpp"
#include "engine/communicator.hpp"
#include "engine/random.hpp"
#include "engine/runtime.hpp"
#include "programs/cli.hpp"
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
  try {  // before solving: noise too large to compute with names the flag
    logreg::checked_noise_norm(split.train.n, split.train.d, eo);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--") + e.what());
  }
  const logreg::ExperimentResult r = logreg::run_experiment(split, eo, *rng);
  // Only the noised copies of w* are released; they all perturb the same w*, so they compose (pure DP adds up).
  const std::string guarantee = fmt::format(
      "pure epsilon-DP (delta = 0), replace-one neighbouring data sets: each release below is epsilon-DP; the {} "
      "releases ({} per epsilon) all perturb the same w*, so together they are {:g}-DP (sequential composition)",
      r.releases, o.repeats, r.epsilon_total);
  const char* mechanism =
      "output perturbation: w* + eta, density of eta proportional to exp(-(eps / Delta) ||eta||), "
      "Delta = 2 / (N lambda) + 2 grad_tol / lambda (Chaudhuri, Monteleoni, Sarwate 2011)";
  const char* not_private = "NOT private: computed from w* without noise, not covered by epsilon";

  if (o.json_out) {
    json j = {{"dataset", o.dataset},
              {"description", split.description},
              {"train_size", split.train.n},
              {"test_size", split.test.n},
              {"features", split.train.d},
              {"lambda", o.lambda},
              {"bias", o.bias},
              {"guarantee", guarantee},
              {"epsilon_total", r.epsilon_total},
              {"releases", r.releases},
              {"composition", "sequential: the releases perturb the same w*, their epsilons add up"},
              {"mechanism", mechanism},
              {"rng", rng->describe()},
              {"private", rng->secure()},
              {"repeats", o.repeats},
              {"solver", {{"method", "damped Newton"}, {"grad_tol", o.grad_tol}, {"seconds", r.solve_seconds}}}};
    if (o.show_non_private) {
      j["not_private"] = {{"note", not_private},
                          {"iterations", r.solution.iterations},
                          {"grad_norm", r.solution.grad_norm},
                          {"objective", r.solution.objective},
                          {"train_accuracy", r.train_accuracy},
                          {"test_accuracy", r.test_accuracy}};
    }
    if (o.dataset == "fashion-mnist") j["classes"] = o.classes;
    else {
      j["dim"] = o.dim;
      j["separation"] = o.separation;
      j["seed"] = o.seed;
    }
    json rows = json::array();
    for (const auto& e : r.results) {
      json row = {{"epsilon", e.epsilon},
                  {"delta", 0.0},
                  {"releases", o.repeats},
                  {"sensitivity", e.sensitivity},
                  {"expected_noise_norm", e.expected_noise_norm},
                  {"accuracy_mean", e.accuracy_mean},
                  {"accuracy_std", e.accuracy_std}};
      if (o.show_non_private) row["mean_noise_norm_not_private"] = e.mean_noise_norm;
      rows.push_back(row);
    }
    j["results"] = rows;  // "private" says whether the noise is secure
    fmt::print("{}\n", j.dump());
    return 0;
  }

  fmt::print("data         {}\n", split.description);
  fmt::print("             {} train / {} test examples, {} features (rows projected onto the unit ball{})\n",
             split.train.n, split.test.n, split.train.d, o.bias != 0.0 ? ", incl. a constant feature" : "");
  fmt::print("model        L2-regularised logistic regression, lambda = {:g}\n", o.lambda);
  fmt::print("solver       damped Newton to ||grad|| < {:g} ({:.2f}s); w* itself is never shown\n", o.grad_tol,
             r.solve_seconds);
  if (o.show_non_private) {
    fmt::print("NOT private  {} steps, ||grad|| = {:.2e}, J(w*) = {:.6f}; w*'s train accuracy {:.2f}%, test accuracy "
               "{:.2f}% ({})\n",
               r.solution.iterations, r.solution.grad_norm, r.solution.objective, 100 * r.train_accuracy,
               100 * r.test_accuracy, not_private);
  }
  fmt::print("privacy      {}\n", guarantee);
  fmt::print("mechanism    {}\n", mechanism);
  fmt::print("generator    {}\n", rng_note);
  fmt::print("\n{:>8}  {:>12}  {:>12}  {:>22}{}\n", "epsilon", "sensitivity", "E||eta||",
             fmt::format("test acc. ({} releases)", o.repeats), o.show_non_private ? "  mean||eta|| (NOT private)" : "");
  for (const auto& e : r.results)
    fmt::print("{:>8g}  {:>12.4e}  {:>12.4g}  {:>13.2f}% +- {:5.2f}{}\n", e.epsilon, e.sensitivity,
               e.expected_noise_norm, 100 * e.accuracy_mean, 100 * e.accuracy_std,
               o.show_non_private ? fmt::format("  {:>12.4g}", e.mean_noise_norm) : std::string());
  fmt::print("total        epsilon {:g} over all {} releases (pure DP, delta 0)\n", r.epsilon_total, r.releases);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  use_best_blas_core("dpgrad-logreg", argc, argv);
  if (const auto closed = guard_standard_output("dpgrad-logreg")) return *closed;
  keep_freed_memory();  // reuse what each training step frees (docs/library.md, "Speed")
  try {
    require_single_process();
    const logreg::Parsed parsed = logreg::parse_logreg_options(argc, argv);
    if (parsed.exit_code) return *parsed.exit_code;
    return finish_standard_output("dpgrad-logreg", run(parsed.options));
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
