// Checks shared by the recurrent layer tests (LSTM, GRU): outputs flattened for
// gradcheck, a layer's derivatives with respect to its own parameters (which
// gradcheck cannot reach), padded states that must agree or be zero, and the
// properties every recurrent layer has (padding, reversal, per-sample, joining
// two directions, float and empty batches), written once for every layer.
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

// The property checks below take the layer as callables, so one check serves
// every recurrent layer whose output has .states (B, L, k) and .final (B, k):
//   one(x, lengths, reverse): one direction, k = h;
//   both(x, lengths): a bidirectional layer, k = 2h;
// with x: (B, L, d) and lengths (B) in [1, L]. The caller builds the layers
// from `rng` first; the checks then draw their inputs from it.

/// Outputs do not depend on the padding: junk (10x larger) at every padded
/// position and 3 extra padded steps leave final and valid states unchanged,
/// for one direction (both ways) and for the bidirectional layer.
template <class One, class Both>
void check_padding_invariance(const One& one, const Both& both, std::size_t d, std::size_t h, Rng& rng) {
  using D = TensorT<double>;
  using A = ArrayT<double>;
  const std::vector<std::int32_t> lengths = {4, 2, 3};
  A x = randn<double>({3, 4, d}, rng);
  A x_ext = randn<double>({3, 7, d}, rng, 10.0);
  for (std::size_t n = 0; n < 3; ++n)
    for (std::size_t t = 0; t < std::size_t(lengths[n]); ++t)
      for (std::size_t j = 0; j < d; ++j) x_ext(n, t, j) = x(n, t, j);
  NoRecordScope<double> none;
  for (bool reverse : {false, true}) {
    CAPTURE(reverse);
    auto a = one(D(x), lengths, reverse);
    auto b = one(D(x_ext), lengths, reverse);
    CHECK(b.states.shape() == Shape{3, 7, h});
    DPGRAD_CHECK_CLOSE(a.final.value(), b.final.value(), 1e-12);
    check_states_agree(a.states.value(), b.states.value(), lengths, 1e-12);
  }
  auto a = both(D(x), lengths);
  auto b = both(D(x_ext), lengths);
  DPGRAD_CHECK_CLOSE(a.final.value(), b.final.value(), 1e-12);
  check_states_agree(a.states.value(), b.states.value(), lengths, 1e-12);
}

/// The reverse direction equals the forward one on each sequence reversed
/// within its length (padded positions hold other junk): the reverse state at
/// t is the forward state at len-1-t, padded steps are 0, and the reverse final
/// state is the state at t = 0.
template <class One>
void check_reverse_is_forward_reversed(const One& one, std::size_t d, std::size_t h, Rng& rng) {
  using D = TensorT<double>;
  using A = ArrayT<double>;
  const std::size_t l = 5;
  const std::vector<std::int32_t> lengths = {5, 1, 3, 4};
  A x = randn<double>({4, l, d}, rng);
  A x_rev = randn<double>({4, l, d}, rng);
  for (std::size_t n = 0; n < 4; ++n) {
    std::size_t len = std::size_t(lengths[n]);
    for (std::size_t t = 0; t < len; ++t)
      for (std::size_t j = 0; j < d; ++j) x_rev(n, t, j) = x(n, len - 1 - t, j);
  }
  NoRecordScope<double> none;
  auto r = one(D(x), lengths, true);
  auto f = one(D(x_rev), lengths, false);
  DPGRAD_CHECK_CLOSE(r.final.value(), f.final.value(), 1e-12);
  for (std::size_t n = 0; n < 4; ++n) {
    CAPTURE(n);
    std::size_t len = std::size_t(lengths[n]);
    for (std::size_t t = 0; t < len; ++t)
      for (std::size_t j = 0; j < h; ++j)
        CHECK(r.states.value()(n, t, j) == doctest::Approx(f.states.value()(n, len - 1 - t, j)).epsilon(1e-12));
    for (std::size_t t = len; t < l; ++t)
      for (std::size_t j = 0; j < h; ++j) CHECK(r.states.value()(n, t, j) == 0.0);
  }
  DPGRAD_CHECK_CLOSE(A(xt::view(r.states.value(), xt::all(), 0, xt::all())), r.final.value(), 0.0);
}

