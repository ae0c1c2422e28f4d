// dpgrad-train killed mid-run (SIGKILL, no chance to clean up) and resumed
// with --resume ends exactly where an uninterrupted run ends: same epsilon, same
// accuracy, bit-identical parameters (also with ONNX Dropout, whose masks are
// keyed per record). Contradicting flags and reused directories are refused.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "engine/config.hpp"
#include "engine/random.hpp"
#include "optim/checkpoint/checkpoint.hpp"
#include "support/temp_dir.hpp"
#if DPGRAD_HAVE_ONNX
#include "support/onnx_graph.hpp"
#endif

namespace {

namespace fs = std::filesystem;
using dpgrad::test::TempDir;

const std::string train = DPGRAD_TRAIN;

// A small private run: cnn26k on synthetic images, 32 steps in 2 epochs. Its
// noise is reproducible (asked for by name) so that runs can be compared bit for
// bit, unless `secure`.
std::vector<std::string> run_args(const std::string& dir, long every, bool secure = false,
                                  const std::string& model = "cnn26k") {
  std::vector<std::string> a{"--dataset", "synthetic", "--model", model, "--train-limit", "1024",
                             "--test-limit", "128", "--optimizer", "dp-momentum", "--lr", "0.05", "--batch-size", "64",
                             "--epochs", "2", "--noise-multiplier", "1.1", "--clip-strategy", "ghost", "--seed", "7",
                             "--threads", "1", "--json", "--report-train-loss", "--checkpoint-dir", dir,
                             "--checkpoint-every", std::to_string(every)};
  if (!secure) a.push_back("--reproducible-noise");
  return a;
}

pid_t spawn(std::vector<std::string> args, const std::string& out_path) {
  args.insert(args.begin(), train);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, train.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return pid;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Runs to completion; returns the exit status and the final JSON line.
std::pair<int, nlohmann::json> run_to_end(const std::vector<std::string>& args, const std::string& out) {
  pid_t pid = spawn(args, out);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  nlohmann::json last;
  std::istringstream in(slurp(out));
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') last = nlohmann::json::parse(line);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, last};
}

long latest_step(const fs::path& dir) {
  std::string s = slurp(dir / "latest");
  if (s.rfind("step-", 0) != 0) return -1;
  return std::stol(s.substr(5));
}

/// Starts a run, SIGKILLs it once its latest checkpoint is at `after` steps or
/// more (plus `extra` of sleep), and checks that it really died of the signal.
void kill_midway(const std::vector<std::string>& args, const fs::path& dir, long after, int extra_ms,
                 const std::string& out) {
  pid_t pid = spawn(args, out);
  auto start = std::chrono::steady_clock::now();
  while (!(fs::exists(dir / "latest") && latest_step(dir) >= after)) {
    int st = 0;
    REQUIRE_MESSAGE(waitpid(pid, &st, WNOHANG) == 0, "the run ended before it could be killed");
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::minutes(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(extra_ms));
  REQUIRE(kill(pid, SIGKILL) == 0);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  REQUIRE_MESSAGE(WIFSIGNALED(st), "the run finished before SIGKILL arrived");
}

/// The bytes of every parameter file of the latest checkpoint, by file name.
std::map<std::string, std::string> final_params(const fs::path& dir) {
  std::string name = slurp(dir / "latest");
  name.erase(name.find_last_not_of("\n") + 1);
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir / name / "params")) out[e.path().filename()] = slurp(e.path());
  return out;
}

/// Runs the small run whole, and killed after 8 steps then resumed from the
/// directory alone; both must end the same, bit for bit. `more`: further flags.
void check_kill_and_resume(const std::vector<std::string>& more, const std::string& model = "cnn26k") {
  auto args = [&](const fs::path& dir) {
    auto a = run_args(dir, 4, false, model);
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  TempDir tmp("dpgrad-resume");
  const fs::path full = tmp.path / "full", cut = tmp.path / "cut";
  auto [rc_full, end_full] = run_to_end(args(full), tmp / "full.out");
  REQUIRE(rc_full == 0);
  REQUIRE(end_full["final"] == true);
  REQUIRE(end_full["steps"] == 32);
  REQUIRE(end_full["epsilon"].is_number());

  kill_midway(args(cut), cut, 8, 0, tmp / "cut.out");
  const long at_kill = latest_step(cut);
  CHECK(at_kill >= 8);
  CHECK(at_kill < 32);

  // Resume with only the directory: the run's settings come from the checkpoint.
  auto [rc, end] = run_to_end({"--checkpoint-dir", cut.string(), "--resume", "--json", "--threads", "1"},
                              tmp / "resumed.out");
  REQUIRE(rc == 0);
  CHECK(end["steps"] == 32);
  // The same ledger continued, never restarted: exactly the same epsilon.
  CHECK(end["epsilon"].get<double>() == end_full["epsilon"].get<double>());
  CHECK(end["test_accuracy"].get<double>() == end_full["test_accuracy"].get<double>());
  CHECK(end["train_loss_not_covered_by_epsilon"].get<double>() ==
        end_full["train_loss_not_covered_by_epsilon"].get<double>());
  auto a = final_params(full), b = final_params(cut);
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  for (const auto& [name, bytes] : a) CHECK_MESSAGE(b[name] == bytes, name);
  // The checkpoints hold .npy files numpy can read: magic string and a float32 header.
  CHECK(a.begin()->second.compare(0, 6, "\x93NUMPY") == 0);
  CHECK(a.begin()->second.find("'descr': '<f4'") != std::string::npos);
}
}  // namespace

TEST_CASE("dpgrad-train: a run killed with SIGKILL and resumed ends as an uninterrupted run does") {
  check_kill_and_resume({});
}

TEST_CASE("dpgrad-train: the same with DP-SAT, whose direction (the last noised gradient) the checkpoint keeps") {
  check_kill_and_resume({"--sat-rho", "0.05"});
}

#if DPGRAD_HAVE_ONNX
TEST_CASE("dpgrad-train: the same with an ONNX model's Dropout, whose masks are keyed per record and step") {
  // images (B, 1, 28, 28) -> Flatten -> Gemm (256) -> Relu -> Dropout(0.3) -> Gemm -> logits (B, 10). A resumed
  // process starts its dropout afresh: only masks keyed by the run's key, the record and the step come out the same.
  TempDir tmp("dpgrad-resume-onnx");
  dpgrad::FastRng rng(1);
  dpgrad::test::OnnxGraph g;
  g.input("images", {dpgrad::test::OnnxGraph::kBatch, 1, 28, 28});
  g.output("logits", {dpgrad::test::OnnxGraph::kBatch, 10});
  auto weights = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = float(0.03 * rng.normal());
    return v;
  };
  g.node("Flatten", {"images"}, {"flat"}, "/Flatten");
  g.init("fc1.weight", {256, 28 * 28}, weights(256 * 28 * 28));
  g.init("fc1.bias", {256}, weights(256));
  dpgrad::test::OnnxGraph::attr(g.node("Gemm", {"flat", "fc1.weight", "fc1.bias"}, {"h"}, "/fc1/Gemm"), "transB",
                                std::int64_t(1));
  g.node("Relu", {"h"}, {"r"}, "/Relu");
  g.constant_float("ratio", 0.3f);
  g.node("Dropout", {"r", "ratio"}, {"dropped"}, "/Dropout");
  g.init("fc2.weight", {10, 256}, weights(10 * 256));
  g.init("fc2.bias", {10}, weights(10));
  dpgrad::test::OnnxGraph::attr(g.node("Gemm", {"dropped", "fc2.weight", "fc2.bias"}, {"logits"}, "/fc2/Gemm"),
                                "transB", std::int64_t(1));
  g.save((tmp.path / "dropout.onnx").string());
  check_kill_and_resume({}, "onnx:" + (tmp.path / "dropout.onnx").string());
}
#endif

