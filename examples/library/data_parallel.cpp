// Data-parallel private training (docs/distributed.md): started by mpirun,
// every process holds a shard of the data, and together they run one DP-SGD
// run with one ledger. Link with dpgrad-mpi (pkg-config dpgrad-mpi, CMake
// dpgrad::mpi); run with `mpirun -np 2 ./data_parallel` (or alone).
#include <dpgrad/dpgrad.hpp>

#include <cstdio>

dpgrad::Batch my_data(std::size_t n, std::uint64_t seed) {  // 20 features, 3 classes
  dpgrad::FastRng rng(seed);
  dpgrad::Batch b;
  b.inputs = dpgrad::Array::from_shape({n, 20});
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < 20; ++j) b.inputs(i, j) = float(rng.normal());
    const float score = b.inputs(i, 0) + 0.5f * b.inputs(i, 1) - 0.25f * b.inputs(i, 2);
    b.labels.push_back(score < -0.5f ? 0 : score < 0.5f ? 1 : 2);
    b.ids.push_back(std::int64_t(seed * 1000000 + i));
  }
  return b;
}

int main() {
  auto comm = dpgrad::world_communicator();  // MPI's under mpirun, null when run alone
  const int rank = comm ? comm->rank() : 0, size = comm ? comm->size() : 1;
  const dpgrad::Batch all = my_data(20000, 1), test = my_data(2000, 2);
  const auto mine = dpgrad::data::shard_positions(all.examples(), rank, size);  // this rank's records
  dpgrad::FastRng init(7);  // the same initial model on every rank
  auto model = dpgrad::make_mlp<float>({20, 64, 3}, dpgrad::Activation::relu, init);
  dpgrad::Sgd sgd(model->parameters(), 0.5, 0.9);
  dpgrad::PrivateTrainingConfig config;
  config.target_epsilon = 2;
  config.epochs = 5;
  config.batch_size = 500;
  config.communicator = comm;
  config.positions = mine;
  const dpgrad::Batch shard = all.select(mine);
  dpgrad::PrivateTrainer trainer(*model, sgd, shard, config);
  trainer.train();
  const double accuracy = trainer.evaluate(test).accuracy;
  if (rank == 0)
    std::printf("%d process(es): test accuracy %.2f%% at %s\n", size, 100 * accuracy, trainer.privacy_statement().c_str());
  return accuracy > 0.75 && trainer.epsilon() <= 2.0 ? 0 : 1;
}
