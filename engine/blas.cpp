// OpenBLAS GEMM entry points with dpgrad's row-major, tightly packed layout.
#include "engine/blas.hpp"

#include <cblas.h>

namespace dpgrad::blas {

namespace {
template <class T>
void scale_only(std::size_t n, T beta, T* c) {  // an empty product: C = beta C
  for (std::size_t i = 0; i < n; ++i) c[i] = beta == T(0) ? T(0) : beta * c[i];
}
}  // namespace

template <>
void gemm<float>(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                 const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) return scale_only(m * n, beta, c);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n),
              int(k), alpha, a, ta ? int(m) : int(k), b, tb ? int(k) : int(n), beta, c, int(n));
}

template <>
void gemm<double>(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, double alpha, const double* a,
                  const double* b, double beta, double* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) return scale_only(m * n, beta, c);
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n),
              int(k), alpha, a, ta ? int(m) : int(k), b, tb ? int(k) : int(n), beta, c, int(n));
}

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

void set_threads(int n) { openblas_set_num_threads(n); }
int threads() { return openblas_get_num_threads(); }

}  // namespace dpgrad::blas
