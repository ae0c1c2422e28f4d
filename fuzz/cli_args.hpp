// The fuzzers of the programs' options: the input split on NUL bytes into argv.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dpgrad::fuzz {

struct Argv {
  std::vector<std::string> words;
  std::vector<const char*> pointers;
  Argv(const char* program, const std::uint8_t* data, std::size_t size) : words{program} {
    std::string cur;
    for (std::size_t i = 0; i < size; ++i) {
      if (data[i] == 0) {
        words.push_back(cur);
        cur.clear();
      } else {
        cur.push_back(char(data[i]));
      }
    }
    if (!cur.empty()) words.push_back(cur);
    for (const auto& w : words) pointers.push_back(w.c_str());
  }
  int argc() const { return int(pointers.size()); }
  const char* const* argv() const { return pointers.data(); }
};

}  // namespace dpgrad::fuzz
