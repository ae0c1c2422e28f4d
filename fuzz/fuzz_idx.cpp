// libFuzzer harness: the IDX reader (images and labels, plain or gzipped) on any bytes.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/dpgrad-fuzz-idx-" + std::to_string(::getpid());
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    dpgrad::data::read_idx_images(path);
  } catch (const dpgrad::data::DataError&) {
  }
  try {
    dpgrad::data::read_idx_labels(path);
  } catch (const dpgrad::data::DataError&) {
  }
  return 0;
}
