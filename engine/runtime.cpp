// Process-wide settings: see runtime.hpp.
#include "engine/runtime.hpp"

#include <malloc.h>

namespace dpgrad {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  // Serve large blocks from the heap (no per-allocation mmap/munmap), never trim
  // its top, and grow it in generous steps.
  bool ok = mallopt(M_MMAP_MAX, 0) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && ok;
  ok = mallopt(M_TOP_PAD, 64 << 20) == 1 && ok;
  return ok;
#else
  return false;
#endif
}

}  // namespace dpgrad
