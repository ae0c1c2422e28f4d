// dpgrad-train --model onnx:PATH (with --freeze and --export-onnx),
// dpgrad-predict and dpgrad-tune --export-onnx, run as a user runs them: the
// model's input and output shapes checked against the dataset, bad files and
// export paths refused with a clear message and a non-zero exit before any
// training, the exported model loadable and its predictions those of the library.
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <xtensor/xnpy.hpp>

#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "onnx/onnx.hpp"
#include "optim/checkpoint/npy.hpp"
#include "support/key_store.hpp"
#include "support/onnx_graph.hpp"
#include "support/programs.hpp"
#include "support/temp_dir.hpp"

using dpgrad::test::OnnxGraph;

namespace {

using dpgrad::test::Run;
Run run(const std::string& cmd) { return dpgrad::test::run_shell(cmd); }

const std::string train = DPGRAD_TRAIN;
const std::string predict = DPGRAD_PREDICT;
const std::string tune = DPGRAD_TUNE;

/// images (B, 1, side, side) -> Flatten -> Gemm (classes) -> logits
void classifier(const std::string& path, std::size_t side = 28, std::size_t classes = 10) {
  dpgrad::FastRng rng(1);
  OnnxGraph g;
  g.input("images", {OnnxGraph::kBatch, 1, std::int64_t(side), std::int64_t(side)});
  g.output("logits", {OnnxGraph::kBatch, std::int64_t(classes)});
  std::vector<float> w(classes * side * side), b(classes);
  for (auto& v : w) v = float(0.01 * rng.normal());
  for (auto& v : b) v = float(0.01 * rng.normal());
  g.node("Flatten", {"images"}, {"flat"}, "/Flatten");
  g.init("fc.weight", {classes, side * side}, w);
  g.init("fc.bias", {classes}, b);
  auto* n = g.node("Gemm", {"flat", "fc.weight", "fc.bias"}, {"logits"}, "/fc/Gemm");
  OnnxGraph::attr(n, "transB", std::int64_t(1));
  g.save(path);
}

const std::string private_args =
    " --dataset synthetic --optimizer dp-sgd --noise-multiplier 1 --batch-size 64 --max-steps 3 --epochs 1 "
    "--reproducible-noise --json";

}  // namespace

TEST_CASE("dpgrad-train --model onnx: trains privately, exports, and dpgrad-predict reads the export") {
  dpgrad::test::TempDir dir("dpgrad-onnx-prog");
  classifier(dir / "model.onnx");
  const Run r = run(train + " --model onnx:" + (dir / "model.onnx") + private_args + " --export-onnx " +
                    (dir / "trained.onnx"));
  INFO(r.out);
  REQUIRE(r.status == 0);
  REQUIRE(std::filesystem::exists(dir / "trained.onnx"));
  auto before = dpgrad::onnx::load<float>(dir / "model.onnx");
  auto after = dpgrad::onnx::load<float>(dir / "trained.onnx");
  CHECK_FALSE(after->all_values()[0] == before->all_values()[0]);  // trained
  // predictions: the program's equal the library's
  dpgrad::FastRng rng(2);
  dpgrad::ArrayT<float> x = dpgrad::ArrayT<float>::from_shape({3, 1, 28, 28});
  for (auto& v : x) v = float(rng.uniform());
  xt::dump_npy(dir / "x.npy", x);
  const Run p = run(predict + " --model " + (dir / "trained.onnx") + " --input " + (dir / "x.npy") + " --output " +
                    (dir / "y.npy") + " --batch-size 2");
  INFO(p.out);
  REQUIRE(p.status == 0);
  std::ifstream f(dir / "y.npy", std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  const dpgrad::ArrayT<float> y = dpgrad::read_npy<float>(s.str(), "y.npy");
  dpgrad::BatchT<float> batch;
  batch.inputs = x;
  after->set_training(false);
  dpgrad::NoRecordScope<float> none;
  CHECK(y == after->forward(batch).value());
}

TEST_CASE("dpgrad-train --freeze keeps the matching initializers as they were") {
  dpgrad::test::TempDir dir("dpgrad-onnx-prog");
  classifier(dir / "model.onnx");
  const Run r = run(train + " --model onnx:" + (dir / "model.onnx") + private_args + " --freeze 'fc\\.weight' --export-onnx " +
                    (dir / "trained.onnx"));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("1 frozen tensors") != std::string::npos);
  auto before = dpgrad::onnx::load<float>(dir / "model.onnx");
  auto after = dpgrad::onnx::load<float>(dir / "trained.onnx");
  CHECK(after->all_values()[0] == before->all_values()[0]);        // fc.weight: frozen
  CHECK_FALSE(after->all_values()[1] == before->all_values()[1]);  // fc.bias: trained
}

