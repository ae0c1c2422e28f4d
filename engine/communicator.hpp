// Processes that train one model together (docs/distributed.md). A run with a
// communicator shards its data over the processes ("ranks"): each clips its
// share of every logical batch, the clipped sums are added up across ranks,
// each coordinate is noised once, and every rank gets the same noised sum
// back. single_process() is
// the communicator of one process; engine/mpi.hpp has MPI's (the dpgrad-mpi library).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dpgrad {

/// The processes of one run and the collective operations between them: every
/// rank makes the same calls in the same order (docs/distributed.md).
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This process's rank, 0 to size() - 1, and the number of ranks in the run.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "1 process" or "MPI, 4 processes": for run output.
  virtual std::string describe() const = 0;
  /// x <- the sum of every rank's x, on rank `root` only (elsewhere x is left as it was).
  virtual void reduce_sum(float* x, std::size_t n, int root) = 0;
  virtual void reduce_sum(double* x, std::size_t n, int root) = 0;
  /// x <- the sum of every rank's x, on every rank.
  virtual void allreduce_sum(double* x, std::size_t n) = 0;
  /// x has the same layout on every rank, cut into consecutive parts of counts[r]
  /// values (one per rank, summing to x's length). On rank r, part r of x <- the
  /// sum of every rank's part r; the rest of x is left as it was.
  virtual void reduce_scatter_sum(float* x, const std::vector<std::size_t>& counts) = 0;
  virtual void reduce_scatter_sum(double* x, const std::vector<std::size_t>& counts) = 0;
  /// The same layout: part r of x, on every rank <- rank r's part r.
  virtual void allgather(float* x, const std::vector<std::size_t>& counts) = 0;
  virtual void allgather(double* x, const std::vector<std::size_t>& counts) = 0;
  /// `bytes` bytes at `data` <- rank `root`'s, on every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  /// Ends every rank's process with `code` (the job cannot go on: a rank failed).
  [[noreturn]] virtual void abort(int code) = 0;
};

/// The communicator of a run on one process (rank 0 of 1).
std::shared_ptr<Communicator> single_process();

/// A refusal that every rank of a run raised at the same point (the checks
/// below): no rank is left waiting for another, so a program may end normally
/// on every rank instead of aborting the job.
class RefusedOnAllRanks : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Rank 0's string on every rank.
std::string broadcast_string(Communicator& comm, const std::string& s, int root = 0);

/// Throws RefusedOnAllRanks on every rank when `ok` is false on any: with
/// `message` where it failed, elsewhere naming the first rank that failed. Checks
/// of one rank's data go through it, so that no rank waits for one that threw.
void require_on_all_ranks(Communicator& comm, bool ok, const std::string& message);

/// A program's step before anything collective (its command line read) on every
/// rank: `stop` is this rank's exit status when it ends there (--help, a refused
/// command line), nullopt when it goes on. Every rank learns whether any stops:
/// a rank that stops gets its `stop` back, and when one does, the ranks that
/// would go on throw RefusedOnAllRanks naming it, so no rank waits for one that
/// has ended. Without a communicator (or on one rank), `stop` as it is.
std::optional<int> stop_on_all_ranks(Communicator* comm, std::optional<int> stop);

/// Throws std::runtime_error naming `what` unless every rank passed the same `value`
/// (each rank compares its own with rank 0's, exactly; NaN equals NaN).
void require_same_on_all_ranks(Communicator& comm, double value, const std::string& what);

/// Throws RefusedOnAllRanks on every rank unless every rank passed the same
/// `settings` (a JSON object; nested objects are compared key by key). The
/// message names each differing key with this rank's value and rank 0's, e.g.
/// "the ranks' runs differ in noise_multiplier (this rank 0.5, rank 0 2)". Every
/// rank must call it, with objects built by the same code (the same keys): it
/// sends rank 0's settings and one flag per key, so no rank waits for another
/// whatever the values. `what` names the settings in the message ("runs").
void require_same_settings_on_all_ranks(Communicator& comm, const std::string& settings_json, const std::string& what);

/// True when an MPI launcher (mpirun, mpiexec, srun with PMI) started this
/// process: its environment names a rank.
bool launched_by_mpi_launcher();

/// Throws std::invalid_argument when an MPI launcher started this process, for
/// programs that run on one process only: each of the launcher's copies would
/// spend the privacy budget again.
void require_single_process();

/// MPI_COMM_WORLD (MPI initialised on first call, finalised at exit) when an MPI
/// launcher started this process; null otherwise. MPI comes with the dpgrad-mpi
/// library (pkg-config dpgrad-mpi, CMake dpgrad::mpi; docs/distributed.md): a
/// program linked without it that a launcher started gets std::runtime_error
/// (each process would train alone, as many runs, each spending the budget).
std::shared_ptr<Communicator> world_communicator();

/// Engine threads for one process: `asked` when it is > 0, when DPGRAD_THREADS
/// is set, or when `comm` is null or of one rank; otherwise the machine's cores
/// shared among the ranks on it (OMPI_COMM_WORLD_LOCAL_SIZE, or all ranks), at
/// least 1. 0 means "every core".
int threads_per_rank(const Communicator* comm, int asked);

/// dpgrad-mpi's hook (engine/mpi.cpp): the function world_communicator() calls
/// under an MPI launcher. Programs do not call it.
void set_world_communicator_factory(std::shared_ptr<Communicator> (*factory)());

/// Runs a program's body as one run over every process an MPI launcher started
/// (or over this process alone: comm null). Ranks other than 0 print nothing
/// while the body runs. An exception ends the body on its rank: its message is
/// printed as "PROGRAM: error (rank R): MESSAGE" on standard error, and the
/// return is 2. A RefusedOnAllRanks ends every rank normally; any other
/// exception on a rank of several aborts the job (the others would wait for it
/// forever). std::bad_alloc is reported as `out_of_memory`. `words`, when
/// given, rewrites each message first (a program naming the library's settings by
/// its flags). Returns the body's return otherwise (docs/distributed.md).
int run_on_every_rank(const std::string& program,
                      const std::function<int(const std::shared_ptr<Communicator>&)>& body,
                      const std::string& out_of_memory = "out of memory",
                      const std::function<std::string(const std::string&)>& words = nullptr);

class Rng;

/// Makes `rng` the same stream on every rank (sampling and JL directions, which
/// every rank must draw alike; docs/distributed.md). The secure generator is
/// re-keyed with 32 bytes rank 0 draws from its own (sent to the others, then
/// wiped); a ReproducibleRng takes rank 0's state. Any other generator, or
/// generators of different kinds on different ranks, throw std::invalid_argument.
void share_generator(Communicator& comm, Rng& rng);

}  // namespace dpgrad
