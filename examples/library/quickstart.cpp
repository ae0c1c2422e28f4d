// The README's example: an MLP trained privately on Fashion-MNIST to epsilon 3.
#include <dpgrad/dpgrad.hpp>

#include <cstdio>

int main() {
  auto data = dpgrad::data::load_dataset("fashion-mnist");  // or a dpgrad::Batch of your own
  dpgrad::FastRng init(1);
  auto model = dpgrad::make_mlp<float>({784, 256, 10}, dpgrad::Activation::relu, init);
  dpgrad::Sgd sgd(model->parameters(), 0.5, 0.9);
  dpgrad::PrivateTrainingConfig config;
  config.target_epsilon = 3;
  config.epochs = 5;
  config.batch_size = 1024;
  dpgrad::PrivateTrainer trainer(*model, sgd, data.train, config);
  trainer.train();
  const auto test = trainer.evaluate(data.test);
  std::printf("test accuracy %.2f%% at %s\n", 100 * test.accuracy, trainer.privacy_statement().c_str());
}
