// Gradient checks of every primitive op: vjp and jvp against central finite
// differences, forward against reverse mode, full Jacobians for tiny shapes.
#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

namespace {

/// Normal entries pushed at least `gap` away from zero (relu's kink).
A away_from_zero(const Shape& s, Rng& rng, double gap = 0.1) {
  A a = randn<double>(s, rng);
  for (auto& v : a) v += v >= 0 ? gap : -gap;
  return a;
}

A positive(const Shape& s, Rng& rng) {
  A a = randn<double>(s, rng, 0.3);
  for (auto& v : a) v = std::exp(v) + 0.2;
  return a;
}

}  // namespace

TEST_CASE("ops: elementwise binary ops with broadcasting") {
  FastRng rng(11);
  struct Case { Shape a, b; };
  for (auto c : {Case{{3, 4}, {3, 4}}, Case{{1, 5}, {1, 5}}, Case{{4, 3}, {3}}, Case{{2, 1, 3}, {4, 1}},
                 Case{{5}, {2, 5}}, Case{{3, 1}, {3, 4}}}) {
    A a = randn<double>(c.a, rng), b = randn<double>(c.b, rng);
    CAPTURE(c.a.size());
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& x) { return add(x[0], x[1]); }, {a, b}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& x) { return sub(x[0], x[1]); }, {a, b}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& x) { return mul(x[0], x[1]); }, {a, b}));
  }
}

TEST_CASE("ops: broadcast values equal xtensor's broadcasting") {
  FastRng rng(14);
  NoRecordScope<double> none;
  struct Case { Shape a, b; };
  for (auto c : {Case{{3, 1}, {3, 4}}, Case{{2, 1, 3}, {4, 1}}, Case{{5}, {2, 5}}, Case{{1, 3}, {4, 2, 1}},
                 Case{{2, 3, 1, 1}, {1, 3, 4, 5}}, Case{{1}, {2, 3}}, Case{{2, 1, 4}, {2, 3, 1}}, Case{{0, 3}, {1, 3}}}) {
    CAPTURE(shape_str(c.a));
    CAPTURE(shape_str(c.b));
    A a = randn<double>(c.a, rng), b = randn<double>(c.b, rng);
    A sum_want = a + b, prod_want = a * b, diff_want = b - a;
    DPGRAD_CHECK_CLOSE(add(D(a), D(b)).value(), sum_want, 0.0);
    DPGRAD_CHECK_CLOSE(mul(D(a), D(b)).value(), prod_want, 0.0);
    DPGRAD_CHECK_CLOSE(sub(D(b), D(a)).value(), diff_want, 0.0);
  }
}

TEST_CASE("ops: elementwise unary ops") {
  FastRng rng(12);
  for (Shape s : {Shape{1, 3}, Shape{4, 7}, Shape{2, 3, 2}}) {
    A x = away_from_zero(s, rng);
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return scale(v[0], -2.5); }, {x}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return add_scalar(v[0], 0.75); }, {x}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return relu(v[0]); }, {x}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return tanh(v[0]); }, {x}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return sigmoid(v[0]); }, {x}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return exp(v[0]); }, {x}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return log(v[0]); }, {positive(s, rng)}));
  }
}

TEST_CASE("ops: primal values") {
  A x = {{-1.0, 0.0, 2.0}};
  NoRecordScope<double> none;
  D t(x);
  DPGRAD_CHECK_CLOSE(relu(t).value(), (A{{0.0, 0.0, 2.0}}), 0.0);
  DPGRAD_CHECK_CLOSE(sigmoid(t).value(), (A{{1 / (1 + std::exp(1.0)), 0.5, 1 / (1 + std::exp(-2.0))}}), 1e-15);
  DPGRAD_CHECK_CLOSE(sum(t).value(), (A(1.0)), 0.0);
  DPGRAD_CHECK_CLOSE(mean(t, {1}).value(), (A{1.0 / 3}), 1e-15);
  // a very negative logit neither overflows the sigmoid nor NaNs
  CHECK(sigmoid(D(A{-1000.0})).value()(0) == 0.0);
}

