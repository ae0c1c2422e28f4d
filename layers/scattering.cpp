// The scattering transform (layers/scattering.hpp, docs/scattering.md).
#include "layers/scattering.hpp"

#include <cmath>
#include <complex>
#include <numbers>
#include <stdexcept>

#include "engine/conv.hpp"
#include "engine/ops.hpp"
#include "engine/tape.hpp"

namespace dpgrad {

namespace {

using cd = std::complex<double>;

/// Kymatio's Gabor function at the point (a, b) (rows, columns) of the full-
/// resolution grid: a Gaussian envelope of width sigma, stretched by 1 / slant
/// across the direction theta, times a plane wave of frequency xi along theta,
/// over the envelope's integral.
cd gabor(double a, double b, double sigma, double theta, double xi, double slant) {
  const double c = std::cos(theta), s = std::sin(theta);
  // curvature R diag(1, slant^2) R^-1 / (2 sigma^2), R the rotation by theta
  const double k = 1.0 / (2 * sigma * sigma), s2 = slant * slant;
  const double c00 = k * (c * c + s2 * s * s), c11 = k * (s * s + s2 * c * c), c01 = k * (c * s - s2 * c * s);
  const double arg = -(c00 * a * a + 2 * c01 * a * b + c11 * b * b);
  const double phase = xi * (a * c + b * s);
  return std::exp(arg) * cd(std::cos(phase), std::sin(phase)) / (2 * std::numbers::pi * sigma * sigma / slant);
}

/// Samples f at spacing 2^res on offsets -R..R (R covers three widths `extent`),
/// times 4^res (so that a sum over the coarse grid approximates the fine one's).
template <class F>
ScatteringFilter sample(F&& f, double extent, int res) {
  const double step = std::ldexp(1.0, res);
  ScatteringFilter out;
  out.radius = std::size_t(std::ceil(3 * extent / step));
  const long r = long(out.radius);
  for (long a = -r; a <= r; ++a)
    for (long b = -r; b <= r; ++b) {
      const cd v = f(double(a) * step, double(b) * step) * step * step;
      out.re.push_back(v.real());
      out.im.push_back(v.imag());
    }
  return out;
}

double angle(int l, int L) { return double(int(L - L / 2 - 1) - l) * std::numbers::pi / double(L); }

}  // namespace

ScatteringFilter morlet_filter(int j, int l, int L, int res) {
  const double sigma = 0.8 * std::ldexp(1.0, j), theta = angle(l, L), xi = 0.75 * std::numbers::pi / std::ldexp(1.0, j);
  const double slant = 4.0 / double(L);
  auto wave = [&](double a, double b) { return gabor(a, b, sigma, theta, xi, slant); };
  auto envelope = [&](double a, double b) { return gabor(a, b, sigma, theta, 0.0, slant); };
  ScatteringFilter w = sample(wave, sigma / std::min(1.0, slant), res);
  const ScatteringFilter e = sample(envelope, sigma / std::min(1.0, slant), res);
  // Morlet: the Gabor minus the envelope times beta, so that the filter sums to 0 exactly
  cd sw = 0, se = 0;
  for (std::size_t i = 0; i < w.re.size(); ++i) {
    sw += cd(w.re[i], w.im[i]);
    se += cd(e.re[i], e.im[i]);
  }
  const cd beta = sw / se;
  for (std::size_t i = 0; i < w.re.size(); ++i) {
    const cd v = cd(w.re[i], w.im[i]) - beta * cd(e.re[i], e.im[i]);
    w.re[i] = v.real();
    w.im[i] = v.imag();
  }
  return w;
}

ScatteringFilter lowpass_filter(int J, int res) {
  const double sigma = 0.8 * std::ldexp(1.0, J - 1);
  return sample([&](double a, double b) { return gabor(a, b, sigma, 0.0, 0.0, 1.0); }, sigma, res);
}

namespace {

/// Zero padding so that output n reads the input centred at n * stride.
Pad2d centred_pads(std::size_t h, std::size_t w, std::size_t radius, std::size_t stride) {
  const std::size_t k = 2 * radius + 1;
  auto after = [&](std::size_t n) {
    const std::size_t out = (n + stride - 1) / stride, need = (out - 1) * stride + k;
    return need > n + radius ? need - n - radius : std::size_t(0);
  };
  return Pad2d{radius, after(h), radius, after(w)};
}

/// x (N, H, W, 1) with `w` (k*k, outs): the filters' responses, subsampled by `stride`.
template <class T>
TensorT<T> filter(const TensorT<T>& x, const ArrayT<T>& w, std::size_t radius, std::size_t stride) {
  const std::size_t k = 2 * radius + 1;
  const Shape s = x.shape();
  return conv2d(x, constant(w), TensorT<T>(), k, k, stride, stride, centred_pads(s[1], s[2], radius, stride));
}

/// u (N, H, W, C) filtered channel by channel with the low-pass `phi`: (N, h, w, C).
template <class T>
TensorT<T> average(const TensorT<T>& u, const ArrayT<T>& phi, std::size_t radius, std::size_t stride) {
  const Shape s = u.shape();
  const std::size_t n = s[0], c = s[3];
  const TensorT<T> views = reshape(transpose(u, {0, 3, 1, 2}), {n * c, s[1], s[2], 1});
  const TensorT<T> f = filter(views, phi, radius, stride);
  const Shape fs = f.shape();
  return transpose(reshape(f, {n, c, fs[1], fs[2]}), {0, 2, 3, 1});
}

/// |x * psi_{j, l}| for the L angles: z (N, h, w, 2L) holds L real parts, then L imaginary parts.
template <class T>
TensorT<T> modulus(const TensorT<T>& z, std::size_t L) {
  return complex_abs(slice(z, 3, 0, L), slice(z, 3, L, 2 * L));
}

template <class T>
ArrayT<T> weights(const std::vector<ScatteringFilter>& fs, bool complex) {
  const std::size_t taps = fs.front().re.size(), outs = fs.size() * (complex ? 2 : 1);
  ArrayT<T> w = ArrayT<T>::from_shape({taps, outs});
  for (std::size_t f = 0; f < fs.size(); ++f)
    for (std::size_t t = 0; t < taps; ++t) {
      w(t, f) = T(fs[f].re[t]);
      if (complex) w(t, fs.size() + f) = T(fs[f].im[t]);
    }
  return w;
}

}  // namespace

template <class T>
ScatteringT<T>::ScatteringT(std::size_t channels, int J, int L, ScatteringBorder border)
    : channels_(channels), J_(J), L_(L), border_(border) {
  if (channels == 0) throw std::invalid_argument("Scattering: needs at least one channel");
  if (J < 1 || J > 6) throw std::invalid_argument("Scattering: J must be in [1, 6], got " + std::to_string(J));
  if (L < 1 || L > 32) throw std::invalid_argument("Scattering: L must be in [1, 32], got " + std::to_string(L));
  psi_.resize(std::size_t(J));
  psi_radius_.resize(std::size_t(J));
  for (int res = 0; res < J; ++res)
    for (int j = 0; j < J; ++j) {  // psi_j is applied at resolutions 0..j
      std::vector<ScatteringFilter> bank;
      for (int l = 0; l < L; ++l) bank.push_back(morlet_filter(j, l, L, res));
      psi_[std::size_t(res)].push_back(weights<T>(bank, true));
      psi_radius_[std::size_t(res)].push_back(bank.front().radius);
    }
  for (int res = 0; res < J; ++res) {  // phi is applied at resolutions 0..J-1
    const ScatteringFilter phi = lowpass_filter(J, res);
    phi_.push_back(weights<T>({phi}, false));
    phi_radius_.push_back(phi.radius);
  }
}

template <class T>
std::size_t ScatteringT<T>::coefficients() const {
  const std::size_t J = std::size_t(J_), L = std::size_t(L_);
  return 1 + J * L + L * L * J * (J - 1) / 2;
}

template <class T>
Shape ScatteringT<T>::output_shape(const Shape& in) const {
  if (in.size() != 4 || in[3] != channels_)
    throw std::invalid_argument("Scattering(" + std::to_string(channels_) + " channels): input of shape " +
                                shape_str(in) + " is not (B, H, W, C) with that many channels");
  const std::size_t step = std::size_t(1) << J_;
  return {in[0], (in[1] + step - 1) / step, (in[2] + step - 1) / step, channels_ * coefficients()};
}

namespace {

/// x extended by `p` pixels on both sides of `axis`, mirrored about the edge
/// pixels (the edge itself is not repeated): row -k reads row k, row H-1+k reads row H-1-k.
template <class T>
TensorT<T> reflect(const TensorT<T>& x, std::size_t axis, std::size_t p) {
  const std::size_t n = x.shape()[axis];
  std::vector<TensorT<T>> parts;
  for (std::size_t k = p; k >= 1; --k) parts.push_back(slice(x, axis, k, k + 1));
  parts.push_back(x);
  for (std::size_t k = 1; k <= p; ++k) parts.push_back(slice(x, axis, n - 1 - k, n - k));
  return concat(parts, axis);
}

}  // namespace

template <class T>
TensorT<T> ScatteringT<T>::scatter_one_channel(const TensorT<T>& image) const {
  const std::size_t L = std::size_t(L_), N = image.shape()[0], step = std::size_t(1) << J_;
  // Reflection: 2^J mirrored pixels on every side, so that the output grid of
  // the padded image holds the unpadded one's positions from index 1 on.
  const std::size_t H = image.shape()[1], W = image.shape()[2];
  const bool mirrored = border_ == ScatteringBorder::reflect;
  if (mirrored && (H <= step || W <= step))
    throw std::invalid_argument("Scattering: reflection needs images larger than 2^J = " + std::to_string(step) +
                                " pixels on each side, got " + std::to_string(H) + " x " + std::to_string(W));
  const TensorT<T> x = mirrored ? reflect(reflect(image, 1, step), 2, step) : image;
  auto stride = [](int from, int to) { return std::size_t(1) << (to - from); };
  std::vector<TensorT<T>> out;
  out.push_back(filter(x, phi_[0], phi_radius_[0], stride(0, J_)));  // S0
  std::vector<TensorT<T>> second;
  for (int j1 = 0; j1 < J_; ++j1) {
    // U1 = |x * psi_{j1, l1}|, subsampled to resolution j1
    const TensorT<T> u1 = modulus(filter(x, psi_[0][std::size_t(j1)], psi_radius_[0][std::size_t(j1)], stride(0, j1)), L);
    out.push_back(average(u1, phi_[std::size_t(j1)], phi_radius_[std::size_t(j1)], stride(j1, J_)));  // S1
    if (j1 + 1 >= J_) continue;
    const Shape s = u1.shape();
    const TensorT<T> views = reshape(transpose(u1, {0, 3, 1, 2}), {N * L, s[1], s[2], 1});  // each l1 alone
    for (int j2 = j1 + 1; j2 < J_; ++j2) {
      const std::size_t r1 = std::size_t(j1), r2 = std::size_t(j2);
      const TensorT<T> u2 = modulus(filter(views, psi_[r1][r2], psi_radius_[r1][r2], stride(j1, j2)), L);
      const TensorT<T> s2 = average(u2, phi_[r2], phi_radius_[r2], stride(j2, J_));  // (N L, h, w, L)
      const Shape t = s2.shape();
      // (N, l1, h, w, l2) -> (N, h, w, l1 L + l2)
      second.push_back(reshape(transpose(reshape(s2, {N, L, t[1], t[2], L}), {0, 2, 3, 1, 4}), {N, t[1], t[2], L * L}));
    }
  }
  for (auto& s : second) out.push_back(s);
  const TensorT<T> all = concat(out, 3);
  if (!mirrored) return all;
  return slice(slice(all, 1, 1, 1 + (H + step - 1) / step), 2, 1, 1 + (W + step - 1) / step);
}

template <class T>
TensorT<T> ScatteringT<T>::forward(const TensorT<T>& x) {
  const Shape in = x.shape();
  const Shape out = output_shape(in);
  if (channels_ == 1) return scatter_one_channel(x);
  // each channel as a view of its example: (B, H, W, C) -> (B C, H, W, 1), back to (B, h, w, C K)
  const TensorT<T> views = reshape(transpose(x, {0, 3, 1, 2}), {in[0] * channels_, in[1], in[2], 1});
  const TensorT<T> s = scatter_one_channel(views);
  return reshape(transpose(reshape(s, {in[0], channels_, out[1], out[2], coefficients()}), {0, 2, 3, 1, 4}), out);
}

template <class T>
ArrayT<T> ScatteringT<T>::transform(const ArrayT<T>& images, std::size_t chunk,
                                    const std::function<void(std::size_t, std::size_t)>& progress) {
  const Shape in = shape_of(images);
  Shape out = output_shape(in);
  ArrayT<T> r = ArrayT<T>::from_shape(out);
  const std::size_t per_in = images.size() / std::max<std::size_t>(in[0], 1), per_out = r.size() / std::max<std::size_t>(in[0], 1);
  NoRecordScope<T> none;
  for (std::size_t b0 = 0; b0 < in[0]; b0 += chunk) {
    const std::size_t n = std::min(chunk, in[0] - b0);
    Shape piece = in;
    piece[0] = n;
    ArrayT<T> x = ArrayT<T>::from_shape(piece);
    std::copy_n(images.data() + b0 * per_in, n * per_in, x.data());
    const ArrayT<T> y = forward(TensorT<T>(std::move(x))).value();
    std::copy_n(y.data(), n * per_out, r.data() + b0 * per_out);
    if (progress) progress(b0 + n, in[0]);
  }
  return r;
}

template class ScatteringT<float>;
template class ScatteringT<double>;

}  // namespace dpgrad
