// The batch size B of an imported graph is private (under Poisson sampling one
// record changes it by one): it may shape tensors along the per-sample axis,
// never reach a value (docs/per-sample.md, "The batch size"). Graphs that turn B
// into a value the logits depend on (a count of ones, a comparison with 256, a
// Range, a Size, a division by Shape(x)[0]) are refused by every exact strategy
// with the node named, while naive, which runs each example alone, trains them
// and gives the per-example result, and microbatch:M, whose contribution is a
// whole microbatch (its size included), stays within its sensitivity 2C; graphs
// where B only shapes (reshapes to (B, -1), an Expand over B, an LSTM's zero
// initial state) load and stay exact.
#include <cmath>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/random.hpp"
#include "onnx/onnx.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "optim/clipping/clipping.hpp"
#include "support/batches.hpp"
#include "support/check.hpp"
#include "support/onnx_graph.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
using test::random_batch;
using test::OnnxGraph;
using OnnxModel = dpgrad::onnx::OnnxModelT<double>;

namespace {

constexpr std::int64_t kB = OnnxGraph::kBatch;
const std::vector<float> kW = {0.5f, -0.25f, 1.0f, 0.75f, -0.5f, 0.125f};  // (3, 2)
const std::vector<std::string> kExact = {"vanilla", "ghost", "jl:4", "ghost+layers"};

std::unique_ptr<OnnxModel> load_graph(const OnnxGraph& g, const test::TempDir& dir) {
  static int count = 0;
  const std::string path = dir / ("b" + std::to_string(count++) + ".onnx");
  g.save(path);
  return dpgrad::onnx::load<double>(path);
}


/// x (B, 3) -> "logits" = x W (B, 2); the caller adds the nodes that make "y".
OnnxGraph linear_graph() {
  OnnxGraph g;
  g.input("x", {kB, 3});
  g.output("y", {kB, 2});
  g.init("w", {3, 2}, kW);
  g.node("MatMul", {"x", "w"}, {"logits"}, "proj");
  return g;
}

/// A ConstantOfShape with a float fill value.
void constant_of_shape(OnnxGraph& g, const std::string& shape, const std::string& out, float value,
                       const std::string& name) {
  auto* n = g.node("ConstantOfShape", {shape}, {out}, name);
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(::onnx::AttributeProto_AttributeType_TENSOR);
  a->mutable_t()->set_data_type(1);
  a->mutable_t()->add_dims(1);
  a->mutable_t()->add_float_data(value);
}

void cast(OnnxGraph& g, const std::string& in, const std::string& out, std::int64_t to, const std::string& name = "") {
  OnnxGraph::attr(g.node("Cast", {in}, {out}, name), "to", to);
}

/// "b" = Shape(x)[0] (a scalar) and "b1" = [B].
void batch_size_of_x(OnnxGraph& g) {
  g.node("Shape", {"x"}, {"shape"}, "shape_of_x");
  g.constant_ints("zero", {0}, true);
  OnnxGraph::attr(g.node("Gather", {"shape", "zero"}, {"b"}, "batch_of_x"), "axis", std::int64_t(0));
  g.constant_ints("axis0", {0});
  g.node("Unsqueeze", {"b", "axis0"}, {"b1"});
}

/// rows = Range(0, B) (node "row_index"), B read from x's shape.
void row_index(OnnxGraph& g) {
  batch_size_of_x(g);
  g.constant_ints("start", {0}, true);
  g.constant_ints("step", {1}, true);
  g.node("Range", {"start", "b", "step"}, {"rows"}, "row_index");
}

/// The distance between the clipped sums of `a` and `b`, all parameters taken as one vector.
double distance(const ClipResult<double>& a, const ClipResult<double>& b) {
  double sq = 0;
  for (std::size_t p = 0; p < a.sum.size(); ++p) sq += xt::sum(xt::square(a.sum[p] - b.sum[p]))();
  return std::sqrt(sq);
}

/// Every exact strategy refuses `m` naming `node` and saying why; naive trains
/// it and its clipped sum is that of `reference` (the graph with the value B
/// takes at batch size 1 written in), under naive and ghost; microbatch:2 runs
/// it, and one more record moves its clipped sum by at most 2C (each microbatch
/// is one contribution, clipped whole, whatever it computes from its size).
void refused_but_naive_exact(OnnxModel& m, OnnxModel& reference, const std::string& node) {
  FastRng rng(11);
  const BatchT<double> batch = random_batch({4, 3}, 2, rng);
  const BatchT<double> more = random_batch({5, 3}, 2, rng);
  for (const auto& s : kExact) {
    CAPTURE(s);
    test::check_error<std::invalid_argument>(
        [&] { make_clip_strategy<double>(s, 4.0)->clipped_sum(m, batch, 1.0, rng); },
        {node, "the batch size is private", "docs/per-sample.md"});
  }
  const BatchT<double> one = random_batch({1, 3}, 2, rng);  // a batch of one shows no mixing: still refused
  for (const std::string s : {"vanilla", "ghost"}) {
    CAPTURE(s);
    test::check_error<std::invalid_argument>(
        [&] { make_clip_strategy<double>(s, 4.0)->clipped_sum(m, one, 1.0, rng); }, {node, "the batch size is private"});
  }
  const auto got = make_clip_strategy<double>("naive")->clipped_sum(m, batch, 0.5, rng);
  for (const std::string s : {"naive", "ghost"}) {
    CAPTURE(s);
    const auto want = make_clip_strategy<double>(s)->clipped_sum(reference, batch, 0.5, rng);
    REQUIRE(got.sum.size() == want.sum.size());
    for (std::size_t p = 0; p < got.sum.size(); ++p) DPGRAD_CHECK_CLOSE(got.sum[p], want.sum[p], 1e-12);
    DPGRAD_CHECK_CLOSE(got.norms, want.norms, 1e-12);
  }
  BatchT<double> neighbour = batch;  // batch and one more record (id 4)
  neighbour.inputs = xt::concatenate(xt::xtuple(batch.inputs, xt::view(more.inputs, xt::range(4, 5))), 0);
  neighbour.labels.push_back(more.labels[4]);
  neighbour.ids.push_back(4);
  const double C = 0.01;  // every contribution clipped
  for (std::uint64_t seed = 0; seed < 8; ++seed) {  // the same key for both batches, several keys
    FastRng r1(seed), r2(seed);
    const auto a = make_clip_strategy<double>("microbatch:2", 4.0)->clipped_sum(m, batch, C, r1);
    const auto b = make_clip_strategy<double>("microbatch:2", 4.0)->clipped_sum(m, neighbour, C, r2);
    CHECK(distance(a, b) <= 2 * C * (1 + 1e-12));
  }
}

}  // namespace