TEST_CASE("ops: sums over axes equal xtensor's sums, for every pattern of kept and summed axes") {
  FastRng rng(17);
  for (const Shape& shape : {Shape{5}, Shape{3, 4}, Shape{2, 1, 5}, Shape{3, 4, 9}, Shape{2, 3, 1, 4, 2}, Shape{1, 1}}) {
    A x = randn<double>(shape, rng);
    for (std::size_t mask = 0; mask < (std::size_t(1) << shape.size()); ++mask) {
      std::vector<std::size_t> axes;
      for (std::size_t i = 0; i < shape.size(); ++i)
        if (mask >> i & 1) axes.push_back(i);
      if (axes.empty()) continue;  // (sum's empty list means every axis)
      CAPTURE(shape.size());
      CAPTURE(mask);
      for (bool keep : {false, true}) {
        A want = xt::sum(x, axes);
        if (keep) {
          Shape kept = shape;
          for (auto a : axes) kept[a] = 1;
          want.reshape(kept);
        }
        const A got = sum(D(x), axes, keep).value();
        REQUIRE(got.shape() == want.shape());
        DPGRAD_CHECK_CLOSE(got, want, 1e-13);
      }
    }
  }
  // broadcasting's reverse: positions (L, d) added to every sample of (B, L, d)
  A g = randn<double>({4, 3, 5}, rng);
  A pos = randn<double>({3, 5}, rng);
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D p = make_parameter<double>("p", pos);
  D y = add(D(randn<double>({4, 3, 5}, rng)), p);
  tape.backward(sum(mul(y, D(g))));
  DPGRAD_CHECK_CLOSE(p.grad(), A(xt::sum(g, {0})), 1e-13);
}

TEST_CASE("ops: reductions") {
  FastRng rng(13);
  A x = randn<double>({3, 4, 2}, rng);
  for (std::vector<std::size_t> axes : {std::vector<std::size_t>{}, {0}, {1}, {2}, {0, 2}, {1, 2}})
    for (bool keep : {false, true}) {
      CAPTURE(axes.size());
      CAPTURE(keep);
      DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return sum(v[0], axes, keep); }, {x}));
      DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return mean(v[0], axes, keep); }, {x}));
    }
}

TEST_CASE("ops: shape ops") {
  FastRng rng(14);
  A x = randn<double>({2, 3, 4}, rng);
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return reshape(v[0], {6, 4}); }, {x}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return transpose(v[0], {2, 0, 1}); }, {x}));
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return transpose(v[0], {1, 0, 2}); }, {x}));
  for (std::size_t axis = 0; axis < 3; ++axis) {
    CAPTURE(axis);
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return slice(v[0], axis, 1, 2); }, {x}));
  }
  A y = randn<double>({2, 5, 4}, rng), z = randn<double>({2, 1, 4}, rng);
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return concat<double>({v[0], v[1], v[2]}, 1); }, {x, y, z}));
  A w = randn<double>({2, 3, 4}, rng);
  for (std::size_t axis = 0; axis <= 3; ++axis) {
    CAPTURE(axis);
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return stack<double>({v[0], v[1]}, axis); }, {x, w}));
  }
  // a slice used twice: gradients accumulate into one buffer
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return add(slice(v[0], 1, 0, 2), slice(v[0], 1, 1, 3)); }, {x}));
}

