// Communicator (engine/communicator.hpp): the single-process one and helpers.
#include "engine/communicator.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <map>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>
#include <sodium.h>

#include "engine/config.hpp"
#include "engine/random.hpp"

namespace dpgrad {

namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "1 process"; }
  void reduce_sum(float*, std::size_t, int root) override { check_root(root); }
  void reduce_sum(double*, std::size_t, int root) override { check_root(root); }
  void allreduce_sum(double*, std::size_t) override {}
  void reduce_scatter_sum(float*, const std::vector<std::size_t>& counts) override { check_counts(counts); }
  void reduce_scatter_sum(double*, const std::vector<std::size_t>& counts) override { check_counts(counts); }
  void allgather(float*, const std::vector<std::size_t>& counts) override { check_counts(counts); }
  void allgather(double*, const std::vector<std::size_t>& counts) override { check_counts(counts); }
  void broadcast(void*, std::size_t, int root) override { check_root(root); }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }

 private:
  static void check_counts(const std::vector<std::size_t>& counts) {
    if (counts.size() != 1) throw std::invalid_argument("single process: one part expected, got " +
                                                        std::to_string(counts.size()));
  }
  static void check_root(int root) {
    if (root != 0) throw std::invalid_argument("single process: root must be 0, got " + std::to_string(root));
  }
};

}  // namespace

std::shared_ptr<Communicator> single_process() { return std::make_shared<SingleProcess>(); }

std::string broadcast_string(Communicator& comm, const std::string& s, int root) {
  unsigned long long n = s.size();
  comm.broadcast(&n, sizeof n, root);
  std::string out = comm.rank() == root ? s : std::string(n, '\0');
  if (n) comm.broadcast(out.data(), n, root);
  return out;
}

void require_on_all_ranks(Communicator& comm, bool ok, const std::string& message) {
  if (comm.size() == 1) {
    if (!ok) throw RefusedOnAllRanks(message);
    return;
  }
  // each failing rank adds its rank + 1 to the sum and 1 to the count
  double failed[2] = {ok ? 0.0 : double(comm.rank() + 1), ok ? 0.0 : 1.0};
  comm.allreduce_sum(failed, 2);
  if (failed[1] == 0) return;
  if (!ok) throw RefusedOnAllRanks(message);
  throw RefusedOnAllRanks(std::to_string(int(failed[1])) + " of " + std::to_string(comm.size()) +
                          " ranks refused their data or settings (see their messages)");
}

std::optional<int> stop_on_all_ranks(Communicator* comm, std::optional<int> stop) {
  if (!comm || comm->size() == 1) return stop;
  std::vector<double> stopped(std::size_t(comm->size()), 0.0);  // one flag per rank
  stopped[std::size_t(comm->rank())] = stop ? 1.0 : 0.0;
  comm->allreduce_sum(stopped.data(), stopped.size());
  if (stop) return stop;
  const auto first = std::find(stopped.begin(), stopped.end(), 1.0);
  if (first != stopped.end())
    throw RefusedOnAllRanks("rank " + std::to_string(first - stopped.begin()) +
                            " ended before the run (its command line asked for --help or was refused): start every "
                            "rank with the same options");
  return std::nullopt;
}

void require_same_on_all_ranks(Communicator& comm, double value, const std::string& what) {
  if (comm.size() == 1) return;
  // rank 0's value, against which each rank checks its own exactly
  double first = value;
  comm.broadcast(&first, sizeof first, 0);
  double differs = first == value || (first != first && value != value) ? 0.0 : 1.0;
  comm.allreduce_sum(&differs, 1);
  if (differs > 0)
    throw std::runtime_error("the ranks disagree on " + what + " (" + std::to_string(int(differs)) + " of " +
                             std::to_string(comm.size()) + " ranks differ from rank 0's " + std::to_string(first) + ")");
}

namespace {
/// `j`'s values under dotted keys ("model.parameters"), objects opened.
void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
    return;
  }
  out[prefix.empty() ? "(value)" : prefix] = j.dump();
}
}  // namespace

void require_same_settings_on_all_ranks(Communicator& comm, const std::string& settings_json, const std::string& what) {
  if (comm.size() == 1) return;
  std::map<std::string, std::string> mine, first;
  const std::string root = broadcast_string(comm, settings_json);
  flatten(nlohmann::json::parse(settings_json, nullptr, false), "", mine);
  flatten(nlohmann::json::parse(root, nullptr, false), "", first);
  // one flag per key of rank 0's (the same count on every rank), and one for keys rank 0 lacks
  std::vector<std::string> keys;
  for (const auto& [k, v] : first) keys.push_back(k);
  std::vector<double> differs(keys.size() + 1, 0.0);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto it = mine.find(keys[i]);
    if (it == mine.end() || it->second != first[keys[i]]) differs[i] = 1;
  }
  for (const auto& [k, v] : mine)
    if (!first.count(k)) differs.back() = 1;
  const std::vector<double> here = differs;
  comm.allreduce_sum(differs.data(), differs.size());
  std::string list;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (differs[i] == 0) continue;
    const auto it = mine.find(keys[i]);
    list += (list.empty() ? "" : "; ") + keys[i] + " (rank 0: " + first[keys[i]] +
            (here[i] > 0 ? ", this rank: " + (it == mine.end() ? std::string("none") : it->second)
                         : ", on " + std::to_string(int(differs[i])) + " other rank(s) another value") + ")";
  }
  if (differs.back() > 0) list += std::string(list.empty() ? "" : "; ") + "which settings there are";
  if (!list.empty())
    throw RefusedOnAllRanks("the ranks' " + what + " differ in " + list +
                                ": every rank must be started with the same settings (docs/distributed.md)");
}

