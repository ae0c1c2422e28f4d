#!/usr/bin/env python3
"""Fits the polynomial behind float GELU's erfc (engine/simd/kernels.hpp, gelu_block).

erfc(z) = t g(t) exp(-z^2) with t = 1 / (1 + z / 2), z >= 0, so g(t) = erfcx(z) / t.
g is fitted by least squares weighted by 1 / g (relative error) at Chebyshev nodes on
[0, 1], then checked in exact arithmetic and in a float32 evaluation of the kernel's
steps against GELU and its slope in double. Run by hand (numpy and scipy); the
library and its tests never need Python. docs/fused-ops.md quotes the output.
"""
import numpy as np
from numpy.polynomial import chebyshev as cheb
from numpy.polynomial import Polynomial
from scipy.special import erfc, erfcx

DEGREE = 10


def fit(degree):
    n = 4000
    t = 0.5 * (1 - np.cos(np.pi * (np.arange(n) + 0.5) / n))  # Chebyshev nodes on (0, 1)
    g = erfcx(2 * (1 / t - 1)) / t
    c = cheb.chebfit(2 * t - 1, g, degree, w=1 / g)
    # from the variable s = 2 t - 1 back to t
    return Polynomial(cheb.cheb2poly(c))(Polynomial([-1, 2])).coef


def main():
    g = fit(DEGREE)
    t = np.linspace(1e-6, 1, 200001)
    exact = erfcx(2 * (1 / t - 1)) / t
    print("degree", DEGREE, "max relative error of g:", np.max(np.abs(Polynomial(g)(t) / exact - 1)))
    print("coefficients, t^0 first:", ", ".join(f"{v:.11g}" for v in g))

    f = np.float32
    x = np.linspace(-12, 12, 2000001).astype(f)
    z = np.abs(x) * f(np.sqrt(0.5))
    tt = f(1) / (f(0.5) * z + f(1))
    poly = np.full_like(tt, f(g[-1]))
    for k in range(DEGREE - 1, -1, -1):
        poly = poly * tt + f(g[k])
    e = np.exp(-(z * z)).astype(f)
    half_erfc = f(0.5) * tt * poly * e
    cdf = np.where(x < 0, half_erfc, f(1) - half_erfc).astype(f)
    out = x * cdf
    slope = (x * e) * f(1 / np.sqrt(2 * np.pi)) + cdf

    xd = x.astype(np.float64)
    want_cdf = 0.5 * erfc(-xd / np.sqrt(2))
    want_out = xd * want_cdf
    want_slope = want_cdf + xd * np.exp(-0.5 * xd * xd) / np.sqrt(2 * np.pi)
    scaled = lambda got, want: np.max(np.abs(got - want) / (1 + np.abs(want)))
    print("float32, x in [-12, 12]: value", scaled(out, want_out), "slope", scaled(slope, want_slope),
          "rounding the exact value to float", scaled(want_out.astype(f), want_out))
    left = xd < -1
    print("left tail (x < -1), relative error of Phi:", np.max(np.abs(cdf[left] - want_cdf[left]) / want_cdf[left]))


if __name__ == "__main__":
    main()
