// libFuzzer harness: the ONNX writer's round trip (onnx/save.cpp). Any bytes
// the loader accepts are written back by onnx::save through the checked output
// path (engine/files.hpp) and loaded again: the second model must hold the same
// parameters, bit for bit, and give the same outputs on a batch of two examples
// (or refuse it alike), and writing it again must give the same bytes. save
// may refuse a model only with an OnnxError (ONNX's checker is stricter than
// the loader on some graphs); a write that fails, a reload that fails, or any
// difference is a bug. Seeds: fuzz/corpus/onnx_roundtrip, small fixtures.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "engine/tape.hpp"
#include "fuzz/onnx_input.hpp"
#include "onnx/onnx.hpp"

using namespace dpgrad;

namespace {

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "fuzz_onnx_roundtrip: %s\n", what.c_str());
  std::abort();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

/// The model's outputs on two examples of ones, as bytes; "refused: WHY" when the forward pass refuses them.
std::string outputs(onnx::OnnxModelT<float>& model) {
  const onnx::InputSpec& in = model.input();
  Shape s{2};
  s.insert(s.end(), in.sample_shape.begin(), in.sample_shape.end());
  if (numel(s) > (std::size_t(1) << 16)) return "too large";
  BatchT<float> batch;
  if (in.tokens) {
    batch.tokens = xt::ones<std::int32_t>(s);
    batch.lengths.assign(2, std::int32_t(s[1]));
  } else {
    batch.inputs = xt::ones<float>(s);
  }
  model.set_training(false);
  try {
    NoRecordScope<float> none;
    const ArrayT<float> y = model.forward(batch).value();
    return std::string(reinterpret_cast<const char*>(y.data()), y.size() * sizeof(float)) + shape_str(shape_of(y));
  } catch (const std::invalid_argument& e) {
    return std::string("refused: ") + e.what();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string dir = [] {
    const std::string d = "/tmp/dpgrad-fuzz-onnx-roundtrip-" + std::to_string(::getpid());
    ::mkdir(d.c_str(), 0700);
    return d;
  }();
  const std::string in = dir + "/in.onnx", once = dir + "/once.onnx", twice = dir + "/twice.onnx";
  const std::unique_ptr<onnx::OnnxModelT<float>> first = fuzz::load_fuzzed(in, data, size);
  if (!first) return 0;
  try {
    onnx::save(*first, once);
  } catch (const onnx::OnnxError&) {
    return 0;  // the checker refused the graph: said so, nothing written
  } catch (const std::exception& e) {
    bug(std::string("save failed: ") + e.what());
  }
  std::unique_ptr<onnx::OnnxModelT<float>> second;
  try {
    second = onnx::load<float>(once, fuzz::load_options());
  } catch (const std::exception& e) {
    bug(std::string("the written model does not load: ") + e.what());
  }
  const auto v1 = first->all_values(), v2 = second->all_values();
  if (v1.size() != v2.size()) bug("another number of parameters after the round trip");
  for (std::size_t k = 0; k < v1.size(); ++k)
    if (shape_of(v1[k]) != shape_of(v2[k]) ||
        std::memcmp(v1[k].data(), v2[k].data(), v1[k].size() * sizeof(float)) != 0)
      bug("parameter " + std::to_string(k) + " changed in the round trip");
  if (outputs(*first) != outputs(*second)) bug("the outputs changed in the round trip");
  try {
    onnx::save(*second, twice);
  } catch (const std::exception& e) {
    bug(std::string("the written model cannot be written again: ") + e.what());
  }
  if (slurp(once) != slurp(twice)) bug("writing the written model again gives other bytes");
  return 0;
}
