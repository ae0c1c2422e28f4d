// The engine's SIMD kernels (engine/simd.hpp) against their definitions, with the
// kernel set this CPU is given and with the build's baseline set.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/simd.hpp"
#include "engine/simd/kernels.hpp"

using namespace dpgrad;

namespace {

template <class T>
using GemmSmall = void (*)(bool, bool, std::size_t, std::size_t, std::size_t, T, const T*, std::size_t, const T*,
                           std::size_t, T, T*, std::size_t, T*);

/// gemm_small against the definition: strided A, B and C (with values beside C's columns that must stay),
/// every transposition, beta 0 over a C of NaN (only written) and beta 0.5.
template <class T>
void check_gemm_small(GemmSmall<T> gemm, std::size_t (*width)(std::size_t), double tolerance) {
  struct Case {
    std::size_t m, n, k;
  };
  for (Case s : {Case{1, 1, 1}, Case{3, 5, 2}, Case{150, 150, 16}, Case{150, 16, 150}, Case{7, 17, 33}, Case{6, 9, 0},
                 Case{5, 24, 3}}) {
    for (int t = 0; t < 8; ++t) {
      const bool ta = t & 1, tb = t & 2, zero_beta = t & 4;
      CAPTURE(s.m);
      CAPTURE(s.n);
      CAPTURE(s.k);
      CAPTURE(ta);
      CAPTURE(tb);
      CAPTURE(zero_beta);
      const std::size_t ar = ta ? s.k : s.m, ac = ta ? s.m : s.k, br = tb ? s.n : s.k, bc = tb ? s.k : s.n;
      const std::size_t lda = ac + 3, ldb = bc + 2, ldc = s.n + 5;
      std::vector<T> a(ar * lda), b(br * ldb), c(s.m * ldc), pack(s.k * width(s.n) + 1);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = T(double((i * 7919) % 101) / 50.0 - 1.0);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(double((i * 104729) % 103) / 51.0 - 1.0);
      for (std::size_t i = 0; i < c.size(); ++i)
        c[i] = i % ldc < s.n && zero_beta ? std::numeric_limits<T>::quiet_NaN() : T(double(i % 13) / 6.0 - 1.0);
      const std::vector<T> before = c;
      const T alpha = T(1.5), beta = zero_beta ? T(0) : T(0.5);
      gemm(ta, tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, pack.data());
      double worst = 0;
      bool beside_kept = true;
      for (std::size_t i = 0; i < s.m; ++i) {
        for (std::size_t j = 0; j < s.n; ++j) {
          double sum = 0;
          for (std::size_t p = 0; p < s.k; ++p)
            sum += double(ta ? a[p * lda + i] : a[i * lda + p]) * double(tb ? b[j * ldb + p] : b[p * ldb + j]);
          const double want = double(alpha) * sum + (zero_beta ? 0.0 : double(beta) * double(before[i * ldc + j]));
          const double got = double(c[i * ldc + j]);
          worst = std::isfinite(got) ? std::max(worst, std::abs(got - want)) : HUGE_VAL;
        }
        for (std::size_t j = s.n; j < ldc; ++j) beside_kept = beside_kept && c[i * ldc + j] == before[i * ldc + j];
      }
      CHECK(worst <= tolerance * double(s.k + 1));
      CHECK(beside_kept);
    }
  }
}

}  // namespace

TEST_CASE("simd::gemm_small equals the definition: every transposition, strides, odd sizes, beta 0 and 0.5") {
  INFO("kernels: " << simd::kernel_set());
  check_gemm_small<double>(&simd::gemm_small<double>, &simd::gemm_pack_width<double>, 1e-13);
  check_gemm_small<float>(&simd::gemm_small<float>, &simd::gemm_pack_width<float>, 2e-6);
  // the baseline set too, whatever this CPU is given
  constexpr auto baseline_d = simd::detail::table_of<xsimd::default_arch, double>();
  constexpr auto baseline_f = simd::detail::table_of<xsimd::default_arch, float>();
  check_gemm_small<double>(baseline_d.gemm_small, baseline_d.pack_width, 1e-13);
  check_gemm_small<float>(baseline_f.gemm_small, baseline_f.pack_width, 2e-6);
}

