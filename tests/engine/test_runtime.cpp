// Process-wide memory settings (engine/runtime.hpp): after keep_freed_memory(),
// back_heap_with_huge_pages() collapses each growth of the heap once, a call late.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#if defined(__GLIBC__) && defined(__linux__)
#include <sys/utsname.h>
#include <unistd.h>
#endif

#include "engine/runtime.hpp"

using namespace dpgrad;

namespace {

#if defined(__GLIBC__) && defined(__linux__)
/// AnonHugePages (kB) of the mapping that holds `address`, from /proc/self/smaps (-1: none).
long huge_kb_at(std::uintptr_t address) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = address >= lo && address < hi;
      continue;
    }
    long kb = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %ld", &kb) == 1) return kb;
  }
  return -1;
}

/// Whether MADV_COLLAPSE should work here: Linux 6.1 or later with transparent
/// huge pages offered ("always" or "madvise").
bool collapse_expected() {
  utsname u{};
  int major = 0, minor = 0;
  if (uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  if (major < 6 || (major == 6 && minor < 1)) return false;
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(f, modes);
  return modes.find("[always]") != std::string::npos || modes.find("[madvise]") != std::string::npos;
}
#endif

}  // namespace

TEST_CASE("back_heap_with_huge_pages: a growth of the heap is collapsed at the call after the next, once") {
#if defined(__GLIBC__) && defined(__linux__)
  if (!keep_freed_memory()) {
    MESSAGE("skipped: the allocator refused keep_freed_memory (a sanitizer's allocator, say)");
    return;
  }
  back_heap_with_huge_pages();  // whatever earlier tests grew: settled, then dealt with
  back_heap_with_huge_pages();
  const auto before = reinterpret_cast<std::uintptr_t>(sbrk(0));
  {
    std::vector<char> big(std::size_t(48) << 20, 1);  // from the heap: keep_freed_memory allows no mmap
    CHECK(big.back() == 1);
  }
  const auto after = reinterpret_cast<std::uintptr_t>(sbrk(0));
  if (after < before + (std::size_t(40) << 20)) {  // freed and not given back, unless brk could not grow
    MESSAGE("skipped: the heap did not grow by brk (malloc fell back to mmap)");
    return;
  }
  CHECK(back_heap_with_huge_pages() == 0);  // the growth waits one call
  const std::size_t collapsed = back_heap_with_huge_pages();
  CHECK(back_heap_with_huge_pages() == 0);  // nothing new since
  const char* off = std::getenv("DPGRAD_HUGE_PAGES");
  if (off && std::string(off) == "0") {  // asked for 4 KiB pages: nothing is collapsed
    CHECK(collapsed == 0);
    return;
  }
  CHECK(collapsed <= after - before + (std::size_t(4) << 20));
  if (collapsed == 0 && !collapse_expected()) {
    MESSAGE("skipped: this kernel collapses no pages (Linux before 6.1, or no transparent huge pages)");
    return;
  }
  CHECK(collapsed >= (std::size_t(40) << 20));
  const long huge_kb = huge_kb_at(before + (std::size_t(8) << 20));
  CHECK_MESSAGE(huge_kb * 1024 >= long(std::size_t(40) << 20), huge_kb);  // the heap's mapping holds them
#else
  MESSAGE("skipped: huge pages for the heap are Linux and glibc only");
  CHECK(back_heap_with_huge_pages() == 0);
#endif
}
