// The fused ops (docs/fused-ops.md): attention, layer_norm and the vectorised
// GELU. Gradchecks in both modes; values, cotangents and tangents against the
// compositions of elementary ops they replace (kept here as reference
// implementations); where the samples go; and the tape's release of records
// during backward.
#include <cmath>
#include <numbers>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/per_sample.hpp"
#include "engine/tape.hpp"
#include "support/check.hpp"
#include "support/reference_ops.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;
using test::reference_attention;
using test::reference_layer_norm;

namespace {

/// Value, input cotangents for the seed u, and 2 tangents of f at xs.
struct Derivatives {
  A value, tangent;
  std::vector<A> grads;
};
Derivatives derivatives(const std::function<D(const std::vector<D>&)>& f, const std::vector<A>& xs, const A& u,
                        const std::vector<A>& tangents) {
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  std::vector<D> in;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    in.emplace_back(xs[i], true);
    in.back().set_tangent(tangents[i]);
  }
  const D y = f(in);
  tape.backward(y, u);
  Derivatives r{y.value(), y.tangent(), {}};
  for (auto& t : in) r.grads.push_back(t.grad());
  return r;
}

/// Agreement to `tol` relative to the larger value, or absolute below 1e-8
/// (entries that cancel to about zero in one and exactly zero in the other).
void check_same(const Derivatives& got, const Derivatives& want, double tol) {
  auto same = [&](const A& a, const A& b) {
    const std::string diff = test::mismatch(a, b, tol, 1e-8);
    INFO(diff);
    CHECK(diff.empty());
  };
  same(got.value, want.value);
  same(got.tangent, want.tangent);
  for (std::size_t i = 0; i < want.grads.size(); ++i) same(got.grads[i], want.grads[i]);
}

std::vector<A> tangents_for(const std::vector<A>& xs, std::size_t k, Rng& rng) {
  std::vector<A> t;
  for (const auto& x : xs) {
    Shape s{k};
    for (auto d : x.shape()) s.push_back(d);
    t.push_back(randn<double>(s, rng));
  }
  return t;
}

/// (B, Lk) mask rows: 1 where a key is padding.
A mask_rows(const std::vector<std::vector<int>>& rows) {
  A m = xt::zeros<double>({rows.size(), rows[0].size()});
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t j = 0; j < rows[i].size(); ++j) m(i, j) = rows[i][j];
  return m;
}

}  // namespace

TEST_CASE("fused attention: gradchecks in both modes, with and without a mask, queries and keys of other lengths") {
  FastRng rng(1);
  SUBCASE("self-attention, 2 heads, no mask") {
    const std::vector<A> in{randn<double>({2, 4, 6}, rng), randn<double>({2, 4, 6}, rng), randn<double>({2, 4, 6}, rng)};
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return attention(v[0], v[1], v[2], 2); }, in));
  }
  SUBCASE("Lq 3, Lk 5, dk 2, dv 3, 2 heads; a key masked inside, padding, and a sample with every key masked") {
    const A mask = mask_rows({{0, 1, 0, 1, 1}, {0, 0, 0, 0, 0}, {1, 1, 1, 1, 1}});
    const std::vector<A> in{randn<double>({3, 3, 4}, rng), randn<double>({3, 5, 4}, rng), randn<double>({3, 5, 6}, rng)};
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return attention(v[0], v[1], v[2], 2, mask); }, in));
    // the same key given as k and v: one cotangent buffer for both
    const std::vector<A> kv{randn<double>({3, 3, 4}, rng), randn<double>({3, 5, 4}, rng)};
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return attention(v[0], v[1], v[1], 2, mask); }, kv));
  }
  SUBCASE("a scale of one's own, a batch of one") {
    const std::vector<A> in{randn<double>({1, 3, 2}, rng), randn<double>({1, 3, 2}, rng), randn<double>({1, 3, 2}, rng)};
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return attention(v[0], v[1], v[2], 1, {}, 0.3); }, in));
  }
}

