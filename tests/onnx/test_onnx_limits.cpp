// Hostile ONNX graphs of a few hundred bytes that ask for gigabytes: each is
// refused at load time, naming the node, before anything of that size is
// allocated (LoadOptions::max_bytes_per_example and max_constant_bytes,
// onnx/limits.cpp); and a default domain imported twice.
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "onnx/onnx.hpp"
#include "support/check.hpp"
#include "support/onnx_graph.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
using test::OnnxGraph;

namespace {

/// Loading `path` (with `o`) throws OnnxError containing every fragment and the path.
void refused(const std::string& path, const std::vector<std::string>& fragments,
             const dpgrad::onnx::LoadOptions& o = {}) {
  CAPTURE(path);
  std::vector<std::string> all = fragments;
  all.push_back(path);
  test::check_error<dpgrad::onnx::OnnxError>([&] { dpgrad::onnx::load<float>(path, o); }, all);
}

/// A ConstantOfShape node filling `shape` (a Constant node's int64 values) with one value of ONNX type `elem`.
void constant_of_shape(OnnxGraph& g, const std::string& name, const std::vector<std::int64_t>& shape, int elem,
                       const std::string& out) {
  g.constant_ints(name + "_shape", shape);
  auto* n = g.node("ConstantOfShape", {name + "_shape"}, {out}, name);
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(::onnx::AttributeProto_AttributeType_TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(elem);
  t->add_dims(1);
  if (elem == 1) t->add_float_data(1.0f);
  else t->add_int64_data(1);
}

/// x (batch, 1) + the sum of `value` (a float tensor of any shape): an output that reads it.
void sum_into_output(OnnxGraph& g, const std::string& value) {
  g.input("x", {OnnxGraph::kBatch, 1});
  g.output("y", {OnnxGraph::kBatch, 1});
  auto* r = g.node("ReduceSum", {value}, {"total"}, "total");
  OnnxGraph::attr(r, "keepdims", std::int64_t(0));
  g.node("Add", {"x", "total"}, {"y"}, "add");
}

}  // namespace

TEST_CASE("onnx limits: ConstantOfShape and Expand to huge constant shapes are refused before they are built") {
  test::TempDir dir("dpgrad-onnx-limits");
  {  // 2^28 int64 ones (the 391-byte file): folded at load time, 4 GiB as the compiler holds them
    OnnxGraph g;
    constant_of_shape(g, "ones", {std::int64_t(1) << 28}, 7, "ones");
    OnnxGraph::attr(g.node("Cast", {"ones"}, {"f"}, "cast"), "to", std::int64_t(1));
    sum_into_output(g, "f");
    g.save(dir / "ints.onnx");
    refused(dir / "ints.onnx",
            {"node 'ones' (ConstantOfShape)", "4.0 GiB", "max_constant_bytes", "before it is built"});
  }
  {  // 2^27 + 2^26 floats: under max_tensor_elements, 1.5 GiB as doubles
    OnnxGraph g;
    constant_of_shape(g, "fill", {(std::int64_t(1) << 27) + (std::int64_t(1) << 26)}, 1, "fill");
    sum_into_output(g, "fill");
    g.save(dir / "floats.onnx");
    refused(dir / "floats.onnx", {"node 'fill' (ConstantOfShape)", "1.5 GiB", "max_constant_bytes"});
    dpgrad::onnx::LoadOptions tight;  // the limit is the caller's
    tight.max_constant_bytes = 1000;
    OnnxGraph small;
    constant_of_shape(small, "fill", {200}, 1, "fill");
    sum_into_output(small, "fill");
    small.save(dir / "small.onnx");
    refused(dir / "small.onnx", {"node 'fill' (ConstantOfShape)", "1600 bytes", "limit of 1000 bytes"}, tight);
    CHECK(dpgrad::onnx::load<float>(dir / "small.onnx") != nullptr);
  }
  {  // Expand of one integer to 2^27 (a fold), read as floats
    OnnxGraph g;
    g.constant_ints("one", {1});
    g.constant_ints("to", {std::int64_t(1) << 27});
    g.node("Expand", {"one", "to"}, {"many"}, "expand");
    auto* c = g.node("Cast", {"many"}, {"f"}, "cast");
    OnnxGraph::attr(c, "to", std::int64_t(1));
    sum_into_output(g, "f");
    g.save(dir / "expand.onnx");
    refused(dir / "expand.onnx", {"node 'expand' (Expand)", "2.0 GiB", "max_constant_bytes"});
  }
  {  // a broadcast of two constants (2^14) x (2^14, 1) to 2^28 sums
    OnnxGraph g;
    constant_of_shape(g, "row", {1, std::int64_t(1) << 14}, 7, "row");
    constant_of_shape(g, "col", {std::int64_t(1) << 14, 1}, 7, "col");
    g.node("Add", {"row", "col"}, {"grid"}, "grid");
    auto* c = g.node("Cast", {"grid"}, {"f"}, "cast");
    OnnxGraph::attr(c, "to", std::int64_t(1));
    sum_into_output(g, "f");
    g.save(dir / "broadcast.onnx");
    refused(dir / "broadcast.onnx", {"node 'grid' (Add)", "4.0 GiB", "max_constant_bytes"});
  }
}

TEST_CASE("onnx limits: tensors of the forward pass too large per example are refused at load, the node named") {
  test::TempDir dir("dpgrad-onnx-limits");
  {  // Expand of the input (batch, 1) to (batch, 2^28): 1 GiB of floats for each example (2 GiB as int64 in the issue)
    OnnxGraph g;
    g.input("x", {OnnxGraph::kBatch, 1});
    g.output("y", {OnnxGraph::kBatch, 1});
    g.constant_ints("to", {1, std::int64_t(1) << 28});
    g.node("Expand", {"x", "to"}, {"wide"}, "widen");
    auto* r = g.node("ReduceSum", {"wide"}, {"y"}, "sum");
    r->add_input("axes");
    g.init_ints("axes", {1}, {1});
    g.save(dir / "expand.onnx");
    refused(dir / "expand.onnx", {"node 'widen' (Expand)", "(B, 268435456)", "per example", "max_bytes_per_example"});
  }
  {  // MatMul (batch, 2^14, 1) x (1, 2^14): an intermediate of 2^28 floats per example
    OnnxGraph g;
    g.input("x", {OnnxGraph::kBatch, 1 << 14, 1});
    g.output("y", {OnnxGraph::kBatch, 1 << 14});
    g.init("w", {1, 1 << 14}, std::vector<float>(1 << 14, 0.5f));
    g.node("MatMul", {"x", "w"}, {"outer"}, "outer");
    auto* r = g.node("ReduceSum", {"outer", "axes"}, {"y"}, "sum");
    OnnxGraph::attr(r, "keepdims", std::int64_t(0));
    g.init_ints("axes", {1}, {2});
    g.save(dir / "matmul.onnx");
    refused(dir / "matmul.onnx", {"node 'outer' (MatMul)", "(B, 16384, 16384)", "per example",
                                  "max_bytes_per_example"});
  }
  {  // the bound is the caller's: a linear model of 2 outputs needs 20 bytes per example in float
    test::linear_gemm_graph().save(dir / "linear.onnx");
    dpgrad::onnx::LoadOptions tight;
    tight.max_bytes_per_example = 19;
    refused(dir / "linear.onnx", {"node 'fc' (Gemm)", "20 bytes per example", "limit of 19 bytes"}, tight);
    tight.max_bytes_per_example = 20;
    CHECK(dpgrad::onnx::load<float>(dir / "linear.onnx", tight) != nullptr);
    tight.max_bytes_per_example = 39;  // in double: 40 bytes
    test::check_error<dpgrad::onnx::OnnxError>([&] { dpgrad::onnx::load<double>(dir / "linear.onnx", tight); },
                                       {"40 bytes per example"});
  }
}

TEST_CASE("onnx limits: Tile and Range (huge repeats, a huge count) are refused by name without running them") {
  test::TempDir dir("dpgrad-onnx-limits");
  {
    OnnxGraph g;
    g.input("x", {OnnxGraph::kBatch, 1});
    g.output("y", {OnnxGraph::kBatch, 1});
    g.constant_ints("reps", {1, std::int64_t(1) << 40});
    g.node("Tile", {"x", "reps"}, {"y"}, "tile");
    g.save(dir / "tile.onnx");
    refused(dir / "tile.onnx", {"node 'tile' (Tile)"});
  }
  {
    OnnxGraph g;
    g.constant_ints("start", {0}, true);
    g.constant_ints("limit", {std::int64_t(1) << 27}, true);  // 2^27 values: 2 GiB as the compiler folds them
    g.constant_ints("delta", {1}, true);
    g.node("Range", {"start", "limit", "delta"}, {"r"}, "range");
    auto* c = g.node("Cast", {"r"}, {"f"}, "cast");
    OnnxGraph::attr(c, "to", std::int64_t(1));
    sum_into_output(g, "f");
    g.save(dir / "range.onnx");
    refused(dir / "range.onnx", {"node 'range' (Range)", "2.0 GiB", "max_constant_bytes", "before it is built"});
  }
}

TEST_CASE("onnx limits: a domain imported twice is refused, whatever the order") {
  test::TempDir dir("dpgrad-onnx-limits");
  for (const auto& versions : {std::vector<std::int64_t>{99, 13}, std::vector<std::int64_t>{13, 99},
                               std::vector<std::int64_t>{13, 13}}) {
    CAPTURE(versions[0]);
    CAPTURE(versions[1]);
    OnnxGraph g(versions[0]);
    auto* o = g.model().add_opset_import();
    o->set_domain(versions[1] == 99 ? "ai.onnx" : "");
    o->set_version(versions[1]);
    g.input("x", {OnnxGraph::kBatch, 2});
    g.output("y", {OnnxGraph::kBatch, 2});
    g.node("Relu", {"x"}, {"y"}, "relu");
    g.save(dir / "twice.onnx");
    refused(dir / "twice.onnx", {"imports domain 'ai.onnx' twice", "one opset import per domain"});
  }
}
