// The engine's thread pool and the work it splits: every index covered once,
// errors carried back, nesting inline, split GEMMs and bias passes equal to the
// definition, and background work for idle workers.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/blas.hpp"
#include "engine/ops.hpp"
#include "engine/parallel.hpp"
#include "engine/tape.hpp"
#include "support/check.hpp"
#include "support/threads.hpp"

using namespace dpgrad;
using test::randn;
using test::ThreadsScope;
using test::wake_workers_until;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

/// C = op(A) op(B) by the definition, row-major, for the reference.
std::vector<double> naive_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const std::vector<double>& a,
                               const std::vector<double>& b) {
  std::vector<double> c(m * n, 0.0);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t l = 0; l < k; ++l)
        c[i * n + j] += (ta ? a[l * m + i] : a[i * k + l]) * (tb ? b[j * k + l] : b[l * n + j]);
  return c;
}

/// Runs `split` (parallel::for_range or for_each_piece) over [0, n) with `grain`:
/// how many pieces ran, how many of them `odd(begin, end)` flagged, and how many
/// indices were not covered exactly once.
struct Coverage {
  int pieces = 0, flagged = 0, wrong = 0;
};
template <class Odd>
Coverage cover(void (*split)(std::size_t, std::size_t, const std::function<void(std::size_t, std::size_t)>&),
               std::size_t n, std::size_t grain, Odd odd) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int> pieces{0}, flagged{0};
  split(n, grain, [&](std::size_t b, std::size_t e) {
    ++pieces;
    if (odd(b, e)) ++flagged;
    for (std::size_t i = b; i < e; ++i) ++hits[i];
  });
  Coverage c{pieces.load(), flagged.load(), 0};
  for (auto& h : hits) c.wrong += h.load() != 1;
  return c;
}

/// f(threads, n, grain) for 1 to 3 threads and every n and grain given.
template <class F>
void for_each_case(std::initializer_list<std::size_t> sizes, std::initializer_list<std::size_t> grains, F f) {
  for (int threads : {1, 2, 3}) {
    ThreadsScope scope(threads);
    CAPTURE(threads);
    for (std::size_t n : sizes)
      for (std::size_t grain : grains) {
        CAPTURE(n);
        CAPTURE(grain);
        f(threads, n, grain);
      }
  }
}
}  // namespace

TEST_CASE("parallel::for_range covers every index exactly once, in pieces no shorter than the grain") {
  for_each_case({0, 1, 7, 100, 1001, 65536}, {1, 10, 5000}, [](int threads, std::size_t n, std::size_t grain) {
    const Coverage c = cover(&parallel::for_range, n, grain,
                             [&](std::size_t b, std::size_t e) { return e - b < grain && e - b != n; });
    CHECK(c.wrong == 0);
    CHECK(c.flagged == 0);  // no piece shorter than the grain
    CHECK(c.pieces <= threads);
  });
}

TEST_CASE("parallel::for_range rethrows a piece's exception and stays usable; nested calls run inline") {
  ThreadsScope scope(2);
  CHECK_THROWS_WITH_AS(parallel::for_range(1000, 1,
                                           [](std::size_t b, std::size_t) {
                                             if (b > 0) throw std::runtime_error("piece failed");
                                           }),
                       "piece failed", std::runtime_error);
  std::atomic<long> total{0};
  parallel::for_range(1000, 1, [&](std::size_t b, std::size_t e) {
    parallel::for_range(e - b, 1, [&](std::size_t bb, std::size_t ee) { total += long(ee - bb); });
  });
  CHECK(total.load() == 1000);
  CHECK_THROWS_AS(parallel::set_threads(0), std::invalid_argument);
}

TEST_CASE("parallel::for_each_piece covers every index once in pieces of at most the grain, claimed by any thread") {
  for_each_case({0, 1, 7, 100, 1001, 200000}, {1, 3, 64}, [](int threads, std::size_t n, std::size_t grain) {
    const Coverage c = cover(&parallel::for_each_piece, n, grain,
                             [&](std::size_t b, std::size_t e) { return e - b > grain; });
    CHECK(c.wrong == 0);
    const bool inline_run = n == 0 || threads == 1 || n < 2 * grain;
    const std::size_t want = n == 0 ? 0 : inline_run ? 1 : std::min<std::size_t>(0xffff, (n + grain - 1) / grain);
    CHECK(std::size_t(c.pieces) == want);
    // past 65,535 pieces they grow longer than the grain; an inline run is one piece of n
    if (!inline_run && want < 0xffff) CHECK(c.flagged == 0);
  });
  ThreadsScope scope(2);
  CHECK_THROWS_WITH_AS(parallel::for_each_piece(100, 1,
                                                [](std::size_t b, std::size_t) {
                                                  if (b == 57) throw std::runtime_error("piece 57 failed");
                                                }),
                       "piece 57 failed", std::runtime_error);
  std::atomic<int> calls{0};
  parallel::for_range(10, 1, [&](std::size_t, std::size_t) {
    parallel::for_each_piece(100, 1, [&](std::size_t b, std::size_t e) { calls += (b == 0 && e == 100) ? 1 : 1000; });
  });
  CHECK(calls.load() == 2);  // inside a piece: one inline call each
}