/// A sample's outputs from the bidirectional layer depend on neither the other
/// samples' tokens nor their lengths: sample 1 of a batch of 3 (others replaced,
/// their lengths changed) and sample 1 run alone give the same outputs.
template <class Both>
void check_per_sample_independence(const Both& both, std::size_t d, Rng& rng) {
  using D = TensorT<double>;
  using A = ArrayT<double>;
  using Lengths = std::vector<std::int32_t>;
  const std::size_t l = 4;
  A x = randn<double>({3, l, d}, rng);
  A y = randn<double>({3, l, d}, rng);
  xt::view(y, 1, xt::all(), xt::all()) = xt::view(x, 1, xt::all(), xt::all());
  A alone = xt::view(x, xt::range(1, 2), xt::all(), xt::all());
  NoRecordScope<double> none;
  auto a = both(D(x), Lengths{4, 2, 3});
  auto b = both(D(y), Lengths{1, 2, 4});
  auto c = both(D(alone), Lengths{2});
  auto row = [](const D& t) { return A(xt::view(t.value(), xt::range(1, 2))); };
  DPGRAD_CHECK_CLOSE(row(a.final), row(b.final), 1e-12);
  DPGRAD_CHECK_CLOSE(row(a.states), row(b.states), 1e-12);
  DPGRAD_CHECK_CLOSE(row(a.final), c.final.value(), 1e-12);
  DPGRAD_CHECK_CLOSE(row(a.states), c.states.value(), 1e-12);
}

/// The bidirectional output is [forward, backward] of its two directions, to
/// the last bit: states (B, L, 2h) and final (B, 2h) are the two joined
/// feature-wise. direction(x, lengths, reverse) runs the recurrence with the
/// bidirectional layer's own weights for that direction. The two directions
/// must differ (different weights, different order).
template <class Both, class Direction>
void check_bidirectional_joins_directions(const Both& both, const Direction& direction, std::size_t d, std::size_t h,
                                          Rng& rng) {
  using D = TensorT<double>;
  using A = ArrayT<double>;
  const std::vector<std::int32_t> lengths = {2, 4, 3};
  A x = randn<double>({3, 4, d}, rng);
  NoRecordScope<double> none;
  auto out = both(D(x), lengths);
  auto f = direction(D(x), lengths, false);
  auto r = direction(D(x), lengths, true);
  CHECK(out.states.shape() == Shape{3, 4, 2 * h});
  CHECK(out.final.shape() == Shape{3, 2 * h});
  DPGRAD_CHECK_CLOSE(A(xt::view(out.states.value(), xt::all(), xt::all(), xt::range(0, h))), f.states.value(), 0.0);
  DPGRAD_CHECK_CLOSE(A(xt::view(out.states.value(), xt::all(), xt::all(), xt::range(h, 2 * h))), r.states.value(), 0.0);
  DPGRAD_CHECK_CLOSE(A(xt::view(out.final.value(), xt::all(), xt::range(0, h))), f.final.value(), 0.0);
  DPGRAD_CHECK_CLOSE(A(xt::view(out.final.value(), xt::all(), xt::range(h, 2 * h))), r.final.value(), 0.0);
  CHECK(xt::amax(xt::abs(f.final.value() - r.final.value()))() > 1e-3);
}

/// The float instantiation of a bidirectional layer (input d = 3, 2h = 8 outputs)
/// runs on a padded batch with finite outputs, and on an empty batch (B = 0).
/// both takes a float x: (B, 3, 3).
template <class Both>
void check_float_and_empty_batch(const Both& both, Rng& rng) {
  using Lengths = std::vector<std::int32_t>;
  ArrayT<float> x = randn<float>({2, 3, 3}, rng);
  auto out = both(Tensor(x), Lengths{3, 1});
  CHECK(out.states.shape() == Shape{2, 3, 8});
  CHECK(out.final.shape() == Shape{2, 8});
  for (float v : out.final.value()) CHECK(std::isfinite(v));
  ArrayT<float> none = xt::zeros<float>({std::size_t(0), std::size_t(3), std::size_t(3)});
  auto empty = both(Tensor(none), Lengths{});
  CHECK(empty.states.shape() == Shape{0, 3, 8});
  CHECK(empty.final.shape() == Shape{0, 8});
}

}  // namespace dpgrad::test