namespace {

/// Two float computations of attention (fused, composed) agree to their rounding, a bound that follows from the
/// arithmetic and not from one machine's BLAS kernels. An output is y = sum_j p_j v_j over lk keys, with p =
/// softmax(s) and s = q.k / sqrt(dk). A score is a dot product of length dk: its rounding error is at most about
/// dk u sum_l |q_l k_l| / sqrt(dk) <= dk u smax (u = 2^-24; smax the largest such sum over the query-key pairs),
/// and it moves each p_j by at most 2 dk u smax p_j (its own and the normaliser's share). The softmax's sum, the
/// exp and division, and the output's sum add about (2 lk + 8) u relative error, on terms whose magnitudes sum to
/// scale = sum_j p_j |v_j| (the same attention over |v|). So each computation is within (2 dk smax + 2 lk + 8) u
/// scale of the exact value, whatever order its sums take: twice that for two of them, and a factor 2 to spare.
/// Relative to the output itself there is no bound: the sum can cancel to as little as it likes.
void check_float_attention(const ArrayT<float>& fused, const ArrayT<float>& composed, const ArrayT<float>& q,
                           const ArrayT<float>& k, const ArrayT<float>& v, std::size_t heads,
                           const ArrayT<float>& mask) {
  const std::size_t b = q.shape()[0], lq = q.shape()[1], lk = k.shape()[1], dk = q.shape()[2] / heads;
  double smax = 0;
  for (std::size_t n = 0; n < b; ++n)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < lq; ++i)
        for (std::size_t j = 0; j < lk; ++j) {
          double sum = 0;
          for (std::size_t l = h * dk; l < (h + 1) * dk; ++l) sum += std::abs(double(q(n, i, l)) * double(k(n, j, l)));
          smax = std::max(smax, sum / std::sqrt(double(dk)));
        }
  // the scale in double precision, from the same weights: attention over |v|
  const ArrayT<double> scale = reference_attention(TensorT<double>(A(xt::cast<double>(q))),
                                                   TensorT<double>(A(xt::cast<double>(k))),
                                                   TensorT<double>(A(xt::cast<double>(xt::abs(v)))), heads,
                                                   A(xt::cast<double>(mask)))
                                   .value();
  const double u = std::ldexp(1.0, -24);
  const double per_scale = 2 * 2 * (2 * double(dk) * smax + 2 * double(lk) + 8) * u;
  CAPTURE(smax);
  CAPTURE(per_scale);
  REQUIRE(fused.size() == composed.size());
  double worst = 0;  // the largest error as a fraction of its bound
  for (std::size_t e = 0; e < fused.size(); ++e)
    worst = std::max(worst, std::abs(double(fused.data()[e]) - double(composed.data()[e])) /
                                (per_scale * scale.data()[e]));
  CAPTURE(worst);
  CHECK(worst <= 1.0);
}

}  // namespace

TEST_CASE("fused attention: the same values, cotangents and tangents as the composition it replaces") {
  FastRng rng(2);
  struct Case {
    std::size_t b, lq, lk, heads, dk, dv;
    std::vector<std::vector<int>> mask;
  };
  // 300 and 520 keys: more than one block of queries and keys (blocks of at most 256; the
  // weights are recomputed from the log-sum-exp),
  // with masked keys inside the later blocks and a first block masked whole for one sample
  std::vector<int> long_row(520, 0), masked_first(520, 0);
  for (std::size_t j = 400; j < 520; ++j) long_row[j] = 1;
  for (std::size_t j = 0; j < 270; ++j) masked_first[j] = 1;
  long_row[300] = 1;
  std::vector<int> padded_40(40, 0);
  for (std::size_t j = 25; j < 40; ++j) padded_40[j] = 1;
  padded_40[3] = 1;
  const std::vector<Case> cases{
      {2, 5, 5, 2, 3, 3, {}},
      {3, 4, 6, 2, 2, 3, {{0, 0, 0, 1, 1, 1}, {1, 0, 1, 0, 0, 0}, {1, 1, 1, 1, 1, 1}}},
      {1, 300, 300, 1, 4, 2, {}},
      {2, 7, 520, 2, 2, 2, {long_row, masked_first}},
      // 300 queries against 40 keys: one key block, two query blocks, for samples whose
      // padding differs
      {2, 300, 40, 2, 2, 2, {std::vector<int>(40, 0), padded_40}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.lq);
    CAPTURE(c.lk);
    const A mask = c.mask.empty() ? A() : mask_rows(c.mask);
    const std::vector<A> xs{randn<double>({c.b, c.lq, c.heads * c.dk}, rng),
                            randn<double>({c.b, c.lk, c.heads * c.dk}, rng),
                            randn<double>({c.b, c.lk, c.heads * c.dv}, rng)};
    const A u = randn<double>({c.b, c.lq, c.heads * c.dv}, rng);
    const auto t = tangents_for(xs, 2, rng);
    const auto fused = derivatives([&](const std::vector<D>& v) { return attention(v[0], v[1], v[2], c.heads, mask); },
                                   xs, u, t);
    const auto composed = derivatives(
        [&](const std::vector<D>& v) { return reference_attention(v[0], v[1], v[2], c.heads, mask); }, xs, u, t);
    check_same(fused, composed, 1e-10);
  }
  // float, the transformer's shapes at batch 2: rounding only
  FastRng frng(3);
  const Shape s{2, 150, 64};
  const ArrayT<float> qa = randn<float>(s, frng), ka = randn<float>(s, frng), va = randn<float>(s, frng);
  const TensorT<float> q(qa), k(ka), v(va);
  ArrayT<float> mask = xt::zeros<float>({std::size_t(2), std::size_t(150)});
  for (std::size_t j = 90; j < 150; ++j) mask(1, j) = 1;
  NoRecordScope<float> none;
  check_float_attention(attention(q, k, v, 4, mask).value(), reference_attention(q, k, v, 4, mask).value(), qa, ka,
                        va, 4, mask);
}

