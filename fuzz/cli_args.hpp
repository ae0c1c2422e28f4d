// The fuzzers of the programs' options: the input split on NUL bytes into argv.
// Every NUL ends a word, so "--momentum\0\0" gives "--momentum" and an empty
// value; after a parse that went on (no error, no --help), no option that holds
// numbers may have taken an empty value (programs/cli.hpp, apply_number_rules).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "programs/cli.hpp"

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

  /// Stops the fuzzer (a finding) when a numeric option was given an empty
  /// value, "--flag ''" or "--flag=", and the parse accepted it.
  void require_no_empty_number() const {
    const auto& numeric = numeric_options_seen();
    auto is_numeric = [&](const std::string& name) {
      return !name.empty() && std::find(numeric.begin(), numeric.end(), name) != numeric.end();
    };
    for (std::size_t i = 1; i < words.size(); ++i) {
      const std::string& w = words[i];
      const bool empty_next = i + 1 < words.size() && words[i + 1].empty() && is_numeric(w);
      const bool empty_after_equals = !w.empty() && w.back() == '=' && is_numeric(w.substr(0, w.size() - 1));
      if (empty_next || empty_after_equals) std::abort();
    }
  }
};

}  // namespace dpgrad::fuzz
