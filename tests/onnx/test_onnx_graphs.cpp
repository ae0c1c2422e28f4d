// Small ONNX graphs built in C++: the operators the PyTorch fixtures do not
// reach (Where, Equal, Not, Expand, Pad, padded and ceil-mode pooling, Dropout,
// Slice and Gather of integers, a Transpose read by Softmax), against values
// worked out by hand; and the per-sample exactness of imported graphs: uses
// without an exact rule refused by vanilla and ghost with the node named,
// naive and jl:K still running, and a reshape that mixes samples refused.
#include <cmath>
#include <limits>
#include <string>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "layers/dropout.hpp"
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
using A = ArrayT<double>;

namespace {

constexpr std::int64_t kB = OnnxGraph::kBatch;

std::unique_ptr<dpgrad::onnx::OnnxModelT<double>> load_graph(const OnnxGraph& g, const test::TempDir& dir,
                                                      const dpgrad::onnx::LoadOptions& o = {}) {
  static int count = 0;
  const std::string path = dir / ("g" + std::to_string(count++) + ".onnx");
  g.save(path);
  return dpgrad::onnx::load<double>(path, o);
}

A run(dpgrad::onnx::OnnxModelT<double>& m, const A& x) {
  BatchT<double> b;
  b.inputs = x;
  NoRecordScope<double> none;
  return m.forward(b).value();
}

A run_tokens(dpgrad::onnx::OnnxModelT<double>& m, const ArrayT<std::int32_t>& t) {
  BatchT<double> b;
  b.tokens = t;
  NoRecordScope<double> none;
  return m.forward(b).value();
}


std::vector<float> random_floats(std::size_t n, Rng& rng) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(0.5 * rng.normal());
  return v;
}

}  // namespace

TEST_CASE("onnx graphs: a padding mask from token ids: Equal, Not, Cast, Where, Expand, Unsqueeze") {
  // tokens (B, 4); mask = tokens == 0; y = Where(mask, -1, Cast(tokens)) * Expand(Cast(Not(mask)), (B, 4))
  test::TempDir dir("dpgrad-onnx-g");
  OnnxGraph g;
  g.input("t", {kB, 4}, 7);
  g.output("y", {kB, 4});
  g.constant_ints("zero", {0}, true);
  g.node("Equal", {"t", "zero"}, {"mask"});
  g.node("Not", {"mask"}, {"keep"});
  auto* c1 = g.node("Cast", {"keep"}, {"keepf"});
  OnnxGraph::attr(c1, "to", std::int64_t(1));
  auto* c2 = g.node("Cast", {"t"}, {"tf"});
  OnnxGraph::attr(c2, "to", std::int64_t(1));
  g.constant_float("minus", -1.0f);
  g.node("Where", {"mask", "minus", "tf"}, {"w"});
  g.node("Shape", {"t"}, {"shape"});
  g.node("Expand", {"keepf", "shape"}, {"ke"});
  g.node("Mul", {"w", "ke"}, {"y"});
  auto m = load_graph(g, dir);
  const ArrayT<std::int32_t> t{{3, 0, 5, 0}, {0, 2, 2, 1}};
  DPGRAD_CHECK_CLOSE(run_tokens(*m, t), (A{{3, -0.0, 5, -0.0}, {-0.0, 2, 2, 1}}), 0.0);
}

