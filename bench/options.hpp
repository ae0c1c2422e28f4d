// dpgrad-bench's options: parsed and checked apart from the measuring, so that
// a mistake is named before any child process starts (and so that they can be fuzzed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace dpgrad::bench {

struct Options {
  std::vector<std::string> models{"cnn26k"};
  std::vector<std::size_t> batches{256};
  std::vector<std::string> methods{"none", "ghost", "vanilla", "jl:1", "jl:5", "microbatch:16", "naive"};
  std::string optimizer = "sgd";
  // naive: three pairs, so that its ratio is a median too (with one, a slow
  // first non-private step after naive's allocations made it 1.5x or 4.5x)
  long steps = 10, warmup = 1, naive_steps = 3;
  int threads = 0;
  std::uint64_t seed = 1;
  bool json_out = false;
  bool gemm_detail = false;
  std::string markdown, suite;
  bool max_batch = false;
  double memory_limit_gb = 8;
  std::string limit = "rss";
  double max_batch_seconds = 600, probe_timeout = 300;
  std::size_t max_batch_start = 16, batch_cap = std::size_t(1) << 20;
  // hidden: what a child process runs
  std::string child, child_method;
  double child_as_limit = 0;  // bytes of address space the child allows itself after warming OpenBLAS
};

struct Parsed {
  Options options;
  std::set<std::string> given;   // the flags on the command line
  bool noise_cost = false;       // --noise-cost
  bool norm_routes = false;      // --norm-routes
  bool paired = false;           // --paired
  std::optional<int> exit_code;  // --help (0) or a command-line error (2): exit with it
};

/// Parses dpgrad-bench's flags. Never exits the process.
Parsed parse_bench_options(int argc, const char* const* argv);

/// Checks one configuration's settings; throws std::invalid_argument naming the problem.
void check_bench_options(const Options& o);

}  // namespace dpgrad::bench
