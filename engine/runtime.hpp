// Process-wide settings for training speed.
#pragma once

#include <string>

namespace dpgrad {

/// Keeps memory freed by the engine in the process for the next step instead of
/// handing it back to the kernel. A training step allocates and frees the same
/// large temporaries (activations, im2col buffers, gradients) every time; with
/// glibc's defaults each one above the mmap threshold is a fresh mapping whose
/// pages fault in again, and the kernel time can exceed the arithmetic
/// (cnn26k at batch 2048: 2.7 s of system time against 3.0 s of user time over
/// six steps; 0.4 s with this call). Peak memory is unchanged; the process
/// holds on to its peak. Call once at the start of main(); programs that link
/// dpgrad decide for themselves. Returns false if the allocator refused.
bool keep_freed_memory();

}  // namespace dpgrad

namespace dpgrad::profile {

/// Per-op timing: set DPGRAD_PROFILE=1 in the environment and every op's
/// forward, jvp and vjp are timed; a table (op, phase, calls, total ms, share)
/// goes to standard error when the process exits. Off, the cost is one branch
/// per op application.
bool enabled();

/// Phases of an op application; `step` for other timed work (per-sample rules).
enum class Phase { forward, jvp, vjp, step };

/// Adds `ns` nanoseconds to (op, phase). Only called when enabled().
void add(const char* op, Phase phase, long long ns);

/// The table so far (empty when nothing was timed).
std::string report();

/// Forgets what was timed so far (e.g. after warm-up steps).
void reset();

/// Times its own lifetime as (name, phase) when profiling is on.
class Scope {
 public:
  /// Starts the clock when enabled(); the destructor adds the time to (name,
  /// phase). `name` must outlive the scope (the pointer is kept).
  explicit Scope(const char* name, Phase phase = Phase::step);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* name_;
  Phase phase_;
  long long start_ns_ = -1;
};

}  // namespace dpgrad::profile
