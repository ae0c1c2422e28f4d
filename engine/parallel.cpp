// A small fixed pool: workers wait on a generation counter, spin briefly after
// each job (the next op usually follows within microseconds), then sleep. The
// caller and the workers claim a job's pieces from one atomic ticket.
#include "engine/parallel.hpp"
#include "engine/blas.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dpgrad::parallel {
namespace {

thread_local bool inside_piece = false;
constexpr std::size_t kMaxPieces = 0xffff;  // a job's pieces: the ticket's 16 bits

/// A spin-wait hint to the processor (x86 pause): frees the core's resources for a moment.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int default_threads() {
  const int all = int(std::max(1u, std::thread::hardware_concurrency()));
  if (const char* v = std::getenv("DPGRAD_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && n >= 1 && n <= 1024) return int(n);
    std::fprintf(stderr, "dpgrad: DPGRAD_THREADS='%s' is not a whole number from 1 to 1024; using %d threads\n", v, all);
  }
  return all;
}

class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop_workers(); }

  int size() const { return size_; }

  /// Lets idle workers run `unit` (see Background); false when another is in place or
  /// there are no workers.
  bool start_background(const std::function<bool()>* unit) {
    if (size_ < 2) return false;
    const std::function<bool()>* none = nullptr;
    if (!background_.compare_exchange_strong(none, unit, std::memory_order_acq_rel)) return false;
    background_error_ = nullptr;
    return true;
  }

  /// Takes `unit` away and waits until no worker is inside it; returns what a unit threw.
  std::exception_ptr stop_background(const std::function<bool()>* unit) {
    const std::function<bool()>* mine = unit;
    if (!background_.compare_exchange_strong(mine, nullptr, std::memory_order_seq_cst)) return nullptr;
    // a worker counts itself in before it reads background_ (both sequentially
    // consistent): once the count is 0 here, no worker holds `unit`
    while (inside_background_.load(std::memory_order_seq_cst) != 0) cpu_relax();
    std::lock_guard<std::mutex> lock(error_mutex_);
    return std::exchange(background_error_, nullptr);
  }

  void resize(int n) {
    if (n < 1) throw std::invalid_argument("threads: need at least 1, got " + std::to_string(n));
    std::lock_guard<std::mutex> run(run_mutex_);
    stop_workers();
    size_ = n;
    stopping_ = false;
    const unsigned long start = generation_.load();  // read here: a worker may start after the first job
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, start] { work(start); });
  }

  /// Runs f over [0, n) cut into `pieces` (1 to kMaxPieces) equal contiguous pieces.
  void run(std::size_t n, std::size_t pieces, const std::function<void(std::size_t, std::size_t)>& f) {
    std::lock_guard<std::mutex> run(run_mutex_);  // one job at a time (calls from several user threads queue)
    job_ = &f;
    n_ = n;
    pieces_ = pieces;
    error_ = nullptr;
    completed_.store(0, std::memory_order_relaxed);
    const std::uint32_t gen = std::uint32_t(generation_.load(std::memory_order_relaxed) + 1);
    ticket_.store(pack(gen, std::uint32_t(pieces), 0), std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(wake_mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    // The caller takes pieces too, so a worker that is asleep or has lost its
    // core to another process never holds the job up: it finds nothing left.
    claim_and_run(gen);
    for (int spin = 0; completed_.load(std::memory_order_acquire) < pieces; ++spin)
      if (spin < 50000) cpu_relax();  // a piece taken by a worker: about as long as ours
      else std::this_thread::yield();
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // ticket_: generation (32 bits) | pieces (16 bits) | next unclaimed piece (16 bits).
  // A piece is claimed by one compare-and-swap that also checks the generation,
  // so a worker that wakes late can never claim a piece of a later job by mistake.
  static std::uint64_t pack(std::uint32_t gen, std::uint32_t pieces, std::uint32_t next) {
    return (std::uint64_t(gen) << 32) | (std::uint64_t(pieces) << 16) | next;
  }

  /// Claims and runs pieces of job `gen` until none is left.
  void claim_and_run(std::uint32_t gen) {
    std::uint64_t t = ticket_.load(std::memory_order_acquire);
    for (;;) {
      const std::uint32_t pieces = std::uint32_t(t >> 16) & 0xffff, next = std::uint32_t(t) & 0xffff;
      if (std::uint32_t(t >> 32) != gen || next >= pieces) return;
      if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      run_piece(next);  // the job cannot end before this piece is counted
      completed_.fetch_add(1, std::memory_order_release);
      t = ticket_.load(std::memory_order_acquire);
    }
  }

  void run_piece(std::size_t i) {
    const std::size_t begin = n_ * i / pieces_, end = n_ * (i + 1) / pieces_;
    inside_piece = true;
    try {
      (*job_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    inside_piece = false;
  }

  /// One unit of the background work, if there is one: true when it did something.
  bool background_unit() {
    if (background_.load(std::memory_order_relaxed) == nullptr) return false;
    inside_background_.fetch_add(1, std::memory_order_seq_cst);
    bool did = false;
    if (const auto* unit = background_.load(std::memory_order_seq_cst)) {
      try {
        did = (*unit)();
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!background_error_) background_error_ = std::current_exception();
      }
    }
    inside_background_.fetch_sub(1, std::memory_order_seq_cst);
    return did;
  }

  void work(unsigned long seen) {
    for (;;) {
      // spin a while: the next op's job usually comes within microseconds, and a wait
      // of the caller's serial work (tape bookkeeping, allocations) runs into the
      // milliseconds. 200,000 pauses are about 5 ms on AMD Zen 3: a worker that slept
      // after 0.5 ms had to be woken for the next product, 4-7 ms of a transformer
      // step's 90 spent with the caller waiting for its half. After 800 pauses (about
      // 20 us: most waits between one op's job and the next are shorter) the worker
      // runs background units, if any, and spins on afresh after each
      constexpr int kBackgroundAfter = 800;
      unsigned long now = seen;
      for (int spin = 0; spin < 200000 && (now = generation_.load(std::memory_order_acquire)) == seen; ++spin) {
        if (stopping_.load(std::memory_order_relaxed)) return;
        if (spin >= kBackgroundAfter && background_unit()) {
          spin = kBackgroundAfter;
          continue;
        }
        cpu_relax();
      }
      if (now == seen) {
        std::unique_lock<std::mutex> lock(wake_mutex_);
        wake_.wait(lock, [&] {
          return stopping_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen;
        });
        if (stopping_.load(std::memory_order_relaxed)) return;
        now = generation_.load(std::memory_order_acquire);
      }
      seen = now;
      claim_and_run(std::uint32_t(now));
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(wake_mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  int size_ = 1;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_, wake_mutex_, error_mutex_;
  std::condition_variable wake_;
  std::atomic<unsigned long> generation_{0};
  std::atomic<std::uint64_t> ticket_{0};
  std::atomic<std::size_t> completed_{0};
  std::atomic<bool> stopping_{false};
  const std::function<void(std::size_t, std::size_t)>* job_ = nullptr;
  std::size_t n_ = 0, pieces_ = 0;
  std::exception_ptr error_;
  std::atomic<const std::function<bool()>*> background_{nullptr};
  std::atomic<int> inside_background_{0};
  std::exception_ptr background_error_;
};

Pool& pool() {
  static Pool p = [] {
    openblas_set_num_threads(1);
    // once per process: OpenBLAS on kernels slower than the CPU runs (docs/training.md, "The BLAS core")
    if (const std::string w = blas::core_warning(); !w.empty()) std::fprintf(stderr, "%s\n", w.c_str());
    return Pool(default_threads());
  }();
  return p;
}

}  // namespace

int threads() { return pool().size(); }

void set_threads(int n) {
  openblas_set_num_threads(1);
  if (n != pool().size()) pool().resize(n);
}

void for_range(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& f) {
  if (n == 0) return;
  if (inside_piece || n < 2 * std::max<std::size_t>(grain, 1) || pool().size() < 2) return f(0, n);
  pool().run(n, std::min<std::size_t>(std::size_t(pool().size()), n / std::max<std::size_t>(grain, 1)), f);
}

void for_each_piece(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& f) {
  if (n == 0) return;
  const std::size_t g = std::max<std::size_t>(grain, 1);
  if (inside_piece || n < 2 * g || pool().size() < 2) return f(0, n);
  pool().run(n, std::min<std::size_t>(kMaxPieces, (n + g - 1) / g), f);
}

Background::Background(std::function<bool()> unit) : unit_(std::move(unit)) {
  active_ = pool().start_background(&unit_);
}

Background::~Background() {
  if (active_) pool().stop_background(&unit_);
  active_ = false;
}

void Background::stop() {
  if (!active_) return;
  active_ = false;
  if (std::exception_ptr e = pool().stop_background(&unit_)) std::rethrow_exception(e);
}

std::size_t grain_for(std::size_t n, std::size_t per_thread) {
  const std::size_t pieces = std::max<std::size_t>(1, per_thread) * std::size_t(threads());
  return std::max<std::size_t>(1, (n + pieces - 1) / pieces);
}

}  // namespace dpgrad::parallel
