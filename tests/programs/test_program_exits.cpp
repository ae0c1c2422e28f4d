// Every program's every exit checks its standard output (issue 54): --help to a
// full disk is an error, as a run's results are; and dpgrad-predict's inputs
// read as they are declared: the dtype from the npy header alone, token ids as
// int64 values, never narrowed to another id.
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <xtensor/xnpy.hpp>

#include "engine/array.hpp"
#include "support/onnx_graph.hpp"
#include "support/programs.hpp"
#include "support/temp_dir.hpp"

using dpgrad::test::OnnxGraph;
using dpgrad::test::Run;
using dpgrad::test::run_shell;

namespace {

const std::string predict = DPGRAD_PREDICT;
const std::vector<std::string> programs = {DPGRAD_TRAIN, DPGRAD_ACCOUNT, DPGRAD_AUDIT, DPGRAD_LOGREG,
                                           DPGRAD_BENCH, DPGRAD_PATE,    DPGRAD_TUNE,  DPGRAD_PREDICT};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// ids (batch, 2) int64 -> Gather on a table (5, 3) -> mean over the positions: logits (batch, 3)
void token_model(const std::string& path) {
  OnnxGraph g;
  g.input("ids", {OnnxGraph::kBatch, 2}, 7);
  g.output("logits", {OnnxGraph::kBatch, 3});
  std::vector<float> table(15);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = float(i);
  g.init("embedding.weight", {5, 3}, table);
  g.node("Gather", {"embedding.weight", "ids"}, {"rows"}, "embed");
  auto* n = g.node("ReduceMean", {"rows"}, {"logits"}, "mean");
  OnnxGraph::attr(n, "axes", std::vector<std::int64_t>{1});
  OnnxGraph::attr(n, "keepdims", std::int64_t(0));
  g.save(path);
}

/// features (batch, 3) -> Gemm (2): logits (batch, 2)
void feature_model(const std::string& path) { dpgrad::test::linear_gemm_graph().save(path); }

/// A version 1.0 npy file of float32 (1, 3) whose header takes 80 bytes (aligned
/// to 16, as older numpy wrote it) and whose data start with the bytes '<i8'.
std::string float_data_holding_int64_descr() {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }";
  dict.append(80 - 10 - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string b = "\x93NUMPY";
  b += std::string("\x01\x00", 2);
  b.push_back(char(dict.size()));
  b.push_back('\0');
  b += dict;
  b += std::string("'<i8'\x00\x00\x3f", 8);  // about 5.6e-5 and 0.5 + 39 2^-24
  const float one = 1.0f;
  b.append(reinterpret_cast<const char*>(&one), 4);
  return b;
}

}  // namespace

TEST_CASE("every program: --help to a full standard output is an error, not a success") {
  for (const auto& program : programs) {
    CAPTURE(program);
    const Run ok = run_shell(program + " --help >/dev/null");
    CHECK(ok.status == 0);
    const Run full = run_shell("(" + program + " --help >/dev/full)");
    CHECK(full.status == 1);
    CHECK(contains(full.out, "could not write to standard output"));
    const Run closed = run_shell("(" + program + " --help >&-)");
    CHECK(closed.status == 2);
    CHECK(contains(closed.out, "standard output is closed"));
  }
}

TEST_CASE("dpgrad-predict: results it could not show are an error; a closed standard output is refused") {
  dpgrad::test::TempDir dir("dpgrad-exits");
  feature_model(dir / "model.onnx");
  xt::dump_npy(dir / "x.npy", dpgrad::ArrayT<float>({{1.0f, 0.0f, 0.0f}, {0.0f, 1.0f, 0.0f}}));
  const std::string cmd = predict + " --model " + (dir / "model.onnx") + " --input " + (dir / "x.npy") + " --output ";
  const Run ok = run_shell(cmd + (dir / "y.npy"));
  INFO(ok.out);
  CHECK(ok.status == 0);
  const Run full = run_shell("(" + cmd + (dir / "full.npy") + " >/dev/full)");
  CHECK(full.status == 1);
  CHECK(contains(full.out, "dpgrad-predict: error: could not write to standard output"));
  const Run closed = run_shell("(" + cmd + (dir / "closed.npy") + " >&-)");
  CHECK(closed.status == 2);
  CHECK(contains(closed.out, "standard output is closed"));
}