TEST_CASE("onnx graphs: Pad, padded MaxPool (and ceil mode), AveragePool without the padding in its divisor") {
  test::TempDir dir("dpgrad-onnx-g");
  FastRng rng(1);
  const A x = test::randn<double>({2, 1, 5, 5}, rng);
  {  // MaxPool 3x3, stride 2, pads 1: the -inf padding never wins
    OnnxGraph g;
    g.input("x", {kB, 1, 5, 5});
    g.output("y", {kB, 1, 3, 3});
    auto* n = g.node("MaxPool", {"x"}, {"y"});
    OnnxGraph::attr(n, "kernel_shape", std::vector<std::int64_t>{3, 3});
    OnnxGraph::attr(n, "strides", std::vector<std::int64_t>{2, 2});
    OnnxGraph::attr(n, "pads", std::vector<std::int64_t>{1, 1, 1, 1});
    const A y = run(*load_graph(g, dir), x);
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < 3; ++j) {
          double m = -INFINITY;
          for (long u = long(2 * i) - 1; u <= long(2 * i) + 1; ++u)
            for (long v = long(2 * j) - 1; v <= long(2 * j) + 1; ++v)
              if (u >= 0 && v >= 0 && u < 5 && v < 5) m = std::max(m, x(b, 0, std::size_t(u), std::size_t(v)));
          CHECK(y(b, 0, i, j) == m);
        }
  }
  {  // ceil mode: 5 with window 2, stride 2 gives 3 windows, the last one partial
    OnnxGraph g;
    g.input("x", {kB, 1, 5, 5});
    g.output("y", {kB, 1, 3, 3});
    auto* n = g.node("MaxPool", {"x"}, {"y"});
    OnnxGraph::attr(n, "kernel_shape", std::vector<std::int64_t>{2, 2});
    OnnxGraph::attr(n, "strides", std::vector<std::int64_t>{2, 2});
    OnnxGraph::attr(n, "ceil_mode", std::int64_t(1));
    const A y = run(*load_graph(g, dir), x);
    REQUIRE(y.shape() == Shape{2, 1, 3, 3});
    CHECK(y(0, 0, 2, 2) == x(0, 0, 4, 4));
  }
  {  // AveragePool 3x3 stride 1 pads 1, count_include_pad 0: a corner averages its 4 pixels
    OnnxGraph g;
    g.input("x", {kB, 1, 5, 5});
    g.output("y", {kB, 1, 5, 5});
    auto* n = g.node("AveragePool", {"x"}, {"y"});
    OnnxGraph::attr(n, "kernel_shape", std::vector<std::int64_t>{3, 3});
    OnnxGraph::attr(n, "pads", std::vector<std::int64_t>{1, 1, 1, 1});
    const A y = run(*load_graph(g, dir), x);
    CHECK(y(1, 0, 0, 0) == doctest::Approx((x(1, 0, 0, 0) + x(1, 0, 0, 1) + x(1, 0, 1, 0) + x(1, 0, 1, 1)) / 4));
  }
  {  // Pad with a constant on two axes
    OnnxGraph g;
    g.input("x", {kB, 1, 5, 5});
    g.output("y", {kB, 1, 6, 8});
    g.constant_ints("pads", {0, 0, 1, 2, 0, 0, 0, 1});
    g.constant_float("value", 7.0f);
    g.node("Pad", {"x", "pads", "value"}, {"y"});
    const A y = run(*load_graph(g, dir), x);
    CHECK(y(0, 0, 0, 0) == 7.0);
    CHECK(y(0, 0, 1, 2) == x(0, 0, 0, 0));
    CHECK(y(1, 0, 5, 7) == 7.0);
  }
}

TEST_CASE("onnx graphs: Slice and Gather of computed tensors and of integers, Concat, Softmax on a transposed value") {
  test::TempDir dir("dpgrad-onnx-g");
  FastRng rng(2);
  const A x = test::randn<double>({3, 4, 5}, rng);
  OnnxGraph g;
  g.input("x", {kB, 4, 5});
  g.output("y", {kB, 5, 3});
  auto* tr = g.node("Transpose", {"x"}, {"xt"});
  OnnxGraph::attr(tr, "perm", std::vector<std::int64_t>{0, 2, 1});  // (B, 5, 4)
  auto* sm = g.node("Softmax", {"xt"}, {"s"});
  OnnxGraph::attr(sm, "axis", std::int64_t(1));  // over the 5, the input's last axis
  g.constant_ints("starts", {1});
  g.constant_ints("ends", {3});
  g.constant_ints("axes", {2});
  g.node("Slice", {"s", "starts", "ends", "axes"}, {"sl"});  // (B, 5, 2)
  g.constant_ints("last", {-1}, true);
  auto* ga = g.node("Gather", {"s", "last"}, {"col"});
  OnnxGraph::attr(ga, "axis", std::int64_t(2));  // (B, 5)
  g.constant_ints("one", {2});
  g.node("Unsqueeze", {"col", "one"}, {"col3"});  // (B, 5, 1)
  auto* cc = g.node("Concat", {"sl", "col3"}, {"y"});
  OnnxGraph::attr(cc, "axis", std::int64_t(2));
  const A y = run(*load_graph(g, dir), x);
  REQUIRE(y.shape() == Shape{3, 5, 3});
  for (std::size_t b = 0; b < 3; ++b)
    for (std::size_t c = 0; c < 4; ++c) {
      double z = 0;
      for (std::size_t k = 0; k < 5; ++k) z += std::exp(x(b, c, k));
      for (std::size_t k = 0; k < 5; ++k) {
        const double s = std::exp(x(b, c, k)) / z;
        if (c == 1) CHECK(y(b, k, 0) == doctest::Approx(s).epsilon(1e-12));
        if (c == 2) CHECK(y(b, k, 1) == doctest::Approx(s).epsilon(1e-12));
        if (c == 3) CHECK(y(b, k, 2) == doctest::Approx(s).epsilon(1e-12));
      }
    }
}

