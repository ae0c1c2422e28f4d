// Process-wide settings for training speed.
#pragma once

#include <cstddef>
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
///
/// On Linux the kept heap is also backed by transparent huge pages, 2 MiB a page
/// instead of 4 KiB: see back_heap_with_huge_pages(). Set DPGRAD_HUGE_PAGES=0 in
/// the environment to keep 4 KiB pages.
bool keep_freed_memory();

/// Backs the heap with transparent huge pages (Linux 6.1 and later): collapses
/// (MADV_COLLAPSE) each 2 MiB of the heap whose 4 KiB pages are all resident,
/// from what lay below the break at the previous call, so a step's growth waits
/// one call and a process of one step pays nothing. A step streams through a few
/// hundred MB of arrays, of which 4 KiB pages let the TLB hold a few MB at a time
/// (the transformer's private step at batch 64: a few percent faster,
/// docs/library.md, "Speed"). A 2 MiB with a page not resident is left as it is:
/// collapsing it would fill the hole. Does nothing unless keep_freed_memory() is
/// in effect (a heap that is trimmed would give the huge pages back); older
/// kernels refuse, and nothing changes. A call that collapses takes about 2.7 ms
/// per MB, once. Every DPOptimizerT::step ends with a call; a training loop of
/// your own may call it after each step. Returns the bytes collapsed by this call.
/// Thread-safe.
std::size_t back_heap_with_huge_pages();

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
