// The engine's SIMD kernels, chosen at run time: AVX2 with FMA on a CPU that has
// both, else the build's baseline (x86-64-v2 in the default, portable build).
// The choice is made once, from the CPU alone (docs/library.md, "Portable builds").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dpgrad::simd {

/// The instruction set the kernels below run with: "avx2+fma" or "baseline".
std::string kernel_set();

/// The largest element of x[0, n) (n >= 1).
template <class T>
T max(const T* x, std::size_t n);
/// x = exp(x - shift) over [0, n); returns the sum of the new values.
template <class T>
T exp_shifted(T* x, std::size_t n, T shift);
/// out = exp(a) over [0, n).
template <class T>
void exp(const T* a, T* out, std::size_t n);
/// out = x Phi(x) (GELU, Phi the standard normal CDF) over [0, n), or its
/// derivative Phi(x) + x phi(x) when `derivative`.
template <class T>
void gelu(const T* a, T* out, std::size_t n, bool derivative);
/// out = sigmoid(a + b) over [0, n), or sigmoid(a) when b is null.
template <class T>
void sigmoid(const T* a, const T* b, T* out, std::size_t n);
/// out = tanh(a + b) over [0, n), or tanh(a) when b is null.
template <class T>
void tanh(const T* a, const T* b, T* out, std::size_t n);

/// g = d * o, or s * d when o is null; g += that when `accumulate`; over [0, n).
template <class T>
void scaled_into(const T* d, const T* o, T s, T* g, std::size_t n, bool accumulate);
/// Max pooling, window element e: m = max(m, v) over [0, n) and a = e where v
/// won (strictly: the first maximum stays, as does a NaN in m).
template <class T>
void max_into(const T* v, T* m, std::uint16_t* a, std::size_t n, std::uint16_t e);
/// d += u where a == e, over [0, n).
template <class T>
void add_where(const T* u, const std::uint16_t* a, std::uint16_t e, T* d, std::size_t n);
/// d = t where a == e, over [0, n).
template <class T>
void copy_where(const T* t, const std::uint16_t* a, std::uint16_t e, T* d, std::size_t n);

/// g = d * o * (1 - t * t) (the slope of a tanh output t, times o and d), or g += that when
/// `accumulate`; over [0, n).
template <class T>
void tanh_slope_into(const T* d, const T* o, const T* t, T* g, std::size_t n, bool accumulate);
/// The four elementwise arithmetic operations: r = a op b over [0, n).
enum class Arith { add = 0, sub = 1, mul = 2, div = 3 };
template <class T>
void combine(const T* a, const T* b, T* r, std::size_t n, Arith op);
/// One row of the LSTM gates' backward pass (engine/ops/recurrent.cpp): dz = f'(z) d, f'
/// taken from the gates' outputs a over [0, 4H) (sigmoid on i, f and o: a (1 - a); tanh on
/// g: 1 - a^2). dz goes to gx and to gh (either may be null), added when add_x / add_h.
template <class T>
void lstm_gates_vjp(const T* a, const T* d, T* gx, T* gh, std::size_t H, bool add_x, bool add_h);

/// The sum of x[0, n), of x[i] y[i], and of (x[i] - m)^2: each in 8 interleaved partial sums
/// joined in a fixed order, so the same bits with either kernel set.
template <class T>
T sum(const T* x, std::size_t n);
template <class T>
T dot(const T* x, const T* y, std::size_t n);
template <class T>
T centred_squares(const T* x, std::size_t n, T m);
/// out = GELU(a) = a Phi(a) and d = its slope Phi(a) + a phi(a), over [0, n), in one pass.
template <class T>
void gelu_slope(const T* a, T* out, T* d, std::size_t n);

/// s[j] += the sum over `rows` rows of r (rows p apart) of r[i p + j], j in [0, p):
/// column sums, each column in row order.
template <class T>
void add_rows(const T* r, std::size_t rows, std::size_t p, T* s);

/// C (m x n, row stride ldc) = alpha op(A) op(B) + beta C for small products (attention's
/// per-head blocks): op(A) is A (m x k, rows lda apart) or with `ta` A^T (A k x m); op(B)
/// is B (k x n, rows ldb apart) or with `tb` B^T. beta 0 only writes C. `pack` holds at
/// least k * gemm_pack_width<T>(n) values (scratch).
template <class T>
void gemm_small(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc, T* pack);
/// The scratch gemm_small needs per row of op(B) with n columns.
template <class T>
std::size_t gemm_pack_width(std::size_t n);

/// conv2d_direct's blocks (engine/ops/conv_direct.cpp): out (nq, p) = rows (nq, d) w (d, p)
/// + bias (null: none), or out += rows w with `accumulate`; and g (d, p) += rows^T dout.
template <class T>
void conv_forward_block(const T* rows, std::size_t nq, std::size_t d, const T* w, std::size_t p, const T* bias,
                        bool accumulate, T* out);
template <class T>
void conv_weight_grad_block(const T* rows, std::size_t nq, std::size_t d, const T* dout, std::size_t p, T* g);
/// The grid noise sampler's quick acceptances, a vector of words at a time
/// (engine/grid_noise.cpp; the test is spelled out in engine/simd/kernels.hpp): from
/// w[0] on, while each word's candidate passes, out[i] = it; returns how many passed.
/// Stops at the first that does not or when fewer words are left than a vector holds.
std::size_t grid_quick_accept(const std::uint64_t* w, std::size_t n, const std::uint64_t* columns,
                              const double* accept, double inv_two_s2, std::int64_t* out);
/// The width in bytes of the vectors of the kernel set in use (16 on the x86-64-v2
/// baseline, 32 with AVX2).
std::size_t vector_bytes();

}  // namespace dpgrad::simd