TEST_CASE("dpgrad-train: killed at arbitrary moments while checkpointing every step, it always resumes") {
  TempDir tmp("dpgrad-resume");
  const fs::path dir = tmp.path / "run";
  nlohmann::json end_full;
  {
    auto [rc, end] = run_to_end(run_args((tmp.path / "full").string(), 1), tmp / "full.out");
    REQUIRE(rc == 0);
    end_full = end;
  }
  // Kill, resume (and kill the resumed run), at different offsets into a save.
  long after = 3;
  for (int extra_ms : {0, 1, 3}) {
    std::vector<std::string> args = run_args(dir.string(), 1);
    if (fs::exists(dir / "latest")) args.push_back("--resume");
    kill_midway(args, dir, after, extra_ms, tmp / "cut.out");
    after = latest_step(dir) + 3;
    if (after >= 28) break;
  }
  auto [rc, end] = run_to_end({"--checkpoint-dir", dir.string(), "--resume", "--json"}, tmp / "resumed.out");
  REQUIRE(rc == 0);
  CHECK(end["steps"] == 32);
  CHECK(end["epsilon"].get<double>() == end_full["epsilon"].get<double>());
  CHECK(end["test_accuracy"].get<double>() == end_full["test_accuracy"].get<double>());
  // Nothing half-written is left behind once a save completes.
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename().string().rfind(".partial-", 0) != 0);
}