TEST_CASE("simd::exp_shifted: exp(x - shift) and its sum, the last values past whole vectors included") {
  for (std::size_t n : {1, 3, 7, 8, 9, 150}) {
    CAPTURE(n);
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = float(i % 7) - 3.0f;
    if (n > 2) x[n / 2] = -std::numeric_limits<float>::infinity();  // a masked score: exp 0
    const std::vector<float> before = x;
    const float sum = simd::exp_shifted(x.data(), n, 1.25f);
    double want_sum = 0, worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double want = std::exp(double(before[i]) - 1.25);
      want_sum += want;
      worst = std::max(worst, std::abs(double(x[i]) - want) / std::max(want, 1e-30));
    }
    CHECK(worst < 1e-6);
    CHECK(std::abs(double(sum) - want_sum) < 1e-6 * want_sum);
  }
}

TEST_CASE("simd::add_rows adds each column's sum in row order, bit for bit, with either kernel set") {
  constexpr auto baseline = simd::detail::table_of<xsimd::default_arch, float>();
  for (std::size_t p : {1, 5, 8, 64, 67}) {
    CAPTURE(p);
    const std::size_t rows = 13;
    std::vector<float> r(rows * p);
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = float(double((i * 7919) % 101) / 7.0 - 7.0);
    std::vector<float> want(p), got(p), got_baseline(p);
    for (std::size_t j = 0; j < p; ++j) want[j] = got[j] = got_baseline[j] = float(j) * 0.25f;
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < p; ++j) want[j] += r[i * p + j];
    simd::add_rows(r.data(), rows, p, got.data());
    baseline.add_rows(r.data(), rows, p, got_baseline.data());
    CHECK(got == want);
    CHECK(got_baseline == want);
  }
}

namespace {

/// Deterministic values in (-lo, hi) for kernel tests.
std::vector<float> test_values(std::size_t n, std::size_t seed, float lo = -1.5f, float hi = 1.5f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * float(((i + 3) * (seed * 2654435761u + 40503u)) % 1009) / 1009.0f;
  return v;
}

}  // namespace

TEST_CASE("simd::combine, tanh_slope_into and lstm_gates_vjp equal their definitions with either kernel set") {
  constexpr auto baseline = simd::detail::table_of<xsimd::default_arch, float>();
  const auto near = [](const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(std::abs(got[i] - want[i]) <= 1e-6f * (1.0f + std::abs(want[i])));
    }
  };
  for (std::size_t n : {1, 7, 8, 13, 64, 67}) {
    CAPTURE(n);
    const auto a = test_values(n, 1), b = test_values(n, 2, 0.5f, 2.0f), t = test_values(n, 3, -0.99f, 0.99f);
    // combine: the four operations
    for (int op = 0; op < 4; ++op) {
      CAPTURE(op);
      std::vector<float> want(n), got(n), got_baseline(n);
      for (std::size_t i = 0; i < n; ++i)
        want[i] = op == 0 ? a[i] + b[i] : op == 1 ? a[i] - b[i] : op == 2 ? a[i] * b[i] : a[i] / b[i];
      simd::combine(a.data(), b.data(), got.data(), n, simd::Arith(op));
      baseline.combine(a.data(), b.data(), got_baseline.data(), n, op);
      near(got, want);
      near(got_baseline, want);
    }
    // tanh_slope_into: assigned and added
    for (bool accumulate : {false, true}) {
      CAPTURE(accumulate);
      std::vector<float> want = test_values(n, 4), got = want, got_baseline = want;
      for (std::size_t i = 0; i < n; ++i) {
        const float v = a[i] * b[i] * (1.0f - t[i] * t[i]);
        want[i] = accumulate ? want[i] + v : v;
      }
      simd::tanh_slope_into(a.data(), b.data(), t.data(), got.data(), n, accumulate);
      baseline.tanh_slope_into(a.data(), b.data(), t.data(), got_baseline.data(), n, accumulate);
      near(got, want);
      near(got_baseline, want);
    }
  }
  // lstm_gates_vjp: every combination of outputs present and added to
  for (std::size_t H : {1, 5, 16, 19}) {
    CAPTURE(H);
    const std::size_t W = 4 * H;
    const auto a = test_values(W, 5, 0.01f, 0.99f), d = test_values(W, 6);
    for (int gx_on : {0, 1})
      for (int gh_on : {0, 1})
        for (bool add_x : {false, true})
          for (bool add_h : {false, true}) {
            CAPTURE(gx_on);
            CAPTURE(gh_on);
            CAPTURE(add_x);
            CAPTURE(add_h);
            const std::vector<float> gx0 = test_values(W, 7), gh0 = test_values(W, 8);
            std::vector<float> want_x = gx0, want_h = gh0;
            for (std::size_t j = 0; j < W; ++j) {
              const bool tanh_gate = j >= 2 * H && j < 3 * H;
              const float dz = (tanh_gate ? 1.0f - a[j] * a[j] : a[j] * (1.0f - a[j])) * d[j];
              if (gx_on) want_x[j] = add_x ? want_x[j] + dz : dz;
              if (gh_on) want_h[j] = add_h ? want_h[j] + dz : dz;
            }
            for (int set = 0; set < 2; ++set) {
              CAPTURE(set);
              std::vector<float> gx = gx0, gh = gh0;
              auto f = set == 0 ? &simd::lstm_gates_vjp<float> : baseline.lstm_gates_vjp;
              f(a.data(), d.data(), gx_on ? gx.data() : nullptr, gh_on ? gh.data() : nullptr, H, add_x, add_h);
              near(gx, want_x);  // untouched when absent: gx0 == want_x then
              near(gh, want_h);
            }
          }
  }
}