TEST_CASE("dpgrad-train --model onnx: shapes that do not fit the data, and bad files, fail before training") {
  dpgrad::test::TempDir dir("dpgrad-onnx-prog");
  classifier(dir / "small.onnx", 27);
  Run r = run(train + " --model onnx:" + (dir / "small.onnx") + private_args);
  CHECK(r.status == 2);
  CHECK(r.out.find("reads examples of shape (1, 27, 27)") != std::string::npos);
  CHECK(r.out.find("gives (1, 28, 28)") != std::string::npos);
  classifier(dir / "five.onnx", 28, 5);
  r = run(train + " --model onnx:" + (dir / "five.onnx") + private_args);
  CHECK(r.status == 2);
  CHECK(r.out.find("outputs 5 classes") != std::string::npos);
  {
    std::ofstream f(dir / "junk.onnx", std::ios::binary);
    f << "not a model";
  }
  r = run(train + " --model onnx:" + (dir / "junk.onnx") + private_args);
  CHECK(r.status == 2);
  CHECK(r.out.find("not a valid ONNX model") != std::string::npos);
  CHECK(r.out.find("epsilon") == std::string::npos);  // nothing ran
  r = run(train + " --model mlp --freeze x" + private_args);
  CHECK(r.status == 2);
  CHECK(r.out.find("--freeze applies to --model onnx:PATH") != std::string::npos);
  r = run(predict + " --model " + (dir / "junk.onnx") + " --input " + (dir / "none.npy") + " --output " + (dir / "y.npy"));
  CHECK(r.status == 2);  // the status of every program's errors
}

TEST_CASE("dpgrad-predict reads a dpgrad-train checkpoint of a built-in model") {
  dpgrad::test::TempDir dir("dpgrad-onnx-prog");
  const Run r = run(train + " --model mlp --hidden 16" + private_args + " --checkpoint-dir " + (dir / "run"));
  INFO(r.out);
  REQUIRE(r.status == 0);
  dpgrad::ArrayT<float> x = dpgrad::ArrayT<float>::from_shape({5, 1, 28, 28});
  x.fill(0.5f);
  xt::dump_npy(dir / "x.npy", x);
  const Run p = run(predict + " --model " + (dir / "run") + " --input " + (dir / "x.npy") + " --output " + (dir / "y.npy"));
  INFO(p.out);
  REQUIRE(p.status == 0);
  std::ifstream f(dir / "y.npy", std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  const dpgrad::ArrayT<float> y = dpgrad::read_npy<float>(s.str(), "y.npy");
  CHECK(y.shape() == dpgrad::Shape{5, 10});
  for (auto v : y) CHECK(std::isfinite(v));
  // a changed parameter file is refused, like a resume would refuse it
  const std::string latest = [&] {
    std::ifstream l(dir.path / "run" / "latest");
    std::string name;
    std::getline(l, name);
    return name;
  }();
  REQUIRE(!latest.empty());
  int changed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path / "run" / latest / "params"))
    if (e.path().extension() == ".npy" && changed++ == 0) std::ofstream(e.path(), std::ios::app) << 'x';
  REQUIRE(changed > 0);
  const Run bad = run(predict + " --model " + (dir / "run") + " --input " + (dir / "x.npy") + " --output " + (dir / "z.npy"));
  CHECK(bad.status != 0);
  CHECK(bad.out.find("dpgrad-predict: error:") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "z.npy"));
}

namespace {

/// The file's first bytes (empty when it cannot be read).
std::string head_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string s(64, '\0');
  f.read(s.data(), 64);
  s.resize(std::size_t(f.gcount()));
  return s;
}

}  // namespace

TEST_CASE("dpgrad-train --export-onnx: a path it must not or cannot write is refused before any data is read") {
  dpgrad::test::TempDir dir("dpgrad-onnx-export");
  classifier(dir / "model.onnx");
  const std::string fifo = dir / "fifo", folder = dir / "folder", link = dir / "link.onnx", victim = dir / "victim";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::filesystem::create_directory(folder);
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, link);
  std::filesystem::create_symlink(folder, dir / "folder-link");
  // (no device: a writer with this bug, run as root, would replace /dev/full; the FIFO takes its place)
  for (const std::string& path : {fifo, folder, link, dir / "folder-link/", dir / "missing/out.onnx", folder + "/"}) {
    CAPTURE(path);
    const Run r = dpgrad::test::run_argv({train, "--model", "onnx:" + (dir / "model.onnx"), "--dataset", "synthetic",
                                          "--optimizer", "dp-sgd", "--noise-multiplier", "1", "--batch-size", "64",
                                          "--max-steps", "1", "--epochs", "1", "--export-onnx", path});
    CHECK(r.status == 2);
    const std::string named = path.substr(0, path.size() - (path.back() == '/'));  // named without its '/'
    CHECK_MESSAGE(r.out.find("--export-onnx " + named) != std::string::npos, r.out);
    CHECK(r.out.find("epsilon") == std::string::npos);  // no step taken, nothing spent
    CHECK(r.out.find("synthetic") == std::string::npos);  // no data read
  }
  struct stat st {};
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK(std::filesystem::is_symlink(link));
  CHECK(head_of(victim) == "precious");
}

