// Process-wide settings (see runtime.hpp) and the per-op profile.
#include "engine/runtime.hpp"

#include <malloc.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dpgrad {

namespace {
// The end of the heap's part that back_heap_with_huge_pages() has dealt with, and
// the break it saw at its last call; both 0 until keep_freed_memory() succeeds with
// huge pages allowed (then the break rounded up: what lies below is small).
std::mutex heap_mutex;
std::uintptr_t heap_done = 0, heap_seen = 0;
constexpr std::uintptr_t kHugePage = std::uintptr_t(1) << 21;  // x86-64's and arm64's THP size

bool huge_pages_allowed() {
  const char* v = std::getenv("DPGRAD_HUGE_PAGES");
  if (!v || std::string(v) == "1") return true;
  if (std::string(v) == "0") return false;
  std::fprintf(stderr, "dpgrad: DPGRAD_HUGE_PAGES='%s' is neither 0 nor 1; using huge pages\n", v);
  return true;
}
}  // namespace

bool keep_freed_memory() {
#if defined(__GLIBC__)
  // Serve large blocks from the heap (no per-allocation mmap/munmap) and never
  // trim its top (-1: no threshold; a 1 GiB threshold still gave pages back each
  // step once a step peaked above it: cnn26k, batch 2048 x 4 views, 1.24 million
  // page faults in four steps against 0.42 million, 11.1 s against 5.1 s).
  // Grow the heap by exactly what is asked (top pad 0). With a pad (glibc's
  // 128 KiB, or 64 MiB) where a step's blocks land depended on allocations made
  // before the model existed: bilstm598k's ghost step at batch 256 peaked at
  // 494 or 561 MB with the length of the program's name; with no pad, 500 MB in
  // all 12 variations tried. Once the heap has grown to a step's peak,
  // no step asks the kernel for more.
  bool ok = mallopt(M_MMAP_MAX, 0) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, -1) == 1 && ok;
  ok = mallopt(M_TOP_PAD, 0) == 1 && ok;
#if defined(__linux__)
  if (ok && huge_pages_allowed()) {
    std::lock_guard<std::mutex> lock(heap_mutex);
    if (heap_done == 0) {
      const auto brk = reinterpret_cast<std::uintptr_t>(sbrk(0));
      heap_done = heap_seen = (brk + kHugePage - 1) & ~(kHugePage - 1);
    }
  }
#endif
  return ok;
#else
  return false;
#endif
}

std::size_t back_heap_with_huge_pages() {
#if defined(__GLIBC__) && defined(__linux__)
  std::lock_guard<std::mutex> lock(heap_mutex);
  if (heap_done == 0) return 0;
  // Whole huge pages below the break seen at the previous call: what a step grew
  // the heap by waits one call, so that a process of one step (a memory probe)
  // pays nothing for pages it will not use again.
  const std::uintptr_t settled = heap_seen & ~(kHugePage - 1);
  heap_seen = std::max(heap_seen, reinterpret_cast<std::uintptr_t>(sbrk(0)));
  if (settled <= heap_done) return 0;
  const std::uintptr_t from = heap_done;
  heap_done = settled;
  // Only huge pages whose 4 KiB pages are all resident: collapsing one with a hole
  // would fill the hole, and the process would hold more memory than it used.
  const long page = sysconf(_SC_PAGESIZE);
  if (page <= 0 || kHugePage % std::uintptr_t(page) != 0) return 0;
  const std::size_t small = std::size_t(page), per = kHugePage / small;
  std::vector<unsigned char> resident((settled - from) / small);
  if (mincore(reinterpret_cast<void*>(from), settled - from, resident.data()) != 0) return 0;
  constexpr int kCollapse = 25;  // MADV_COLLAPSE (Linux 6.1), absent from older headers
  std::size_t collapsed = 0;
  for (std::size_t h = 0; h < resident.size() / per; ++h) {
    bool whole = true;
    for (std::size_t q = h * per; q < (h + 1) * per && whole; ++q) whole = (resident[q] & 1) != 0;
    // A refusal (older kernels: EINVAL; no huge page free: EAGAIN) leaves the
    // pages as they were, which is only slower.
    if (whole && madvise(reinterpret_cast<void*>(from + h * kHugePage), kHugePage, kCollapse) == 0)
      collapsed += kHugePage;
  }
  return collapsed;
#else
  return 0;
#endif
}

namespace profile {
namespace {

struct Totals {
  long long ns = 0;
  long long calls = 0;
};

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::jvp: return "jvp";
    case Phase::vjp: return "vjp";
    case Phase::step: return "-";
  }
  return "?";
}

struct Table {
  std::mutex mutex;
  std::map<std::pair<std::string, Phase>, Totals> rows;
  ~Table() {
    const std::string r = report_locked();
    if (!r.empty()) std::fputs(r.c_str(), stderr);
  }
  std::string report_locked() {
    if (rows.empty()) return {};
    std::vector<std::pair<std::pair<std::string, Phase>, Totals>> v(rows.begin(), rows.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
    long long total = 0;
    for (const auto& r : v) total += r.second.ns;
    std::string out = "dpgrad profile (DPGRAD_PROFILE): time inside op rules and per-sample steps\n";
    char line[160];
    std::snprintf(line, sizeof line, "  %-16s %-8s %10s %12s %7s\n", "op", "phase", "calls", "total ms", "share");
    out += line;
    for (const auto& [key, t] : v) {
      std::snprintf(line, sizeof line, "  %-16s %-8s %10lld %12.2f %6.1f%%\n", key.first.c_str(),
                    phase_name(key.second), t.calls, double(t.ns) / 1e6, total ? 100.0 * double(t.ns) / double(total) : 0.0);
      out += line;
    }
    std::snprintf(line, sizeof line, "  %-16s %-8s %10s %12.2f\n", "all", "", "", double(total) / 1e6);
    out += line;
    return out;
  }
};

Table& table() {
  static Table t;
  return t;
}

}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("DPGRAD_PROFILE");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

void add(const char* op, Phase phase, long long ns) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  Totals& r = t.rows[{op, phase}];
  r.ns += ns;
  ++r.calls;
}

std::string report() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.report_locked();
}

namespace {
long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Scope::Scope(const char* name, Phase phase) : name_(name), phase_(phase) {
  if (enabled()) start_ns_ = now_ns();
}

Scope::~Scope() {
  if (start_ns_ >= 0) add(name_, phase_, now_ns() - start_ns_);
}

void reset() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.rows.clear();
}

}  // namespace profile
}  // namespace dpgrad