TEST_CASE("fused attention: keeps the samples on axis 0 apart; refuses shapes that do not fit") {
  FastRng rng(4);
  const D q = per_sample_input(randn<double>({3, 4, 6}, rng)), k = per_sample_input(randn<double>({3, 4, 6}, rng));
  CHECK(attention(q, k, k, 3).samples() == Samples::at(0, 3));
  CHECK(attention(q, k, D(randn<double>({3, 4, 6}, rng)), 3).samples() == Samples::at(0, 3));  // v a constant
  // samples on axis 1 (time-major): the op attends along axis 1, so it would mix them
  const D t = per_sample_input(randn<double>({4, 3, 6}, rng), 1);
  CHECK(attention(t, t, t, 3).samples() == Samples::mixed());
  CHECK(attention(per_sample_input(A(xt::zeros<double>({0, 4, 6}))), D(A(xt::zeros<double>({0, 4, 6}))),
                  D(A(xt::zeros<double>({0, 4, 6}))), 2)
            .shape() == Shape{0, 4, 6});
  test::check_error<std::invalid_argument>([&] { attention(q, k, k, 4); }, {"attention:", "H dividing"});
  test::check_error<std::invalid_argument>(
      [&] { attention(q, D(randn<double>({3, 5, 6}, rng)), k, 3); }, {"need q (B, Lq, H dk)"});
  test::check_error<std::invalid_argument>([&] { attention(q, k, k, 3, A(xt::zeros<double>({3, 5}))); },
                                           {"key mask of shape (3, 5)"});
}

TEST_CASE("fused layer_norm: gradchecks in both modes, and the composition's values and derivatives") {
  FastRng rng(5);
  for (Shape s : {Shape{2, 5}, Shape{3, 4, 7}, Shape{1, 2, 1, 9}}) {
    CAPTURE(s.size());
    const std::size_t d = s.back();
    const std::vector<A> xs{randn<double>(s, rng, 2.0), randn<double>({d}, rng), randn<double>({d}, rng)};
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return layer_norm(v[0], v[1], v[2], 1e-5); }, xs));
    DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return layer_norm(v[0], D(), D(), 0.1); }, {xs[0]}));
    const A u = randn<double>(s, rng);
    const auto t = tangents_for(xs, 3, rng);
    check_same(derivatives([](const std::vector<D>& v) { return layer_norm(v[0], v[1], v[2], 1e-5); }, xs, u, t),
               derivatives([](const std::vector<D>& v) { return reference_layer_norm(v[0], v[1], v[2], 1e-5); }, xs,
                           u, t),
               1e-10);
  }
  FastRng r2(6);
  const D x = per_sample_input(randn<double>({3, 4, 5}, r2));
  CHECK(layer_norm(x, D(), D()).samples() == Samples::at(0, 3));
  CHECK(layer_norm(per_sample_input(randn<double>({3, 4}, r2), 1), D(), D()).samples() == Samples::mixed());
  test::check_error<std::invalid_argument>([&] { layer_norm(x, D(A{1.0}), D(A{0.0})); }, {"gain (1) must be (5)"});
  test::check_error<std::invalid_argument>([&] { layer_norm(x, D(A{1.0}), D()); }, {"both a gain and a shift"});
}

