// The library example examples/library/checkpointed_training.cpp, killed with
// SIGKILL at random moments and started again until it finishes, ends where an
// uninterrupted run ends: the same final parameters (noise reproducible by name)
// and the same ledger. And no epoch was ever shown before the checkpoint that
// covers it was saved: every step a hook printed is at most the latest
// checkpoint's step at the moment of the kill.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;

const std::string example = DPGRAD_CHECKPOINTED_TRAINING;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Starts the example on `dir` with reproducible noise, its output appended to `out`.
pid_t start(const fs::path& dir, const fs::path& out) {
  std::vector<std::string> args{example, dir.string(), "reproducible"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, example.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return pid;
}

/// The step of the checkpoint `latest` names (-1: none).
long latest_step(const fs::path& dir) {
  const std::string s = slurp(dir / "latest");
  if (s.rfind("step-", 0) != 0) return -1;
  return std::stol(s.substr(5));
}

/// The largest step the example printed ("epoch E step S: ...").
long largest_shown(const fs::path& out) {
  std::istringstream in(slurp(out));
  long largest = -1;
  for (std::string line; std::getline(in, line);) {
    const std::size_t at = line.find(" step ");
    if (line.rfind("epoch ", 0) == 0 && at != std::string::npos) largest = std::max(largest, std::stol(line.substr(at + 6)));
  }
  return largest;
}

/// The final checkpoint's parameters (file name -> bytes) and ledger.
std::pair<std::map<std::string, std::string>, nlohmann::json> final_state(const fs::path& dir) {
  std::string name = slurp(dir / "latest");
  name.erase(name.find_last_not_of('\n') + 1);
  std::map<std::string, std::string> params;
  for (const auto& e : fs::directory_iterator(dir / name / "params")) params[e.path().filename()] = slurp(e.path());
  const nlohmann::json state = nlohmann::json::parse(slurp(dir / name / "state.json"));
  return {params, state.at("accountant").at("ledger")};
}

int wait_for(pid_t pid) {
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  return st;
}

}  // namespace

TEST_CASE("library example: killed 20 times at random moments, it resumes to an uninterrupted run's end") {
  dpgrad::test::TempDir tmp("dpgrad-library-resume");
  // the uninterrupted run, and how long it takes
  const auto t0 = std::chrono::steady_clock::now();
  const int whole = wait_for(start(tmp.path / "whole", tmp.path / "whole.out"));
  REQUIRE(WIFEXITED(whole));
  REQUIRE(WEXITSTATUS(whole) == 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto want = final_state(tmp.path / "whole");
  REQUIRE(slurp(tmp.path / "whole.out").find("complete") != std::string::npos);

  const fs::path dir = tmp.path / "killed", out = tmp.path / "killed.out";
  std::mt19937_64 random(20261126);
  std::uniform_real_distribution<double> moment(0.0, 1.0);
  int kills = 0, runs = 0;
  for (;;) {
    ++runs;
    REQUIRE(runs < 200);
    const pid_t pid = start(dir, out);
    // a random moment within an uninterrupted run's length: loading, training, saving or printing
    std::this_thread::sleep_for(std::chrono::duration<double>(moment(random) * seconds * (kills < 20 ? 0.6 : 2.0)));
    if (kills < 20 && kill(pid, SIGKILL) == 0) {
      const int st = wait_for(pid);
      if (WIFSIGNALED(st)) {
        ++kills;
        // everything shown so far is covered by a saved checkpoint
        CHECK(largest_shown(out) <= latest_step(dir));
        continue;
      }
      REQUIRE(WIFEXITED(st));
      REQUIRE(WEXITSTATUS(st) == 0);
      // it finished before this kill (a fast machine, or little left to do): that run must
      // end where the uninterrupted one did, and a fresh run takes the kills still wanted
      CHECK(final_state(dir) == want);
      fs::remove_all(dir);
      fs::remove(out);
      continue;
    }
    const int st = wait_for(pid);
    REQUIRE(WIFEXITED(st));
    REQUIRE(WEXITSTATUS(st) == 0);
    break;
  }
  CHECK(kills >= 20);
  INFO("runs " << runs << ", kills " << kills);
  const auto got = final_state(dir);
  CHECK(got.second == want.second);
  CHECK(got.first.size() == want.first.size());
  for (const auto& [file, bytes] : want.first) {
    CAPTURE(file);
    CHECK(got.first.count(file) == 1);
    const bool same = got.first.count(file) && got.first.at(file) == bytes;
    CHECK(same);
  }
}
