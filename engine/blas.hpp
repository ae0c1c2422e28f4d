// Row-major GEMM on contiguous buffers, dispatched to OpenBLAS for float and
// double: C = alpha * op(A) op(B) + beta * C, op(A) (M, K), op(B) (K, N), C (M, N);
// and GEMV, y = alpha * op(A) x + beta * y.
#pragma once

#include <cstddef>
#include <string>

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

/// The kernels OpenBLAS runs against those this CPU can run (docs/performance.md,
/// "The BLAS core"). OpenBLAS picks its kernels by the CPU's model when it loads;
/// a CPU newer than the library (Debian's 0.3.21 on a Sapphire Rapids) gets the
/// generic Prescott kernels, at a fraction of the speed.
struct CoreCheck {
  std::string detected;   // what OpenBLAS runs (openblas_get_corename), e.g. "Prescott", "Haswell", "Cooperlake"
  std::string supported;  // the fastest OpenBLAS core this CPU can run (cpuid): "SkylakeX", "Haswell", "Zen", ...
  bool weaker = false;    // `detected` uses narrower vectors than `supported`
  bool user_set = false;  // OPENBLAS_CORETYPE was set when the program started: respected as given
  /// "OpenBLAS runs its Prescott kernels; this CPU runs SkylakeX's": for a warning.
  std::string str() const;
};

/// Compares the core OpenBLAS detected with the CPU's features (AVX-512
/// F/BW/VL/DQ, AVX2 with FMA, AVX; the vendor picks Zen or Haswell for AVX2).
CoreCheck check_core();

/// For a program's main, before any other work: when OpenBLAS fell back to a
/// core weaker than the CPU runs and the user did not set OPENBLAS_CORETYPE,
/// runs the program again in this process (execv of /proc/self/exe with the same
/// arguments) with OPENBLAS_CORETYPE set to the supported core, once. Returns
/// the line to print (to standard error) in the program that runs: the
/// restart's, a warning when the restart did not help or could not be made, or
/// "" when the kernels are right.
std::string use_best_core(int argc, char** argv);

/// A library's warning, made once per process: "" when the kernels are right,
/// else the detected and supported cores and the variable that fixes it. The
/// engine prints it to standard error when it starts its threads.
std::string core_warning();

}  // namespace dpgrad::blas
