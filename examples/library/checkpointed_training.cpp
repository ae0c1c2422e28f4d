// A private run that survives being killed: epochs, a test evaluation each
// epoch, checkpoints, and resume. Run it, kill it at any moment, run it again:
// it continues the same run and ledger. The trainer saves each epoch's
// checkpoint before on_epoch sees the epoch, so nothing shown is ever re-drawn.
#include <dpgrad/dpgrad.hpp>

#include <cstdio>
#include <filesystem>

int main(int argc, char** argv) {
  using namespace dpgrad;
  const std::filesystem::path dir = argc > 1 ? argv[1] : "checkpointed-training";
  const Batch train = data::synthetic_images(2048, 1), test = data::synthetic_images(512, 2);
  FastRng init(3);
  auto model = make_mlp<float>({784, 32, 10}, Activation::relu, init);
  Sgd sgd(model->parameters(), 0.5, 0.9);
  PrivateTrainingConfig config;
  config.target_epsilon = 4;
  config.epochs = 8;
  config.batch_size = 128;
  config.checkpoints.dir = dir;
  config.checkpoints.resume = CheckpointDir(dir).has_checkpoint();  // continue a killed run
  config.reproducible_noise = argc > 2;  // by name only: NOT private (tests compare runs bit for bit)
  PrivateTrainer trainer(*model, sgd, train, config);
  TrainHooksT<float> hooks;
  hooks.on_epoch = [&trainer](const EpochReport& e) {
    std::printf("epoch %ld step %ld: test accuracy %.2f%%, %s\n", e.epoch, e.steps, 100 * e.evaluation->accuracy,
                trainer.privacy_statement(e.epsilon).c_str());
    std::fflush(stdout);
  };
  const TrainResult result = trainer.train(hooks, &test);
  std::printf("%s; %s\n", result.message.c_str(), trainer.privacy_statement(result.epsilon).c_str());
  return 0;
}
