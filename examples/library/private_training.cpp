// Private training on your own data: a Batch built from plain arrays (here a
// made-up task, 3 classes from 20 features), an MLP, DP-SGD with momentum
// calibrated to epsilon 2, and the test accuracy.
#include <dpgrad/dpgrad.hpp>

#include <cmath>
#include <cstdio>

// Your data: N rows of 20 features, a class label each, and a record id each
// (a fixed label of the record, used to key per-record randomness).
dpgrad::Batch my_data(std::size_t n, std::uint64_t seed) {
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
  dpgrad::keep_freed_memory();  // reuse what each step frees (docs/library.md, "Speed")
  const dpgrad::Batch train = my_data(20000, 1), test = my_data(2000, 2);
  dpgrad::FastRng init(7);
  auto model = dpgrad::make_mlp<float>({20, 64, 3}, dpgrad::Activation::relu, init);
  dpgrad::Sgd sgd(model->parameters(), 0.5, 0.9);
  dpgrad::PrivateTrainingConfig config;
  config.target_epsilon = 2;
  config.epochs = 10;
  config.batch_size = 500;
  dpgrad::PrivateTrainer trainer(*model, sgd, train, config);
  dpgrad::TrainHooksT<float> hooks;
  hooks.on_epoch = [&trainer](const dpgrad::EpochReport& e) {  // epsilon rounded up, never below the truth
    std::printf("epoch %ld: test accuracy %.2f%%, %s\n", e.epoch, 100 * e.evaluation->accuracy,
                trainer.privacy_statement(e.epsilon).c_str());
  };
  trainer.train(hooks, &test);
  const double accuracy = trainer.evaluate(test).accuracy;
  std::printf("final: test accuracy %.2f%% at %s, sigma %.4f\n", 100 * accuracy, trainer.privacy_statement().c_str(),
              trainer.noise_multiplier());
  return accuracy > 0.8 && trainer.epsilon() <= 2.0 ? 0 : 1;
}
