// onnx::save through the one checked path for output files (engine/files.hpp):
// what is not a regular file is never replaced, a planted scratch name is never
// written through, a missing folder is an error, and nothing is left beside the
// file; save_problem says before any work which models cannot be written.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "layers/models.hpp"
#include "layers/registry.hpp"
#include "onnx/onnx.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
namespace fs = std::filesystem;

namespace {

const std::string kMlp = std::string(DPGRAD_ONNX_FIXTURES) + "/mlp/model.onnx";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("onnx::save never replaces what is not a regular file, nor writes through a link or a planted scratch name") {
  test::TempDir dir("dpgrad-onnx-save");
  auto model = onnx::load<float>(kMlp);
  const std::string fifo = dir / "fifo", folder = dir / "folder", link = dir / "link.onnx", victim = dir / "victim";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_directory(folder);
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, link);
  // (no device: a writer with this bug, run as root, would replace /dev/full; the FIFO takes its place)
  for (const std::string& path : {fifo, folder, link, folder + "/", dir / "missing/out.onnx"}) {
    CAPTURE(path);
    CHECK_THROWS_AS(onnx::save(*model, path), std::runtime_error);
  }
  struct stat st {};
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK(fs::is_symlink(link));
  CHECK(slurp(victim) == "precious");
  CHECK(fs::is_empty(folder));
  // the names an OUT.tmp writer would use, planted as links to the victim
  const std::string out = dir / "out.onnx";
  fs::create_symlink(victim, out + ".tmp");
  fs::create_symlink(victim, dir / ".out.onnx.tmp");
  onnx::save(*model, out);
  CHECK(slurp(victim) == "precious");
  CHECK(fs::is_regular_file(fs::symlink_status(out)));
  CHECK(names_in(dir.path) ==
        std::vector<std::string>{".out.onnx.tmp", "fifo", "folder", "link.onnx", "out.onnx", "out.onnx.tmp", "victim"});
  // a regular file is replaced whole, and reads back as the model
  std::ofstream(out, std::ios::trunc) << std::string(100000, 'x');
  onnx::save(*model, out);
  auto again = onnx::load<float>(out);
  const auto v0 = model->all_values(), v1 = again->all_values();
  REQUIRE(v0.size() == v1.size());
  for (std::size_t k = 0; k < v0.size(); ++k) CHECK(std::equal(v0[k].begin(), v0[k].end(), v1[k].begin()));
}

TEST_CASE("onnx::save writes the built-in stacks; imported again they give the same outputs, bit for bit") {
  test::TempDir dir("dpgrad-onnx-save");
  for (const std::string name : {"logreg", "mlp", "cnn26k"}) {
    for (const Activation act : {Activation::relu, Activation::tanh, Activation::sigmoid}) {
      CAPTURE(name);
      CAPTURE(to_string(act));
      FastRng rng(7);
      ModelSpec spec;
      spec.hidden = 16;
      spec.activation = act;
      auto model = build_model<float>(name, spec, rng);
      CHECK(onnx::save_problem(*model).empty());
      const std::string out = dir / (name + ".onnx");
      onnx::save(*model, out, Shape{1, 28, 28});  // ONNX's checker runs inside
      auto again = onnx::load<float>(out);
      CHECK(again->input().sample_shape == Shape{1, 28, 28});
      CHECK(again->output_classes() == 10);
      REQUIRE(again->parameters().size() == model->parameters().size());
      BatchT<float> batch;
      batch.inputs = ArrayT<float>::from_shape({5, 1, 28, 28});
      for (auto& v : batch.inputs) v = float(rng.uniform());
      model->set_training(false);
      again->set_training(false);
      NoRecordScope<float> none;
      const ArrayT<float> y0 = model->forward(batch).value(), y1 = again->forward(batch).value();
      REQUIRE(y0.shape() == y1.shape());
      CHECK(std::equal(y0.begin(), y0.end(), y1.begin()));
    }
  }
  // a built-in model needs the shape of what it reads
  FastRng rng(1);
  auto mlp = build_model<float>("mlp", ModelSpec{}, rng);
  CHECK_THROWS_AS(onnx::save(*mlp, dir / "x.onnx"), onnx::OnnxError);
}

TEST_CASE("onnx::save_problem: a model without an ONNX export names itself and the op") {
  auto imported = onnx::load<float>(kMlp);
  CHECK(onnx::save_problem(*imported).empty());
  FastRng rng(1);
  ModelSpec spec;
  spec.classes = 2;
  const auto bigru = build_model<float>("bigru", spec, rng);
  const std::string why = onnx::save_problem(*bigru);
  CHECK(why.find("bigru") != std::string::npos);
  CHECK(why.find("BiGru") != std::string::npos);
  CHECK_THROWS_WITH_AS(onnx::save(*bigru, "/nonexistent-folder/x.onnx"), doctest::Contains("bigru"), onnx::OnnxError);
  const auto scatter = build_model<float>("scatter-linear", ModelSpec{}, rng);
  CHECK(onnx::save_problem(*scatter).find("GroupNorm") != std::string::npos);
}
