// The tape and forward mode: accumulation, recording rules, forward and
// reverse in one pass, per-sample use records, and errors on bad input.
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/models.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

TEST_CASE("tape: a parameter used twice accumulates both contributions") {
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D w = make_parameter<double>("w", A{2.0, 3.0});
  D y = sum(add(mul(w, w), scale(w, 4.0)));  // d/dw = 2w + 4
  tape.backward(y);
  DPGRAD_CHECK_CLOSE(w.grad(), (A{8.0, 10.0}), 1e-15);
  // a second backward on a new tape adds to the existing gradient
  TapeT<double> tape2;
  RecordScope<double> scope2(tape2);
  tape2.backward(sum(scale(w, 1.0)));
  DPGRAD_CHECK_CLOSE(w.grad(), (A{9.0, 11.0}), 1e-15);
  w.zero_grad();
  CHECK_FALSE(w.has_grad());
}

TEST_CASE("tape: nothing is recorded without a tape or without grad-requiring inputs") {
  D w = make_parameter<double>("w", A{1.0});
  {
    NoRecordScope<double> none;
    D y = scale(w, 2.0);
    CHECK_FALSE(y.requires_grad());
  }
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D c(A{1.0});
  D y = scale(c, 2.0);
  CHECK_FALSE(y.requires_grad());
  CHECK(tape.size() == 0);
  D z = scale(w, 2.0);
  CHECK(z.requires_grad());
  CHECK(tape.size() == 1);
}

