// The kernels of engine/simd/kernels.hpp for AVX2 with FMA. This file alone is
// compiled with -mavx2 -mfma (engine/meson.build), without the precompiled
// header, and it is called only on a CPU that has both (engine/simd.cpp).
// tests/check_simd_objects.sh checks that its object defines nothing another
// file could take in place of its own.
#include "engine/simd/kernels.hpp"

namespace dpgrad::simd::detail {

template <class T>
const Table<T>& avx2() {
  static constexpr Table<T> t = table_of<xsimd::fma3<xsimd::avx2>, T>();
  return t;
}
template const Table<float>& avx2();
template const Table<double>& avx2();

}  // namespace dpgrad::simd::detail
