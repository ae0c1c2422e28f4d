// The SIMD kernels of the engine's hottest elementwise work, written once for
// any xsimd instruction set (Arch) and built for several (docs/library.md,
// "Portable builds"): kernels.cpp for the build's baseline, avx2.cpp for AVX2 with
// FMA. Not installed; engine/simd.hpp is what the engine calls.
//
// This header is read by translation units compiled with other target flags than
// the rest of the library, so it includes nothing but xsimd and the standard
// library, and every function here is a member of Kernels<Arch>: each build of
// it has names of its own, and none can stand in for another at link time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <type_traits>

#include <xsimd/xsimd.hpp>

namespace dpgrad::simd::detail {

template <class Arch>
struct Kernels {
  template <class T>
  using V = xsimd::batch<T, Arch>;

  /// The largest element of x (n >= 1).
  template <class T>
  static T max(const T* x, std::size_t n) {
    T m = -std::numeric_limits<T>::infinity();
    std::size_t i = 0;
    if (n >= V<T>::size) {
      V<T> acc = V<T>::load_unaligned(x);
      for (i = V<T>::size; i + V<T>::size <= n; i += V<T>::size) acc = xsimd::max(acc, V<T>::load_unaligned(x + i));
      alignas(64) T lanes[V<T>::size];
      acc.store_aligned(lanes);
      for (std::size_t l = 0; l < V<T>::size; ++l) m = lanes[l] > m ? lanes[l] : m;
    }
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
  }

  /// x = exp(x - shift) over [0, n); returns the sum of the new values.
  template <class T>
  static T exp_shifted(T* x, std::size_t n, T shift) {
    std::size_t i = 0;
    V<T> acc(T(0)), s(shift);
    for (; i + V<T>::size <= n; i += V<T>::size) {
      const V<T> e = xsimd::exp(V<T>::load_unaligned(x + i) - s);
      e.store_unaligned(x + i);
      acc += e;
    }
    if (i < n) {  // the last values as one vector, padded with -inf (whose exp adds 0)
      alignas(64) T lanes[V<T>::size];
      for (std::size_t l = 0; l < V<T>::size; ++l) lanes[l] = i + l < n ? x[i + l] : -std::numeric_limits<T>::infinity();
      const V<T> e = xsimd::exp(V<T>::load_aligned(lanes) - s);
      e.store_aligned(lanes);
      acc += e;
      for (std::size_t l = 0; i + l < n; ++l) x[i + l] = lanes[l];
    }
    return xsimd::hadd(acc);
  }

  /// out = exp(a) over [0, n).
  template <class T>
  static void exp(const T* a, T* out, std::size_t n) {
    std::size_t i = 0;
    for (; i + V<T>::size <= n; i += V<T>::size) xsimd::exp(V<T>::load_unaligned(a + i)).store_unaligned(out + i);
    for (; i < n; ++i) out[i] = std::exp(a[i]);
  }

  /// out = x Phi(x) (GELU) or, with `derivative`, Phi(x) + x phi(x), over [0, n).
  template <class T>
  static void gelu(const T* a, T* out, std::size_t n, bool derivative) {
    if (derivative) gelu_slope(a, static_cast<T*>(nullptr), out, n);
    else gelu_slope(a, out, static_cast<T*>(nullptr), n);
  }