TEST_CASE("blas::gemm split across threads equals the definition (rows, columns and inner dimension)") {
  ThreadsScope scope(2);
  // shapes that take each split: tall op(A), wide op(B), long inner dimension, and one too small to split
  struct Case {
    std::size_t m, n, k;
  };
  for (Case s : {Case{515, 17, 300}, Case{9, 700, 400}, Case{13, 11, 20001}, Case{3, 4, 5}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      CAPTURE(s.m);
      CAPTURE(s.n);
      CAPTURE(s.k);
      CAPTURE(ta);
      CAPTURE(tb);
      std::vector<double> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n, 1.0);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = double((i * 7919) % 101) / 50.0 - 1.0;
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = double((i * 104729) % 103) / 51.0 - 1.0;
      std::vector<double> want = naive_gemm(ta, tb, s.m, s.n, s.k, a, b);
      blas::gemm<double>(ta, tb, s.m, s.n, s.k, 2.0, a.data(), b.data(), 0.5, c.data());  // 2 AB + 0.5 C
      double worst = 0;
      for (std::size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(c[i] - (2.0 * want[i] + 0.5)));
      CHECK(worst < 1e-9 * double(s.k));
      std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf(s.m * s.n);
      blas::gemm<float>(ta, tb, s.m, s.n, s.k, 1.0f, af.data(), bf.data(), 0.0f, cf.data());
      double worst_f = 0;
      for (std::size_t i = 0; i < cf.size(); ++i) worst_f = std::max(worst_f, std::abs(double(cf[i]) - want[i]));
      CHECK(worst_f < 1e-5 * double(s.k));
    }
  }
}

TEST_CASE("linear's bias passes split across threads: every row starts as b, db = column sums of dout") {
  FastRng rng(77);
  const std::size_t m = 10001, d = 3, p = 5;  // rows enough for a piece per thread (about 2^14 values each)
  A x = randn<double>({m, d}, rng), w = randn<double>({d, p}, rng), b = randn<double>({p}, rng),
    r = randn<double>({m, p}, rng);
  A want_out = xt::zeros<double>({m, p});
  std::vector<double> want_db(p, 0.0);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < p; ++j) {
      want_out(i, j) = b(j);
      for (std::size_t l = 0; l < d; ++l) want_out(i, j) += x(i, l) * w(l, j);
      want_db[j] += r(i, j);
    }
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    ThreadsScope scope(threads);
    TapeT<double> tape;
    RecordScope<double> record(tape);
    D wt = make_parameter<double>("w", w), bt = make_parameter<double>("b", b);
    D out = linear(D(x), wt, bt);
    DPGRAD_CHECK_CLOSE(out.value(), want_out, 1e-9);
    tape.backward(sum(mul(out, D(r))));  // dout = r
    for (std::size_t j = 0; j < p; ++j) CHECK(bt.grad()(j) == doctest::Approx(want_db[j]).epsilon(1e-12));
  }
}

TEST_CASE("parallel::Background: idle workers run its units, never the caller; stop waits for them and rethrows") {
  {
    ThreadsScope one(1);
    parallel::Background none([] { return true; });
    CHECK_FALSE(none.active());  // no workers: the owner does the work itself
  }
  ThreadsScope scope(2);
  const auto caller = std::this_thread::get_id();
  std::atomic<int> units{0}, on_caller{0}, inside{0};
  {
    parallel::Background background([&] {
      if (std::this_thread::get_id() == caller) ++on_caller;
      ++inside;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      --inside;
      return ++units < 100000;
    });
    CHECK(background.active());
    parallel::Background second([] { return false; });
    CHECK_FALSE(second.active());  // one at a time
    CHECK(wake_workers_until([&] { return units.load() >= 20; }));
    // jobs still run while a unit is in hand, and give the same results
    std::atomic<long> total{0};
    parallel::for_range(1000, 1, [&](std::size_t b, std::size_t e) { total += long(e - b); });
    CHECK(total.load() == 1000);
    background.stop();
    CHECK(inside.load() == 0);  // no unit in hand once stop returns
    const int after = units.load();
    parallel::for_range(2, 1, [](std::size_t, std::size_t) {});
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(units.load() == after);  // and none after
    parallel::Background next([] { return false; });
    CHECK(next.active());  // the pool is free again
  }
  CHECK(on_caller.load() == 0);
  std::atomic<int> tries{0};
  parallel::Background failing([&]() -> bool {
    ++tries;
    throw std::runtime_error("unit failed");
  });
  CHECK(wake_workers_until([&] { return tries.load() > 0; }));
  CHECK_THROWS_WITH_AS(failing.stop(), "unit failed", std::runtime_error);
  CHECK_NOTHROW(failing.stop());  // stopped once
}
