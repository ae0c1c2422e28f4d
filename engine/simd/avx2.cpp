// The kernels of engine/simd/kernels.hpp for AVX2 with FMA. This file alone is
// compiled with -mavx2 -mfma (engine/meson.build), without the precompiled
// header, and it is called only on a CPU that has both (engine/simd.cpp).
// tests/check_simd_objects.sh checks that its object defines nothing another
// file could take in place of its own.
#include "engine/simd/kernels.hpp"

namespace dpgrad::simd::detail {

using Avx2 = xsimd::fma3<xsimd::avx2>;

const Table<float>& avx2_float() {
  static constexpr Table<float> t = table_of<Avx2, float>();
  return t;
}
const Table<double>& avx2_double() {
  static constexpr Table<double> t = table_of<Avx2, double>();
  return t;
}

}  // namespace dpgrad::simd::detail
