// A program of about 100 lines, as a new user writes one against the installed
// library: a layer of their own, the per-sample check, a regression loss,
// physical batches, checkpoints and resume. `./dev bench` times its compile,
// with and without the precompiled header (docs/library.md, "Compile time").
#include <dpgrad/dpgrad.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace {

// A residual block of one's own: y = x + tanh(x W + b) * g, g a learned gain per output.
class Residual final : public dpgrad::LayerT<float> {
 public:
  Residual(std::size_t width, dpgrad::Rng& rng)
      : dense_(width, width, rng, "residual.dense"),
        gain_(dpgrad::make_parameter<float>("residual.gain", xt::ones<float>({width}))) {}
  dpgrad::TensorT<float> forward(const dpgrad::TensorT<float>& x) override {
    return dpgrad::add(x, dpgrad::mul(dpgrad::tanh(dense_.forward(x)), gain_));
  }
  std::vector<dpgrad::TensorT<float>> parameters() const override {
    auto p = dense_.parameters();
    p.push_back(gain_);
    return p;
  }

 private:
  dpgrad::DenseT<float> dense_;
  dpgrad::TensorT<float> gain_;
};

// y = sin(x_0) + x_1 x_2 / 2 + noise: a regression task on 8 features.
dpgrad::Batch regression_data(std::size_t n, std::uint64_t seed) {
  dpgrad::FastRng rng(seed);
  dpgrad::Batch b;
  b.inputs = dpgrad::Array::from_shape({n, 8});
  b.targets = dpgrad::Array::from_shape({n, 1});
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < 8; ++j) b.inputs(i, j) = float(rng.normal());
    b.targets(i, 0) = std::sin(b.inputs(i, 0)) + 0.5f * b.inputs(i, 1) * b.inputs(i, 2) + 0.1f * float(rng.normal());
    b.ids.push_back(std::int64_t(seed * 1000000 + i));
  }
  return b;
}

std::unique_ptr<dpgrad::FeatureModelT<float>> make_model(std::uint64_t seed) {
  dpgrad::FastRng rng(seed);
  dpgrad::SequentialT<float> net;
  net.emplace<dpgrad::DenseT<float>>(8, 32, rng, "in");
  net.add(std::make_unique<Residual>(32, rng));
  net.emplace<dpgrad::DenseT<float>>(32, 1, rng, "out");
  auto model = std::make_unique<dpgrad::FeatureModelT<float>>("residual-mlp", std::move(net));
  model->set_loss(dpgrad::mse_loss<float>());
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : "residual-regression-run";
  const dpgrad::Batch train = regression_data(4000, 1), test = regression_data(1000, 2);
  auto model = make_model(3);

  // every exact strategy's per-sample gradients against the per-example loop, on a few records
  const dpgrad::PerSampleCheck check = dpgrad::check_per_sample(*model, train.select({0, 1, 2, 3, 4, 5}));
  if (!check.agrees(1e-3)) {
    std::printf("the per-sample check failed:\n%s\n", check.str().c_str());
    return 1;
  }

  dpgrad::Adam adam(model->parameters(), 0.005);
  dpgrad::PrivateTrainingConfig config;
  config.target_epsilon = 4;
  config.epochs = 4;
  config.batch_size = 400;
  config.physical_batch_size = 100;  // memory for 100 examples' per-sample work at a time
  config.checkpoints.dir = dir;
  config.checkpoints.resume = dpgrad::CheckpointDir(dir).has_checkpoint();
  dpgrad::PrivateTrainer trainer(*model, adam, train, config);
  dpgrad::TrainHooksT<float> hooks;
  hooks.on_epoch = [&trainer](const dpgrad::EpochReport& e) {
    std::printf("epoch %ld: test MSE %.4f, %s\n", e.epoch, e.evaluation->metric("mse"),
                trainer.privacy_statement(e.epsilon).c_str());
  };
  const dpgrad::TrainResult result = trainer.train(hooks, &test);
  const double mse = trainer.evaluate(test).metric("mse");
  std::printf("%s; test MSE %.4f at %s\n", result.message.c_str(), mse, trainer.privacy_statement().c_str());
  return std::isfinite(mse) ? 0 : 1;
}
