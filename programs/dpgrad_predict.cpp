// dpgrad-predict: a trained model's outputs (logits) for the examples of an
// npy file, in an npy file. The model is an ONNX file (dpgrad-train
// --export-onnx, or any export dpgrad reads: docs/onnx.md) or a dpgrad-train
// checkpoint directory of a built-in model. Inference only: no privacy is spent.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <xtensor/xnpy.hpp>

#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "engine/check.hpp"
#include "layers/models.hpp"
#include "layers/registry.hpp"
#include "optim/checkpoint/checkpoint.hpp"
#include "optim/checkpoint/checkpoint_key.hpp"
#include "optim/checkpoint/npy.hpp"
#include "programs/cli.hpp"
#if DPGRAD_HAVE_ONNX
#include "onnx/onnx.hpp"
#endif

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace dpgrad;

namespace {

/// An input file's bytes: a regular file of at most 16 GiB (never a device or FIFO that never ends).
std::string slurp(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) throw std::invalid_argument(p.string() + " is not a regular file");
  if (fs::file_size(p, ec) > (std::uintmax_t(1) << 34)) throw std::invalid_argument(p.string() + " is over 16 GiB");
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::invalid_argument("cannot read " + p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// A model of dpgrad-train's, rebuilt from a checkpoint: its options say which
/// model and how it was built, the checkpoint's parameters (verified with the
/// run's key against its MAC and manifest) give the weights.
std::unique_ptr<ModelT<float>> from_checkpoint(const fs::path& dir, const Shape& input) {
  const CheckpointDir cd(dir);
  const auto key = RunKey::peek(cd.run_id());  // the run's key, read and not locked: the run may go on
  const json extra = cd.read_extra(*key);
  const auto recorded = [&](const char* what) {
    return extra.contains("options") && extra["options"].is_object() && extra["options"].contains(what);
  };
  require(recorded("model") && extra.contains("classes") && extra["classes"].is_number_unsigned(),
          dir.string() + ": not a dpgrad-train checkpoint (its run's options and classes are not recorded)");
  const json& o = extra["options"];
  const std::string name = o["model"].get<std::string>();
  require(name.rfind("onnx:", 0) != 0, dir.string() + ": a run of an ONNX model: predict with the file it exported "
                                                      "(dpgrad-train --export-onnx)");
  const ModelEntry& entry = find_model(name);
  require(entry.input != ModelInput::scattering, dir.string() + ": " + name + " reads scattering features (and "
                                                 "perhaps a private centre): dpgrad-predict does not rebuild it");
  require(input.size() >= 2, "the input needs a batch axis and at least one more");
  ModelSpec spec;
  spec.classes = extra["classes"].get<std::size_t>();
  spec.features = 1;
  for (std::size_t i = 1; i < input.size(); ++i) spec.features *= input[i];
  spec.length = entry.input == ModelInput::tokens ? input[1] : 0;
  if (recorded("vocabulary")) spec.vocabulary = o["vocabulary"].get<std::size_t>();
  if (recorded("activation")) spec.activation = parse_activation(o["activation"].get<std::string>());
  if (recorded("hidden")) spec.hidden = o["hidden"].get<std::size_t>();
  if (recorded("frozen-embedding")) spec.train_embedding = !o["frozen-embedding"].get<bool>();
  // the run's initial values: a frozen table is not in the checkpoint, it is drawn again from the run's seed
  FastRng init(recorded("seed") ? o["seed"].get<std::uint64_t>() : 0);
  auto model = build_model<float>(name, spec, init);
  TrainingStateT<float> state;
  state.params = model->parameters();
  cd.load(state, *key);
  return model;
}

/// Token ids as the model reads them (int32): an id outside [0, 2^31 - 1] is
/// refused as it is, never wrapped to another id by the narrowing.
ArrayT<std::int64_t> checked_token_ids(ArrayT<std::int64_t> ids, const std::string& input) {
  const std::size_t length = ids.dimension() > 1 ? ids.shape()[1] : 1;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::int64_t id = ids.data()[k];
    if (id < 0 || id > std::numeric_limits<std::int32_t>::max())
      throw std::invalid_argument(input + ": token id " + std::to_string(id) + " (example " +
                                  std::to_string(k / std::max<std::size_t>(1, length)) + ", position " +
                                  std::to_string(k % std::max<std::size_t>(1, length)) +
                                  ") is not a token id: ids are whole numbers from 0 to 2147483647");
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  use_best_blas_core("dpgrad-predict", argc, argv);
  if (const auto closed = guard_standard_output("dpgrad-predict")) return *closed;
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
    require_output_file(output, "--output");  // before any work
    const std::string bytes = slurp(input);
    const bool tokens = npy_dtype(bytes, input) == "<i8";  // the header's dtype, never bytes of the data
    ArrayT<float> x;
    ArrayT<std::int64_t> ids;
    if (tokens) ids = checked_token_ids(read_npy<std::int64_t>(bytes, input), input);
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
    write_output_file(output, xt::dump_npy(out), "--output");
    fmt::print("dpgrad-predict: {} outputs {} of {} written to {}\n", n, shape_str(shape_of(out)), model->name(), output);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dpgrad-predict: error: {}\n", e.what());
    return 2;  // as every program: bad input, a bad file, an unwritable output
  }
  return 0;
}
