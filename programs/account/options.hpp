// dpgrad-account's options: parsed and checked before anything is accounted,
// so that every mistake is named before any work (and so that they can be fuzzed).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include "privacy/accountant.hpp"

namespace dpgrad::account {

/// A problem with the input: exit status 2, the message on stderr.
struct InvalidInput : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

inline constexpr long kMaxCurveEpochs = 100000;  // --curve prints one line per epoch

/// What to account, checked.
struct Request {
  long dataset_size = 0, batch_size = 0;
  double noise_multiplier = -1, epochs = 0, delta = 0, target_epsilon = 0, epoch_fraction = 0;
  std::string accountant, sampler;
  int jl_dim = 0;
  bool json = false, curve = false, paper_pair = false;
  bool epochs_given = false;  // --epochs E (else --steps T)
  bool calibrate = false;     // --target-epsilon X (else --noise-multiplier S)
  privacy::AccountantOptions accountant_options;
  long steps = 0;          // of the whole run
  std::string steps_note;  // how --epochs became steps
  double sampling_rate = 0;
};

struct Parsed {
  Request request;
  std::optional<int> exit_code;  // --help (0) or a command-line error (2): exit with it
};

/// Parses and checks dpgrad-account's flags; throws InvalidInput naming the
/// problem. Never exits the process.
Parsed parse_account_options(int argc, const char* const* argv);

/// The steps of `epochs` epochs, rounded up, as dpgrad-train counts them.
long steps_after(const Request& r, double epochs);

}  // namespace dpgrad::account