TEST_CASE("simd::sum, dot and centred_squares: 8 partial sums in a fixed order, the same with either kernel set") {
  constexpr auto baseline = simd::detail::table_of<xsimd::default_arch, float>();
  for (std::size_t n : {0, 1, 7, 8, 9, 64, 150, 257}) {
    CAPTURE(n);
    const auto x = test_values(n, 9), y = test_values(n, 10);
    // the definition: lane l sums x[i] for i = l mod 8 below the last whole 8, joined pairwise, then the tail
    const auto reference = [&](auto term) {
      float acc[8] = {};
      std::size_t i = 0;
      for (; i + 8 <= n; i += 8)
        for (std::size_t l = 0; l < 8; ++l) acc[l] += term(i + l);
      float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
      for (; i < n; ++i) s += term(i);
      return s;
    };
    const float want_sum = reference([&](std::size_t i) { return x[i]; });
    CHECK(simd::sum(x.data(), n) == want_sum);  // additions only: the same bits
    CHECK(baseline.sum(x.data(), n) == want_sum);
    const float want_dot = reference([&](std::size_t i) { return x[i] * y[i]; });
    const float m = 0.25f;
    const float want_sq = reference([&](std::size_t i) { return (x[i] - m) * (x[i] - m); });
    for (float got : {simd::dot(x.data(), y.data(), n), baseline.dot(x.data(), y.data(), n)})
      CHECK(std::abs(got - want_dot) <= 1e-5f * (1.0f + std::abs(want_dot)));
    for (float got : {simd::centred_squares(x.data(), n, m), baseline.centred_squares(x.data(), n, m)})
      CHECK(std::abs(got - want_sq) <= 1e-5f * (1.0f + std::abs(want_sq)));
  }
}

