// Data-parallel runs over MPI (docs/distributed.md), run by `meson test` as
// `mpirun --oversubscribe -np 2 test_mpi`. Every rank runs every test case in
// the same order (their collective calls must match), and the checks never
// throw, so that a failure on one rank cannot leave the other waiting.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/communicator.hpp"
#include "engine/mpi.hpp"
#include "engine/random.hpp"
#include "layers/dense.hpp"
#include "layers/dropout.hpp"
#include "layers/models.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/run/private_trainer.hpp"
#include "optim/sampling/sampler.hpp"
#include "privacy/accountant.hpp"
#include "support/key_store.hpp"

using namespace dpgrad;

namespace {

std::shared_ptr<Communicator> world() { return mpi_communicator(MPI_COMM_WORLD); }
std::shared_ptr<Communicator> self() { return mpi_communicator(MPI_COMM_SELF); }

/// n records of `dim` features (the same on every rank), labels in [0, 3), ids 0..n-1.
BatchT<double> records(std::size_t n, std::size_t dim) {
  FastRng rng(7);
  BatchT<double> b;
  b.inputs = ArrayT<double>::from_shape({n, dim});
  for (auto& v : b.inputs) v = rng.normal();
  for (std::size_t i = 0; i < n; ++i) {
    b.labels.push_back(std::int32_t(i % 3));
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

/// The records at positions rank, rank + size, ...
BatchT<double> shard(const BatchT<double>& all, const Communicator& comm) {
  std::vector<std::size_t> rows;
  for (std::size_t i = std::size_t(comm.rank()); i < all.examples(); i += std::size_t(comm.size())) rows.push_back(i);
  return all.select(rows);
}

std::vector<double> flat(ModelT<double>& m) {
  std::vector<double> v;
  for (const auto& p : m.parameters()) v.insert(v.end(), p.value().begin(), p.value().end());
  return v;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

struct RunSpec {
  std::string strategy = "ghost";
  Sampling sampling = Sampling::poisson;
  long steps = 20;
  std::vector<std::size_t> sizes = {6, 8, 3};  // the MLP's layers
  bool adaptive = false;  // adaptive clipping: the count summed over the ranks and noised once
  bool dropout = false;   // Dropout(0.5) after the hidden layer: masks keyed per record, whichever rank holds it
};

struct RunResult {
  std::vector<double> params;
  std::vector<privacy::Step> ledger;
  double epsilon = 0;
  long batch_total = 0;
  double clip_norm = 0;
};

PrivateTrainingConfigT<double> config(const RunSpec& spec, std::shared_ptr<Communicator> comm) {
  PrivateTrainingConfigT<double> c;
  c.clip_norm = 1.0;
  c.noise_multiplier = 3.0;  // jl:K proves a finite epsilon from about 2 at these sizes
  c.delta = 1e-5;
  c.batch_size = 16;
  c.epochs = 100;
  c.max_steps = spec.steps;
  c.sampling = spec.sampling;
  c.epoch_fraction = 0.5;
  c.clipping = make_clip_strategy<double>(spec.strategy, 16.0);
  c.reproducible_noise = true;
  c.seed = 5;
  if (spec.adaptive) c.adaptive_clipping = AdaptiveClipping{0.5, 4.0, 0.2};  // count noise 4 > sigma sqrt(2) / 2
  c.alone_under_launcher = !comm;  // the reference runs below: one process alone, on purpose
  c.communicator = std::move(comm);
  return c;
}

/// A run of spec.steps steps on `data` (this rank's shard, or everything on one process).
RunResult train(const RunSpec& spec, const BatchT<double>& data, std::shared_ptr<Communicator> comm) {
  FastRng init(1);
  std::unique_ptr<ModelT<double>> model;
  if (!spec.dropout) {
    model = make_mlp<double>(spec.sizes, Activation::tanh, init);
  } else {
    SequentialT<double> net;
    net.emplace<DenseT<double>>(spec.sizes[0], spec.sizes[1], init, "d1");
    net.emplace<ActivationT<double>>(Activation::tanh);
    net.emplace<DropoutT<double>>(0.5, 3);
    net.emplace<DenseT<double>>(spec.sizes[1], spec.sizes[2], init, "d2");
    model = std::make_unique<FeatureModelT<double>>("mlp-dropout", std::move(net));
  }
  SgdT<double> sgd(model->parameters(), 0.1, 0.9);
  PrivateTrainerT<double> trainer(*model, sgd, data, config(spec, std::move(comm)));
  RunResult r;
  while (!trainer.done()) r.batch_total += long(trainer.step().batch);
  r.params = flat(*model);
  r.ledger = trainer.accountant()->ledger();
  r.epsilon = trainer.epsilon();
  r.clip_norm = trainer.dp_optimizer().clip_norm();
  return r;
}

/// True when every rank passed the same values.
bool same_on_all_ranks(Communicator& comm, const std::vector<double>& v) {
  double sum = 0, weighted = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    sum += v[i];
    weighted += v[i] * double(i % 97 + 1);
  }
  try {
    require_same_on_all_ranks(comm, sum, "the sum");
    require_same_on_all_ranks(comm, weighted, "the weighted sum");
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

TEST_CASE("2 ranks train exactly as 1 rank, for every strategy that shards and every sampler") {
  auto comm = world();
  REQUIRE(comm->size() == 2);
  // the last: 124,410 parameters, 5 noise blocks of at most 2^16 coordinates, drawn by both ranks
  const std::vector<RunSpec> specs = {{"naive"}, {"vanilla"}, {"ghost"}, {"jl:3"},
                                      {"ghost", Sampling::shuffle}, {"vanilla", Sampling::fixed},
                                      {"ghost", Sampling::poisson, 5, {300, 400, 10}},
                                      {"ghost", Sampling::poisson, 20, {6, 8, 3}, true},
                                      // per layer: the G = 2 counts, summed over the ranks and noised once each
                                      {"ghost+layers:adaptive", Sampling::poisson, 20, {6, 8, 3}, true},
                                      {"ghost", Sampling::poisson, 20, {6, 8, 3}, false, true},
                                      {"naive", Sampling::shuffle, 20, {6, 8, 3}, false, true}};
  for (const RunSpec& spec : specs) {
    CAPTURE(spec.strategy);
    CAPTURE(to_string(spec.sampling));
    CAPTURE(spec.sizes[0]);
    CAPTURE(spec.adaptive);
    CAPTURE(spec.dropout);
    const BatchT<double> all = records(96, spec.sizes[0]);
    const RunResult two = train(spec, shard(all, *comm), comm);
    CHECK(same_on_all_ranks(*comm, two.params));
    if (comm->rank() == 0) {
      // the same run on one process holding every record (MPI_COMM_SELF)
      const RunResult one = train(spec, all, self());
      CHECK(max_difference(one.params, two.params) < 1e-9);
      CHECK(max_difference(one.params, two.params) >= 0);
      CHECK(one.ledger == two.ledger);
      CHECK(one.ledger.size() == 1);
      CHECK(one.epsilon == two.epsilon);
      CHECK(one.batch_total == two.batch_total);
      CHECK(one.clip_norm == two.clip_norm);
      if (spec.adaptive) CHECK(two.clip_norm != 1.0);  // it moved, the same way on 2 ranks as on 1
      // and as a run with no communicator at all, for strategies that draw nothing (a
      // data-parallel jl:K draws each step's directions from a generator split off
      // the shared one, a single process from the shared one itself)
      if (spec.strategy.rfind("jl:", 0) != 0) {
        const RunResult plain = train(spec, all, nullptr);
        CHECK(max_difference(plain.params, two.params) < 1e-9);
      }
    }
    comm->barrier();
  }
}

TEST_CASE("Poisson sampling over the union of the shards has rate q, and the ranks draw the same batches") {
  auto comm = world();
  // through the trainer: the batch sizes of 400 steps, summed over the ranks
  const BatchT<double> all = records(96, 6);
  RunSpec spec;
  spec.steps = 400;
  const RunResult r = train(spec, shard(all, *comm), comm);
  const double q = 16.0 / 96.0, mean = 400 * 96 * q, sd = std::sqrt(400 * 96 * q * (1 - q));
  CHECK(std::abs(double(r.batch_total) - mean) < 5 * sd);

  // the secure generator, shared: every record's frequency over the union, and one batch per step
  SecureRng rng;
  share_generator(*comm, rng);
  auto sampler = poisson_sampler(1000, 100);
  std::vector<double> mine(1000, 0.0);  // inclusions of this rank's records (positions rank, rank + 2, ...)
  std::vector<double> digest(1, 0.0);
  const int steps = 2000;
  for (int s = 0; s < steps; ++s) {
    for (const std::size_t i : sampler->next(rng)) {
      if (int(i % 2) == comm->rank()) mine[i] += 1;
      digest[0] += double(i) * double(s % 13 + 1);
    }
  }
  CHECK(same_on_all_ranks(*comm, digest));
  comm->allreduce_sum(mine.data(), mine.size());
  double chi2 = 0, total = 0;
  for (const double c : mine) {
    const double e = steps * 0.1, v = steps * 0.1 * 0.9;
    chi2 += (c - e) * (c - e) / v;
    total += c;
  }
  // 1000 records, each Binomial(2000, 0.1): chi-square with about 1000 degrees of freedom
  CHECK(chi2 < 1000 + 6 * std::sqrt(2000.0));
  CHECK(chi2 > 1000 - 6 * std::sqrt(2000.0));
  CHECK(std::abs(total - steps * 100.0) < 6 * std::sqrt(steps * 1000 * 0.1 * 0.9));
}

TEST_CASE("the noise is drawn once per step: variance sigma^2 C^2 in all, the same on every rank") {
  auto comm = world();
  FastRng init(2);
  // 124,410 parameters: 5 noise blocks, the first drawn by rank 0, the others by rank 1
  auto model = make_mlp<double>({300, 400, 10}, Activation::tanh, init);
  SgdT<double> sgd(model->parameters(), 1.0);
  auto strategy = make_clip_strategy<double>("ghost", 10.0);
  auto sampler = poisson_sampler(100, 10);  // q 0.1, expected batch 10
  // each rank its own seed: were every rank to add noise, the sums would differ and add up
  ReproducibleRng noise(100 + std::uint64_t(comm->rank())), aux(7);
  DPConfig dc;
  dc.clip_norm = 1.0;
  dc.noise_multiplier = 2.0;
  dc.communicator = comm;
  DPOptimizerT<double> opt(*model, sgd, *strategy, dc, *sampler, noise, aux, nullptr);
  BatchT<double> empty;  // no examples on any rank: what moves the parameters is the noise alone
  empty.inputs = ArrayT<double>::from_shape({0, 300});
  double sum_sq = 0;
  std::size_t count = 0;
  for (int s = 0; s < 5; ++s) {
    const std::vector<double> before = flat(*model);
    const StepStats st = opt.step(empty);
    CHECK(st.batch == 0);
    const std::vector<double> after = flat(*model);
    for (std::size_t i = 0; i < after.size(); ++i) {
      sum_sq += (after[i] - before[i]) * (after[i] - before[i]);
      ++count;
    }
  }
  CHECK(same_on_all_ranks(*comm, flat(*model)));
  // per coordinate, the update is the noise over the expected batch: sd sigma C / L = 0.2
  const double variance = sum_sq / double(count), expected = 0.04;
  CHECK(count > 10000);
  CHECK(std::abs(variance / expected - 1) < 6 * std::sqrt(2.0 / double(count)));
}

TEST_CASE("strategies whose groups would span ranks, and shards that do not partition the data, are refused") {
  auto comm = world();
  const BatchT<double> all = records(96, 6);
  RunSpec micro;
  micro.strategy = "microbatch:4";
  CHECK_THROWS_WITH_AS(train(micro, shard(all, *comm), comm), doctest::Contains("microbatch:4 cannot run on 2"),
                       std::invalid_argument);
  // rank 1 holds rank 0's records too: one of them would count twice
  BatchT<double> overlapping = comm->rank() == 0 ? shard(all, *comm) : all;
  CHECK_THROWS_AS(train(RunSpec{}, overlapping, comm), std::invalid_argument);
  // a shard without record ids
  BatchT<double> anonymous = shard(all, *comm);
  if (comm->rank() == 1) anonymous.ids.clear();
  CHECK_THROWS_AS(train(RunSpec{}, anonymous, comm), std::invalid_argument);
}

TEST_CASE("ranks whose runs differ in any setting are refused on every rank, naming the setting, with no hang") {
  auto comm = world();
  const BatchT<double> data = shard(records(96, 6), *comm);
  // one edit per setting that defines the mechanism or the run, made on rank 1 only
  using Edit = std::function<void(PrivateTrainingConfigT<double>&, std::unique_ptr<ModelT<double>>&,
                                  std::unique_ptr<SgdT<double>>&)>;
  const std::vector<std::pair<std::string, Edit>> edits = {
      {"noise_multiplier", [](auto& c, auto&, auto&) { c.noise_multiplier = 0.5; }},
      {"clip_norm", [](auto& c, auto&, auto&) { c.clip_norm = 50; }},
      {"clip_strategy", [](auto& c, auto&, auto&) { c.clipping = clipping::vanilla<double>(); }},
      {"sampler", [](auto& c, auto&, auto&) { c.sampling = Sampling::fixed; }},
      {"batch_size", [](auto& c, auto&, auto&) { c.batch_size = 8; }},
      {"epochs", [](auto& c, auto&, auto&) { c.epochs = 50; }},
      {"max_steps", [](auto& c, auto&, auto&) { c.max_steps = 7; }},
      {"delta", [](auto& c, auto&, auto&) { c.delta = 1e-6; }},
      {"target_epsilon", [](auto& c, auto&, auto&) { c.target_epsilon = 8; }},
      {"accountant", [](auto& c, auto&, auto&) { c.accounting = Accounting::rdp; }},
      {"releases_before", [](auto& c, auto&, auto&) {
         c.releases.push_back(private_feature_mean<double>(
             6, 10.0, 1.0, [](const BatchT<double>& r) { return r.inputs; }, [](const ArrayT<double>&) {}));
       }},
      {"seed", [](auto& c, auto&, auto&) { c.seed = 6; }},
      {"ema", [](auto& c, auto&, auto&) { c.ema = 0.9; }},
      {"sat_rho", [](auto& c, auto&, auto&) { c.sat_rho = 0.1; }},
      {"optimizer.lr", [](auto&, auto& m, auto& o) { o = std::make_unique<SgdT<double>>(m->parameters(), 0.2, 0.9); }},
      {"optimizer.momentum", [](auto&, auto& m, auto& o) { o = std::make_unique<SgdT<double>>(m->parameters(), 0.1, 0.5); }},
      {"model.values", [](auto&, auto& m, auto& o) {
         FastRng other(2);
         m = make_mlp<double>({6, 8, 3}, Activation::tanh, other);
         o = std::make_unique<SgdT<double>>(m->parameters(), 0.1, 0.9);
       }},
      {"model.parameters", [](auto&, auto& m, auto& o) {
         FastRng init(1);
         m = make_mlp<double>({6, 9, 3}, Activation::tanh, init);
         o = std::make_unique<SgdT<double>>(m->parameters(), 0.1, 0.9);
       }},
  };
  for (const auto& [field, edit] : edits) {
    CAPTURE(field);
    FastRng init(1);
    auto model = make_mlp<double>({6, 8, 3}, Activation::tanh, init);
    auto sgd = std::make_unique<SgdT<double>>(model->parameters(), 0.1, 0.9);
    PrivateTrainingConfigT<double> c = config(RunSpec{}, comm);
    if (comm->rank() == 1) edit(c, model, sgd);
    std::string error;
    try {
      PrivateTrainerT<double> t(*model, *sgd, data, c);
    } catch (const std::invalid_argument& e) {
      error = e.what();
    }
    INFO(error);
    CHECK(error.find("the ranks' runs differ in ") != std::string::npos);
    CHECK(error.find(field + " (rank 0: ") != std::string::npos);
  }
  // the same settings on both ranks: accepted
  FastRng init(1);
  auto model = make_mlp<double>({6, 8, 3}, Activation::tanh, init);
  SgdT<double> sgd(model->parameters(), 0.1, 0.9);
  CHECK_NOTHROW(PrivateTrainerT<double>(*model, sgd, data, config(RunSpec{}, comm)));
}

TEST_CASE("a 2-rank checkpoint resumes on 2 ranks and on 1, with the same parameters and ledger") {
  auto comm = world();
  const BatchT<double> all = records(96, 6);
  const BatchT<double> mine = shard(all, *comm);
  // a folder rank 0 names for both
  std::string dir;
  if (comm->rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dpgrad-mpi-XXXXXX").string();
    CHECK(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  dir = broadcast_string(*comm, dir);
  RunSpec spec;
  spec.strategy = "jl:3";
  spec.steps = 20;
  const RunResult whole = train(spec, mine, comm);
  {
    FastRng init(1);
    auto model = make_mlp<double>({6, 8, 3}, Activation::tanh, init);
    SgdT<double> sgd(model->parameters(), 0.1, 0.9);
    PrivateTrainerT<double> trainer(*model, sgd, mine, config(spec, comm));
    for (int s = 0; s < 10; ++s) trainer.step();
    trainer.save(dir);
  }
  auto resume = [&](const BatchT<double>& data, std::shared_ptr<Communicator> c) {
    FastRng init(99);  // overwritten by the checkpoint
    auto model = make_mlp<double>({6, 8, 3}, Activation::tanh, init);
    SgdT<double> sgd(model->parameters(), 0.1, 0.9);
    PrivateTrainerT<double> trainer(*model, sgd, data, config(spec, std::move(c)), dir);
    CHECK(trainer.steps_done() == 10);
    while (!trainer.done()) trainer.step();
    RunResult r;
    r.params = flat(*model);
    r.ledger = trainer.accountant()->ledger();
    r.epsilon = trainer.epsilon();
    return r;
  };
  const RunResult again = resume(mine, comm);
  CHECK(max_difference(again.params, whole.params) < 1e-12);
  CHECK(again.ledger == whole.ledger);
  CHECK(again.epsilon == whole.epsilon);
  if (comm->rank() == 0) {
    const RunResult alone = resume(all, self());
    CHECK(max_difference(alone.params, whole.params) < 1e-9);
    CHECK(alone.epsilon == whole.epsilon);
    std::filesystem::remove_all(dir);
  }
  comm->barrier();
}

int main(int argc, char** argv) {
  test::KeyStoreForTests store;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  doctest::Context context(argc, argv);
  int rc = context.run();
  // a failure on either rank fails the test
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
