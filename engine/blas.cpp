// OpenBLAS GEMM entry points with dpgrad's row-major, tightly packed layout.
// Products large enough to share are cut into one block per engine thread
// (engine/parallel.hpp), each a single-threaded OpenBLAS call: rows of C when
// op(A) is tall, columns of C when op(B) is wide, else the inner dimension, whose
// partial products are summed.
#include "engine/blas.hpp"

#include <cblas.h>

#include <algorithm>
#include <type_traits>

#include "engine/parallel.hpp"

namespace dpgrad::blas {

namespace {
template <class T>
void scale_only(std::size_t n, T beta, T* c) {  // an empty product: C = beta C
  for (std::size_t i = 0; i < n; ++i) c[i] = beta == T(0) ? T(0) : beta * c[i];
}

/// One OpenBLAS call with explicit leading dimensions.
template <class T>
void raw_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
              const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  const auto oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, oa, ob, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
  else
    cblas_dgemm(CblasRowMajor, oa, ob, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// Below this many multiply-adds a product runs whole: splitting costs a few
// microseconds of hand-off, about what 2^21 multiply-adds take.
constexpr std::size_t kSplitWork = std::size_t(1) << 21;
constexpr std::size_t kMinRows = 32, kMinDepth = 256;

template <class T>
void split_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, const T* b,
                T beta, T* c) {
  const std::size_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
  const std::size_t t = std::size_t(parallel::threads());
  if (t < 2 || m * n * k < kSplitWork) return raw_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  // a long inner dimension against a small C (weight gradients x^T dy): split it,
  // each thread reading its own rows of both inputs once
  const bool deep = k >= 8 * std::max(m, n) && k >= t * kMinDepth;
  if (!deep && m >= t * kMinRows && m >= n) {  // rows of C and of op(A)
    parallel::for_range(m, kMinRows, [&](std::size_t r0, std::size_t r1) {
      raw_gemm(ta, tb, r1 - r0, n, k, alpha, ta ? a + r0 : a + r0 * lda, lda, b, ldb, beta, c + r0 * ldc, ldc);
    });
  } else if (!deep && n >= t * kMinRows) {  // columns of C and of op(B)
    parallel::for_range(n, kMinRows, [&](std::size_t c0, std::size_t c1) {
      raw_gemm(ta, tb, m, c1 - c0, k, alpha, a, lda, tb ? b + c0 * ldb : b + c0, ldb, beta, c + c0, ldc);
    });
  } else if (k >= t * kMinDepth) {  // the inner dimension: the first block accumulates into C, the others apart
    parallel::sum_pieces(k, kMinDepth, m * n, c, [&](std::size_t k0, std::size_t k1, T* acc) {
      const T* ap = ta ? a + k0 * lda : a + k0;
      const T* bp = tb ? b + k0 : b + k0 * ldb;
      raw_gemm(ta, tb, m, n, k1 - k0, alpha, ap, lda, bp, ldb, k0 == 0 ? beta : T(0), acc, ldc);
    });
  } else {
    raw_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}
}  // namespace

template <>
void gemm<float>(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                 const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) return scale_only(m * n, beta, c);
  split_gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
}

template <>
void gemm<double>(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, double alpha, const double* a,
                  const double* b, double beta, double* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) return scale_only(m * n, beta, c);
  split_gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
}

template <class T>
void gemm_strided(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                  const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t i = 0; i < m; ++i) scale_only(n, beta, c + i * ldc);
    return;
  }
  raw_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
template void gemm_strided<float>(bool, bool, std::size_t, std::size_t, std::size_t, float, const float*, std::size_t,
                                  const float*, std::size_t, float, float*, std::size_t);
template void gemm_strided<double>(bool, bool, std::size_t, std::size_t, std::size_t, double, const double*,
                                   std::size_t, const double*, std::size_t, double, double*, std::size_t);

template <>
void gemv<float>(bool ta, std::size_t m, std::size_t n, float alpha, const float* a, const float* x, float beta,
                 float* y) {
  if (m == 0 || n == 0) return scale_only(ta ? n : m, beta, y);
  cblas_sgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, int(m), int(n), alpha, a, int(n), x, 1, beta, y, 1);
}

template <>
void gemv<double>(bool ta, std::size_t m, std::size_t n, double alpha, const double* a, const double* x, double beta,
                  double* y) {
  if (m == 0 || n == 0) return scale_only(ta ? n : m, beta, y);
  cblas_dgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, int(m), int(n), alpha, a, int(n), x, 1, beta, y, 1);
}

void set_threads(int n) { parallel::set_threads(n); }
int threads() { return parallel::threads(); }

}  // namespace dpgrad::blas
