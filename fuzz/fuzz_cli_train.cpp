// libFuzzer harness: dpgrad-train's option parsing, the input split on NUL bytes into argv.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "examples/train/options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args{"dpgrad-train"};
  std::string cur;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(char(data[i]));
    }
  }
  if (!cur.empty()) args.push_back(cur);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  // help and errors print and return an exit code; nothing may crash or exit
  auto parsed = dpgrad::train::parse_train_options(int(argv.size()), argv.data());
  (void)parsed;
  return 0;
}
