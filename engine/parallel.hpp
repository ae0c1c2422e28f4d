// The engine's own threads. OpenBLAS gains little from a second thread on the
// tall, skinny products of small models (cnn26k's convolutions: none at all), so
// the engine splits work itself: a GEMM into row, column or depth blocks run by
// single-threaded OpenBLAS calls, and large elementwise and copy kernels into
// contiguous ranges. One pool per process; nested calls run inline.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

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

/// Calls f(begin, end) on about n / grain contiguous pieces of nearly equal
/// length that cover [0, n) (at most 65,535 pieces), each claimed by whichever
/// thread is free next, the caller among them: for work whose items take
/// unequal times (noise blocks of different sizes), where for_range's one piece
/// per thread would leave a thread waiting. Same exceptions and inline cases as
/// for_range; the pieces run in no fixed order.
void for_each_piece(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& f);
/// The grain for for_each_piece that cuts n items into about `per_thread` pieces
/// for each of the engine's threads (at least 1 item a piece).
std::size_t grain_for(std::size_t n, std::size_t per_thread);

/// Work for the pool's idle workers (docs/training.md, "Threads and profiling"): while
/// a Background is alive, a worker that has waited about 20 microseconds for the next
/// job calls unit() again and again until a job comes (a job that comes waits for the
/// unit in hand, so a unit should take tens of microseconds at most). unit() returns
/// false when it found nothing to do; it may run on several workers at once, never on
/// the calling thread, and must not start jobs of its own (for_range and the like).
/// One Background at a time in a process: while another is alive, or with one thread,
/// no unit runs (active() is false) and the owner does the work itself.
class Background {
 public:
  /// Starts: idle workers may call `unit` from now on (if active()).
  explicit Background(std::function<bool()> unit);
  /// Stops: returns once no worker is inside a unit. Does not throw.
  ~Background();
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  /// Stops as the destructor does, then rethrows the first exception a unit threw.
  void stop();
  /// Whether the workers may run its units.
  bool active() const { return active_; }

 private:
  std::function<bool()> unit_;
  bool active_ = false;
};

/// A sum over [0, n) in pieces, as for_range cuts it: f(begin, end, acc) adds
/// its piece's share into acc, `len` values. The piece at 0 gets `out` itself;
/// every other piece a zeroed buffer of its own, added to out afterwards in
/// order of begin, so the rounding is the same every run.
template <class T, class F>
void sum_pieces(std::size_t n, std::size_t grain, std::size_t len, T* out, F&& f) {
  std::vector<std::pair<std::size_t, std::vector<T>>> partial(static_cast<std::size_t>(threads()));  // (begin, sum)
  std::atomic<std::size_t> next{0};
  for_range(n, grain, [&](std::size_t begin, std::size_t end) {
    if (begin == 0) return f(begin, end, out);
    auto& [first, acc] = partial[next.fetch_add(1)];
    first = begin;
    acc.assign(len, T(0));
    f(begin, end, acc.data());
  });
  partial.resize(next.load());
  std::sort(partial.begin(), partial.end());
  for (const auto& [first, acc] : partial)
    for (std::size_t i = 0; i < len; ++i) out[i] += acc[i];
}

}  // namespace dpgrad::parallel
