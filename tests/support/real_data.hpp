// Tests of real data sets that may be missing on a machine: they fail under CI
// (CI is set: ./dev deps installs the data there), and elsewhere they report
// themselves skipped, exiting with 77, which meson counts as a skipped test
// (they run as the meson test "real-data", on their own).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <doctest/doctest.h>

namespace dpgrad::test {

inline void real_data_missing(const std::string& what) {
  if (const char* ci = std::getenv("CI"); ci && *ci) FAIL("missing under CI: " << what);
  std::fprintf(stderr, "SKIPPED: %s\n", what.c_str());
  std::fflush(stderr);
  std::exit(77);
}

}  // namespace dpgrad::test