  /// GELU over [0, n) in one pass: out = x Phi(x) unless out is null, and its slope
  /// d = Phi(x) + x phi(x) unless d is null, both from one erfc (float: gelu_block).
  template <class T>
  static void gelu_slope(const T* a, T* out, T* d, std::size_t n) {
    if constexpr (std::is_same_v<T, float>) {
      constexpr std::size_t W = V<float>::size;
      std::size_t i = 0;
      for (; i + W <= n; i += W) gelu_block(V<float>::load_unaligned(a + i), out ? out + i : nullptr, d ? d + i : nullptr);
      if (i < n) {  // the last n % W values through the same vectors, padded with zeros
        alignas(64) float x[W] = {}, o[W], s[W];
        std::copy(a + i, a + n, x);
        gelu_block(V<float>::load_aligned(x), o, s);
        if (out) std::copy(o, o + (n - i), out + i);
        if (d) std::copy(s, s + (n - i), d + i);
      }
      return;
    }
    constexpr T r2 = T(std::numbers::sqrt2 / 2), inv_sqrt_2pi = T(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);
    const V<T> half(T(0.5)), vr2(r2), vphi(inv_sqrt_2pi), mhalf(T(-0.5));
    std::size_t i = 0;
    for (; i + V<T>::size <= n; i += V<T>::size) {
      const V<T> x = V<T>::load_unaligned(a + i);
      const V<T> cdf = half * xsimd::erfc(-x * vr2);
      if (out) (x * cdf).store_unaligned(out + i);
      if (d) (cdf + x * xsimd::exp(mhalf * x * x) * vphi).store_unaligned(d + i);
    }
    for (; i < n; ++i) {
      const T cdf = T(0.5) * std::erfc(-a[i] * r2);
      if (out) out[i] = a[i] * cdf;
      if (d) d[i] = cdf + a[i] * std::exp(T(-0.5) * a[i] * a[i]) * inv_sqrt_2pi;
    }
  }

  /// gelu_slope in float, for one vector (out, d: null or W values): Phi(x) = erfc(-x / sqrt 2) / 2
  /// from erfc(z) = t g(t) exp(-z^2), z = |x| / sqrt 2, t = 1 / (1 + z / 2), g a polynomial of
  /// degree 10 fitted to erfcx(z) / t (relative error 1.2e-8 on [0, 1]; docs/fused-ops.md, docs/gelu_fit.py).
  /// exp(-z^2) = exp(-x^2 / 2) is also phi's: one exp gives the value and the slope, within
  /// 1.3e-7 (1 + |y|) of the exact ones in float.
  static void gelu_block(V<float> x, float* out, float* d) {
    static constexpr float g[11] = {0.28209479519f,  0.28209375381f, 0.24688457471f,  0.17531597584f,
                                    0.093462434236f, -0.059211357256f, 0.13217704313f, -0.45497398625f,
                                    0.49369493005f,  -0.23473359195f, 0.043195433083f};
    using F = V<float>;
    const F z = xsimd::abs(x) * F(float(std::numbers::sqrt2 / 2));
    const F t = F(1.0f) / xsimd::fma(F(0.5f), z, F(1.0f));
    F poly(g[10]);
    for (int k = 9; k >= 0; --k) poly = xsimd::fma(poly, t, F(g[k]));
    const F e = xsimd::exp(-(z * z));
    const F half_erfc = F(0.5f) * t * poly * e;
    const F cdf = xsimd::select(x < F(0.0f), half_erfc, F(1.0f) - half_erfc);
    if (out) (x * cdf).store_unaligned(out);
    if (d) xsimd::fma(x * e, F(float(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2)), cdf).store_unaligned(d);
  }

  /// out = sigmoid(a + b) (tanh with `tanh`) over [0, n); f(a) when b is null.
  template <class T>
  static void squash(const T* a, const T* b, T* out, std::size_t n, bool tanh) {
    std::size_t i = 0;
    for (; i + V<T>::size <= n; i += V<T>::size) {
      V<T> z = V<T>::load_unaligned(a + i);
      if (b) z += V<T>::load_unaligned(b + i);
      if (tanh) xsimd::tanh(z).store_unaligned(out + i);
      else (V<T>(T(1)) / (V<T>(T(1)) + xsimd::exp(-z))).store_unaligned(out + i);
    }
    for (; i < n; ++i) {
      const T z = b ? a[i] + b[i] : a[i];
      out[i] = tanh ? std::tanh(z) : T(1) / (T(1) + std::exp(-z));
    }
  }

  /// g = d * o, or s * d when o is null; g += that when `accumulate`; over [0, n).
  template <class T>
  static void scaled_into(const T* __restrict d, const T* __restrict o, T s, T* __restrict g, std::size_t n,
                          bool accumulate) {
    if (o && accumulate) for (std::size_t l = 0; l < n; ++l) g[l] += d[l] * o[l];
    else if (o) for (std::size_t l = 0; l < n; ++l) g[l] = d[l] * o[l];
    else if (accumulate) for (std::size_t l = 0; l < n; ++l) g[l] += s * d[l];
    else for (std::size_t l = 0; l < n; ++l) g[l] = s * d[l];
  }

