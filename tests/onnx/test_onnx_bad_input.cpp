// Bad ONNX files: each refused at load time with an OnnxError that names the
// file and the node, op, tensor or file at fault, never a crash or a silent
// acceptance: truncated and malformed protobuf, unsupported operators and
// attributes, dynamic dimensions other than the batch, opsets outside 13-17,
// initializers whose data disagree with their dims, huge declared sizes, and
// external data outside the model's folder.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <doctest/doctest.h>

#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "onnx/onnx.hpp"
#include "support/check.hpp"
#include "support/onnx_graph.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
using test::OnnxGraph;
namespace fs = std::filesystem;

namespace {

/// input (batch, 3) -> Gemm(W (2, 3), b (2), transB) -> logits (batch, 2)
OnnxGraph linear_graph(std::int64_t opset = 13) {
  OnnxGraph g(opset);
  g.input("x", {OnnxGraph::kBatch, 3});
  g.output("y", {OnnxGraph::kBatch, 2});
  g.init("w", {2, 3}, {1, 2, 3, 4, 5, 6});
  g.init("b", {2}, {0.5f, -0.5f});
  auto* n = g.node("Gemm", {"x", "w", "b"}, {"y"}, "fc");
  OnnxGraph::attr(n, "transB", std::int64_t(1));
  return g;
}

/// Loading `path` throws OnnxError containing every fragment (and the path).
void refused(const std::string& path, const std::vector<std::string>& fragments) {
  CAPTURE(path);
  std::vector<std::string> all = fragments;
  all.push_back(path);
  test::check_error<dpgrad::onnx::OnnxError>([&] { dpgrad::onnx::load<float>(path); }, all);
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

}  // namespace

TEST_CASE("onnx bad input: a valid model loads (the baseline of the cases below)") {
  test::TempDir dir("dpgrad-onnx-bad");
  linear_graph().save(dir / "ok.onnx");
  auto m = dpgrad::onnx::load<float>(dir / "ok.onnx");
  BatchT<float> b;
  b.inputs = ArrayT<float>{{1.0f, 0.0f, 0.0f}};
  NoRecordScope<float> none;
  DPGRAD_CHECK_CLOSE(m->forward(b).value(), (ArrayT<float>{{1.5f, 3.5f}}), 1e-7);
}

TEST_CASE("onnx bad input: truncated or malformed protobuf, a missing or empty file") {
  test::TempDir dir("dpgrad-onnx-bad");
  const std::string good = linear_graph().bytes();
  for (double frac : {0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99}) {
    CAPTURE(frac);
    const std::string path = dir / "cut.onnx";
    write(path, good.substr(0, std::size_t(frac * double(good.size()))));
    test::check_error<dpgrad::onnx::OnnxError>([&] { dpgrad::onnx::load<float>(path); }, {path});
  }
  write(dir / "junk.onnx", "this is not an ONNX file at all\n\xff\xff\xff\xff");
  refused(dir / "junk.onnx", {"not a valid ONNX model"});
  // flipped bytes: refused or (where the flip lands in data) loaded, never a crash
  FastRng rng(1);
  for (int k = 0; k < 200; ++k) {
    std::string b = good;
    for (int j = 0; j < 3; ++j) b[rng.below(b.size())] = char(rng.below(256));
    write(dir / "flip.onnx", b);
    try {
      dpgrad::onnx::load<float>(dir / "flip.onnx");
    } catch (const dpgrad::onnx::OnnxError&) {
    }
  }
  refused(dir / "absent.onnx", {"no such file"});
  refused(dir.path.string(), {"not a regular file"});
  dpgrad::onnx::LoadOptions small;
  small.max_file_bytes = 10;
  linear_graph().save(dir / "big.onnx");
  test::check_error<dpgrad::onnx::OnnxError>([&] { dpgrad::onnx::load<float>(dir / "big.onnx", small); }, {"more than the limit of 10"});
}

TEST_CASE("onnx bad input: an unsupported operator or attribute names the node") {
  test::TempDir dir("dpgrad-onnx-bad");
  {
    OnnxGraph g;
    g.input("x", {OnnxGraph::kBatch, 3});
    g.output("y", {OnnxGraph::kBatch, 6});
    g.constant_ints("reps", {1, 2});
    g.node("Tile", {"x", "reps"}, {"y"}, "tiler");
    g.save(dir / "tile.onnx");
    refused(dir / "tile.onnx", {"node 'tiler' (Tile)", "operator Tile is not supported"});
  }
  {
    OnnxGraph g;
    g.input("x", {OnnxGraph::kBatch, 4, 5, 5});
    g.output("y", {OnnxGraph::kBatch, 2, 3, 3});
    g.init("k", {2, 2, 3, 3}, std::vector<float>(36, 0.1f));
    auto* n = g.node("Conv", {"x", "k"}, {"y"}, "grouped");
    OnnxGraph::attr(n, "group", std::int64_t(2));
    g.save(dir / "group.onnx");
    refused(dir / "group.onnx", {"node 'grouped' (Conv)", "attribute 'group' = 2 is not supported"});
  }
  {
    OnnxGraph g;
    g.input("x", {OnnxGraph::kBatch, 1, 6, 6});
    g.output("y", {OnnxGraph::kBatch, 1, 2, 2});
    auto* n = g.node("MaxPool", {"x"}, {"y"}, "dilated");
    OnnxGraph::attr(n, "kernel_shape", std::vector<std::int64_t>{2, 2});
    OnnxGraph::attr(n, "dilations", std::vector<std::int64_t>{2, 2});
    OnnxGraph::attr(n, "strides", std::vector<std::int64_t>{2, 2});
    g.save(dir / "dilated.onnx");
    refused(dir / "dilated.onnx", {"node 'dilated' (MaxPool)", "dilations"});
  }
  {  // batch normalisation in training mode: refused by name, pointing to GroupNorm
    OnnxGraph g(15);
    g.input("x", {OnnxGraph::kBatch, 2, 3, 3});
    g.output("y", {OnnxGraph::kBatch, 2, 3, 3});
    for (const char* s : {"scale", "bias", "mean", "var"}) g.init(s, {2}, {1.0f, 1.0f});
    auto* n = g.node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"}, "bn1");
    OnnxGraph::attr(n, "training_mode", std::int64_t(1));
    g.save(dir / "bn.onnx");
    refused(dir / "bn.onnx", {"node 'bn1' (BatchNormalization)", "mixes samples", "GroupNorm"});
  }
}

TEST_CASE("onnx bad input: dynamic dimensions other than the batch, a fixed batch, several inputs") {
  test::TempDir dir("dpgrad-onnx-bad");
  {
    OnnxGraph g = linear_graph();
    auto* d = g.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1);
    d->clear_dim_value();
    d->set_dim_param("features");
    g.save(dir / "dyn.onnx");
    refused(dir / "dyn.onnx", {"input 'x'", "dynamic dimension 'features' on axis 1", "only the batch"});
  }
  {
    OnnxGraph g = linear_graph();
    auto* d = g.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0);
    d->clear_dim_param();
    d->set_dim_value(4);
    g.save(dir / "fixed.onnx");
    refused(dir / "fixed.onnx", {"input 'x'", "fixed batch size 4", "dynamic_axes"});
  }
  {
    OnnxGraph g = linear_graph();
    g.input("z", {OnnxGraph::kBatch, 3});
    g.save(dir / "two.onnx");
    refused(dir / "two.onnx", {"2 inputs", "'x', 'z'"});
  }
}

