// The helpers of engine/communicator.hpp and engine/progress.hpp that programs
// are built from: threads per rank, a program body run on every rank, progress.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "engine/communicator.hpp"
#include "engine/progress.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;

namespace {

/// Ranks of a run that never communicates: only rank() and size() are asked.
class FakeRanks final : public Communicator {
 public:
  FakeRanks(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return "fake"; }
  void reduce_sum(float*, std::size_t, int) override {}
  void reduce_sum(double*, std::size_t, int) override {}
  void allreduce_sum(double*, std::size_t) override {}
  void reduce_scatter_sum(float*, const std::vector<std::size_t>&) override {}
  void reduce_scatter_sum(double*, const std::vector<std::size_t>&) override {}
  void allgather(float*, const std::vector<std::size_t>&) override {}
  void allgather(double*, const std::vector<std::size_t>&) override {}
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int) override { throw std::logic_error("abort"); }

 private:
  int rank_, size_;
};

/// Sets an environment variable for its lifetime (unset: nullptr), restoring the old value.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvVar() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("threads_per_rank: the cores shared among the ranks on a machine, unless threads were asked for") {
  const EnvVar threads("DPGRAD_THREADS", nullptr), local("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr);
  const int cores = int(std::thread::hardware_concurrency());
  FakeRanks one(0, 1), two(1, 2), eight(3, 8);
  CHECK(threads_per_rank(nullptr, 0) == 0);  // one process: every core
  CHECK(threads_per_rank(&one, 0) == 0);
  CHECK(threads_per_rank(&two, 3) == 3);  // asked for
  CHECK(threads_per_rank(&two, 0) == std::max(1, cores / 2));
  CHECK(threads_per_rank(&eight, 0) == std::max(1, cores / 8));
  {
    const EnvVar on_this_machine("OMPI_COMM_WORLD_LOCAL_SIZE", "1");  // the other ranks run elsewhere
    CHECK(threads_per_rank(&eight, 0) == std::max(1, cores));
  }
  const EnvVar set("DPGRAD_THREADS", "1");
  CHECK(threads_per_rank(&two, 0) == 0);  // the engine reads DPGRAD_THREADS itself
}

TEST_CASE("run_on_every_rank: the body's return, or 2 with the error named after the program") {
  if (launched_by_mpi_launcher()) return;  // the test process itself runs alone
  CHECK(run_on_every_rank("prog", [](const auto& comm) { return comm ? 9 : 7; }) == 7);
  std::string err = test::captured_stderr([] {
    CHECK(run_on_every_rank("prog", [](const auto&) -> int { throw std::invalid_argument("bad --flag"); }) == 2);
  });
  CHECK(err == "prog: error: bad --flag\n");
  err = test::captured_stderr([] {
    CHECK(run_on_every_rank("prog", [](const auto&) -> int { throw std::bad_alloc(); }, "out of memory; less") == 2);
  });
  CHECK(err == "prog: error: out of memory; less\n");
  err = test::captured_stderr([] {
    CHECK(run_on_every_rank("prog", [](const auto&) -> int { throw RefusedOnAllRanks("all refused"); }) == 2);
  });
  CHECK(err == "prog: error: all refused\n");
}

TEST_CASE("Progress: off a terminal, a line every tenth of each part, with counts and speed only") {
  const std::string err = test::captured_stderr([] {
    Progress p("step");
    for (long i = 1; i <= 20; ++i) p.update(i, 20, "epoch   1");
    for (long i = 1; i <= 3; ++i) p.update(i, 3, "epoch   2");
    Progress quiet("step", true);
    quiet.update(1, 1);
  });
  std::istringstream lines(err);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    CHECK(line.rfind("  epoch   ", 0) == 0);
    CHECK(line.find(" step ") != std::string::npos);
  }
  CHECK(count == 10 + 3);
  CHECK(err.find("epoch   1 step 20/20") != std::string::npos);
  CHECK(err.find("epoch   2 step 3/3") != std::string::npos);
  CHECK(err.find("steps/s ETA") != std::string::npos);
}
