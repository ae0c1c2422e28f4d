// Iterative radix-2 complex FFT in double precision and the real convolution
// built on it, with an a-priori bound on its rounding error. The PLD accountant
// composes privacy loss distributions with these and adds the bound to delta.
#pragma once

#include <complex>
#include <cstddef>
#include <vector>

namespace dpgrad::privacy {

/// Smallest power of two >= n (n >= 1).
std::size_t next_power_of_two(std::size_t n);

/// In-place discrete Fourier transform, a.size() a power of two:
/// forward X_k = sum_j x_j e^{-2 pi i jk/n}; inverse with e^{+...} and 1/n.
void fft(std::vector<std::complex<double>>& a, bool inverse);

/// Linear convolution c_k = sum_j a_j b_{k-j} (size a + b - 1; empty if either
/// is empty). FFT of the smallest power of two >= that size, both real inputs
/// packed into one complex transform (a == b, the same object, squares with
/// one forward transform); short inputs are convolved directly.
/// If error_bound is given it receives a bound on sum_k |c_k computed - c_k|.
std::vector<double> convolve(const std::vector<double>& a, const std::vector<double>& b,
                             double* error_bound = nullptr);

}  // namespace dpgrad::privacy
