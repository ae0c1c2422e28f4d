// dpgrad-predict: a trained model's outputs (logits) for the examples of an
// npy file, in an npy file. The model is an ONNX file (dpgrad-train
// --export-onnx, or any export dpgrad reads: docs/onnx.md) or a dpgrad-train
// checkpoint directory of a built-in model. Inference only: no privacy is spent.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <xtensor/xnpy.hpp>

#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "layers/models.hpp"
#include "optim/checkpoint.hpp"
#include "optim/npy.hpp"
#include "programs/cli.hpp"
#if DPGRAD_HAVE_ONNX
#include "onnx/onnx.hpp"
#endif

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace dpgrad;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::invalid_argument("cannot read " + p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// A model of dpgrad-train's, rebuilt from a checkpoint: its options say which,
/// the checkpoint's parameters (verified against its manifest) give the weights
/// and the number of classes (the size of the last bias).
std::unique_ptr<ModelT<float>> from_checkpoint(const fs::path& dir, const Shape& input) {
  const json extra = CheckpointDir(dir).read_extra();  // verifies every file of the latest checkpoint
  if (!extra.contains("options") || !extra["options"].is_object())
    throw std::invalid_argument(dir.string() + ": the checkpoint does not record its run's options");
  const json& o = extra["options"];
  const std::string name = o.value("model", "");
  std::string latest = slurp(dir / "latest");
  while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
  const json state = json::parse(slurp(dir / latest / "state.json"));
  const json& plist = state.at("params");
  if (plist.empty()) throw std::invalid_argument(dir.string() + ": the checkpoint holds no parameters");
  const auto last = plist.back().at("shape").get<std::vector<std::size_t>>();
  const std::size_t classes = last.empty() ? 0 : last.back();
  FastRng rng(0);
  const Activation act = parse_activation(o.value("activation", std::string("relu")));
  std::unique_ptr<ModelT<float>> model;
  if (name.rfind("onnx:", 0) == 0) {
    throw std::invalid_argument(dir.string() + ": a run of an ONNX model: predict with the file it exported "
                                "(dpgrad-train --export-onnx)");
  } else if (name == "scatter-linear" || name == "scatter-cnn") {
    throw std::invalid_argument(dir.string() + ": " + name + " reads scattering features (and perhaps a private "
                                "centre): dpgrad-predict does not rebuild it");
  } else if (name == "mlp" || name == "logreg") {
    std::size_t in = 1;
    for (std::size_t i = 1; i < input.size(); ++i) in *= input[i];
    model = name == "logreg" ? make_mlp<float>({in, classes}, act, rng)
                             : make_mlp<float>({in, o.value("hidden", std::size_t(256)), classes}, act, rng);
  } else if (name == "transformer") {
    TransformerOptions to;
    to.length = input.size() == 2 ? input[1] : 0;
    to.vocab = o.value("vocabulary", std::size_t(8185));
    to.classes = classes;
    to.train_embedding = !o.value("frozen-embedding", false);
    model = make_transformer<float>(rng, to);
  } else if (name == "bilstm598k") {
    model = make_bilstm598k<float>(rng, classes);
  } else if (name == "bigru") {
    model = make_bigru<float>(rng, 8185, 64, 64, classes);
  } else {
    model = make_model<float>(name, rng, act);
  }
  auto ps = model->parameters();
  if (ps.size() != plist.size())
    throw std::invalid_argument(fmt::format("{}: the checkpoint holds {} parameters, model {} has {}", dir.string(),
                                            plist.size(), name, ps.size()));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const std::string pname = plist[i].at("name").get<std::string>();
    if (pname != ps[i].name())
      throw std::invalid_argument(dir.string() + ": parameter " + std::to_string(i) + " is '" + pname + "', the model's is '" +
                                  ps[i].name() + "'");
    const std::string file = plist[i].at("file").get<std::string>();
    if (file.find("..") != std::string::npos || fs::path(file).is_absolute())
      throw std::invalid_argument(dir.string() + ": parameter file '" + file + "' is outside the checkpoint");
    ArrayT<float> v = read_npy<float>(slurp(dir / latest / file), file);
    if (shape_of(v) != ps[i].shape())
      throw std::invalid_argument(dir.string() + ": parameter '" + pname + "' has shape " + shape_str(shape_of(v)) +
                                  ", the model's is " + shape_str(ps[i].shape()));
    ps[i].mutable_value() = std::move(v);
  }
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, input, output;
  std::size_t batch_size = 256;
  CLI::App app{"dpgrad-predict: a trained model's outputs for the examples of an npy file"};
  name_cli_errors(app, "dpgrad-predict");
  app.add_option("--model", model_path, "an ONNX file (PATH.onnx or onnx:PATH) or a dpgrad-train checkpoint directory")
      ->required();
  app.add_option("--input", input, "X.npy: float32 inputs (B, ...) or int64 token ids (B, L)")->required();
  app.add_option("--output", output, "Y.npy: float32 outputs (B, ...)")->required();
  app.add_option("--batch-size", batch_size, "examples per forward pass")->check(whole_number())->capture_default_str();
  if (auto code = parse_arguments(app, argc, argv)) return *code;
  try {
    if (batch_size == 0) throw std::invalid_argument("--batch-size must be >= 1");
    const std::string bytes = slurp(input);
    const bool tokens = bytes.find("'<i8'") != std::string::npos && bytes.find("'<i8'") < 128;
    ArrayT<float> x;
    ArrayT<std::int64_t> ids;
    if (tokens) ids = read_npy<std::int64_t>(bytes, input);
    else x = read_npy<float>(bytes, input);
    const Shape shape = tokens ? shape_of(ids) : shape_of(x);
    if (shape.empty() || shape[0] == 0) throw std::invalid_argument(input + ": holds no examples (a batch axis of 0)");
    const std::string path = model_path.rfind("onnx:", 0) == 0 ? model_path.substr(5) : model_path;
    std::unique_ptr<ModelT<float>> model;
    if (fs::is_directory(path)) {
      model = from_checkpoint(path, shape);
    } else {
#if DPGRAD_HAVE_ONNX
      auto m = onnx::load<float>(path);
      if (m->input().tokens != tokens)
        throw std::invalid_argument(input + ": the model reads " +
                                    (m->input().tokens ? std::string("int64 token ids") : std::string("float32 inputs")));
      model = std::move(m);
#else
      throw std::invalid_argument(path + ": this dpgrad was built without ONNX (-Donnx)");
#endif
    }
    model->set_training(false);
    NoRecordScope<float> none;
    ArrayT<float> out;
    const std::size_t n = shape[0];
    for (std::size_t b0 = 0; b0 < n; b0 += batch_size) {
      const std::size_t b1 = std::min(n, b0 + batch_size);
      BatchT<float> batch;
      if (tokens) {
        batch.tokens = ArrayT<std::int32_t>(xt::cast<std::int32_t>(xt::view(ids, xt::range(b0, b1))));
        batch.lengths.assign(b1 - b0, std::int32_t(shape.size() > 1 ? shape[1] : 0));
      } else {
        batch.inputs = xt::view(x, xt::range(b0, b1));
      }
      const ArrayT<float> y = model->forward(batch).value();
      if (b0 == 0) {
        Shape s = shape_of(y);
        s[0] = n;
        out = ArrayT<float>::from_shape(s);
      }
      std::copy(y.begin(), y.end(), out.begin() + std::ptrdiff_t(b0 * (y.size() / (b1 - b0))));
    }
    const std::string tmp = output + ".tmp";
    xt::dump_npy(tmp, out);
    if (std::rename(tmp.c_str(), output.c_str()) != 0) throw std::runtime_error("cannot write " + output);
    fmt::print("dpgrad-predict: {} outputs {} of {} written to {}\n", n, shape_str(shape_of(out)), model->name(), output);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dpgrad-predict: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
