// BidirectionalT over either cell: the tests the LSTM and GRU share.
#include <doctest/doctest.h>

#include <string>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/gru.hpp"
#include "layers/lstm.hpp"
#include "support/check.hpp"
#include "support/recurrent.hpp"

using namespace dpgrad;
using test::check_parameter_derivatives;
using test::check_per_sample_independence;
using test::flat;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;
using Lengths = std::vector<std::int32_t>;

TEST_CASE_TEMPLATE("bidirectional: gradchecks with respect to the input and to both directions' parameters", Cell,
                   LstmT<double>, GruT<double>) {
  FastRng rng(103);
  BidirectionalT<double, Cell> bi(3, 2, rng);
  struct Case {
    std::size_t b, l;
    Lengths lengths;
  };
  for (const auto& c : {Case{1, 1, {1}}, Case{1, 4, {3}}, Case{3, 4, {4, 2, 1}}, Case{3, 4, {1, 3, 2}}}) {
    CAPTURE(c.b);
    CAPTURE(c.l);
    A x = randn<double>({c.b, c.l, 3}, rng);
    DPGRAD_CHECK_GRADS(gradcheck([&](const std::vector<D>& v) { return flat(bi.forward(v[0], c.lengths)); }, {x}));
    check_parameter_derivatives(bi.parameters(), [&] { return flat(bi.forward(D(x), c.lengths)); }, 11);
  }
}

TEST_CASE_TEMPLATE("bidirectional: per-sample independence (other samples' tokens and lengths do not matter)", Cell,
                   LstmT<double>, GruT<double>) {
  FastRng rng(107);
  BidirectionalT<double, Cell> bi(3, 2, rng);
  check_per_sample_independence([&](const D& x, const Lengths& l) { return bi.forward(x, l); }, 3, rng);
}

TEST_CASE_TEMPLATE("bidirectional: parameters are the forward cell's then the backward cell's, named for checkpoints",
                   Cell, LstmT<double>, GruT<double>) {
  FastRng rng(1);
  BidirectionalT<double, Cell> bi(3, 2, rng);
  Cell one(3, 2, rng, "x");
  const auto p = bi.parameters();
  const std::size_t per_direction = one.parameters().size();
  REQUIRE(p.size() == 2 * per_direction);
  const std::string name = Cell::kBidirectionalName;
  for (std::size_t i = 0; i < per_direction; ++i) {
    const std::string suffix = one.parameters()[i].name().substr(1);  // ".w_ih", ...
    CHECK(p[i].name() == name + ".forward" + suffix);
    CHECK(p[per_direction + i].name() == name + ".backward" + suffix);
  }
  CHECK(bi.hidden_size() == 2);
}
