// libFuzzer harness: the npy reader (optim/checkpoint/npy.hpp) on any bytes, as
// checkpoints and dpgrad-predict's inputs reach it. Besides not crashing: the
// dtype comes from the header alone (a read as T succeeds only when npy_dtype
// says T's), at most one of the three types reads, and what reads is written
// back by xtensor and read again to the same bits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include <xtensor/xnpy.hpp>

#include "optim/checkpoint/npy.hpp"

namespace {

/// Reads `bytes` as T: false when refused; aborts (a finding) when an array
/// that reads disagrees with the header's dtype or does not survive a round trip.
template <class T>
bool reads_as(const std::string& bytes, const char* descr) {
  dpgrad::ArrayT<T> a;
  try {
    a = dpgrad::read_npy<T>(bytes, "fuzz");
  } catch (const std::invalid_argument&) {
    return false;
  }
  if (dpgrad::npy_dtype(bytes, "fuzz") != descr) std::abort();  // the header said another type
  const std::string again = xt::dump_npy(a);
  const dpgrad::ArrayT<T> b = dpgrad::read_npy<T>(again, "fuzz (written back)");
  if (b.shape() != a.shape() || (a.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) != 0))
    std::abort();
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    dpgrad::npy_dtype(bytes, "fuzz");
  } catch (const std::invalid_argument&) {
  }
  const int read = int(reads_as<float>(bytes, "<f4")) + int(reads_as<double>(bytes, "<f8")) +
                   int(reads_as<std::int64_t>(bytes, "<i8"));
  if (read > 1) std::abort();  // one header, one dtype
  return 0;
}