TEST_CASE("fused layer_norm: gain and shift recorded as elementwise uses whose per-sample gradients are exact") {
  FastRng rng(7);
  const std::size_t b = 3, l = 4, d = 5;
  const A xv = randn<double>({b, l, d}, rng), u = randn<double>({b, l, d}, rng);
  const D gain = make_parameter<double>("gain", randn<double>({d}, rng));
  const D shift = make_parameter<double>("shift", randn<double>({d}, rng));
  TapeT<double> tape;
  tape.record_uses(true, false);
  {
    RecordScope<double> scope(tape);
    const D y = layer_norm(per_sample_input(xv), gain, shift);
    tape.backward(y, u);
  }
  REQUIRE(tape.uses().size() == 2);
  // G_i by hand: sum over sample i's rows of u xhat (gain) and u (shift)
  const A mu = xt::mean(xv, {2}, xt::keep_dims), var = xt::mean(xt::square(xv - mu), {2}, xt::keep_dims);
  const A xhat = (xv - mu) / xt::sqrt(var + 1e-5);
  const A want_gain = xt::sum(u * xhat, {1}), want_shift = xt::sum(u, {1});
  for (const auto& g : tape.uses()) {
    CHECK(g.uses.size() == 1);
    CHECK(g.uses[0]->kind == UseKind::elementwise);
    const A got = per_sample_gradients(g, b);
    DPGRAD_CHECK_CLOSE(got, g.param->name == "gain" ? want_gain : want_shift, 1e-12);
    for (NormMethod m : {NormMethod::ghost, NormMethod::materialise}) {
      const A norms = per_sample_norms_squared(g, b, m);
      DPGRAD_CHECK_CLOSE(norms, A(xt::sum(xt::square(got), {1})), 1e-12);
    }
  }
  CHECK(!gain.has_grad());  // the summed gradient is left to the rules (param_grads = false)
}

TEST_CASE("gelu: the vectorised kernel agrees with x Phi(x) and its derivative in float and double") {
  FastRng rng(8);
  for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(37), std::size_t(1000)}) {
    const A x = randn<double>({n}, rng, 3.0);
    A want = x, dwant = x;
    for (std::size_t i = 0; i < n; ++i) {
      const double cdf = 0.5 * std::erfc(-x(i) / std::numbers::sqrt2);
      want(i) = x(i) * cdf;
      dwant(i) = cdf + x(i) * std::exp(-0.5 * x(i) * x(i)) / std::sqrt(2 * std::numbers::pi);
    }
    TapeT<double> tape;
    RecordScope<double> scope(tape);
    D xd(x, true);
    D y = gelu(xd);
    tape.backward(y, xt::ones<double>({n}));
    // xsimd's erfc: a few 1e-12 from glibc's, relative, in the left tail
    DPGRAD_CHECK_CLOSE(y.value(), want, 1e-11);
    DPGRAD_CHECK_CLOSE(xd.grad(), dwant, 1e-11);
    TapeT<float> ftape;
    RecordScope<float> fscope(ftape);
    TensorT<float> xf(ArrayT<float>(xt::cast<float>(x)), true);
    TensorT<float> yf = gelu(xf);
    ftape.backward(yf, xt::ones<float>({n}));
    // float: to a few ulps of the terms (Phi and x phi are of order 1 where the sum cancels)
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(double(yf.value()(i)) == doctest::Approx(want(i)).epsilon(1e-6).scale(1));
      CHECK(double(xf.grad()(i)) == doctest::Approx(dwant(i)).epsilon(1e-6).scale(1));
    }
  }
  FastRng r2(9);
  DPGRAD_CHECK_GRADS(gradcheck([](const std::vector<D>& v) { return gelu(v[0]); }, {randn<double>({3, 19}, r2)}));
}

TEST_CASE("tape: records released during backward free activations and give the same gradients") {
  FastRng rng(10);
  const D w = make_parameter<double>("w", randn<double>({4, 3}, rng));
  const A xv = randn<double>({5, 4}, rng);
  std::weak_ptr<Node<double>> hidden;
  A kept;
  for (bool release : {false, true}) {
    TapeT<double> tape;
    tape.release_during_backward(release);
    w.node()->grad = A();
    w.node()->has_grad = false;
    {
      RecordScope<double> scope(tape);
      D h = tanh(linear(D(xv), w));
      hidden = h.shared();
      D loss = sum(mul(h, h));
      h = D();
      CHECK(!hidden.expired());  // the tape holds it for backward
      tape.backward(loss);
    }
    CHECK(hidden.expired() == release);
    if (!release) kept = w.grad();
    else DPGRAD_CHECK_CLOSE(w.grad(), kept, 0.0);
    if (release) {
      test::check_error<std::logic_error>([&] { tape.backward(D(A{1.0}), A{1.0}); }, {"released its records"});
      CHECK(tape.ops_reading(w.node()) == std::vector<std::string>{"linear"});  // names outlive the records
    }
  }
}