TEST_CASE("dpgrad-train: secure noise resumes, and nothing is released before the checkpoint that covers it") {
  // A resumed run re-draws the steps after its checkpoint with fresh noise, so each epoch's row (accuracy,
  // epsilon) is printed only once a checkpoint holds that epoch: the re-drawn steps were never shown.
  TempDir tmp("dpgrad-resume");
  const fs::path dir = tmp.path / "run", out = tmp.path / "run.out";
  pid_t pid = spawn(run_args(dir.string(), 0, true), out.string());
  auto start = std::chrono::steady_clock::now();
  long row_steps = -1;
  while (row_steps < 0) {
    std::istringstream in(slurp(out));
    for (std::string line; std::getline(in, line);)
      if (line.rfind("{", 0) == 0 && line.find("\"epoch\":1,") != std::string::npos) {
        REQUIRE(kill(pid, SIGSTOP) == 0);  // freeze it the moment the row is visible
        row_steps = nlohmann::json::parse(line).at("steps").get<long>();
      }
    if (row_steps >= 0) break;
    int st = 0;
    REQUIRE_MESSAGE(waitpid(pid, &st, WNOHANG) == 0, "the run ended before its first epoch was seen");
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::minutes(5));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  CHECK(row_steps == 16);
  REQUIRE(fs::exists(dir / "latest"));
  CHECK(latest_step(dir) >= row_steps);
  REQUIRE(kill(pid, SIGKILL) == 0);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  // the checkpoint says the run is private (secure generator), and resuming it re-keys and ends the run
  auto [rc, end] = run_to_end({"--checkpoint-dir", dir.string(), "--resume", "--json", "--threads", "1"},
                              (tmp.path / "resumed.out").string());
  REQUIRE(rc == 0);
  CHECK(end["steps"] == 32);
  CHECK(end["private"] == true);
  CHECK(end["noise_generator"].get<std::string>().find("secure") != std::string::npos);
  // the ledger continued: the epsilon of 32 steps, as a whole run of the same settings gives
  auto [rc_full, end_full] = run_to_end(run_args((tmp.path / "full").string(), 0, true), (tmp.path / "full.out").string());
  REQUIRE(rc_full == 0);
  CHECK(end["epsilon"].get<double>() == end_full["epsilon"].get<double>());
}