TEST_CASE("onnx graphs: Dropout draws masks in training and is the identity in evaluation") {
  test::TempDir dir("dpgrad-onnx-g");
  OnnxGraph g;
  g.input("x", {kB, 1000});
  g.output("y", {kB, 1000});
  g.constant_float("ratio", 0.25f);
  g.node("Dropout", {"x", "ratio"}, {"y"});
  auto m = load_graph(g, dir);
  const A x = xt::ones<double>({2, 1000});
  m->set_training(false);
  CHECK(run(*m, x) == x);
  m->set_training(true);
  const A y = run(*m, x);
  std::size_t zeros = 0;
  for (auto v : y) {
    CHECK((v == 0.0 || v == doctest::Approx(1 / 0.75)));
    zeros += v == 0.0;
  }
  CHECK(zeros > 400);
  CHECK(zeros < 600);
}

TEST_CASE("onnx graphs: in a private run Dropout keys each record's mask: adding a record changes no other's") {
  // docs/data-privacy.md, "Dropout masks": the mask of a record depends on the key, the step and its id alone
  test::TempDir dir("dpgrad-onnx-g");
  OnnxGraph g;
  g.input("x", {kB, 6, 5});
  g.output("y", {kB, 6, 5});
  g.constant_float("ratio", 0.5f);
  g.node("Dropout", {"x", "ratio"}, {"y"});
  const HashKey key = hash_key_from_seed(3, "test");
  auto masks = [&](dpgrad::onnx::OnnxModelT<double>& m, const std::vector<std::int64_t>& ids, std::uint64_t step) {
    BatchT<double> b;
    b.inputs = xt::ones<double>({ids.size(), std::size_t(6), std::size_t(5)});
    b.ids = ids;
    b.labels.assign(ids.size(), 0);
    const DropoutKeyScope scope(key, step);
    NoRecordScope<double> none;
    return A(m.forward(b).value());
  };
  // two runs over two steps, each with its model: D, then D with a record more (first) at step 0
  auto a = load_graph(g, dir), b = load_graph(g, dir);
  const std::vector<std::int64_t> ids{4, 17, 9};
  const A a0 = masks(*a, ids, 0), a1 = masks(*a, ids, 1);
  const A b0 = masks(*b, {50, 4, 17, 9}, 0), b1 = masks(*b, ids, 1);
  CHECK(A(xt::view(b0, xt::range(1, 4))) == a0);
  CHECK(b1 == a1);
  CHECK(A(xt::view(a0, xt::range(0, 1))) != A(xt::view(a1, xt::range(0, 1))));  // a new mask each step
  // the library layer at the same key, step and ids draws the same masks (the first dropout of the pass)
  SequentialT<double> net;
  net.emplace<DropoutT<double>>(0.5);
  FeatureModelT<double> lib("dropout", std::move(net));
  BatchT<double> one;
  one.inputs = xt::ones<double>({std::size_t(3), std::size_t(6), std::size_t(5)});
  one.ids = ids;
  one.labels.assign(3, 0);
  const DropoutKeyScope scope(key, 0);
  CHECK(A(lib.forward(one).value()) == a0);
}

TEST_CASE("onnx graphs: a parameter with no exact rule: vanilla and ghost refuse naming the node; naive and jl:K run") {
  test::TempDir dir("dpgrad-onnx-g");
  FastRng rng(3);
  // y = (x / s) W: the divisor s (3) is a trainable initializer
  OnnxGraph g;
  g.input("x", {kB, 3});
  g.output("y", {kB, 2});
  g.init("s", {3}, {1.5f, 2.0f, 2.5f});
  g.init("w", {3, 2}, random_floats(6, rng));
  g.node("Div", {"x", "s"}, {"h"}, "scale_by_s");
  g.node("MatMul", {"h", "w"}, {"y"}, "proj");
  auto m = load_graph(g, dir);
  REQUIRE(m->inexact_uses().size() == 1);
  CHECK(m->inexact_uses()[0].find("node 'scale_by_s' (Div)") != std::string::npos);
  const BatchT<double> batch = random_batch({4, 3}, 2, rng);
  for (const std::string s : {"vanilla", "ghost"}) {
    CAPTURE(s);
    test::check_error<std::invalid_argument>(
        [&] { make_clip_strategy<double>(s)->clipped_sum(*m, batch, 1.0, rng); },
        {"node 'scale_by_s' (Div)", "parameter 's'", "naive and jl:K"});
  }
  CHECK_NOTHROW(make_clip_strategy<double>("naive")->clipped_sum(*m, batch, 1.0, rng));
  CHECK_NOTHROW(make_clip_strategy<double>("jl:3")->clipped_sum(*m, batch, 1.0, rng));
  // frozen, the divisor is a constant and every exact route runs and agrees
  dpgrad::onnx::LoadOptions o;
  o.freeze = "^s$";
  auto frozen = load_graph(g, dir, o);
  CHECK(frozen->inexact_uses().empty());
  const PerSampleCheck c = check_per_sample(*frozen, batch);
  INFO(c.str());
  CHECK(c.agrees(1e-9));
}

