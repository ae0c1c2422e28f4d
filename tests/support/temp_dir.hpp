// A fresh temporary folder for tests that write files, removed with its contents
// at scope exit; and what a function writes to standard error.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <filesystem>
#include <string>
#include <system_error>

#include <doctest/doctest.h>

namespace dpgrad::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "dpgrad") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

/// What `f` writes to standard error (file descriptor 2), through a temporary file.
template <class F>
std::string captured_stderr(F&& f) {
  TempDir dir;
  const std::string path = (dir.path / "err").string();
  std::fflush(stderr);
  const int saved = dup(2);
  FILE* file = std::fopen(path.c_str(), "w");
  REQUIRE(file != nullptr);
  dup2(fileno(file), 2);
  f();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::fclose(file);
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace dpgrad::test
