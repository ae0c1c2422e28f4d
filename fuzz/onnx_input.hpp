// What the ONNX harnesses share: the fuzzer's bytes written to a file and
// loaded with small limits (a small model's worth, so that each run is quick).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "onnx/onnx.hpp"

namespace dpgrad::fuzz {

/// The loader's limits for fuzzed models: a small model's worth, so that each run is quick.
inline onnx::LoadOptions load_options() {
  onnx::LoadOptions o;
  o.max_tensor_elements = std::size_t(1) << 16;
  o.max_file_bytes = std::size_t(1) << 22;
  return o;
}

/// The model in data[0, size), written to `path` and loaded (load_options()); null when the loader refuses it.
inline std::unique_ptr<onnx::OnnxModelT<float>> load_fuzzed(const std::string& path, const std::uint8_t* data,
                                                            std::size_t size) {
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    return onnx::load<float>(path, load_options());
  } catch (const onnx::OnnxError&) {
    return nullptr;
  }
}

}  // namespace dpgrad::fuzz
