// A layer of your own, written from engine ops (no derivative, no per-sample
// code), and the check that every exact clipping strategy gets its per-sample
// gradients right: check_per_sample compares them with the per-example loop.
#include <dpgrad/dpgrad.hpp>

#include <cstdio>

// A gated dense layer: y = tanh(x W1 + b1) * sigmoid(x W2 + b2).
class GatedDense final : public dpgrad::LayerT<double> {
 public:
  GatedDense(std::size_t in, std::size_t out, dpgrad::Rng& rng)
      : value_(in, out, rng, "gated.value"), gate_(in, out, rng, "gated.gate") {}
  dpgrad::TensorT<double> forward(const dpgrad::TensorT<double>& x) override {
    return dpgrad::mul(dpgrad::tanh(value_.forward(x)), dpgrad::sigmoid(gate_.forward(x)));
  }
  std::vector<dpgrad::TensorT<double>> parameters() const override {
    auto p = value_.parameters();
    for (auto& q : gate_.parameters()) p.push_back(q);
    return p;
  }

 private:
  dpgrad::DenseT<double> value_, gate_;
};

int main() {
  dpgrad::FastRng rng(3);
  dpgrad::SequentialT<double> net;
  net.add(std::make_unique<GatedDense>(12, 16, rng));
  net.emplace<dpgrad::DenseT<double>>(16, 4, rng, "out");
  dpgrad::FeatureModelT<double> model("gated", std::move(net));

  dpgrad::BatchT<double> batch;
  batch.inputs = dpgrad::ArrayT<double>::from_shape({6, 12});
  for (auto& v : batch.inputs) v = rng.normal();
  batch.labels = {0, 1, 2, 3, 0, 1};

  const dpgrad::PerSampleCheck check = dpgrad::check_per_sample(model, batch);
  std::printf("%s\n", check.str().c_str());
  std::printf("%s\n", check.agrees(1e-9) ? "every strategy agrees with the per-example loop"
                                         : "a strategy disagrees or refuses");
  return check.agrees(1e-9) ? 0 : 1;
}