  /// The sum of x[0, n) in 8 interleaved partial sums, joined in a fixed order: the same
  /// bits with any vector width (1 x 8, 2 x 4 or 8 x 1 lanes).
  template <class T>
  static T sum(const T* __restrict x, std::size_t n) {
    T acc[8] = {};
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (std::size_t l = 0; l < 8; ++l) acc[l] += x[i + l];
    T s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; ++i) s += x[i];
    return s;
  }
  /// The sum of x[i] y[i] over [0, n), in the order of sum.
  template <class T>
  static T dot(const T* __restrict x, const T* __restrict y, std::size_t n) {
    T acc[8] = {};
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (std::size_t l = 0; l < 8; ++l) acc[l] += x[i + l] * y[i + l];
    T s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; ++i) s += x[i] * y[i];
    return s;
  }
  /// The sum of (x[i] - m)^2 over [0, n), in the order of sum.
  template <class T>
  static T centred_squares(const T* __restrict x, std::size_t n, T m) {
    T acc[8] = {};
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (std::size_t l = 0; l < 8; ++l) acc[l] += (x[i + l] - m) * (x[i + l] - m);
    T s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; ++i) s += (x[i] - m) * (x[i] - m);
    return s;
  }

  /// g = d * o * (1 - t * t) over [0, n) (a tanh output t's slope times o and d), or g += that
  /// when `accumulate`.
  template <class T>
  static void tanh_slope_into(const T* __restrict d, const T* __restrict o, const T* __restrict t, T* __restrict g,
                              std::size_t n, bool accumulate) {
    if (accumulate) for (std::size_t l = 0; l < n; ++l) g[l] += d[l] * o[l] * (T(1) - t[l] * t[l]);
    else for (std::size_t l = 0; l < n; ++l) g[l] = d[l] * o[l] * (T(1) - t[l] * t[l]);
  }

  /// r = a op b over [0, n), op 0 +, 1 -, 2 *, 3 /.
  template <class T>
  static void combine(const T* __restrict a, const T* __restrict b, T* __restrict r, std::size_t n, int op) {
    switch (op) {
      case 0: for (std::size_t i = 0; i < n; ++i) r[i] = a[i] + b[i]; break;
      case 1: for (std::size_t i = 0; i < n; ++i) r[i] = a[i] - b[i]; break;
      case 2: for (std::size_t i = 0; i < n; ++i) r[i] = a[i] * b[i]; break;
      default: for (std::size_t i = 0; i < n; ++i) r[i] = a[i] / b[i]; break;
    }
  }

  /// One row of the LSTM gates' backward pass: dz = f'(z) d for the gates' outputs a over
  /// [0, 4H) (sigmoid on i, f and o, tanh on g), written to gx and gh (either may be null),
  /// added to what is there when add_x / add_h.
  template <class T>
  static void lstm_gates_vjp(const T* a, const T* d, T* gx, T* gh, std::size_t H, bool add_x, bool add_h) {
    auto run = [&]<bool Gx, bool Gh, bool AddX, bool AddH>() {
      gate_run<T, false, Gx, Gh, AddX, AddH>(a, d, gx, gh, 2 * H);  // i, f
      gate_run<T, true, Gx, Gh, AddX, AddH>(a + 2 * H, d + 2 * H, Gx ? gx + 2 * H : nullptr, Gh ? gh + 2 * H : nullptr, H);  // g
      gate_run<T, false, Gx, Gh, AddX, AddH>(a + 3 * H, d + 3 * H, Gx ? gx + 3 * H : nullptr, Gh ? gh + 3 * H : nullptr, H);  // o
    };
    if (gx && gh) {
      if (add_x && add_h) run.template operator()<true, true, true, true>();
      else if (add_x) run.template operator()<true, true, true, false>();
      else if (add_h) run.template operator()<true, true, false, true>();
      else run.template operator()<true, true, false, false>();
    } else if (gx) {
      if (add_x) run.template operator()<true, false, true, false>();
      else run.template operator()<true, false, false, false>();
    } else if (gh) {
      if (add_h) run.template operator()<false, true, false, true>();
      else run.template operator()<false, true, false, false>();
    }
  }
  /// lstm_gates_vjp over one run of n gates of one kind (a branch-free loop per case).
  template <class T, bool Tanh, bool Gx, bool Gh, bool AddX, bool AddH>
  static void gate_run(const T* __restrict a, const T* __restrict d, T* __restrict gx, T* __restrict gh,
                       std::size_t n) {
    for (std::size_t j = 0; j < n; ++j) {
      const T dz = (Tanh ? T(1) - a[j] * a[j] : a[j] * (T(1) - a[j])) * d[j];
      if constexpr (Gx) gx[j] = AddX ? gx[j] + dz : dz;
      if constexpr (Gh) gh[j] = AddH ? gh[j] + dz : dz;
    }
  }

  /// s[j] += sum over rows i of r[i p + j], j in [0, p): column sums (bias gradients), each
  /// column summed in row order (a plain loop: the compiler vectorises it across columns).
  template <class T>
  static void add_rows(const T* __restrict r, std::size_t rows, std::size_t p, T* __restrict s) {
    for (std::size_t i = 0; i < rows; ++i) {
      const T* __restrict row = r + i * p;
      for (std::size_t j = 0; j < p; ++j) s[j] += row[j];
    }
  }

  /// C (m x n, row stride ldc) = alpha op(A) op(B) + beta C (beta 0: C is only written), for
  /// the small products of attention, which a BLAS call spends more time setting up than
  /// computing (docs/fused-ops.md). op(A) (m x k) is A, read as a[r lda + p], or with `ta`
  /// A^T, read as a[p lda + r]; op(B) (k x n) likewise with `tb`. `pack` holds at least
  /// k * pack_width(n) values: op(B) is copied there once, alpha folded in, rows padded
  /// with zeros to whole vectors. Each 6-row by 2-vector block of C is summed in registers.
  template <class T>
  static void gemm_small(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                         std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc, T* pack) {
    constexpr std::size_t W = V<T>::size;
    const std::size_t np = pack_width<T>(n);
    for (std::size_t p = 0; p < k; ++p) {
      T* row = pack + p * np;
      if (tb) for (std::size_t j = 0; j < n; ++j) row[j] = alpha * b[j * ldb + p];
      else for (std::size_t j = 0; j < n; ++j) row[j] = alpha * b[p * ldb + j];
      for (std::size_t j = n; j < np; ++j) row[j] = T(0);
    }
    // op(A)(r, p) = a[r * ra + p * pa]
    const std::size_t ra = ta ? 1 : lda, pa = ta ? lda : 1;
    for (std::size_t j0 = 0; j0 < np; j0 += 2 * W) {
      if (j0 + 2 * W <= np) rows<T, 2>(m, j0, n, k, a, ra, pa, pack, np, beta, c, ldc);
      else rows<T, 1>(m, j0, n, k, a, ra, pa, pack, np, beta, c, ldc);
    }
  }

  /// Every row of gemm_small's C in vector columns [j0, j0 + NV W): blocks of 6 rows (12
  /// sums in registers with NV 2), then the last 1 to 5 rows.
  template <class T, std::size_t NV>
  static void rows(std::size_t m, std::size_t j0, std::size_t n, std::size_t k, const T* a, std::size_t ra,
                   std::size_t pa, const T* pack, std::size_t np, T beta, T* c, std::size_t ldc) {
    std::size_t r0 = 0;
    for (; r0 + 6 <= m; r0 += 6) block<T, 6, NV>(r0, j0, n, k, a, ra, pa, pack, np, beta, c, ldc);
    if (m - r0 >= 4) {
      block<T, 4, NV>(r0, j0, n, k, a, ra, pa, pack, np, beta, c, ldc);
      r0 += 4;
    }
    switch (m - r0) {
      case 3: block<T, 3, NV>(r0, j0, n, k, a, ra, pa, pack, np, beta, c, ldc); break;
      case 2: block<T, 2, NV>(r0, j0, n, k, a, ra, pa, pack, np, beta, c, ldc); break;
      case 1: block<T, 1, NV>(r0, j0, n, k, a, ra, pa, pack, np, beta, c, ldc); break;
      default: break;
    }
  }

  /// Rows [r0, r0 + R) and vector columns [j0, j0 + NV W) of gemm_small's C (columns at or
  /// past n are padding: computed, not stored).
  template <class T, std::size_t R, std::size_t NV>
  static void block(std::size_t r0, std::size_t j0, std::size_t n, std::size_t k, const T* a, std::size_t ra,
                    std::size_t pa, const T* pack, std::size_t np, T beta, T* c, std::size_t ldc) {
    constexpr std::size_t W = V<T>::size;
    // The loops over the block's rows and vectors are unrolled outright (the pragmas): GCC
    // then keeps the R NV sums in registers from start to store. Unrolled later on its own,
    // it kept them in a stack array that every block zeroed, and copied them there and back
    // after the last product (EXPERIMENTS.md, "Attention's weights recomputed").
    V<T> acc[R][NV];
    #pragma GCC unroll 8
    for (std::size_t i = 0; i < R; ++i)
      #pragma GCC unroll 8
      for (std::size_t v = 0; v < NV; ++v) acc[i][v] = V<T>(T(0));
    const T* ar = a + r0 * ra;
    for (std::size_t p = 0; p < k; ++p) {
      V<T> bv[NV];
      #pragma GCC unroll 8
      for (std::size_t v = 0; v < NV; ++v) bv[v] = V<T>::load_unaligned(pack + p * np + j0 + v * W);
      #pragma GCC unroll 8
      for (std::size_t i = 0; i < R; ++i) {
        const V<T> av(ar[i * ra + p * pa]);
        #pragma GCC unroll 8
        for (std::size_t v = 0; v < NV; ++v) acc[i][v] = xsimd::fma(av, bv[v], acc[i][v]);
      }
    }
    if (j0 + NV * W <= n) {  // whole vectors only: every sum goes straight from its register to C
      if (beta == T(0)) {
        #pragma GCC unroll 8
        for (std::size_t i = 0; i < R; ++i)
          #pragma GCC unroll 8
          for (std::size_t v = 0; v < NV; ++v) acc[i][v].store_unaligned(c + (r0 + i) * ldc + j0 + v * W);
      } else {
        const V<T> vb(beta);
        #pragma GCC unroll 8
        for (std::size_t i = 0; i < R; ++i)
          #pragma GCC unroll 8
          for (std::size_t v = 0; v < NV; ++v) {
            T* cv = c + (r0 + i) * ldc + j0 + v * W;
            xsimd::fma(vb, V<T>::load_unaligned(cv), acc[i][v]).store_unaligned(cv);
          }
      }
      return;
    }
    // the block reaches past n: the sums through memory, then C value by value (the
    // accumulators are only ever read whole, so they stay in registers above)
    alignas(64) T sums[R][NV * W];
    #pragma GCC unroll 8
    for (std::size_t i = 0; i < R; ++i)
      #pragma GCC unroll 8
      for (std::size_t v = 0; v < NV; ++v) acc[i][v].store_aligned(&sums[i][v * W]);
    const std::size_t cols = std::min(n - j0, NV * W);
    #pragma GCC unroll 8
    for (std::size_t i = 0; i < R; ++i) {
      T* cr = c + (r0 + i) * ldc + j0;
      for (std::size_t l = 0; l < cols; ++l) cr[l] = beta != T(0) ? sums[i][l] + beta * cr[l] : sums[i][l];
    }
  }

  /// conv2d_direct's forward block (engine/ops/conv_direct.cpp): out (nq, p) = rows (nq,
  /// d) w (d, p) + bias (bias null: 0), or out += rows w with `accumulate`. Vectors of
  /// output channels, 8 rows of them summed in registers; each sum over e in order.
  template <class T>
  static void conv_forward_block(const T* rows, std::size_t nq, std::size_t d, const T* w, std::size_t p,
                                 const T* bias, bool accumulate, T* out) {
    constexpr std::size_t L = V<T>::size;
    std::size_t c0 = 0;
    for (; c0 + L <= p; c0 += L) {
      const T* init = bias ? bias + c0 : nullptr;
      std::size_t q = 0;
      for (; q + 8 <= nq; q += 8) rows_times_w<8>(rows + q * d, d, w + c0, p, init, accumulate, out + q * p + c0);
      for (; q + 2 <= nq; q += 2) rows_times_w<2>(rows + q * d, d, w + c0, p, init, accumulate, out + q * p + c0);
      for (; q < nq; ++q) rows_times_w<1>(rows + q * d, d, w + c0, p, init, accumulate, out + q * p + c0);
    }
    for (std::size_t q = 0; q < nq && c0 < p; ++q)  // the last p % L channels
      for (std::size_t c = c0; c < p; ++c) {
        T s = accumulate ? out[q * p + c] : bias ? bias[c] : T(0);
        for (std::size_t e = 0; e < d; ++e) s += rows[q * d + e] * w[e * p + c];
        out[q * p + c] = s;
      }
  }

  /// out[r, :L] = init (or out itself when accumulating) + sum_e rows[r, e] w[e, :L] for R rows.
  template <std::size_t R, class T>
  static void rows_times_w(const T* __restrict rows, std::size_t d, const T* __restrict w, std::size_t p,
                           const T* __restrict init, bool accumulate, T* __restrict out) {
    V<T> acc[R];
    for (std::size_t r = 0; r < R; ++r)
      acc[r] = accumulate ? V<T>::load_unaligned(out + r * p) : init ? V<T>::load_unaligned(init) : V<T>(T(0));
    for (std::size_t e = 0; e < d; ++e) {
      const V<T> we = V<T>::load_unaligned(w + e * p);
      for (std::size_t r = 0; r < R; ++r) acc[r] = xsimd::fma(V<T>(rows[r * d + e]), we, acc[r]);
    }
    for (std::size_t r = 0; r < R; ++r) acc[r].store_unaligned(out + r * p);
  }

  /// conv2d_direct's weight-gradient block: g (d, p) += rows (nq, d)^T dout (nq, p).
  /// Vectors of channels, 8 rows of g summed in registers (16 where vectors are
  /// 64 bytes: AVX-512's 32 registers hold them); each sum over q in order.
  template <class T>
  static void conv_weight_grad_block(const T* rows, std::size_t nq, std::size_t d, const T* dout, std::size_t p,
                                     T* g) {
    constexpr std::size_t L = V<T>::size, E = sizeof(V<T>) >= 64 ? 16 : 8;
    std::size_t c0 = 0;
    for (; c0 + L <= p; c0 += L) {
      std::size_t e = 0;
      for (; e + E <= d; e += E) rows_t_dout<E>(rows + e, d, nq, dout + c0, p, g + e * p + c0);
      for (; e + 4 <= d; e += 4) rows_t_dout<4>(rows + e, d, nq, dout + c0, p, g + e * p + c0);
      for (; e < d; ++e) rows_t_dout<1>(rows + e, d, nq, dout + c0, p, g + e * p + c0);
    }
    for (std::size_t e = 0; e < d && c0 < p; ++e)
      for (std::size_t c = c0; c < p; ++c) {
        T s = 0;
        for (std::size_t q = 0; q < nq; ++q) s += rows[q * d + e] * dout[q * p + c];
        g[e * p + c] += s;
      }
  }

  /// g[e, :L] += sum_q rows[q, e] dout[q, :L] for E consecutive rows e of g.
  template <std::size_t E, class T>
  static void rows_t_dout(const T* __restrict rows, std::size_t d, std::size_t nq, const T* __restrict dout,
                          std::size_t p, T* __restrict g) {
    V<T> acc[E];
    for (std::size_t e = 0; e < E; ++e) acc[e] = V<T>::load_unaligned(g + e * p);
    for (std::size_t q = 0; q < nq; ++q) {
      const V<T> dv = V<T>::load_unaligned(dout + q * p);
      for (std::size_t e = 0; e < E; ++e) acc[e] = xsimd::fma(V<T>(rows[q * d + e]), dv, acc[e]);
    }
    for (std::size_t e = 0; e < E; ++e) acc[e].store_unaligned(g + e * p);
  }

  /// Values gemm_small's pack needs per row of op(B): n rounded up to whole vectors.
  template <class T>
  static std::size_t pack_width(std::size_t n) {
    return (n + V<T>::size - 1) / V<T>::size * V<T>::size;
  }

  // Max pooling's passes over one window element e (plain loops: the compiler
  // vectorises them for the instruction set of the file that builds them).

  /// m = max(m, v) over [0, n), a = e where v won (strictly: the first max stays, as does a NaN in m).
  template <class T>
  static void max_into(const T* __restrict v, T* __restrict m, std::uint16_t* __restrict a, std::size_t n,
                       std::uint16_t e) {
    for (std::size_t l = 0; l < n; ++l) {
      const bool greater = v[l] > m[l];
      m[l] = greater ? v[l] : m[l];
      a[l] = greater ? e : a[l];
    }
  }
  /// d += u where a == e, over [0, n).
  template <class T>
  static void add_where(const T* __restrict u, const std::uint16_t* __restrict a, std::uint16_t e, T* __restrict d,
                        std::size_t n) {
    for (std::size_t l = 0; l < n; ++l) d[l] += a[l] == e ? u[l] : T(0);
  }
  /// d = t where a == e, over [0, n).
  template <class T>
  static void copy_where(const T* __restrict t, const std::uint16_t* __restrict a, std::uint16_t e, T* __restrict d,
                         std::size_t n) {
    for (std::size_t l = 0; l < n; ++l) d[l] = a[l] == e ? t[l] : d[l];
  }

  /// The grid noise sampler's common case (engine/grid_noise.cpp, GridNoiseSampler::fill;
  /// docs/noise.md section 5), a vector of words at a time. Word p proposes |k| = m =
  /// j 2^20 + o with sign bit 36, column p >> 53, its threshold bits 37..52 (j is the column
  /// when they are below the column's threshold, else its alias; columns[c] = threshold |
  /// alias << 32) and o = bits 16..35; bits 0..15 are u. The word is accepted here when
  /// u + 1 <= c (1 - x - 2^-40) 2^16, x = o (2 j 2^20 + o) / (2 s^2) (inv_two_s2 = 1 / (2 s^2)),
  /// c = accept[j], halved at m = 0: the sampler's own sufficient test, computed with the same
  /// roundings, which never accepts what the exact test refuses. From w[0] on, while each word
  /// passes, out[i] = +-m; stops at the first word that does not, or when fewer than a
  /// vector's words are left. Returns the number of words accepted (values written).
  static std::size_t grid_quick_accept(const std::uint64_t* w, std::size_t n, const std::uint64_t* columns,
                                       const double* accept, double inv_two_s2, std::int64_t* out) {
    using U = V<std::uint64_t>;
    using I = V<std::int64_t>;
    using D = V<double>;
    constexpr std::size_t L = U::size;
    static_assert(D::size == L && I::size == L);
    // a whole number below 2^52 to double: its bits under 2^52's exponent, less 2^52
    const U two52_bits(std::uint64_t(0x4330000000000000));
    const D two52(0x1p52);
    const auto as_double = [&](const U& v) { return xsimd::bitwise_cast<D>(v | two52_bits) - two52; };
    const auto as_index = [](const U& v) { return xsimd::bitwise_cast<I>(v); };
    const auto* table = reinterpret_cast<const std::int64_t*>(columns);
    std::size_t i = 0;
    for (; i + L <= n; i += L) {
      const U p = U::load_unaligned(w + i);
      const U column = p >> 53;
      const U entry = xsimd::bitwise_cast<U>(I::gather(table, as_index(column)));
      const U threshold = entry & U(std::uint64_t(0x1ffff)), alias = entry >> 32;
      const U bits = (p >> 37) & U(std::uint64_t(0xffff));
      const U j = xsimd::bitwise_cast<U>(
          xsimd::select(as_index(bits) < as_index(threshold), as_index(column), as_index(alias)));
      const U o = (p >> 16) & U(std::uint64_t(0xfffff));
      const U q = (j << 21) + o;  // 2 j 2^20 + o < 2^32
      const D qd = as_double(q);
      const D c = D::gather(accept, as_index(j)) * xsimd::select(qd == D(0.0), D(0.5), D(1.0));
      const D x = (as_double(o) * qd) * D(inv_two_s2);  // o (2 j W + o) < 2^52: the product is exact
      const D floor_a = c * ((D(1.0) - x) - D(0x1p-40));
      const auto pass = as_double(p & U(std::uint64_t(0xffff))) + D(1.0) <= floor_a * D(0x1p16);
      const U sign = U(std::uint64_t(0)) - ((p >> 36) & U(std::uint64_t(1)));  // all ones when negative
      const U value = (((j << 20) | o) ^ sign) - sign;
      if (xsimd::all(pass)) {
        value.store_unaligned(reinterpret_cast<std::uint64_t*>(out + i));
        continue;
      }
      alignas(64) double passed[L];
      alignas(64) std::uint64_t values[L];
      xsimd::select(pass, D(1.0), D(0.0)).store_aligned(passed);
      value.store_aligned(values);
      std::size_t l = 0;
      for (; l < L && passed[l] != 0.0; ++l) out[i + l] = static_cast<std::int64_t>(values[l]);
      return i + l;
    }
    return i;
  }
};