TEST_CASE("ops: linear") {
  FastRng rng(15);
  struct Case { Shape x; std::size_t p; };
  for (auto c : {Case{{1, 3}, 2}, Case{{5, 3}, 7}, Case{{4, 6}, 1}, Case{{2, 3, 4}, 5}, Case{{1, 1, 2}, 3}}) {
    std::size_t d = c.x.back();
    A x = randn<double>(c.x, rng), w = randn<double>({d, c.p}, rng), b = randn<double>({c.p}, rng);
    CAPTURE(d);
    CAPTURE(c.p);
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return linear(v[0], v[1], v[2]); }, {x, w, b}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return linear(v[0], v[1]); }, {x, w}));
    // the jvp's x W_dot_j products: one per thread when k divides among them, else each split
    for (std::size_t k : {1, 2, 4, 5}) {
      CAPTURE(k);
      GradcheckOptions o;
      o.tangents = k;
      DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return linear(v[0], v[1], v[2]); }, {x, w, b}, o));
    }
  }
  // values: x W + b on a hand-checkable case
  NoRecordScope<double> none;
  A x = {{1.0, 2.0}}, w = {{1.0, 0.0, -1.0}, {0.5, 2.0, 1.0}}, b = {0.0, 1.0, 2.0};
  DPGRAD_CHECK_CLOSE(linear(D(x), D(w), D(b)).value(), (A{{2.0, 5.0, 3.0}}), 0.0);
}

TEST_CASE("ops: gather") {
  FastRng rng(16);
  A w = randn<double>({6, 3}, rng);
  ArrayT<std::int32_t> ids = {{0, 5, 5, 2}, {1, 0, 4, 4}};  // repeated ids accumulate
  DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return gather(v[0], ids); }, {w}));
  ArrayT<std::int32_t> one = xt::zeros<std::int32_t>({1, 1}) + 3;
  DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return gather(v[0], one); }, {w}));
  // padding positions give zero rows and no gradient to the padding row
  DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return gather(v[0], ids, 5); }, {w}));
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D table = make_parameter<double>("emb", w);
  D out = gather(table, ids, 5);
  CHECK(xt::sum(xt::abs(xt::view(out.value(), 0, 1)))() == 0.0);
  tape.backward(sum(out));
  CHECK(xt::sum(xt::abs(xt::view(table.grad(), 5)))() == 0.0);
  CHECK(xt::view(table.grad(), 4)(0) == 2.0);
}

TEST_CASE("ops: cross entropy") {
  FastRng rng(17);
  for (std::size_t b : {1, 4}) {
    A z = randn<double>({b, 5}, rng, 2.0);
    std::vector<std::int32_t> y;
    for (std::size_t i = 0; i < b; ++i) y.push_back(std::int32_t(rng.below(5)));
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return cross_entropy(v[0], y); }, {z}));
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return mean_cross_entropy(v[0], y); }, {z}));
  }
  // value: log(sum e^z) - z_y, stable for huge logits
  NoRecordScope<double> none;
  A z = {{1000.0, 1000.0}, {0.0, std::log(3.0)}};
  auto l = cross_entropy(D(z), {0, 1}).value();
  CHECK(l(0) == doctest::Approx(std::log(2.0)).epsilon(1e-12));
  CHECK(l(1) == doctest::Approx(std::log(4.0 / 3.0)).epsilon(1e-12));
}

TEST_CASE("ops: a composite network gets its derivatives from its ops") {
  FastRng rng(18);
  A x = randn<double>({3, 4}, rng), w1 = randn<double>({4, 5}, rng), b1 = randn<double>({5}, rng);
  A w2 = randn<double>({5, 3}, rng), b2 = randn<double>({3}, rng);
  std::vector<std::int32_t> y = {0, 2, 1};
  auto net = [&](const std::vector<D>& v) {
    return mean_cross_entropy(linear(tanh(linear(v[0], v[1], v[2])), v[3], v[4]), y);
  };
  DPGRAD_CHECK_GRADS(gradcheck(net, {x, w1, b1, w2, b2}));
}

