// The npy reader (optim/checkpoint/npy.hpp) on files written here: the dtype is
// read from the header alone, never found in the data.
#include <cmath>
#include <cstring>
#include <string>

#include <doctest/doctest.h>
#include <xtensor/xnpy.hpp>

#include "optim/checkpoint/npy.hpp"
#include "support/check.hpp"

using namespace dpgrad;

namespace {

/// A version 1.0 npy file of `descr` and `shape` whose header takes 80 bytes
/// (aligned to 16, as older numpy wrote it), then `data`.
std::string npy_bytes(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const std::size_t total = 80;
  REQUIRE(dict.size() + 11 <= total);
  dict.append(total - 10 - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string b = "\x93NUMPY";
  b.push_back('\x01');
  b.push_back('\x00');
  b.push_back(char(dict.size() & 0xff));
  b.push_back(char(dict.size() >> 8));
  return b + dict + data;
}

}  // namespace

TEST_CASE("npy: the dtype comes from the header, whatever bytes the data holds") {
  // three float32 values whose bytes start with '<i8' (as text): 0x38693c27 (about 5.6e-5), 0.5, 1
  std::string data = "'<i8";
  data += std::string("'\x00\x00\x3f", 4);
  const float one = 1.0f;
  data.append(reinterpret_cast<const char*>(&one), 4);
  const std::string b = npy_bytes("<f4", "(1, 3)", data);
  CHECK(npy_dtype(b, "x.npy") == "<f4");
  const ArrayT<float> a = read_npy<float>(b, "x.npy");
  REQUIRE(a.size() == 3);
  CHECK(a(0, 1) == 0.5f + 0x27 * std::ldexp(1.0f, -24));  // 0x3f000027
  CHECK(a(0, 2) == 1.0f);
  CHECK(npy_dtype(xt::dump_npy(ArrayT<std::int64_t>({{1, 2}})), "ids.npy") == "<i8");
  test::check_error<std::invalid_argument>([&] { npy_dtype("not npy at all", "bad.npy"); },
                                           {"bad.npy", "not a valid npy array", "no npy magic"});
  test::check_error<std::invalid_argument>([&] { npy_dtype(npy_bytes("", "(1,)", ""), "empty.npy"); },
                                           {"empty.npy", "dtype"});
}
