// libFuzzer harness: the ONNX loader (onnx/read.cpp, onnx/compile*.cpp) on any
// bytes, then, for a file it accepts, one forward pass on a batch of two
// examples of the shape the model declares. Loading must end in an OnnxError
// or a model; the forward pass in a model output or a std::invalid_argument
// naming what is wrong. Anything else (a crash, another exception, a hang, an
// allocation beyond the bounds) is a bug. The seeds (fuzz/corpus/onnx) are
// small exports of the fixtures' kinds.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/tape.hpp"
#include "fuzz/onnx_input.hpp"
#include "onnx/onnx.hpp"

using namespace dpgrad;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/dpgrad-fuzz-onnx-" + std::to_string(::getpid()) + ".onnx";
  const std::unique_ptr<onnx::OnnxModelT<float>> model = fuzz::load_fuzzed(path, data, size);
  if (!model) return 0;
  const onnx::InputSpec& in = model->input();
  BatchT<float> batch;
  Shape s{2};
  s.insert(s.end(), in.sample_shape.begin(), in.sample_shape.end());
  if (numel(s) > (std::size_t(1) << 16)) return 0;
  if (in.tokens) {
    batch.tokens = xt::ones<std::int32_t>(s);
    batch.lengths.assign(2, std::int32_t(s[1]));
  } else {
    batch.inputs = xt::ones<float>(s);
  }
  try {
    NoRecordScope<float> none;
    model->forward(batch);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
