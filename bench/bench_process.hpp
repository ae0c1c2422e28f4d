// Child processes for dpgrad-bench: each measurement runs in a fresh process
// (this program re-executed with hidden flags), so that its peak resident
// memory is its own and a crash or an out-of-memory death ends only that row.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dpgrad::bench {

/// How a child's memory is limited (for the max-batch search).
enum class MemoryLimit {
  none,           // no limit (an address-space limit is set by the child itself, after OpenBLAS is warm)
  resident,       // the parent samples VmRSS and kills the child above the limit; peak checked after exit
};

struct ChildOptions {
  MemoryLimit limit = MemoryLimit::none;
  double limit_bytes = 0;   // for resident
  double timeout_s = 0;     // kill after this many seconds (0: never)
  bool quiet = false;       // discard the child's stderr
};

struct ChildResult {
  std::string out;            // everything the child wrote on stdout
  int exit_code = -1;         // when it exited normally
  int signal = 0;             // when a signal ended it
  long peak_rss_kb = 0;       // wait4's ru_maxrss
  bool over_limit = false;    // killed by the parent for exceeding the resident limit
  bool timed_out = false;
  double seconds = 0;
  bool ok() const { return signal == 0 && exit_code == 0 && !over_limit && !timed_out; }
  /// "exit 3", "signal 9 (Killed)", "timed out after 60 s", ...
  std::string describe() const;
};

/// Runs `/proc/self/exe args...` and waits for it (see ChildOptions).
ChildResult run_self(const std::vector<std::string>& args, const ChildOptions& opts);

/// A field of /proc/self/status in KiB ("VmHWM", "VmRSS", "VmPeak"); 0 if absent.
long self_status_kb(const std::string& field);

}  // namespace dpgrad::bench