TEST_CASE("onnx graphs: a weight read in two orientations, a table read at constant rows: inexact, by name") {
  test::TempDir dir("dpgrad-onnx-g");
  FastRng rng(4);
  {  // y = (x W) W^T: the second use transposes the parameter
    OnnxGraph g;
    g.input("x", {kB, 3});
    g.output("y", {kB, 3});
    g.init("w", {3, 2}, random_floats(6, rng));
    g.node("MatMul", {"x", "w"}, {"h"}, "down");
    auto* n = g.node("Gemm", {"h", "w"}, {"y"}, "up");
    OnnxGraph::attr(n, "transB", std::int64_t(1));
    auto m = load_graph(g, dir);
    REQUIRE(m->inexact_uses().size() == 1);
    CHECK(m->inexact_uses()[0].find("node 'up' (Gemm)") != std::string::npos);
    const BatchT<double> batch = random_batch({3, 3}, 3, rng);
    test::check_error<std::invalid_argument>(
        [&] { make_clip_strategy<double>("ghost")->clipped_sum(*m, batch, 1.0, rng); }, {"node 'up' (Gemm)"});
    CHECK_NOTHROW(make_clip_strategy<double>("naive")->clipped_sum(*m, batch, 1.0, rng));
  }
  {  // positions: a table (4, 2) gathered at the constant rows 0..3 and added to the data
    OnnxGraph g;
    g.input("x", {kB, 4, 2});
    g.output("y", {kB, 4, 2});
    g.init("positions", {4, 2}, random_floats(8, rng));
    g.init_ints("rows", {4}, {0, 1, 2, 3});
    g.node("Gather", {"positions", "rows"}, {"p"}, "lookup");
    g.node("Add", {"x", "p"}, {"y"}, "plus");
    auto m = load_graph(g, dir);
    REQUIRE(m->inexact_uses().size() == 1);
    CHECK(m->inexact_uses()[0].find("node 'lookup' (Gather)") != std::string::npos);
  }
}

TEST_CASE("onnx graphs: a reshape that mixes samples is refused by the exact strategies; naive runs") {
  // x (B, 4, 3) -> (4, B, 3) -> Reshape (B, 12) (not a transpose back) -> Gemm -> (B, 2)
  test::TempDir dir("dpgrad-onnx-g");
  FastRng rng(5);
  OnnxGraph g;
  g.input("x", {kB, 4, 3});
  g.output("y", {kB, 2});
  auto* t = g.node("Transpose", {"x"}, {"xt"});
  OnnxGraph::attr(t, "perm", std::vector<std::int64_t>{1, 0, 2});
  g.constant_ints("to", {-1, 12});
  g.node("Reshape", {"xt", "to"}, {"r"}, "mixer");
  g.init("w", {2, 12}, random_floats(24, rng));
  auto* n = g.node("Gemm", {"r", "w"}, {"y"}, "fc");
  OnnxGraph::attr(n, "transB", std::int64_t(1));
  auto m = load_graph(g, dir);
  CHECK(m->inexact_uses().empty());  // nothing the loader can see: the engine's tracking refuses it
  for (std::size_t b : {2, 3}) {
    CAPTURE(b);
    const BatchT<double> batch = random_batch({b, 4, 3}, 2, rng);
    const PerSampleCheck c = check_per_sample(*m, batch);
    INFO(c.str());
    CHECK(c.never_silently_wrong(1e-9));
    for (const auto& r : c.routes) CHECK(r.refused);
    CHECK_NOTHROW(make_clip_strategy<double>("naive")->clipped_sum(*m, batch, 1.0, rng));
  }
}