TEST_CASE("simd::gelu_slope gives gelu's value and its derivative in one pass, either alone, with either kernel set") {
  constexpr auto baseline = simd::detail::table_of<xsimd::default_arch, float>();
  for (const auto& [set, n] : {std::pair{0, 1}, {0, 8}, {0, 13}, {0, 67}, {0, 1000}, {1, 1}, {1, 13}, {1, 1000}}) {
    CAPTURE(set);
    CAPTURE(n);
    // float's GELU is a fitted erfc (engine/simd/kernels.hpp gelu_block): far into both tails too
    const std::size_t len = std::size_t(n);
    const auto a = test_values(len, 11, n == 1000 ? -12.0f : -6.0f, n == 1000 ? 12.0f : 6.0f);
    std::vector<float> out(len), d(len), out_alone(len), d_alone(len);
    if (set == 0) {
      simd::gelu_slope(a.data(), out.data(), d.data(), len);
      simd::gelu(a.data(), out_alone.data(), len, false);
      simd::gelu(a.data(), d_alone.data(), len, true);
    } else {
      baseline.gelu_slope(a.data(), out.data(), d.data(), len);
      baseline.gelu(a.data(), out_alone.data(), len, false);
      baseline.gelu(a.data(), d_alone.data(), len, true);
    }
    for (std::size_t i = 0; i < len; ++i) {  // against the definition in double
      CAPTURE(i);
      const double x = a[i], cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
      const double want_out = x * cdf, want_d = cdf + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * 3.14159265358979323846);
      for (float got : {out[i], out_alone[i]}) CHECK(std::abs(got - want_out) <= 4e-7 * (1.0 + std::abs(want_out)));
      for (float got : {d[i], d_alone[i]}) CHECK(std::abs(got - want_d) <= 4e-7 * (1.0 + std::abs(want_d)));
    }
  }
}

TEST_CASE("simd::conv_forward_block and conv_weight_grad_block equal their definitions with either kernel set") {
  constexpr auto baseline = simd::detail::table_of<xsimd::default_arch, double>();
  const auto values = [](std::size_t n, unsigned seed) {
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = double(((i + 5) * (seed * 2654435761u + 97u)) % 2003) / 1001.0 - 1.0;
    return v;
  };
  for (std::size_t nq : {1, 2, 3, 9, 17})
    for (std::size_t d : {1, 4, 5, 16, 17, 64})
      for (std::size_t p : {1, 3, 4, 8, 16, 19, 32}) {
        CAPTURE(nq);
        CAPTURE(d);
        CAPTURE(p);
        const auto rows = values(nq * d, 1), w = values(d * p, 2), bias = values(p, 3), dout = values(nq * p, 4),
                   start = values(nq * p, 5), g0 = values(d * p, 6);
        for (int set = 0; set < 2; ++set) {
          CAPTURE(set);
          auto forward = set == 0 ? &simd::conv_forward_block<double> : baseline.conv_forward_block;
          auto weight_grad = set == 0 ? &simd::conv_weight_grad_block<double> : baseline.conv_weight_grad_block;
          for (int mode = 0; mode < 3; ++mode) {  // plain, with a bias, added to what out holds
            CAPTURE(mode);
            std::vector<double> out = start, want(nq * p);
            for (std::size_t q = 0; q < nq; ++q)
              for (std::size_t c = 0; c < p; ++c) {
                double s = mode == 1 ? bias[c] : mode == 2 ? start[q * p + c] : 0.0;
                for (std::size_t e = 0; e < d; ++e) s += rows[q * d + e] * w[e * p + c];
                want[q * p + c] = s;
              }
            forward(rows.data(), nq, d, w.data(), p, mode == 1 ? bias.data() : nullptr, mode == 2, out.data());
            for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == doctest::Approx(want[i]).epsilon(1e-12));
          }
          std::vector<double> g = g0, want = g0;
          for (std::size_t e = 0; e < d; ++e)
            for (std::size_t c = 0; c < p; ++c)
              for (std::size_t q = 0; q < nq; ++q) want[e * p + c] += rows[q * d + e] * dout[q * p + c];
          weight_grad(rows.data(), nq, d, dout.data(), p, g.data());
          for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(want[i]).epsilon(1e-12));
        }
      }
}

