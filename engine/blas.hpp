// Row-major GEMM on contiguous buffers, dispatched to OpenBLAS for float and
// double: C = alpha * op(A) op(B) + beta * C, op(A) (M, K), op(B) (K, N), C (M, N).
#pragma once

#include <cstddef>

namespace dpgrad::blas {

template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
          const T* b, T beta, T* c);

/// Sets OpenBLAS's thread count (1 inside per-example parallel loops).
void set_threads(int n);
int threads();

}  // namespace dpgrad::blas