TEST_CASE("dpgrad-train: checkpoint misuse is refused with a message and status 2") {
  TempDir tmp("dpgrad-resume");
  const fs::path dir = tmp.path / "run";
  auto args = run_args(dir.string(), 0);
  auto [rc, end] = run_to_end(args, tmp / "a.out");
  REQUIRE(rc == 0);
  auto status_and_text = [&](const std::vector<std::string>& a) {
    std::string cmd = train;
    for (const auto& s : a) cmd += " '" + s + "'";
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    std::string text;
    std::array<char, 4096> buf;
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) text.append(buf.data(), n);
    int st = pclose(p);
    return std::make_pair(WIFEXITED(st) ? WEXITSTATUS(st) : -1, text);
  };
  // the same directory without --resume would mix two runs
  auto [c1, t1] = status_and_text(args);
  CHECK(c1 == 2);
  CHECK(t1.find("already holds a checkpoint") != std::string::npos);
  // a flag that contradicts the run
  auto [c2, t2] = status_and_text({"--checkpoint-dir", dir.string(), "--resume", "--lr", "0.5"});
  CHECK(c2 == 2);
  CHECK(t2.find("--lr 0.5 (the run's: ") != std::string::npos);
  CHECK(t2.find("contradicts the checkpointed run") != std::string::npos);
  // --resume without a directory, and an empty directory
  auto [c3, t3] = status_and_text({"--resume"});
  CHECK(c3 == 2);
  CHECK(t3.find("--checkpoint-dir") != std::string::npos);
  auto [c4, t4] = status_and_text({"--resume", "--checkpoint-dir", (tmp.path / "empty").string()});
  CHECK(c4 == 2);
  CHECK(t4.find("no checkpoint") != std::string::npos);
  std::string latest = slurp(dir / "latest");
  latest.erase(latest.find_last_not_of("\n") + 1);
  // a forged ledger, the manifest's hashes recomputed (as anyone can): its MAC no longer matches
  {
    const fs::path root = dir / latest;
    const std::string state = slurp(root / "state.json"), manifest = slurp(root / "manifest.json");
    nlohmann::json st = nlohmann::json::parse(state), m = nlohmann::json::parse(manifest);
    st["accountant"]["ledger"] = nlohmann::json::array();
    const std::string forged = st.dump(1);
    std::ofstream(root / "state.json", std::ios::trunc) << forged;
    m["files"]["state.json"] = {{"bytes", forged.size()}, {"blake2b", dpgrad::checkpoint_file_hash(forged)}};
    std::ofstream(root / "manifest.json", std::ios::trunc) << m.dump(1);
    auto [cf, tf] = status_and_text({"--resume", "--checkpoint-dir", dir.string()});
    CHECK(cf == 2);
    CHECK(tf.find("does not match its MAC") != std::string::npos);
    CHECK(tf.find("epsilon") == std::string::npos);
    std::ofstream(root / "state.json", std::ios::trunc) << state;
    std::ofstream(root / "manifest.json", std::ios::trunc) << manifest;
  }
  // a corrupted parameter file is named
  fs::path pdir = dir / latest / "params";
  fs::path victim = fs::directory_iterator(pdir)->path();
  fs::resize_file(victim, fs::file_size(victim) - 4);
  auto [c5, t5] = status_and_text({"--resume", "--checkpoint-dir", dir.string()});
  CHECK(c5 == 2);
  CHECK(t5.find(victim.filename().string()) != std::string::npos);
  CHECK(t5.find("truncated") != std::string::npos);
  // a bad flag fails before any checkpoint is written
  const fs::path fresh = tmp.path / "fresh";
  auto bad = run_args(fresh.string(), 1);
  bad.push_back("--clip-norm");
  bad.push_back("-1");
  auto [c6, t6] = status_and_text(bad);
  CHECK(c6 == 2);
  CHECK(!fs::exists(fresh / "latest"));
}