/// One instruction set's kernels for T, as function pointers.
template <class T>
struct Table {
  T (*max)(const T*, std::size_t);
  T (*exp_shifted)(T*, std::size_t, T);
  void (*exp)(const T*, T*, std::size_t);
  void (*gelu)(const T*, T*, std::size_t, bool);
  void (*squash)(const T*, const T*, T*, std::size_t, bool);
  void (*scaled_into)(const T*, const T*, T, T*, std::size_t, bool);
  void (*max_into)(const T*, T*, std::uint16_t*, std::size_t, std::uint16_t);
  void (*add_where)(const T*, const std::uint16_t*, std::uint16_t, T*, std::size_t);
  void (*copy_where)(const T*, const std::uint16_t*, std::uint16_t, T*, std::size_t);
  void (*gemm_small)(bool, bool, std::size_t, std::size_t, std::size_t, T, const T*, std::size_t, const T*, std::size_t,
                     T, T*, std::size_t, T*);
  std::size_t (*pack_width)(std::size_t);
  void (*add_rows)(const T*, std::size_t, std::size_t, T*);
  void (*tanh_slope_into)(const T*, const T*, const T*, T*, std::size_t, bool);
  void (*combine)(const T*, const T*, T*, std::size_t, int);
  void (*lstm_gates_vjp)(const T*, const T*, T*, T*, std::size_t, bool, bool);
  T (*sum)(const T*, std::size_t);
  T (*dot)(const T*, const T*, std::size_t);
  T (*centred_squares)(const T*, std::size_t, T);
  void (*gelu_slope)(const T*, T*, T*, std::size_t);
  void (*conv_forward_block)(const T*, std::size_t, std::size_t, const T*, std::size_t, const T*, bool, T*);
  void (*conv_weight_grad_block)(const T*, std::size_t, std::size_t, const T*, std::size_t, T*);
  std::size_t (*grid_quick_accept)(const std::uint64_t*, std::size_t, const std::uint64_t*, const double*, double,
                                   std::int64_t*);  // not T's: the same in both tables
};

template <class Arch, class T>
constexpr Table<T> table_of() {
  using K = Kernels<Arch>;
  return {&K::template max<T>, &K::template exp_shifted<T>, &K::template exp<T>, &K::template gelu<T>,
          &K::template squash<T>, &K::template scaled_into<T>, &K::template max_into<T>, &K::template add_where<T>, &K::template copy_where<T>,
          &K::template gemm_small<T>, &K::template pack_width<T>, &K::template add_rows<T>,
          &K::template tanh_slope_into<T>, &K::template combine<T>, &K::template lstm_gates_vjp<T>,
          &K::template sum<T>, &K::template dot<T>, &K::template centred_squares<T>, &K::template gelu_slope<T>,
          &K::template conv_forward_block<T>, &K::template conv_weight_grad_block<T>, &K::grid_quick_accept};
}

/// AVX2 with FMA (avx2.cpp, built only for x86-64; float and double).
template <class T>
const Table<T>& avx2();

}  // namespace dpgrad::simd::detail