TEST_CASE("onnx graphs: the sequence-first attention reshapes of PyTorch exports are exact") {
  // x (B, 3, 4) -> (3, B, 4) -> MatMul W + b -> (3, B 2, 2) -> (B 2, 3, 2) -> back -> (3 B, 4) -> Gemm -> (3, B, 4)
  // -> (B, 3, 4) -> ReduceMean over 1 -> Gemm -> (B, 2): every reshape built from Shape chains
  test::TempDir dir("dpgrad-onnx-g");
  FastRng rng(6);
  OnnxGraph g;
  g.input("x", {kB, 3, 4});
  g.output("y", {kB, 2});
  auto* t0 = g.node("Transpose", {"x"}, {"s"});
  OnnxGraph::attr(t0, "perm", std::vector<std::int64_t>{1, 0, 2});
  g.init("w_in", {4, 4}, random_floats(16, rng));
  g.init("b_in", {4}, random_floats(4, rng));
  g.node("MatMul", {"s", "w_in"}, {"p"}, "in_proj");
  g.node("Add", {"b_in", "p"}, {"q"}, "in_bias");
  g.node("Shape", {"s"}, {"shape"});
  g.constant_ints("i0", {0}, true);
  g.constant_ints("i1", {1}, true);
  auto* g0 = g.node("Gather", {"shape", "i0"}, {"len"});
  OnnxGraph::attr(g0, "axis", std::int64_t(0));
  auto* g1 = g.node("Gather", {"shape", "i1"}, {"batch"});
  OnnxGraph::attr(g1, "axis", std::int64_t(0));
  g.constant_ints("heads", {2}, true);
  g.node("Mul", {"batch", "heads"}, {"bh"});
  g.constant_ints("ax0", {0});
  g.node("Unsqueeze", {"len", "ax0"}, {"len1"});
  g.node("Unsqueeze", {"bh", "ax0"}, {"bh1"});
  g.node("Unsqueeze", {"batch", "ax0"}, {"b1"});
  g.constant_ints("dk", {2});
  g.constant_ints("d", {4});
  auto* c1 = g.node("Concat", {"len1", "bh1", "dk"}, {"heads_shape"});
  OnnxGraph::attr(c1, "axis", std::int64_t(0));
  g.node("Reshape", {"q", "heads_shape"}, {"qh"}, "split_heads");  // (3, 2B, 2): batch outer
  auto* t1 = g.node("Transpose", {"qh"}, {"qb"});
  OnnxGraph::attr(t1, "perm", std::vector<std::int64_t>{1, 0, 2});  // (2B, 3, 2)
  g.node("Tanh", {"qb"}, {"a"});
  auto* t2 = g.node("Transpose", {"a"}, {"at"});
  OnnxGraph::attr(t2, "perm", std::vector<std::int64_t>{1, 0, 2});  // (3, 2B, 2)
  g.node("Mul", {"len", "batch"}, {"lb"});
  g.node("Unsqueeze", {"lb", "ax0"}, {"lb1"});
  auto* c2 = g.node("Concat", {"lb1", "d"}, {"rows_shape"});
  OnnxGraph::attr(c2, "axis", std::int64_t(0));
  g.node("Reshape", {"at", "rows_shape"}, {"rows"}, "merge_rows");  // (3B, 4): batch inner
  g.init("w_out", {4, 4}, random_floats(16, rng));
  g.init("b_out", {4}, random_floats(4, rng));
  auto* go = g.node("Gemm", {"rows", "w_out", "b_out"}, {"o"}, "out_proj");
  OnnxGraph::attr(go, "transB", std::int64_t(1));
  auto* c3 = g.node("Concat", {"len1", "b1", "d"}, {"back_shape"});
  OnnxGraph::attr(c3, "axis", std::int64_t(0));
  g.node("Reshape", {"o", "back_shape"}, {"ob"});
  auto* t3 = g.node("Transpose", {"ob"}, {"obt"});
  OnnxGraph::attr(t3, "perm", std::vector<std::int64_t>{1, 0, 2});
  auto* rm = g.node("ReduceMean", {"obt"}, {"m"});
  OnnxGraph::attr(rm, "axes", std::vector<std::int64_t>{1});
  OnnxGraph::attr(rm, "keepdims", std::int64_t(0));
  g.init("w_fc", {2, 4}, random_floats(8, rng));
  auto* gf = g.node("Gemm", {"m", "w_fc"}, {"y"}, "fc");
  OnnxGraph::attr(gf, "transB", std::int64_t(1));
  auto m = load_graph(g, dir);
  CHECK(m->inexact_uses().empty());
  for (std::size_t b : {2, 3}) {
    CAPTURE(b);
    const PerSampleCheck c = check_per_sample(*m, random_batch({b, 3, 4}, 2, rng));
    INFO(c.str());
    CHECK(c.agrees(1e-9));
  }
}