TEST_CASE("dpgrad-predict: token ids are checked as int64, never wrapped to another id") {
  dpgrad::test::TempDir dir("dpgrad-exits");
  token_model(dir / "tokens.onnx");
  const std::string cmd = predict + " --model " + (dir / "tokens.onnx") + " --output " + (dir / "y.npy") + " --input ";
  xt::dump_npy(dir / "ok.npy", dpgrad::ArrayT<std::int64_t>({{1, 3}, {0, 4}}));
  const Run ok = run_shell(cmd + (dir / "ok.npy"));
  INFO(ok.out);
  CHECK(ok.status == 0);
  // 4294967299 = 2^32 + 3 and -4294967293 = -2^32 + 3: id 3 once narrowed to int32
  for (const std::int64_t id : {std::int64_t(4294967299LL), std::int64_t(-4294967293LL), std::int64_t(-1)}) {
    CAPTURE(id);
    xt::dump_npy(dir / "bad.npy", dpgrad::ArrayT<std::int64_t>({{1, 2}, {0, id}}));
    const Run bad = run_shell(cmd + (dir / "bad.npy"));
    CHECK(bad.status == 2);
    CHECK(contains(bad.out, "token id " + std::to_string(id) + " (example 1, position 1)"));
  }
}

TEST_CASE("dpgrad-predict: a float32 input whose data holds the bytes '<i8' is read as float32") {
  dpgrad::test::TempDir dir("dpgrad-exits");
  feature_model(dir / "model.onnx");
  {
    std::ofstream f(dir / "x.npy", std::ios::binary);
    f << float_data_holding_int64_descr();
  }
  const Run r = run_shell(predict + " --model " + (dir / "model.onnx") + " --input " + (dir / "x.npy") + " --output " +
                          (dir / "y.npy"));
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "1 outputs (1, 2)"));
}

TEST_CASE("dpgrad-train --onnx-max-bytes-per-example: an imported model's bound per example is the user's") {
  dpgrad::test::TempDir dir("dpgrad-exits");
  feature_model(dir / "model.onnx");  // 12 + 8 bytes of floats for each example
  const Run r = run_shell(std::string(DPGRAD_TRAIN) + " --model onnx:" + (dir / "model.onnx") +
                          " --dataset synthetic --epochs 1 --onnx-max-bytes-per-example 19");
  INFO(r.out);
  CHECK(r.status == 2);
  CHECK(contains(r.out, "node 'fc' (Gemm)"));
  CHECK(contains(r.out, "20 bytes per example, more than the limit of 19 bytes"));
}

TEST_CASE("dpgrad-predict: memory that runs out in a forward pass is an error naming the model's file") {
  dpgrad::test::TempDir dir("dpgrad-exits");
  OnnxGraph g;  // (batch, 1) -> Expand to (batch, 2^26) -> sum: 256 MiB for each example, within the bound
  g.input("x", {OnnxGraph::kBatch, 1});
  g.output("y", {OnnxGraph::kBatch, 1});
  g.constant_ints("to", {1, std::int64_t(1) << 26});
  g.node("Expand", {"x", "to"}, {"wide"}, "widen");
  g.node("ReduceSum", {"wide", "axes"}, {"y"}, "sum");
  g.init_ints("axes", {1}, {1});
  g.save(dir / "wide.onnx");
  xt::dump_npy(dir / "x.npy", dpgrad::ArrayT<float>(xt::ones<float>({std::size_t(8), std::size_t(1)})));
  // 2 GiB at batch size 8, in a process that may take 1.5 GB of address space
  const Run r = run_shell("(ulimit -v 1500000; " + predict + " --model " + (dir / "wide.onnx") + " --input " +
                          (dir / "x.npy") + " --output " + (dir / "y.npy") + " --batch-size 8)");
  INFO(r.out);
  CHECK(r.status == 2);
  CHECK(contains(r.out, "dpgrad-predict: error: onnx:wide.onnx: out of memory in the forward pass at batch size 8"));
}