TEST_CASE("dpgrad-train --export-onnx: a planted scratch file is never written through, and none is left behind") {
  dpgrad::test::TempDir dir("dpgrad-onnx-export");
  classifier(dir / "model.onnx");
  const std::string out = dir / "out.onnx", victim = dir / "victim";
  std::ofstream(victim) << "precious";
  // the names a writer of OUT.tmp or OUT.tmp-PID would use, each a link to the victim
  std::filesystem::create_symlink(victim, out + ".tmp");
  std::filesystem::create_symlink(victim, dir / ".out.onnx.tmp");
  const Run r = dpgrad::test::run_argv({train, "--model", "onnx:" + (dir / "model.onnx"), "--dataset", "synthetic",
                                        "--optimizer", "dp-sgd", "--noise-multiplier", "1", "--batch-size", "64",
                                        "--max-steps", "1", "--epochs", "1", "--export-onnx", out});
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(head_of(victim) == "precious");
  CHECK_FALSE(std::filesystem::is_symlink(out));
  CHECK(std::filesystem::is_regular_file(out));
  CHECK(dpgrad::onnx::load<float>(out)->parameters().size() == 2);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{".out.onnx.tmp", "model.onnx", "out.onnx", "out.onnx.tmp", "victim"});
}

TEST_CASE("dpgrad-tune --export-onnx: a model without an ONNX export is refused before any data is read") {
  dpgrad::test::KeyStoreForTests keys;
  dpgrad::test::TempDir dir("dpgrad-onnx-export");
  const Run r = dpgrad::test::run_argv({tune, "--dataset", "synthetic-text", "--model", "bigru", "--target-epsilon",
                                        "8", "--trials", "poisson:1", "--epochs", "1", "--batch-size", "64",
                                        "--search-dir", dir / "s", "--export-onnx", dir / "best.onnx"});
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.out.find("--export-onnx") != std::string::npos, r.out);
  CHECK(r.out.find("bigru") != std::string::npos);
  CHECK(r.out.find("searching") == std::string::npos);  // nothing read, nothing searched
  CHECK_FALSE(std::filesystem::exists(dir / "s"));
  CHECK_FALSE(std::filesystem::exists(dir / "best.onnx"));
}

TEST_CASE("dpgrad-tune --export-onnx writes the released built-in model, which imports again") {
  dpgrad::test::KeyStoreForTests keys;
  dpgrad::test::TempDir dir("dpgrad-onnx-export");
  const Run r = dpgrad::test::run_argv({tune, "--dataset", "synthetic", "--model", "logreg", "--target-epsilon", "8",
                                        "--score-noise", "0.05", "--trials", "poisson:3", "--epochs", "1",
                                        "--batch-size", "256", "--search-dir", dir / "s", "--reproducible-noise",
                                        "--seed", "1", "--export-onnx", dir / "best.onnx", "--json"});
  INFO(r.out);
  REQUIRE(r.status == 0);
  REQUIRE(dpgrad::test::last_json(r.out)["released"] == true);
  CHECK(dpgrad::test::last_json(r.out)["exported"] == dir / "best.onnx");
  auto m = dpgrad::onnx::load<float>(dir / "best.onnx");
  CHECK(m->input().sample_shape == dpgrad::Shape{1, 28, 28});
  CHECK(m->output_classes() == 10);
}

TEST_CASE("dpgrad-train --export-onnx writes a built-in model, and refuses one without an export before any data") {
  dpgrad::test::TempDir dir("dpgrad-onnx-export");
  const Run r = dpgrad::test::run_argv({train, "--model", "cnn26k", "--dataset", "synthetic", "--optimizer", "dp-sgd",
                                        "--noise-multiplier", "1", "--batch-size", "64", "--max-steps", "1",
                                        "--epochs", "1", "--export-onnx", dir / "cnn.onnx"});
  INFO(r.out);
  REQUIRE(r.status == 0);
  auto m = dpgrad::onnx::load<float>(dir / "cnn.onnx");
  CHECK(m->input().sample_shape == dpgrad::Shape{1, 28, 28});
  CHECK(m->output_classes() == 10);
  CHECK(m->parameters().size() == 8);
  const Run no = dpgrad::test::run_argv({train, "--model", "bigru", "--dataset", "synthetic-text", "--optimizer",
                                         "dp-sgd", "--noise-multiplier", "1", "--max-steps", "1", "--export-onnx",
                                         dir / "gru.onnx"});
  CHECK(no.status == 2);
  CHECK_MESSAGE(no.out.find("--export-onnx: model 'bigru'") != std::string::npos, no.out);
  CHECK(no.out.find("epsilon") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "gru.onnx"));
}
