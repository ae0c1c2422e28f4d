// Running the bundled programs from tests: through the shell (for redirections),
// or with an argument vector and no shell at all (for hostile file names), with
// standard output and error captured together.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

namespace dpgrad::test {

struct Run {
  int status;       // exit status, -1 when killed by a signal
  std::string out;  // stdout and stderr together
};

/// `cmd` run by the shell, its standard error joined to standard output (unless cmd redirects them).
inline Run run_shell(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

/// argv[0] run with these arguments, no shell, in folder `cwd` (empty: this one).
inline Run run_argv(const std::vector<std::string>& argv, const std::string& cwd = "") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  REQUIRE(rc == 0);
  std::string out;
  std::array<char, 4096> buf;
  for (ssize_t n; (n = ::read(fds[0], buf.data(), buf.size())) > 0;) out.append(buf.data(), std::size_t(n));
  ::close(fds[0]);
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

/// The last line of `out` that parses as a JSON object (null when none does).
inline nlohmann::json last_json(const std::string& out) {
  std::istringstream in(out);
  std::string line;
  nlohmann::json j;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    nlohmann::json parsed = nlohmann::json::parse(line, nullptr, false);
    if (!parsed.is_discarded()) j = std::move(parsed);
  }
  return j;
}

}  // namespace dpgrad::test