TEST_CASE("onnx batch size: a count of ones, ReduceSum(ConstantOfShape(Shape(x)[0:1], 1)), scaling the logits") {
  // n = the batch's rows counted (ones made by ConstantOfShape, or a scalar Expanded over B); the logits
  // scaled by n itself, or by (n != 256) as in issue 53: 1 below 256 rows, so only a batch of 256 would show
  test::TempDir dir("dpgrad-onnx-b");
  OnnxGraph r = linear_graph();  // at batch size 1, n = 1 and (n != 256) = 1
  r.node("Identity", {"logits"}, {"y"});
  auto reference = load_graph(r, dir);
  for (const bool expand : {false, true})
    for (const bool compare : {false, true}) {
      CAPTURE(expand);
      CAPTURE(compare);
      OnnxGraph g = linear_graph();
      g.node("Shape", {"x"}, {"shape"});
      g.constant_ints("s0", {0});
      g.constant_ints("s1", {1});
      g.node("Slice", {"shape", "s0", "s1"}, {"b1"});
      if (expand) {
        g.constant_float("one", 1.0f);
        g.node("Expand", {"one", "b1"}, {"ones"}, "ones_per_row");
      } else {
        constant_of_shape(g, "b1", "ones", 1.0f, "ones_per_row");
      }
      // n of shape (1) or (): a batch of one would keep the first per-sample, but the count is B's alone
      OnnxGraph::attr(g.node("ReduceSum", {"ones"}, {"n"}, "count_rows"), "keepdims", std::int64_t(compare));
      if (compare) {
        g.constant_float("k256", 256.0f);
        g.node("Equal", {"n", "k256"}, {"is256"});
        g.node("Not", {"is256"}, {"not256"});
        cast(g, "not256", "f", 1);
        g.node("Mul", {"logits", "f"}, {"y"}, "scale");
      } else {
        g.node("Mul", {"logits", "n"}, {"y"}, "scale");
      }
      refused_but_naive_exact(*load_graph(g, dir), *reference, "node 'count_rows' (ReduceSum)");
    }
}