TEST_CASE("onnx bad input: opsets outside 13 to 17") {
  test::TempDir dir("dpgrad-onnx-bad");
  for (std::int64_t opset : {11, 12, 18, 19}) {
    CAPTURE(opset);
    const std::string path = dir / ("opset" + std::to_string(opset) + ".onnx");
    linear_graph(opset).save(path);
    refused(path, {"opset " + std::to_string(opset), "opsets 13 to 17"});
  }
  for (std::int64_t opset : {13, 17}) {
    const std::string path = dir / ("ok" + std::to_string(opset) + ".onnx");
    linear_graph(opset).save(path);
    CHECK_NOTHROW(dpgrad::onnx::load<float>(path));
  }
}

TEST_CASE("onnx bad input: initializers whose data disagree with their dims, and huge declared sizes") {
  test::TempDir dir("dpgrad-onnx-bad");
  {
    OnnxGraph g = linear_graph();
    g.graph().mutable_initializer(0)->set_raw_data(std::string(20, '\0'));  // 5 floats for (2, 3)
    g.save(dir / "short.onnx");
    refused(dir / "short.onnx", {"initializer 'w'", "holds 5 values", "(2, 3) declare 6"});
  }
  {
    OnnxGraph g = linear_graph();
    g.graph().mutable_initializer(0)->set_raw_data(std::string(23, '\0'));
    g.save(dir / "ragged.onnx");
    refused(dir / "ragged.onnx", {"initializer 'w'", "23 bytes of raw data"});
  }
  {
    OnnxGraph g = linear_graph();
    auto* t = g.graph().mutable_initializer(1);
    t->clear_raw_data();
    t->add_float_data(1.0f);  // 1 typed value for (2)
    g.save(dir / "typed.onnx");
    refused(dir / "typed.onnx", {"initializer 'b'", "holds 1 values"});
  }
  {
    OnnxGraph g = linear_graph();
    auto* t = g.graph().mutable_initializer(0);
    t->clear_dims();
    t->add_dims(std::int64_t(1) << 20);
    t->add_dims(std::int64_t(1) << 20);
    g.save(dir / "huge.onnx");
    refused(dir / "huge.onnx", {"initializer 'w'", "a huge size"});
  }
  {
    OnnxGraph g = linear_graph();
    g.graph().mutable_initializer(0)->set_dims(0, -2);
    g.save(dir / "negative.onnx");
    refused(dir / "negative.onnx", {"initializer 'w'", "negative dimension"});
  }
  {  // a constant of 2^50 elements
    OnnxGraph g;
    g.input("x", {OnnxGraph::kBatch, 3});
    g.output("y", {OnnxGraph::kBatch, 3});
    g.constant_ints("big", {std::int64_t(1) << 30, std::int64_t(1) << 20});
    g.node("ConstantOfShape", {"big"}, {"z"}, "filler");
    auto* r = g.node("ReduceSum", {"z"}, {"s"}, "total");
    OnnxGraph::attr(r, "keepdims", std::int64_t(0));
    g.node("Add", {"x", "s"}, {"y"}, "plus");
    g.save(dir / "bigfill.onnx");
    refused(dir / "bigfill.onnx", {"node 'filler' (ConstantOfShape)", "a huge declared size"});
  }
}