TEST_CASE("tape: backward checks its arguments") {
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D w = make_parameter<double>("w", A{1.0, 2.0});
  D y = scale(w, 2.0);
  CHECK_THROWS_WITH_AS(tape.backward(y), doctest::Contains("one element"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(tape.backward(y, A{1.0}), doctest::Contains("seed shape"), std::invalid_argument);
  tape.backward(y, A{1.0, -1.0});
  DPGRAD_CHECK_CLOSE(w.grad(), (A{2.0, -2.0}), 0.0);
}

TEST_CASE("forward mode and reverse mode in the same pass") {
  FastRng rng(21);
  A x = randn<double>({4, 3}, rng), w = randn<double>({3, 2}, rng), b = randn<double>({2}, rng);
  std::vector<std::int32_t> y = {1, 0, 1, 1};
  const std::size_t k = 5;
  A w_dot = randn<double>({k, 3, 2}, rng), b_dot = randn<double>({k, 2}, rng);

  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D W = make_parameter<double>("w", w), B = make_parameter<double>("b", b);
  W.set_tangent(w_dot);
  B.set_tangent(b_dot);
  D losses = cross_entropy(linear(D(x), W, B), y);  // (4); tangents (k, 4)
  REQUIRE(losses.has_tangent());
  CHECK(losses.tangent().shape()[0] == k);
  tape.backward(sum(losses));
  // <grad of the summed loss, (w_dot_j, b_dot_j)> equals the sum over samples of tangent j
  for (std::size_t j = 0; j < k; ++j) {
    double rev = xt::sum(W.grad() * xt::view(w_dot, j))() + xt::sum(B.grad() * xt::view(b_dot, j))();
    double fwd = xt::sum(xt::view(losses.tangent(), j))();
    CHECK(rev == doctest::Approx(fwd).epsilon(1e-12));
  }
}

TEST_CASE("forward mode: inputs with different tangent counts are refused") {
  D a(A{1.0, 2.0}), b(A{3.0, 4.0});
  a.set_tangent(xt::ones<double>({2, 2}));
  b.set_tangent(xt::ones<double>({3, 2}));
  CHECK_THROWS_WITH_AS(add(a, b), doctest::Contains("tangent counts"), std::invalid_argument);
  CHECK_THROWS_AS(a.set_tangent(xt::ones<double>({2, 3})), std::invalid_argument);
}

TEST_CASE("ops reject bad shapes and ids with clear errors") {
  D x(A{{1.0, 2.0, 3.0}}), w(xt::ones<double>({2, 4}));
  CHECK_THROWS_WITH_AS(linear(x, w), doctest::Contains("does not fit"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(add(x, D(A{1.0, 2.0})), doctest::Contains("do not broadcast"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(reshape(x, {2, 2}), doctest::Contains("cannot reshape"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(slice(x, 1, 2, 5), doctest::Contains("slice"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(transpose(x, {0, 0}), doctest::Contains("permutation"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gather(w, ArrayT<std::int32_t>{2}), doctest::Contains("outside"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(cross_entropy(x, {3}), doctest::Contains("label 3"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(cross_entropy(x, {0, 1}), doctest::Contains("labels"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(D(A{1.0, 2.0}).item(), doctest::Contains("2 elements"), std::invalid_argument);
}

TEST_CASE("tape: parametric ops record their uses for per-sample rules") {
  FastRng rng(22);
  TapeT<double> tape;
  tape.record_uses(true);
  RecordScope<double> scope(tape);
  D W = make_parameter<double>("w", randn<double>({3, 3}, rng));
  D b = make_parameter<double>("b", randn<double>({3}, rng));
  D E = make_parameter<double>("emb", randn<double>({5, 3}, rng));
  ArrayT<std::int32_t> ids = {{1, 4}, {0, 0}};
  D h = sum(gather(E, ids), {1});           // (2, 3)
  D h2 = linear(tanh(linear(h, W, b)), W);  // W used twice
  tape.backward(sum(h2));
  const auto& groups = tape.uses();
  REQUIRE(groups.size() == 3);
  CHECK(groups[0].param.get() == E.node());
  CHECK(groups[0].uses.size() == 1);
  CHECK(groups[0].uses[0]->kind == UseKind::gather);
  CHECK(groups[1].param.get() == W.node());
  CHECK(groups[1].uses.size() == 2);
  CHECK(groups[2].uses[0]->kind == UseKind::bias);
  for (const auto& g : groups)
    for (const auto* u : g.uses) {
      REQUIRE(u->delta);
      CHECK(u->delta->shape()[0] == 2);  // batch axis first
    }
  CHECK(groups[0].uses[0]->delta->shape() == Shape{2, 2, 3});
  // with param_grads = false the summed gradients are left to the per-sample rules
  TapeT<double> t2;
  t2.record_uses(true, false);
  RecordScope<double> s2(t2);
  W.zero_grad();
  t2.backward(sum(linear(h, W, b)));
  CHECK_FALSE(W.has_grad());
  CHECK(t2.uses()[0].uses[0]->delta);
}

TEST_CASE("tape: on_uses_complete gives each parameter's uses once, all holding their cotangents, during backward") {
  FastRng rng(23);
  D W = make_parameter<double>("w", randn<double>({3, 3}, rng));
  D b = make_parameter<double>("b", randn<double>({3}, rng));
  D V = make_parameter<double>("v", randn<double>({3, 2}, rng));
  D x = D(randn<double>({4, 3}, rng));
  TapeT<double> tape;
  tape.record_uses(true, false);
  std::vector<std::string> order;
  tape.on_uses_complete([&](ParamUses<double>& g) {
    order.push_back(g.param->name);
    for (const auto* u : g.uses) CHECK(u->delta);  // every use's cotangent is in
    if (g.param->name == "w") CHECK(g.uses.size() == 2);
    if (g.param->name == "v") {  // V is read last, so complete first: backward has not reached W's uses yet
      const auto& w = tape.uses()[0];
      REQUIRE(w.param->name == "w");
      CHECK_FALSE(w.uses[0]->delta);
      CHECK_FALSE(w.uses[1]->delta);
    }
  });
  RecordScope<double> scope(tape);
  D h = linear(tanh(linear(tanh(linear(x, W, b)), W)), V);  // W used twice, b once, V last
  tape.backward(sum(h));
  CHECK(order == std::vector<std::string>{"v", "w", "b"});
}

namespace {

/// The tangent of per-example cross-entropy losses with respect to `dirs` (one
/// (k, ...) array per parameter), (a) pushed along with the primal and (b)
/// pushed along the tape afterwards; the two must agree.
void pushed_later_equals_pushed_along(ModelT<double>& model, const BatchT<double>& batch, std::size_t k, Rng& rng) {
  auto ps = model.parameters();
  std::vector<A> dirs;
  for (auto& p : ps) {
    Shape s{k};
    for (auto d : p.value().shape()) s.push_back(d);
    dirs.push_back(randn<double>(s, rng));
  }
  A along;
  {
    for (std::size_t j = 0; j < ps.size(); ++j) ps[j].set_tangent(dirs[j]);
    TapeT<double> tape;
    RecordScope<double> scope(tape);
    D losses = cross_entropy(model.forward(batch), batch.labels);
    along = losses.tangent();
    for (auto& p : ps) p.clear_tangent();
  }
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D losses = cross_entropy(model.forward(batch), batch.labels);
  CHECK_FALSE(losses.has_tangent());
  std::vector<std::pair<const Node<double>*, const A*>> seeds;
  for (std::size_t j = 0; j < ps.size(); ++j) seeds.emplace_back(ps[j].node(), &dirs[j]);
  A later = tape.push_tangents(seeds, losses, k);
  REQUIRE(shape_of(later) == shape_of(along));
  DPGRAD_CHECK_CLOSE(later, along, 1e-12);
  // a direction for one parameter only: the others' tangents are zero
  std::vector<std::pair<const Node<double>*, const A*>> one{seeds.back()};
  A partial = tape.push_tangents(one, losses, k);
  CHECK(xt::amax(xt::abs(partial))() > 0);
  // the tape is unchanged by pushing: a backward still works afterwards
  tape.backward(sum(losses));
  for (auto& p : ps) CHECK(p.has_grad());
  for (auto& p : ps) p.zero_grad();
}

}  // namespace

TEST_CASE("tape: tangents pushed along the tape afterwards equal those pushed with the primal") {
  FastRng init(41), data(42), rng(43);
  SUBCASE("MLP") {
    auto model = make_mlp<double>({6, 5, 3}, Activation::tanh, init);
    BatchT<double> batch;
    batch.inputs = randn<double>({4, 6}, data);
    batch.labels = {0, 2, 1, 2};
    pushed_later_equals_pushed_along(*model, batch, 3, rng);
  }
  SUBCASE("cnn26k") {
    auto model = make_cnn26k<double>(Activation::tanh, init);
    BatchT<double> batch;
    batch.inputs = randn<double>({3, 1, 28, 28}, data);
    batch.labels = {1, 7, 3};
    pushed_later_equals_pushed_along(*model, batch, 2, rng);
  }
  SUBCASE("BiGRU over tokens (weights used at every step)") {
    auto model = make_bigru<double>(init, 12, 5, 4, 2);
    BatchT<double> batch;
    batch.tokens = xt::zeros<std::int32_t>({3, 6});
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t t = 0; t < 6 - i; ++t) batch.tokens(i, t) = std::int32_t(1 + (3 * i + 5 * t) % 11);
    batch.lengths = {6, 5, 4};
    batch.labels = {0, 1, 1};
    pushed_later_equals_pushed_along(*model, batch, 4, rng);
  }
}

TEST_CASE("tape: push_tangents checks its seeds and gives zeros when nothing reaches the output") {
  TapeT<double> tape;
  RecordScope<double> scope(tape);
  D w = make_parameter<double>("w", A{1.0, 2.0});
  D v = make_parameter<double>("v", A{3.0, 4.0});
  D y = mul(w, w);
  D z = scale(v, 2.0);
  A good{{1.0, 0.0}};  // (1, 2)
  A bad{1.0, 0.0};     // (2): no direction axis
  CHECK_THROWS_WITH_AS(tape.push_tangents({{w.node(), &bad}}, y, 1), doctest::Contains("expected"), std::invalid_argument);
  CHECK_THROWS_AS(tape.push_tangents({{w.node(), &good}}, y, 0), std::invalid_argument);
  DPGRAD_CHECK_CLOSE(tape.push_tangents({{w.node(), &good}}, y, 1), (A{{2.0, 0.0}}), 1e-15);  // d(w*w) = 2 w dw
  DPGRAD_CHECK_CLOSE(tape.push_tangents({{w.node(), &good}}, z, 1), (A{{0.0, 0.0}}), 0);      // z does not depend on w
  DPGRAD_CHECK_CLOSE(tape.push_tangents({{v.node(), &good}}, z, 1), (A{{2.0, 0.0}}), 1e-15);
}