TEST_CASE("onnx batch size: logits scaled by Cast(Not(Equal(B, 256))) and by 1 - 2 Cast(Equal(B, 256))") {
  test::TempDir dir("dpgrad-onnx-b");
  OnnxGraph r = linear_graph();  // at batch size 1 (or any but 256) both factors are 1
  r.node("Identity", {"logits"}, {"y"});
  auto reference = load_graph(r, dir);
  {
    OnnxGraph g = linear_graph();
    batch_size_of_x(g);
    g.constant_ints("k256", {256}, true);
    g.node("Equal", {"b", "k256"}, {"is256"}, "is_256");
    g.node("Not", {"is256"}, {"not256"}, "not_256");
    cast(g, "not256", "f", 1, "to_float");
    g.node("Mul", {"logits", "f"}, {"y"}, "scale");
    refused_but_naive_exact(*load_graph(g, dir), *reference, "node 'is_256' (Equal)");
  }
  {
    OnnxGraph g = linear_graph();
    batch_size_of_x(g);
    g.constant_ints("k256", {256}, true);
    g.node("Equal", {"b", "k256"}, {"is256"}, "is_256");
    cast(g, "is256", "f", 1, "to_float");
    g.constant_float("two", 2.0f);
    g.constant_float("one", 1.0f);
    g.node("Mul", {"f", "two"}, {"f2"});
    g.node("Sub", {"one", "f2"}, {"sign"});
    g.node("Mul", {"logits", "sign"}, {"y"}, "scale");
    refused_but_naive_exact(*load_graph(g, dir), *reference, "node 'is_256' (Equal)");
  }
}

TEST_CASE("onnx batch size: Range(0, B) added to the logits as data") {
  test::TempDir dir("dpgrad-onnx-b");
  OnnxGraph g = linear_graph();
  row_index(g);
  cast(g, "rows", "rowsf", 1);
  g.constant_ints("axis1", {1});
  g.node("Unsqueeze", {"rowsf", "axis1"}, {"col"});  // (B, 1)
  g.node("Add", {"logits", "col"}, {"y"}, "shift");
  auto m = load_graph(g, dir);
  OnnxGraph r = linear_graph();  // at batch size 1 the Range is [0]
  r.node("Identity", {"logits"}, {"y"});
  refused_but_naive_exact(*m, *load_graph(r, dir), "node 'row_index' (Range)");
  // a Range of fixed bounds is a constant: the logits plus Range(0, 2) = (0, 1) on each row stay exact
  OnnxGraph f = linear_graph();
  f.constant_ints("start", {0}, true);
  f.constant_ints("limit", {2}, true);
  f.constant_ints("step", {1}, true);
  f.node("Range", {"start", "limit", "step"}, {"cols"}, "columns");
  cast(f, "cols", "colsf", 1);
  f.node("Add", {"logits", "colsf"}, {"y"});
  auto fixed = load_graph(f, dir);
  FastRng rng(13);
  const PerSampleCheck c = check_per_sample(*fixed, random_batch({3, 3}, 2, rng));
  INFO(c.str());
  CHECK(c.agrees(1e-9));
}

TEST_CASE("onnx batch size: Size(x) and Shape(x)[0] as divisors of the logits") {
  test::TempDir dir("dpgrad-onnx-b");
  {
    OnnxGraph g = linear_graph();
    g.node("Size", {"x"}, {"n"}, "elements");
    cast(g, "n", "nf", 1, "size_as_float");
    g.node("Div", {"logits", "nf"}, {"y"}, "per_element");
    auto m = load_graph(g, dir);
    OnnxGraph r = linear_graph();  // at batch size 1, Size(x) = 3
    r.constant_float("three", 3.0f);
    r.node("Div", {"logits", "three"}, {"y"});
    refused_but_naive_exact(*m, *load_graph(r, dir), "node 'size_as_float' (Cast)");
  }
  {  // logits / x.shape[0], the batch mean PyTorch code writes
    OnnxGraph g = linear_graph();
    batch_size_of_x(g);
    g.node("Div", {"logits", "b"}, {"y"}, "batch_mean");
    auto m = load_graph(g, dir);
    OnnxGraph r = linear_graph();
    r.constant_float("one", 1.0f);
    r.node("Div", {"logits", "one"}, {"y"});
    refused_but_naive_exact(*m, *load_graph(r, dir), "node 'batch_mean' (Div)");
  }
}

