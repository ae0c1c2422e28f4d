// Compiled by `./dev test` against the staged install three times: with the
// package's flags, with -march=native added, and without xsimd. Each program
// trains a few private steps with reproducible noise and prints its final
// parameters' bits; the three outputs must be equal (docs/library.md, "Portable
// builds"). It also checks that its arrays have the library's type and alignment.
#include <dpgrad/dpgrad.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

namespace {

// Some xtensor work of the program's own, instantiated in this translation unit
// with whatever flags it was given: data, and a standardisation of it.
dpgrad::Batch make_data(std::size_t n, std::uint64_t seed) {
  dpgrad::FastRng rng(seed);
  dpgrad::Batch b;
  b.inputs = dpgrad::Array::from_shape({n, 12});
  b.labels.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < 12; ++j) b.inputs(i, j) = float(rng.normal()) + (j % 3 == i % 3 ? 1.5f : 0.0f);
    b.labels[i] = i % 3;
    b.ids.push_back(std::int64_t(seed * 100000 + i));
  }
  dpgrad::Array mean = xt::mean(b.inputs, {0});
  b.inputs = (b.inputs - mean) * 0.5f;
  return b;
}

}  // namespace

int main() {
  static_assert(std::is_same_v<dpgrad::Array, xt::xarray<float, xt::layout_type::row_major, dpgrad::Allocator<float>>>);
  const dpgrad::Batch train = make_data(600, 1);
  if (reinterpret_cast<std::uintptr_t>(train.inputs.data()) % DPGRAD_ARRAY_ALIGNMENT != 0) {
    std::printf("an array's storage is not %d-byte aligned\n", DPGRAD_ARRAY_ALIGNMENT);
    return 1;
  }
  dpgrad::FastRng init(2);
  auto model = dpgrad::make_mlp<float>({12, 16, 3}, dpgrad::Activation::tanh, init);
  dpgrad::Sgd sgd(model->parameters(), 0.2, 0.9);
  dpgrad::PrivateTrainingConfig config;
  config.noise_multiplier = 1.0;
  config.epochs = 2;
  config.batch_size = 100;
  config.reproducible_noise = true;  // the same noise in every build: NOT private
  config.seed = 3;
  dpgrad::PrivateTrainer trainer(*model, sgd, train, config);
  trainer.train();
  // FNV-1a over every parameter's bits
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& p : model->parameters())
    for (float v : p.value()) {
      std::uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      for (int k = 0; k < 4; ++k) h = (h ^ ((bits >> (8 * k)) & 0xffu)) * 1099511628211ull;
    }
  std::printf("parameters' bits: %016llx; %s\n", static_cast<unsigned long long>(h), trainer.privacy_statement().c_str());
}
