// Run-time choice of the SIMD kernels (engine/simd.hpp).
#include "engine/simd.hpp"

#include "engine/config.hpp"

#include "engine/simd/kernels.hpp"

namespace dpgrad::simd {

namespace {

using detail::Table;

/// True when this CPU runs the AVX2 kernels (and this build has them).
bool use_avx2() {
#if DPGRAD_SIMD_AVX2
  static const bool yes = [] {
    __builtin_cpu_init();  // also when the first call comes from another file's static initialisation
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
#else
  return false;
#endif
}

template <class T>
const Table<T>& kernels() {
  static constexpr Table<T> baseline = detail::table_of<xsimd::default_arch, T>();
#if DPGRAD_SIMD_AVX2
  if (use_avx2()) return detail::avx2<T>();
#endif
  return baseline;
}

}  // namespace

std::string kernel_set() { return use_avx2() ? "avx2+fma" : "baseline"; }

template <class T>
T max(const T* x, std::size_t n) { return kernels<T>().max(x, n); }
template <class T>
T exp_shifted(T* x, std::size_t n, T shift) { return kernels<T>().exp_shifted(x, n, shift); }
template <class T>
void exp(const T* a, T* out, std::size_t n) { kernels<T>().exp(a, out, n); }
template <class T>
void gelu(const T* a, T* out, std::size_t n, bool derivative) { kernels<T>().gelu(a, out, n, derivative); }
template <class T>
void sigmoid(const T* a, const T* b, T* out, std::size_t n) { kernels<T>().squash(a, b, out, n, false); }
template <class T>
void tanh(const T* a, const T* b, T* out, std::size_t n) { kernels<T>().squash(a, b, out, n, true); }

template <class T>
void scaled_into(const T* d, const T* o, T s, T* g, std::size_t n, bool accumulate) {
  kernels<T>().scaled_into(d, o, s, g, n, accumulate);
}
template <class T>
void max_into(const T* v, T* m, std::uint16_t* a, std::size_t n, std::uint16_t e) {
  kernels<T>().max_into(v, m, a, n, e);
}
template <class T>
void add_where(const T* u, const std::uint16_t* a, std::uint16_t e, T* d, std::size_t n) {
  kernels<T>().add_where(u, a, e, d, n);
}
template <class T>
void copy_where(const T* t, const std::uint16_t* a, std::uint16_t e, T* d, std::size_t n) {
  kernels<T>().copy_where(t, a, e, d, n);
}

template <class T>
void gemm_small(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc, T* pack) {
  kernels<T>().gemm_small(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pack);
}
template <class T>
std::size_t gemm_pack_width(std::size_t n) { return kernels<T>().pack_width(n); }
template <class T>
void add_rows(const T* r, std::size_t rows, std::size_t p, T* s) { kernels<T>().add_rows(r, rows, p, s); }

template <class T>
void tanh_slope_into(const T* d, const T* o, const T* t, T* g, std::size_t n, bool accumulate) {
  kernels<T>().tanh_slope_into(d, o, t, g, n, accumulate);
}
template <class T>
void combine(const T* a, const T* b, T* r, std::size_t n, Arith op) { kernels<T>().combine(a, b, r, n, int(op)); }
template <class T>
void lstm_gates_vjp(const T* a, const T* d, T* gx, T* gh, std::size_t H, bool add_x, bool add_h) {
  kernels<T>().lstm_gates_vjp(a, d, gx, gh, H, add_x, add_h);
}

template <class T>
T sum(const T* x, std::size_t n) { return kernels<T>().sum(x, n); }
template <class T>
T dot(const T* x, const T* y, std::size_t n) { return kernels<T>().dot(x, y, n); }
template <class T>
T centred_squares(const T* x, std::size_t n, T m) { return kernels<T>().centred_squares(x, n, m); }
template <class T>
void gelu_slope(const T* a, T* out, T* d, std::size_t n) { kernels<T>().gelu_slope(a, out, d, n); }
std::size_t grid_quick_accept(const std::uint64_t* w, std::size_t n, const std::uint64_t* columns,
                              const double* accept, double inv_two_s2, std::int64_t* out) {
  return kernels<double>().grid_quick_accept(w, n, columns, accept, inv_two_s2, out);
}
template <class T>
void conv_forward_block(const T* rows, std::size_t nq, std::size_t d, const T* w, std::size_t p, const T* bias,
                        bool accumulate, T* out) {
  kernels<T>().conv_forward_block(rows, nq, d, w, p, bias, accumulate, out);
}
template <class T>
void conv_weight_grad_block(const T* rows, std::size_t nq, std::size_t d, const T* dout, std::size_t p, T* g) {
  kernels<T>().conv_weight_grad_block(rows, nq, d, dout, p, g);
}
std::size_t vector_bytes() { return kernels<float>().pack_width(1) * sizeof(float); }

#define DPGRAD_SIMD_INSTANTIATE(T)                                  \
  template T max(const T*, std::size_t);                            \
  template T exp_shifted(T*, std::size_t, T);                       \
  template void exp(const T*, T*, std::size_t);                     \
  template void gelu(const T*, T*, std::size_t, bool);              \
  template void sigmoid(const T*, const T*, T*, std::size_t);       \
  template void tanh(const T*, const T*, T*, std::size_t);                                     \
  template void scaled_into(const T*, const T*, T, T*, std::size_t, bool);                     \
  template void max_into(const T*, T*, std::uint16_t*, std::size_t, std::uint16_t);            \
  template void add_where(const T*, const std::uint16_t*, std::uint16_t, T*, std::size_t);     \
  template void copy_where(const T*, const std::uint16_t*, std::uint16_t, T*, std::size_t);    \
  template void gemm_small(bool, bool, std::size_t, std::size_t, std::size_t, T, const T*, std::size_t, const T*, \
                           std::size_t, T, T*, std::size_t, T*);                                \
  template std::size_t gemm_pack_width<T>(std::size_t);                                      \
  template void add_rows(const T*, std::size_t, std::size_t, T*);                             \
  template void tanh_slope_into(const T*, const T*, const T*, T*, std::size_t, bool);         \
  template void combine(const T*, const T*, T*, std::size_t, Arith);                          \
  template void lstm_gates_vjp(const T*, const T*, T*, T*, std::size_t, bool, bool);          \
  template T sum(const T*, std::size_t);                                                     \
  template T dot(const T*, const T*, std::size_t);                                           \
  template T centred_squares(const T*, std::size_t, T);                                      \
  template void gelu_slope(const T*, T*, T*, std::size_t);                                   \
  template void conv_forward_block(const T*, std::size_t, std::size_t, const T*, std::size_t, const T*, bool, T*); \
  template void conv_weight_grad_block(const T*, std::size_t, std::size_t, const T*, std::size_t, T*);
DPGRAD_SIMD_INSTANTIATE(float)
DPGRAD_SIMD_INSTANTIATE(double)
#undef DPGRAD_SIMD_INSTANTIATE

}  // namespace dpgrad::simd