namespace {
// Deliberately wrong rules: gradcheck must catch each of them.
enum class Bug { none, missing_factor, transposed, wrong_jvp };

/// y = x W for x (m, n), W (n, n), with loops; the bug sits in one rule.
template <Bug B>
struct Matmul final : Op<double> {
  std::size_t m = 0, n = 0;
  const char* name() const override { return "matmul_under_test"; }
  A forward(Values<double> x) override {
    m = x[0]->shape()[0];
    n = x[0]->shape()[1];
    A y = xt::zeros<double>({m, n});
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t l = 0; l < n; ++l) y(i, j) += (*x[0])(i, l) * (*x[1])(l, j);
    return y;
  }
  void vjp(const A& dout, Values<double> x, const A&, Slots<double> dx) override {
    A gx = xt::zeros<double>({m, n}), gw = xt::zeros<double>({n, n});
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t l = 0; l < n; ++l) {
          double w = B == Bug::transposed ? (*x[1])(j, l) : (*x[1])(l, j);
          gx(i, l) += dout(i, j) * w;
          gw(l, j) += dout(i, j) * (*x[0])(i, l) * (B == Bug::missing_factor ? 0.5 : 1.0);
        }
    if (dx[0]) dx[0].add(gx);
    if (dx[1]) dx[1].add(gw);
  }
  A jvp(Values<double> x, Tangents<double> d, const A&, std::size_t k) override {
    A r = xt::zeros<double>({k, m, n});
    for (std::size_t t = 0; t < k; ++t)
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j)
          for (std::size_t l = 0; l < n; ++l) {
            if (d[0]) r(t, i, j) += (*d[0])(t, i, l) * (*x[1])(l, j);
            if (d[1] && B != Bug::wrong_jvp) r(t, i, j) += (*x[0])(i, l) * (*d[1])(t, l, j);
          }
    return r;
  }
};

template <Bug B>
GradcheckResult check_matmul() {
  FastRng rng(19);
  A x = randn<double>({3, 4}, rng), w = randn<double>({4, 4}, rng);
  return gradcheck([](const std::vector<D>& v) { return apply<double>(std::make_unique<Matmul<B>>(), {v[0], v[1]}); },
                   {x, w});
}
}  // namespace

TEST_CASE("gradcheck: passes a correct rule and fails wrong ones") {
  GradcheckResult good = check_matmul<Bug::none>();
  DPGRAD_CHECK_GRADS(good);
  GradcheckResult missing = check_matmul<Bug::missing_factor>();
  CHECK_FALSE(missing.ok);
  CHECK(missing.vjp_error > 1e-2);
  GradcheckResult transposed = check_matmul<Bug::transposed>();
  CHECK_FALSE(transposed.ok);
  CHECK(transposed.vjp_error > 1e-2);
  GradcheckResult jvp = check_matmul<Bug::wrong_jvp>();
  CHECK_FALSE(jvp.ok);
  CHECK(jvp.jvp_error > 1e-2);
  CHECK(jvp.vjp_error < 1e-6);  // the reverse rule is right; only the forward one is wrong
  CHECK(jvp.report.find("jvp") != std::string::npos);
}

TEST_CASE("ops: lstm_gates_at with sole step readers: each step's gradient block written outright") {
  FastRng rng(62);
  const std::size_t B = 2, L = 3, H = 2;
  const A proj = randn<double>({B, L, 4 * H}, rng), other = randn<double>({B, L, 4 * H}, rng);
  std::vector<A> weights;
  for (std::size_t t = 0; t < L; ++t) weights.push_back(randn<double>({B, 4 * H}, rng));
  // the gradient of sum_t <w_t, gates_t> (+ <other, proj> from a reader outside them, added before or after)
  auto grad = [&](bool shared, int outside) {
    TapeT<double> tape;
    RecordScope<double> record(tape);
    D p = make_parameter<double>("proj", proj);
    const auto blocks = shared ? sole_step_readers(L) : nullptr;
    D loss = outside == 1 ? sum(mul(p, D(other))) : D();
    for (std::size_t t : {2, 0, 1}) {
      D term = sum(mul(lstm_gates_at(p, t, D(), blocks), D(weights[t])));
      loss = loss.defined() ? add(loss, term) : term;
    }
    if (outside == 2) loss = add(loss, sum(mul(p, D(other))));
    tape.backward(loss);
    return A(p.grad());
  };
  for (int outside : {0, 1, 2}) {
    CAPTURE(outside);
    DPGRAD_CHECK_CLOSE(grad(true, outside), grad(false, outside), 1e-14);
  }
  CHECK_THROWS_AS(([&] {
                    TapeT<double> tape;
                    RecordScope<double> record(tape);
                    D p = make_parameter<double>("proj", proj);
                    tape.backward(sum(lstm_gates_at(p, 2, D(), sole_step_readers(2))));
                  }()),
                  std::invalid_argument);
}

