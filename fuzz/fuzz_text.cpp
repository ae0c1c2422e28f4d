// libFuzzer harness: the tokenizer, vocabulary files and document encoding on any bytes.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "data/text_folder.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  dpgrad::data::tokenize(text);
  dpgrad::data::record_id(text);
  static const std::string path = "/tmp/dpgrad-fuzz-text-" + std::to_string(::getpid());
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    const auto vocab = dpgrad::data::Vocabulary::from_token_file(path, 100);
    dpgrad::data::encode_doc(text, vocab, 20);
  } catch (const dpgrad::data::DataError&) {
  }
  try {
    dpgrad::data::Vocabulary::load(path);
  } catch (const dpgrad::data::DataError&) {
  }
  return 0;
}
