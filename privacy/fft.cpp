// Radix-2 FFT (iterative, decimation in time, bit-reversed input order) and
// real convolution for the PLD accountant. Complex products are written out by
// hand: std::complex's operator* goes through __muldc3 without -ffast-math.
#include "privacy/fft.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <stdexcept>
#include <string>

namespace dpgrad::privacy {
namespace {

bool is_power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }

/// w_k = e^{-2 pi i k/n} for k < n/2, each from its own cos/sin call (no
/// recurrence), so every twiddle is within a few ulps.
const std::vector<double>& twiddles(std::size_t n) {
  thread_local std::map<std::size_t, std::vector<double>> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  if (cache.size() > 16) cache.clear();
  std::vector<double> w(n);  // interleaved re, im
  for (std::size_t k = 0; k < n / 2; ++k) {
    const double angle = -2.0 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(n);
    w[2 * k] = std::cos(angle);
    w[2 * k + 1] = std::sin(angle);
  }
  return cache.emplace(n, std::move(w)).first->second;
}

double norm2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

double norm1(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += std::abs(x);
  return s;
}

}  // namespace

std::size_t next_power_of_two(std::size_t n) {
  std::size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

void fft(std::vector<std::complex<double>>& a, bool inverse) {
  const std::size_t n = a.size();
  if (!is_power_of_two(n))
    throw std::invalid_argument("fft: size must be a power of two, got " + std::to_string(n));
  if (n == 1) return;
  for (std::size_t i = 1, j = 0; i < n; ++i) {
    std::size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  double* x = reinterpret_cast<double*>(a.data());
  const std::vector<double>& tw = twiddles(n);
  const double sign = inverse ? -1.0 : 1.0;  // the inverse uses conjugate twiddles
  for (std::size_t len = 2; len <= n; len <<= 1) {
    const std::size_t half = len >> 1, step = n / len;
    for (std::size_t i = 0; i < n; i += len) {
      double* p = x + 2 * i;
      double* q = x + 2 * (i + half);
      for (std::size_t k = 0; k < half; ++k) {
        const double wr = tw[2 * k * step], wi = sign * tw[2 * k * step + 1];
        const double vr = q[2 * k] * wr - q[2 * k + 1] * wi;
        const double vi = q[2 * k] * wi + q[2 * k + 1] * wr;
        q[2 * k] = p[2 * k] - vr;
        q[2 * k + 1] = p[2 * k + 1] - vi;
        p[2 * k] += vr;
        p[2 * k + 1] += vi;
      }
    }
  }
  if (inverse) {
    const double scale = 1.0 / static_cast<double>(n);
    for (std::size_t i = 0; i < 2 * n; ++i) x[i] *= scale;
  }
}

std::vector<double> convolve(const std::vector<double>& a, const std::vector<double>& b,
                             double* error_bound) {
  if (a.empty() || b.empty()) {
    if (error_bound) *error_bound = 0;
    return {};
  }
  const std::size_t nc = a.size() + b.size() - 1;
  constexpr double u = std::numeric_limits<double>::epsilon() / 2;
  std::vector<double> c(nc, 0.0);
  if (std::min(a.size(), b.size()) <= 64) {
    // Direct sums of at most m = min(|a|, |b|) products: |error| <= 1.01 m u sum |a_i b_j|.
    for (std::size_t i = 0; i < a.size(); ++i)
      for (std::size_t j = 0; j < b.size(); ++j) c[i + j] += a[i] * b[j];
    if (error_bound)
      *error_bound = 1.01 * static_cast<double>(std::min(a.size(), b.size()) + 1) * u *
                     norm1(a) * norm1(b);
    return c;
  }
  const std::size_t n = next_power_of_two(nc);
  const bool square = (&a == &b);
  std::vector<std::complex<double>> z(n);
  for (std::size_t i = 0; i < a.size(); ++i) z[i].real(a[i]);
  if (!square)
    for (std::size_t i = 0; i < b.size(); ++i) z[i].imag(b[i]);
  fft(z, false);
  double* x = reinterpret_cast<double*>(z.data());
  if (square) {
    for (std::size_t k = 0; k < n; ++k) {
      const double re = x[2 * k], im = x[2 * k + 1];
      x[2 * k] = re * re - im * im;
      x[2 * k + 1] = 2 * re * im;
    }
  } else {
    // With Z = FFT(a + i b): A_k = (Z_k + conj Z_{-k})/2, B_k = (Z_k - conj Z_{-k})/(2i),
    // so C_k = A_k B_k = (Z_k^2 - conj(Z_{-k})^2) / (4i).
    for (std::size_t k = 0; k <= n / 2; ++k) {
      const std::size_t m = (n - k) & (n - 1);
      const double pr = x[2 * k], pi = x[2 * k + 1], qr = x[2 * m], qi = x[2 * m + 1];
      // W_k = Z_k^2 - conj(Z_m)^2, W_m = Z_m^2 - conj(Z_k)^2
      const double wkr = (pr * pr - pi * pi) - (qr * qr - qi * qi);
      const double wki = 2 * pr * pi + 2 * qr * qi;
      const double wmr = (qr * qr - qi * qi) - (pr * pr - pi * pi);
      const double wmi = 2 * qr * qi + 2 * pr * pi;
      // W / (4i) = (Im W, -Re W) / 4
      x[2 * k] = 0.25 * wki;
      x[2 * k + 1] = -0.25 * wkr;
      x[2 * m] = 0.25 * wmi;
      x[2 * m + 1] = -0.25 * wmr;
    }
  }
  fft(z, true);
  for (std::size_t i = 0; i < nc; ++i) c[i] = z[i].real();
  if (error_bound) {
    // Higham, Accuracy and Stability of Numerical Algorithms, Thm 24.2: a radix-2
    // FFT in floating point has ||error||_2 <= log2(n) eta / (1 - log2(n) eta) ||X||_2
    // with eta ~ 7u for accurate twiddles. Forward errors (||.||_2 <= sqrt(n) ||a||_2
    // times that), times ||B||_inf <= ||b||_1, then the scaled inverse: the result's
    // 2-norm error is <= C log2(n) u (||a||_2 ||b||_1 + ||b||_2 ||a||_1 + ||c||_2);
    // C = 32 covers the packing, the products and the three transforms generously.
    // The 1-norm error is at most sqrt(n) times the 2-norm error.
    const double lg = std::log2(static_cast<double>(n));
    const double a1 = norm1(a), a2 = norm2(a), b1 = norm1(b), b2 = norm2(b);
    *error_bound = std::sqrt(static_cast<double>(n)) * 32.0 * lg * u *
                   (a2 * b1 + b2 * a1 + norm2(c) + 1e-300);
  }
  return c;
}

}  // namespace dpgrad::privacy
