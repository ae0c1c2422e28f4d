// dpgrad-pate's options: parsed and checked before any data is read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dpgrad::pate {

struct Options {
  std::string dataset = "fashion-mnist";  // fashion-mnist, mnist, idx:PATH or synthetic
  long teachers = 250;                    // signed: "-3" must be an error, not 2^64 - 3
  long queries = 2000;                    // pool images asked at most, from the first of the pool
  long max_answers = 1000;                // answers stop here; epsilon charges this many (capped at queries)
  long pool = 9000;                       // the first `pool` test images are the public pool; the rest evaluate
  double threshold = 200;                 // T: answer only if max votes + N(0, sigma1^2) >= T
  double sigma1 = 150;                    // threshold noise; 0: plain GNMax (every query answered)
  std::optional<double> sigma;            // GNMax noise sigma2, or (default) calibrated for
  std::optional<double> target_epsilon;   // this epsilon (3 when neither is given), all queries answered
  double delta = 1e-5;
  std::string teacher_model = "scatter-linear", student_model = "scatter-linear";
  double teacher_epochs = 20, teacher_lr = 0.05;
  long teacher_batch = 32;
  double student_epochs = 40, student_lr = 0.05;
  long student_batch = 64;
  double pseudo_confidence = 0.9;  // unanswered pool images the student labels itself at this confidence (0: none)
  std::uint64_t seed = 1;          // initialisation and data order (public randomness)
  bool reproducible_noise = false, json_out = false;
  bool show_data_dependent = false;  // print the data-dependent epsilon: computed from the private votes, it leaks
};

struct Parsed {
  Options options;
  std::optional<int> exit_code;  // --help (0) or a command-line error (2): exit with it
};

/// Parses and checks dpgrad-pate's flags; throws std::invalid_argument naming
/// the problem. Never exits the process.
Parsed parse_pate_options(int argc, const char* const* argv);

}  // namespace dpgrad::pate