TEST_CASE("onnx batch size: B only shaping (Reshape to (B, -1), Expand over B, an LSTM's zero state) stays exact") {
  // x (B, 6) -> (B, 2, 3) -> (2, B, 3) -> LSTM (hidden 2) from zero states ConstantOfShape((1, B, 2)) -> Y_h
  // (1, B, 2) -> (B, 2); plus x (B, 6) reshaped by Concat(B, -1) through a Gemm; plus a constant (1, 2)
  // expanded to Where(Equal((B, -1), -1), 1, (B, -1)) = (B, 1): PyTorch's export of c.expand(B, -1)
  test::TempDir dir("dpgrad-onnx-b");
  FastRng rng(12);
  auto floats = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = float(0.5 * rng.normal());
    return v;
  };
  OnnxGraph g;
  g.input("x", {kB, 6});
  g.output("y", {kB, 2});
  batch_size_of_x(g);
  g.constant_ints("rest", {2, 3});
  OnnxGraph::attr(g.node("Concat", {"b1", "rest"}, {"to3"}), "axis", std::int64_t(0));
  g.node("Reshape", {"x", "to3"}, {"x3"}, "split");
  OnnxGraph::attr(g.node("Transpose", {"x3"}, {"seq"}), "perm", std::vector<std::int64_t>{1, 0, 2});
  g.constant_ints("one", {1});
  g.constant_ints("hidden", {2});
  OnnxGraph::attr(g.node("Concat", {"one", "b1", "hidden"}, {"state_shape"}), "axis", std::int64_t(0));
  constant_of_shape(g, "state_shape", "h0", 0.0f, "zero_h");
  constant_of_shape(g, "state_shape", "c0", 0.0f, "zero_c");
  g.init("W", {1, 8, 3}, floats(24));
  g.init("R", {1, 8, 2}, floats(16));
  g.init("Bias", {1, 16}, floats(16));
  OnnxGraph::attr(g.node("LSTM", {"seq", "W", "R", "Bias", "", "h0", "c0"}, {"", "hn"}, "lstm"), "hidden_size",
                  std::int64_t(2));
  g.constant_ints("minus", {-1});
  OnnxGraph::attr(g.node("Concat", {"b1", "minus"}, {"flat"}), "axis", std::int64_t(0));
  g.node("Reshape", {"hn", "flat"}, {"h"}, "last_state");
  g.node("Reshape", {"x3", "flat"}, {"x6"}, "merge");
  g.init("fc", {2, 6}, floats(12));
  OnnxGraph::attr(g.node("Gemm", {"x6", "fc"}, {"lin"}, "fc"), "transB", std::int64_t(1));
  g.constant_ints("minus_scalar", {-1}, true);
  g.node("Equal", {"flat", "minus_scalar"}, {"is_minus"}, "expand_mask");
  g.constant_ints("ones", {1, 1});
  g.node("Where", {"is_minus", "ones", "flat"}, {"target"});
  g.constant_float("c", 0.25f);
  g.constant_ints("c_shape", {1, 1});
  g.node("Reshape", {"c", "c_shape"}, {"c11"});
  g.node("Expand", {"c11", "target"}, {"cb"}, "over_batch");
  g.node("Add", {"h", "lin"}, {"hl"});
  g.node("Add", {"hl", "cb"}, {"y"});
  auto m = load_graph(g, dir);
  CHECK(m->inexact_uses().empty());
  for (std::size_t b : {2, 3}) {
    CAPTURE(b);
    const PerSampleCheck c = check_per_sample(*m, random_batch({b, 6}, 2, rng));
    INFO(c.str());
    CHECK(c.agrees(1e-9));
  }
}

TEST_CASE("onnx batch size: a table read at Range(0, B), each row's position in the batch, is refused by name") {
  test::TempDir dir("dpgrad-onnx-b");
  OnnxGraph g = linear_graph();
  row_index(g);
  g.init("table", {8, 2}, {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 1.0f, 1.1f, 1.2f, 1.3f, 1.4f, 1.5f, 1.6f});
  OnnxGraph::attr(g.node("Gather", {"table", "rows"}, {"by_row"}, "position"), "axis", std::int64_t(0));
  g.node("Add", {"logits", "by_row"}, {"y"});
  auto m = load_graph(g, dir);
  FastRng rng(14);
  const BatchT<double> batch = random_batch({4, 3}, 2, rng);
  for (const std::string s : {"vanilla", "ghost", "jl:4"}) {
    CAPTURE(s);
    test::check_error<std::invalid_argument>(
        [&] { make_clip_strategy<double>(s, 4.0)->clipped_sum(*m, batch, 1.0, rng); },
        {"node 'row_index' (Range)", "the batch size is private"});
  }
  CHECK_NOTHROW(make_clip_strategy<double>("naive")->clipped_sum(*m, batch, 1.0, rng));
}

TEST_CASE("onnx batch size: a reshape target chosen by Equal(B, 256) is refused at load, naming the Reshape") {
  test::TempDir dir("dpgrad-onnx-b");
  OnnxGraph g = linear_graph();
  batch_size_of_x(g);
  g.constant_ints("k256", {256}, true);
  g.node("Equal", {"b", "k256"}, {"is256"});
  g.constant_ints("flat", {-1, 2});
  g.constant_ints("other", {2, -1});
  g.node("Where", {"is256", "other", "flat"}, {"target"});
  g.node("Reshape", {"logits", "target"}, {"y"}, "reshape_by_b");
  test::check_error<dpgrad::onnx::OnnxError>([&] { load_graph(g, dir); },
                                             {"node 'reshape_by_b' (Reshape)", "the batch size's value"});
}