TEST_CASE("ops: fused LSTM cell ops") {
  FastRng rng(61);
  for (std::size_t H : {1, 3}) {
    CAPTURE(H);
    const std::size_t B = 2;
    A z = randn<double>({B, 4 * H}, rng), c = randn<double>({B, H}, rng);
    A gates = randn<double>({B, 4 * H}, rng, 0.5);
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return lstm_gates(v[0]); }, {z}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return lstm_gates(v[0], v[1]); }, {z, gates}));
    // step t of a (B, L, 4H) projection, read in place
    A proj = randn<double>({B, 3, 4 * H}, rng);
    for (std::size_t t : {0, 2}) {
      CAPTURE(t);
      DPGRAD_CHECK_GRADS(gradcheck([t](const std::vector<D>& v) { return lstm_gates_at(v[0], t); }, {proj}));
      DPGRAD_CHECK_GRADS(gradcheck([t](const std::vector<D>& v) { return lstm_gates_at(v[0], t, v[1]); }, {proj, gates}));
      D pt(proj), zh(gates);
      DPGRAD_CHECK_CLOSE(lstm_gates_at(pt, t, zh).value(),
                         lstm_gates(add(reshape(slice(pt, 1, t, t + 1), {B, 4 * H}), zh)).value(), 1e-15);
    }
    // two steps of one projection: their gradients meet in one buffer
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) {
      return add(lstm_gates_at(v[0], 1), lstm_gates_at(v[0], 0, v[1]));
    }, {proj, gates}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return lstm_state(v[0], v[1]); }, {gates, c}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return lstm_state(v[0]); }, {gates}));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return lstm_output(v[0], v[1]); }, {gates, c}));
    // a whole step, gates read by both cell ops (their gradients meet in one buffer)
    auto step = [](const std::vector<D>& v) {
      D a = lstm_gates(v[0]);
      D c_new = lstm_state(a, v[1]);
      return add(lstm_output(a, c_new), scale(c_new, 0.5));
    };
    DPGRAD_CHECK_GRADS(gradcheck(step, {z, c}));

    // values: the same step from the unfused ops
    D zt(z), ct(c);
    D i = sigmoid(slice(zt, 1, 0, H)), f = sigmoid(slice(zt, 1, H, 2 * H));
    D g = tanh(slice(zt, 1, 2 * H, 3 * H)), o = sigmoid(slice(zt, 1, 3 * H, 4 * H));
    D c_ref = add(mul(i, g), mul(f, ct));
    D h_ref = mul(o, tanh(c_ref));
    D a = lstm_gates(zt);
    DPGRAD_CHECK_CLOSE(slice(a, 1, 2 * H, 3 * H).value(), g.value(), 1e-14);
    DPGRAD_CHECK_CLOSE(lstm_state(a, ct).value(), c_ref.value(), 1e-14);
    DPGRAD_CHECK_CLOSE(lstm_state(a).value(), mul(i, g).value(), 1e-14);
    DPGRAD_CHECK_CLOSE(lstm_output(a, c_ref).value(), h_ref.value(), 1e-14);
  }
  D bad_gates(A(xt::zeros<double>({2, 6})));
  D state(A(xt::zeros<double>({2, 1})));
  CHECK_THROWS_WITH_AS(lstm_gates(bad_gates), doctest::Contains("(B, 4H)"), std::invalid_argument);
  D seq(A(xt::zeros<double>({2, 3, 8})));
  CHECK_THROWS_WITH_AS(lstm_gates_at(seq, 3), doctest::Contains("step"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(lstm_gates_at(seq, 0, state), doctest::Contains("recurrent term"), std::invalid_argument);
  D gates(A(xt::zeros<double>({2, 8})));
  CHECK_THROWS_WITH_AS(lstm_state(gates, state), doctest::Contains("(B, H)"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(lstm_output(gates, state), doctest::Contains("(B, H)"), std::invalid_argument);
}
