// A key store for checkpoint keys (optim/checkpoint/checkpoint_key.hpp) private to one
// test process: a fresh folder of mode 0700 named by DPGRAD_KEY_STORE while the
// object lives, removed with its keys afterwards.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace dpgrad::test {

struct KeyStoreForTests {
  std::filesystem::path path;
  KeyStoreForTests() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dpgrad-keys-XXXXXX").string();
    if (mkdtemp(tmpl.data())) {  // mkdtemp makes it 0700
      path = tmpl;
      setenv("DPGRAD_KEY_STORE", tmpl.c_str(), 1);
    }
  }
  ~KeyStoreForTests() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  KeyStoreForTests(const KeyStoreForTests&) = delete;
  KeyStoreForTests& operator=(const KeyStoreForTests&) = delete;
};

}  // namespace dpgrad::test
