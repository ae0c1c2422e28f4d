// The engine's own threads. OpenBLAS gains little from a second thread on the
// tall, skinny products of small models (cnn26k's convolutions: none at all), so
// the engine splits work itself: a GEMM into row, column or depth blocks run by
// single-threaded OpenBLAS calls, and large elementwise and copy kernels into
// contiguous ranges. One pool per process; nested calls run inline.
#pragma once

#include <cstddef>
#include <functional>

namespace dpgrad::parallel {

/// Threads the engine uses (the caller included). Default: the hardware's
/// concurrency, or DPGRAD_THREADS when set.
int threads();

/// Sets the engine's thread count (>= 1). Also sets OpenBLAS to one thread:
/// the engine's blocks are what runs in parallel.
void set_threads(int n);

/// Calls f(begin, end) on contiguous pieces that cover [0, n), at most one per
/// thread and none shorter than `grain`; the caller runs the first piece and
/// returns when all are done. The first exception thrown by a piece is
/// rethrown here. Runs f(0, n) inline when n < 2 * grain, when one thread is
/// set, or when called from inside a piece.
void for_range(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& f);

}  // namespace dpgrad::parallel