TEST_CASE("simd::grid_quick_accept passes exactly the words the sampler's own quick test passes, with either kernel set") {
  // Made-up tables (the kernel reads them as the grid sampler lays them out: columns[c] =
  // threshold | alias << 32), and a reading of each word as engine/grid_noise.cpp's
  // propose does; the kernel must write the same values and stop at the first word that
  // fails, or at the last whole vector.
  constexpr std::size_t kColumns = 2048;
  std::vector<std::uint64_t> columns(kColumns);
  std::vector<double> accept(kColumns);
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto next = [&] {  // splitmix64
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const double inv_two_s2 = 1.0 / (2.0 * 16777217.0 * 16777217.0);
  const auto quick = [&](std::uint64_t p, std::int64_t& value) {
    const std::uint64_t column = p >> 53, entry = columns[column];
    const std::uint64_t j = ((p >> 37) & 0xffff) < (entry & 0xffffffff) ? column : entry >> 32;
    const std::uint64_t o = (p >> 16) & 0xfffff, m = (j << 20) + o;
    const double c = m == 0 ? accept[0] * 0.5 : accept[j];
    const double x = static_cast<double>(o * ((j << 21) + o)) * inv_two_s2;
    const double floor_a = c * ((1.0 - x) - 0x1p-40);
    value = (p >> 36) & 1 ? -static_cast<std::int64_t>(m) : static_cast<std::int64_t>(m);
    return floor_a > 0 && (p & 0xffff) < static_cast<std::uint32_t>(floor_a * 0x1p16);
  };
  using Kernel = std::size_t (*)(const std::uint64_t*, std::size_t, const std::uint64_t*, const double*, double,
                                 std::int64_t*);
  constexpr auto baseline = simd::detail::table_of<xsimd::default_arch, double>();
  const std::size_t lanes[2] = {simd::vector_bytes() / sizeof(double), xsimd::batch<double, xsimd::default_arch>::size};
  const Kernel kernels[2] = {&simd::grid_quick_accept, baseline.grid_quick_accept};
  std::size_t stopped_early = 0, ran_to_end = 0;
  for (int table = 0; table < 3; ++table) {
    // 0: acceptances near 1 and the first four bins (long runs pass); 1: any bin, acceptances
    // anywhere in [0, 1] with zeros; 2: acceptances 1 and the first four bins
    for (std::size_t c = 0; c < kColumns; ++c) {
      const std::uint64_t threshold = next() % 5 == 0 ? 0x10000 : next() % 0x10000;
      columns[c] = threshold | (next() % (table == 1 ? kColumns : 4)) << 32;
      accept[c] = table == 2   ? 1.0
                  : table == 0 ? 1.0 - double(next() % 1000) * 1e-6
                  : next() % 4 == 0 ? 0.0
                                    : double(next() >> 11) * 0x1p-53;
    }
    for (int trial = 0; trial < 300; ++trial) {
      const std::size_t n = trial % 7 == 0 ? trial % 5 : 1 + next() % 300;
      std::vector<std::uint64_t> w(n);
      for (auto& p : w) {
        p = next();
        if (table != 1) p = (p & ((std::uint64_t(1) << 53) - 1)) | (p >> 53) % 4 << 53;  // small bins: x near 0
      }
      if (trial % 3 == 0 && n > 0) w[next() % n] &= ~((std::uint64_t(0xfffff) << 16) | (std::uint64_t(1) << 36));  // o = 0
      if (trial % 11 == 0 && n > 0) w[0] = 0;  // m = 0: the halved acceptance
      std::vector<std::int64_t> want(n);
      std::size_t first_fail = n;
      for (std::size_t i = 0; i < n && first_fail == n; ++i)
        if (!quick(w[i], want[i])) first_fail = i;
      for (int set = 0; set < 2; ++set) {
        CAPTURE(table);
        CAPTURE(trial);
        CAPTURE(set);
        const std::size_t expect = std::min(first_fail, n / lanes[set] * lanes[set]);
        std::vector<std::int64_t> out(n + 1, 12345);
        const std::size_t got = kernels[set](w.data(), n, columns.data(), accept.data(), inv_two_s2, out.data());
        REQUIRE(got == expect);
        for (std::size_t i = 0; i < got; ++i) CHECK(out[i] == want[i]);
        bool untouched = true;  // nothing written past the words it passed
        for (std::size_t i = got; i <= n; ++i) untouched = untouched && out[i] == 12345;
        CHECK(untouched);
        (got < first_fail ? ran_to_end : stopped_early) += 1;
      }
    }
  }
  CAPTURE(stopped_early);
  CAPTURE(ran_to_end);
  CHECK(stopped_early > 300);
  CHECK(ran_to_end > 300);
}
