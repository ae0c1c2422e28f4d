// Dense, activations, flatten and Sequential: gradchecks through the layers and
// parameter bookkeeping.
#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/dense.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;

TEST_CASE("dense: gradcheck through a Sequential of dense layers and activations") {
  for (auto act : {Activation::relu, Activation::tanh, Activation::sigmoid}) {
    CAPTURE(to_string(act));
    FastRng init(1), data(2);
    SequentialT<double> net;
    net.emplace<FlattenT<double>>();
    net.emplace<DenseT<double>>(6, 4, init, "a");
    net.emplace<ActivationT<double>>(act);
    net.emplace<DenseT<double>>(4, 3, init, "b");
    auto ps = net.parameters();
    REQUIRE(ps.size() == 4);
    CHECK(net.parameter_count() == 6 * 4 + 4 + 4 * 3 + 3);
    CHECK(ps[0].name() == "a.weight");
    CHECK(ps[3].name() == "b.bias");
    // the parameters as gradcheck inputs: rebuild the layer math from them
    A x = randn<double>({2, 2, 3}, data);
    std::vector<A> inputs{x};
    for (auto& p : ps) inputs.push_back(p.value());
    auto f = [&](const std::vector<D>& v) {
      D h = reshape(v[0], {2, 6});
      h = linear(h, v[1], v[2]);
      h = act == Activation::relu ? relu(h) : act == Activation::tanh ? tanh(h) : sigmoid(h);
      return linear(h, v[3], v[4]);
    };
    // the layer stack computes the same function as the op composition
    {
      NoRecordScope<double> none;
      std::vector<D> vs;
      for (auto& a : inputs) vs.emplace_back(a);
      DPGRAD_CHECK_CLOSE(net.forward(D(x)).value(), f(vs).value(), 1e-14);
    }
    if (act == Activation::relu)
      for (auto& v : x) v += v >= 0 ? 0.1 : -0.1;
    DPGRAD_CHECK_GRADS(gradcheck(f, inputs));
  }
}

TEST_CASE("dense: bad sizes and names are rejected") {
  FastRng rng(3);
  CHECK_THROWS_AS(DenseT<double>(0, 3, rng), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_activation("gelu"), doctest::Contains("unknown activation"), std::invalid_argument);
  DenseT<double> d(3, 2, rng);
  CHECK_THROWS_AS(d.forward(D(A{{1.0, 2.0}})), std::invalid_argument);
}

TEST_CASE("dense: initialisation is bounded by 1/sqrt(fan_in) and repeatable") {
  FastRng a(4), b(4);
  DenseT<double> d1(100, 50, a), d2(100, 50, b);
  CHECK(xt::amax(xt::abs(d1.weight().value()))() <= 0.1);
  CHECK(xt::amax(xt::abs(d1.weight().value()))() > 0.09);
  DPGRAD_CHECK_CLOSE(d1.weight().value(), d2.weight().value(), 0.0);
}