TEST_CASE("onnx bad input: external data must lie inside the model's folder, and fit the tensor") {
  test::TempDir dir("dpgrad-onnx-bad");
  fs::create_directories(dir.path / "model");
  const std::string weights(24, '\0');
  write(dir / "outside.bin", weights);
  write(dir / "model/inside.bin", weights);
  auto with_external = [&](const std::string& location, std::int64_t offset = 0, std::int64_t length = -1) {
    OnnxGraph g = linear_graph();
    auto* t = g.graph().mutable_initializer(0);
    t->clear_raw_data();
    t->set_data_location(::onnx::TensorProto_DataLocation_EXTERNAL);
    auto add = [&](const std::string& k, const std::string& v) {
      auto* e = t->add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add("location", location);
    if (offset) add("offset", std::to_string(offset));
    if (length >= 0) add("length", std::to_string(length));
    const std::string path = dir / "model/m.onnx";
    g.save(path);
    return path;
  };
  CHECK_NOTHROW(dpgrad::onnx::load<float>(with_external("inside.bin")));
  CHECK_NOTHROW(dpgrad::onnx::load<float>(with_external("inside.bin", 0, 24)));
  refused(with_external("../outside.bin"), {"tensor 'w'", "'../outside.bin' is outside the model's folder"});
  refused(with_external((dir.path / "outside.bin").string()), {"tensor 'w'", "outside the model's folder"});
  fs::create_symlink(dir.path / "outside.bin", dir.path / "model/link.bin");
  refused(with_external("link.bin"), {"tensor 'w'", "'link.bin' is outside the model's folder"});
  refused(with_external("absent.bin"), {"tensor 'w'", "does not exist"});
  refused(with_external("inside.bin", 0, 20), {"tensor 'w'", "length 20 disagrees"});
  refused(with_external("inside.bin", 8), {"tensor 'w'", "beyond the end of 'inside.bin'"});
  refused(with_external("inside.bin", 0, 999999999999), {"tensor 'w'", "disagrees"});
}