bool launched_by_mpi_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(name)) return true;
  return false;
}

void require_single_process() {
  if (launched_by_mpi_launcher())
    throw std::invalid_argument("an MPI launcher started this program, which runs on one process: each copy would "
                                "spend the privacy budget again (dpgrad-train is the data-parallel program)");
}

namespace {
std::shared_ptr<Communicator> (*world_factory)() = nullptr;  // set when dpgrad-mpi is linked
}  // namespace

void set_world_communicator_factory(std::shared_ptr<Communicator> (*factory)()) { world_factory = factory; }

std::shared_ptr<Communicator> world_communicator() {
  if (!launched_by_mpi_launcher()) return nullptr;
  if (world_factory) return world_factory();
  throw std::runtime_error(DPGRAD_HAVE_MPI ? "an MPI launcher started this process, but this program was linked without "
                                             "dpgrad-mpi (pkg-config dpgrad-mpi, CMake dpgrad::mpi): each process "
                                             "would train alone"
                                           : "an MPI launcher started this process, but this dpgrad was built without "
                                             "MPI (meson -Dmpi=enabled with libopenmpi-dev): each process would "
                                             "train alone");
}

int threads_per_rank(const Communicator* comm, int asked) {
  if (asked > 0 || !comm || comm->size() == 1 || std::getenv("DPGRAD_THREADS")) return asked;
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int sharing = local ? std::max(1, std::atoi(local)) : comm->size();
  return std::max(1, int(std::thread::hardware_concurrency()) / sharing);
}

namespace {

/// Standard output and error go to /dev/null while it lives (error messages are printed after it).
class QuietRank {
 public:
  QuietRank() {
    std::fflush(stdout);
    std::fflush(stderr);
    saved_err_ = ::dup(2);
    if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) {
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::close(null);
    }
  }
  ~QuietRank() {
    std::fflush(stderr);
    if (saved_err_ >= 0) {
      ::dup2(saved_err_, 2);
      ::close(saved_err_);
    }
  }
  QuietRank(const QuietRank&) = delete;
  QuietRank& operator=(const QuietRank&) = delete;

 private:
  int saved_err_ = -1;
};

}  // namespace

int run_on_every_rank(const std::string& program,
                      const std::function<int(const std::shared_ptr<Communicator>&)>& body,
                      const std::string& out_of_memory,
                      const std::function<std::string(const std::string&)>& words) {
  std::shared_ptr<Communicator> comm;
  std::optional<QuietRank> quiet;
  auto fail = [&](const std::string& what, bool alone) {
    quiet.reset();  // every rank's error is shown
    const std::string where = comm && comm->size() > 1 ? " (rank " + std::to_string(comm->rank()) + ")" : "";
    const std::string message = words ? words(what) : what;
    std::fprintf(stderr, "%s: error%s: %s\n", program.c_str(), where.c_str(), message.c_str());
    std::fflush(stderr);
    if (alone && comm && comm->size() > 1) comm->abort(2);
    return 2;
  };
  try {
    comm = world_communicator();
    if (comm && comm->rank() != 0) quiet.emplace();
    return body(comm);
  } catch (const RefusedOnAllRanks& e) {  // every rank refused together: none waits, so each ends normally
    return fail(e.what(), false);
  } catch (const std::bad_alloc& e) {  // one that names where (an imported model's forward pass) says so too
    const std::string where = e.what();
    return fail(where.find("out of memory") == std::string::npos ? out_of_memory : where + " (" + out_of_memory + ")",
                true);
  } catch (const std::exception& e) {
    return fail(e.what(), true);
  }
}

void share_generator(Communicator& comm, Rng& rng) {
  require_private_generator(rng, "shared (sampling, directions)");
  require_same_on_all_ranks(comm, rng.secure() ? 1.0 : 0.0, "the kind of generator (secure or reproducible)");
  if (auto* secure = dynamic_cast<SecureRng*>(&rng)) {
    alignas(std::uint64_t) unsigned char key[32] = {};
    if (comm.rank() == 0) rng.fill_u64(reinterpret_cast<std::uint64_t*>(key), sizeof(key) / sizeof(std::uint64_t));
    comm.broadcast(key, sizeof key, 0);
    secure->set_key(key);
    sodium_memzero(key, sizeof key);
    return;
  }
  if (!rng.reproducible_opt_in())
    throw std::invalid_argument("share_generator: only the secure generator or a ReproducibleRng can be shared");
  rng.set_state(broadcast_string(comm, rng.state()));
}

}  // namespace dpgrad
