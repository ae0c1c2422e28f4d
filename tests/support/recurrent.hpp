// Checks shared by the recurrent layer tests (LSTM, GRU): outputs flattened for
// gradcheck, a layer's derivatives with respect to its own parameters (which
// gradcheck cannot reach), and padded states that must agree or be zero.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "support/check.hpp"

namespace dpgrad::test {

/// states and final flattened into one vector: one output for gradcheck.
template <class Output>
TensorT<double> flat(const Output& out) {
  return concat<double>({reshape(out.states, {out.states.size()}), reshape(out.final, {out.final.size()})}, 0);
}

inline double rel(double a, double b) { return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-3}); }

inline double dot(const ArrayT<double>& a, const ArrayT<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a.data()[i] * b.data()[i];
  return s;
}

/// Derivatives of a layer with respect to its own parameters: <u, J v> by
/// central differences against reverse mode, and forward mode (tangents seeded
/// on the parameters) against reverse mode.
inline void check_parameter_derivatives(const std::vector<TensorT<double>>& params,
                                        const std::function<TensorT<double>()>& run, std::uint64_t seed) {
  using D = TensorT<double>;
  using A = ArrayT<double>;
  FastRng rng(seed);
  std::vector<A> v;
  for (const auto& p : params) v.push_back(randn<double>(p.shape(), rng));
  A y0;
  {
    NoRecordScope<double> none;
    y0 = run().value();
  }
  A u = randn<double>(shape_of(y0), rng);

  double rev = 0;
  {
    TapeT<double> tape;
    RecordScope<double> scope(tape);
    for (auto p : params) p.zero_grad();
    D y = run();
    tape.backward(y, u);
    for (std::size_t i = 0; i < params.size(); ++i) rev += dot(params[i].grad(), v[i]);
  }

  double fwd = 0;
  {
    NoRecordScope<double> none;
    for (std::size_t i = 0; i < params.size(); ++i) {
      Shape s{1};
      s.insert(s.end(), v[i].shape().begin(), v[i].shape().end());
      A t = v[i];
      t.reshape(s);
      D p = params[i];
      p.set_tangent(t);
    }
    D y = run();
    REQUIRE(y.has_tangent());
    fwd = dot(u, A(xt::view(y.tangent(), 0)));
    for (auto p : params) p.clear_tangent();
  }

  const double e = 1e-6;
  auto shifted = [&](double by) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      D p = params[i];
      p.mutable_value() += by * v[i];
    }
    NoRecordScope<double> none;
    return A(run().value());
  };
  A plus = shifted(e);
  A minus = shifted(-2 * e);
  shifted(e);
  double fd = dot(u, A((plus - minus) / (2 * e)));
  INFO("reverse " << rev << ", forward " << fwd << ", finite differences " << fd);
  CHECK(rel(rev, fd) < 1e-6);
  CHECK(rel(fwd, rev) < 1e-10);
}

/// Valid steps (t < length) of `states` (B, L, H) agree, padded steps are zero in both.
inline void check_states_agree(const ArrayT<double>& a, const ArrayT<double>& b,
                               const std::vector<std::int32_t>& lengths, double rtol) {
  using A = ArrayT<double>;
  REQUIRE(a.shape()[0] == b.shape()[0]);
  for (std::size_t n = 0; n < lengths.size(); ++n) {
    CAPTURE(n);
    std::size_t len = std::size_t(lengths[n]);
    A va = xt::view(a, n, xt::range(0, len), xt::all()), vb = xt::view(b, n, xt::range(0, len), xt::all());
    DPGRAD_CHECK_CLOSE(va, vb, rtol);
    for (const A* s : {&a, &b})
      for (std::size_t t = len; t < s->shape()[1]; ++t)
        for (std::size_t j = 0; j < s->shape()[2]; ++j) CHECK((*s)(n, t, j) == 0.0);
  }
}

}  // namespace dpgrad::test
