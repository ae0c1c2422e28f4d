// Row-major GEMM on contiguous buffers, dispatched to OpenBLAS for float and
// double: C = alpha * op(A) op(B) + beta * C, op(A) (M, K), op(B) (K, N), C (M, N);
// and GEMV, y = alpha * op(A) x + beta * y.
#pragma once

#include <cstddef>

namespace dpgrad::blas {

/// C = alpha op(A) op(B) + beta C on tightly packed row-major buffers, T float
/// or double: op(A) (m, k), op(B) (k, n), C (m, n); trans_a or trans_b uses the
/// transpose of A or B. With k = 0, C = beta C. Large products are split into
/// blocks across the engine's threads (set_threads).
template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
          const T* b, T beta, T* c);

/// The same on strided row-major views: A, B and C with leading dimensions
/// lda, ldb, ldc (the distance between consecutive rows), one OpenBLAS call
/// in the calling thread (attention reads each head's columns in place).
template <class T>
void gemm_strided(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                  std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc);

/// y = alpha op(A) x + beta y, A (M, N) row-major: op(A) x is (M) or, transposed, (N).
/// (OpenBLAS runs a GEMM with M = 1 as a GEMM, several times slower than this.)
template <class T>
void gemv(bool trans_a, std::size_t m, std::size_t n, T alpha, const T* a, const T* x, T beta, T* y);

/// The engine's thread count (engine/parallel.hpp): products are split into
/// blocks across these threads, each block a single-threaded OpenBLAS call.
void set_threads(int n);
int threads();

}  // namespace dpgrad::blas
