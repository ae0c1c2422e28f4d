// MPI's communicator (engine/mpi.hpp) and, for programs linked with dpgrad-mpi,
// world_communicator()'s MPI_COMM_WORLD.
#include "engine/mpi.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <vector>
#include <stdexcept>
#include <string>

namespace dpgrad {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string("MPI ") + what + " failed: " + std::string(text, std::size_t(len)));
}

/// MPI's counts are int: long arrays go in pieces.
template <class F>
void in_pieces(std::size_t n, F&& f) {
  constexpr std::size_t kMax = std::size_t(1) << 30;
  for (std::size_t at = 0; at < n; at += kMax) f(at, int(std::min(kMax, n - at)));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    int ok = 0;
    MPI_Initialized(&ok);
    if (!ok) throw std::logic_error("mpi_communicator: MPI is not initialised");
    check(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "Comm_size");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return "MPI, " + std::to_string(size_) + (size_ == 1 ? " process" : " processes");
  }
  void reduce_sum(float* x, std::size_t n, int root) override { reduce(x, n, MPI_FLOAT, root); }
  void reduce_sum(double* x, std::size_t n, int root) override { reduce(x, n, MPI_DOUBLE, root); }
  void allreduce_sum(double* x, std::size_t n) override {
    in_pieces(n, [&](std::size_t at, int count) {
      check(MPI_Allreduce(MPI_IN_PLACE, x + at, count, MPI_DOUBLE, MPI_SUM, comm_), "Allreduce");
    });
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    auto* p = static_cast<unsigned char*>(data);
    in_pieces(bytes, [&](std::size_t at, int count) {
      check(MPI_Bcast(p + at, count, MPI_BYTE, root, comm_), "Bcast");
    });
  }
  void reduce_scatter_sum(float* x, const std::vector<std::size_t>& counts) override {
    reduce_scatter(x, counts, MPI_FLOAT);
  }
  void reduce_scatter_sum(double* x, const std::vector<std::size_t>& counts) override {
    reduce_scatter(x, counts, MPI_DOUBLE);
  }
  void allgather(float* x, const std::vector<std::size_t>& counts) override { gather(x, counts, MPI_FLOAT); }
  void allgather(double* x, const std::vector<std::size_t>& counts) override { gather(x, counts, MPI_DOUBLE); }
  void barrier() override { check(MPI_Barrier(comm_), "Barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::_Exit(code);
  }

 private:
  /// MPI's counts and displacements (int) of parts of `counts` values.
  void layout(const std::vector<std::size_t>& counts, std::vector<int>& n, std::vector<int>& at) const {
    if (counts.size() != std::size_t(size_))
      throw std::invalid_argument("MPI: " + std::to_string(counts.size()) + " parts for " + std::to_string(size_) +
                                  " ranks");
    std::size_t total = 0;
    n.clear();
    at.clear();
    for (const std::size_t c : counts) {
      if (total + c > std::size_t(std::numeric_limits<int>::max()))
        throw std::invalid_argument("MPI: more than 2^31 - 1 values in one reduce-scatter or gather");
      at.push_back(int(total));
      n.push_back(int(c));
      total += c;
    }
  }
  template <class V>
  void reduce_scatter(V* x, const std::vector<std::size_t>& counts, MPI_Datatype type) {
    std::vector<int> n, at;
    layout(counts, n, at);
    std::vector<V> part(std::max<std::size_t>(1, counts[std::size_t(rank_)]));
    check(MPI_Reduce_scatter(x, part.data(), n.data(), type, MPI_SUM, comm_), "Reduce_scatter");
    std::copy(part.begin(), part.begin() + n[std::size_t(rank_)], x + at[std::size_t(rank_)]);
  }
  template <class V>
  void gather(V* x, const std::vector<std::size_t>& counts, MPI_Datatype type) {
    std::vector<int> n, at;
    layout(counts, n, at);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, type, x, n.data(), at.data(), type, comm_), "Allgatherv");
  }
  template <class V>
  void reduce(V* x, std::size_t n, MPI_Datatype type, int root) {
    in_pieces(n, [&](std::size_t at, int count) {
      void* send = rank_ == root ? MPI_IN_PLACE : static_cast<void*>(x + at);
      check(MPI_Reduce(send, x + at, count, type, MPI_SUM, root, comm_), "Reduce");
    });
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

/// MPI_Finalize when the program ends normally.
struct Finalize {
  ~Finalize() {
    int init = 0, done = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&done);
    if (init && !done) MPI_Finalize();
  }
};

}  // namespace

std::shared_ptr<Communicator> mpi_communicator(MPI_Comm comm) { return std::make_shared<MpiCommunicator>(comm); }

namespace {

/// world_communicator() in programs linked with dpgrad-mpi.
std::shared_ptr<Communicator> mpi_world() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "Init_thread");
    static Finalize finalize;
  }
  return mpi_communicator(MPI_COMM_WORLD);
}

}  // namespace

}  // namespace dpgrad

// dpgrad-mpi's link flags name this symbol (-Wl,-u,dpgrad_mpi_linked), so that
// linking the library pulls this file in, and its initialisation makes
// world_communicator() MPI's before main() runs.
extern "C" {
extern const int dpgrad_mpi_linked;
const int dpgrad_mpi_linked = (dpgrad::set_world_communicator_factory(&dpgrad::mpi_world), 1);
}
