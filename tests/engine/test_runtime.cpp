// Process-wide memory settings (engine/runtime.hpp): after keep_freed_memory(),
// back_heap_with_huge_pages() advises each growth of the heap once.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#if defined(__GLIBC__) && defined(__linux__)
#include <unistd.h>
#endif

#include "engine/runtime.hpp"

using namespace dpgrad;

namespace {

#if defined(__GLIBC__) && defined(__linux__)
/// The VmFlags line of the mapping that holds `address` in /proc/self/smaps ("" if none).
std::string vm_flags_at(std::uintptr_t address) {
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
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}
#endif

}  // namespace

TEST_CASE("back_heap_with_huge_pages: the heap's growth is advised once, after keep_freed_memory") {
#if defined(__GLIBC__) && defined(__linux__)
  if (!keep_freed_memory()) {
    MESSAGE("skipped: the allocator refused keep_freed_memory (a sanitizer's allocator, say)");
    return;
  }
  back_heap_with_huge_pages();  // whatever earlier tests grew
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
  const std::size_t advised = back_heap_with_huge_pages();
  const char* off = std::getenv("DPGRAD_HUGE_PAGES");
  if (off && std::string(off) == "0") {  // asked for 4 KiB pages: nothing is advised
    CHECK(advised == 0);
    return;
  }
  CHECK(advised >= (std::size_t(40) << 20));
  CHECK(advised <= after - before + (std::size_t(4) << 20));
  CHECK(back_heap_with_huge_pages() == 0);  // nothing new since
  const std::string flags = vm_flags_at(before + (std::size_t(8) << 20));
  if (flags.empty() || std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").fail())
    MESSAGE("not checked: no smaps or no transparent huge pages on this kernel");
  else
    CHECK_MESSAGE(flags.find(" hg") != std::string::npos, flags);  // MADV_HUGEPAGE took
#else
  MESSAGE("skipped: huge pages for the heap are Linux and glibc only");
  CHECK(back_heap_with_huge_pages() == 0);
#endif
}
