// dpgrad-logreg's options: parsed and checked before any data is read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dpgrad::logreg {

struct Options {
  std::string dataset = "fashion-mnist";
  std::vector<int> classes{0, 9};                  // T-shirt/top vs ankle boot
  long dim = 20, size = 10000, test_size = 5000;  // signed: "-3" must be an error, not 2^64 - 3
  double separation = 2.0;
  double lambda = 1e-2, bias = 1.0, grad_tol = 1e-9;
  std::vector<double> epsilons{0.1, 0.5, 1, 2, 5, 10};
  int repeats = 10;
  std::uint64_t seed = 42;
  bool reproducible_noise = false, json_out = false;
  bool show_non_private = false;  // also show w*'s objective and accuracies: NOT private, not covered by epsilon
};

struct Parsed {
  Options options;
  std::optional<int> exit_code;  // --help (0) or a command-line error (2): exit with it
};

/// Parses and checks dpgrad-logreg's flags; throws std::invalid_argument naming
/// the problem. Never exits the process.
Parsed parse_logreg_options(int argc, const char* const* argv);

}  // namespace dpgrad::logreg
