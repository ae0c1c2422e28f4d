// The BLAS core check of engine/blas.hpp: which kernels OpenBLAS chose when it
// loaded, against the widest vectors this CPU runs (docs/training.md, "The BLAS
// core"), and the one restart that puts a program on the right kernels.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/blas.hpp"

namespace dpgrad::blas {

namespace {

// Set by use_best_core before it restarts the program: the core OpenBLAS had
// detected. Never set by a user: it only tells the restarted program what happened.
constexpr const char* kRestarted = "DPGRAD_BLAS_RESTARTED";
// Test hook (tests/programs): what OpenBLAS is taken to have detected while
// OPENBLAS_CORETYPE is unset, to simulate a CPU that this OpenBLAS does not know.
constexpr const char* kSimulated = "DPGRAD_BLAS_CORENAME_FOR_TESTS";

std::atomic<bool> reported{false};   // use_best_core has said what there is to say
std::atomic<bool> restarted{false};  // this process is use_best_core's restart: OPENBLAS_CORETYPE is dpgrad's

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// The vector width an OpenBLAS core's kernels use: 3 AVX-512, 2 AVX2 with FMA,
/// 1 AVX, 0 SSE (and any name not known here).
int tier_of_core(const std::string& name) {
  const std::string n = lower(name);
  for (const char* c : {"skylakex", "cooperlake", "sapphirerapids"})
    if (n == c) return 3;
  for (const char* c : {"haswell", "zen", "skylake", "excavator"})
    if (n == c) return 2;
  for (const char* c : {"sandybridge", "bulldozer", "piledriver", "steamroller"})
    if (n == c) return 1;
  return 0;
}

/// The same for this CPU (cpuid, with the operating system's support of the registers).
int tier_of_cpu() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
#endif
  return 0;
}

/// The OpenBLAS core to ask for at a tier ("" at tier 0: the generic kernels are all there is).
std::string core_for_tier(int tier) {
  switch (tier) {
    case 3: return "SkylakeX";
#if defined(__x86_64__) || defined(__i386__)
    case 2: return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
#endif
    case 1: return "Sandybridge";
    default: return "";
  }
}

}  // namespace

std::string CoreCheck::str() const {
  return "OpenBLAS runs its " + detected + " kernels on a CPU that runs " + supported + "'s";
}

CoreCheck check_core() {
  CoreCheck c;
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  c.user_set = set && *set && !std::getenv(kRestarted) && !restarted;
  const char* simulated = std::getenv(kSimulated);
  if (simulated && *simulated && !(set && *set)) c.detected = simulated;
  else if (const char* name = openblas_get_corename()) c.detected = name;
  const int cpu = tier_of_cpu();
  c.supported = core_for_tier(cpu);
  c.weaker = !c.supported.empty() && tier_of_core(c.detected) < cpu;
  return c;
}

std::string use_best_core(int argc, char** argv) {
  reported = true;
  const CoreCheck c = check_core();
  if (const char* from = std::getenv(kRestarted)) {
    const std::string before = from;
    restarted = true;
    unsetenv(kRestarted);  // the programs this one starts see only OPENBLAS_CORETYPE
    if (c.weaker)
      return "warning: restarted with OPENBLAS_CORETYPE=" + c.supported + ", but " + c.str() +
             ": matrix products run slowly (docs/training.md, \"The BLAS core\")";
    return "OpenBLAS took this CPU for " + before + ": restarted with OPENBLAS_CORETYPE=" + c.supported +
           " (its " + c.detected + " kernels; docs/training.md, \"The BLAS core\")";
  }
  if (!c.weaker || c.user_set || argc < 1 || !argv || !argv[0]) return "";
  setenv("OPENBLAS_CORETYPE", c.supported.c_str(), 1);
  setenv(kRestarted, c.detected.c_str(), 1);
  execv("/proc/self/exe", argv);
  const std::string why = std::strerror(errno);  // execv returns only when it failed
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kRestarted);
  return "warning: " + c.str() + ", and the restart with OPENBLAS_CORETYPE=" + c.supported + " failed (" + why +
         "): set OPENBLAS_CORETYPE=" + c.supported + " before starting for products several times faster";
}

std::string core_warning() {
  static const std::string once = [] {
    if (reported) return std::string();
    const CoreCheck c = check_core();
    if (!c.weaker || c.user_set) return std::string();
    return "dpgrad: warning: " + c.str() + ": set OPENBLAS_CORETYPE=" + c.supported +
           " before the program starts, or call dpgrad::blas::use_best_core(argc, argv) first in main, for matrix "
           "products several times faster (docs/training.md, \"The BLAS core\")";
  }();
  if (reported.exchange(true)) return "";
  return once;
}

}  // namespace dpgrad::blas
