// Users' layers that move or mix the samples: a time-major Dense, a time-major
// attention-like block, and batch statistics (before and after a Dense). Every
// exact route must refuse them with an error naming the op and the parameter,
// or agree with the per-example loop; never give other norms. Batches of
// B = 2 (dividing T = 4) and B = 3 (not dividing it), in double precision.
#include <cmath>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "layers/dense.hpp"
#include "layers/models.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;

namespace {

constexpr std::size_t kSteps = 4, kIn = 3, kHidden = 5, kClasses = 3;

/// (B, T, d) to (T, B, d) and back.
D swap01(const D& x) { return transpose(x, {1, 0, 2}); }

/// x (B, T, d) -> time-major (T, B, d) -> Dense -> tanh -> back to (B, T, h) -> mean over T -> Dense.
class TimeMajorDense final : public ModelT<double> {
 public:
  explicit TimeMajorDense(Rng& rng) : dense_(kIn, kHidden, rng, "dense"), out_(kHidden, kClasses, rng, "out") {}
  D forward(const BatchT<double>& b) override {
    D h = tanh(dense_.forward(swap01(per_sample_input(b.inputs))));  // (T, B, h)
    return out_.forward(mean(swap01(h), {1}));
  }
  std::vector<D> parameters() const override {
    std::vector<D> p = dense_.parameters();
    for (auto& q : out_.parameters()) p.push_back(q);
    return p;
  }
  std::string name() const override { return "time-major dense"; }

 private:
  DenseT<double> dense_, out_;
};

/// Single-head self-attention computed time-major, with only elementwise ops,
/// reductions and reshapes: q, k, v (T, B, d); scores s[t, u, b] = <q[t, b], k[u, b]>;
/// softmax over u; out[t, b] = sum_u a[t, u, b] v[u, b]. Then mean over T and a Dense.
class TimeMajorAttention final : public ModelT<double> {
 public:
  explicit TimeMajorAttention(Rng& rng)
      : q_(kIn, kHidden, rng, "query"), k_(kIn, kHidden, rng, "key"), v_(kIn, kHidden, rng, "value"),
        out_(kHidden, kClasses, rng, "out") {}
  D forward(const BatchT<double>& b) override {
    const std::size_t B = b.inputs.shape()[0];
    D x = swap01(per_sample_input(b.inputs));  // (T, B, d)
    D q = reshape(q_.forward(x), {kSteps, 1, B, kHidden});
    D k = reshape(k_.forward(x), {1, kSteps, B, kHidden});
    D v = reshape(v_.forward(x), {1, kSteps, B, kHidden});
    D s = sum(mul(q, k), {3}, true);                             // (T, T, B, 1)
    D a = exp(sub(s, log(sum(exp(s), {1}, true))));              // softmax over u
    D o = sum(mul(a, v), {1});                                   // (T, B, h)
    return out_.forward(mean(swap01(o), {1}));
  }
  std::vector<D> parameters() const override {
    std::vector<D> p;
    for (const auto* l : {&q_, &k_, &v_, &out_})
      for (auto& w : l->parameters()) p.push_back(w);
    return p;
  }
  std::string name() const override { return "time-major attention"; }

 private:
  DenseT<double> q_, k_, v_, out_;
};

/// Batch statistics: h - mean over the batch, on the inputs (before the first
/// Dense), on its output (between the Dense layers) or on the logits (after
/// both): x (B, T, d) flattened to (B, T d).
enum class Centred { inputs, hidden, logits };
class BatchCentred final : public ModelT<double> {
 public:
  BatchCentred(Rng& rng, Centred where)
      : where_(where), dense_(kSteps * kIn, kHidden, rng, "dense"), out_(kHidden, kClasses, rng, "out") {}
  D forward(const BatchT<double>& b) override {
    const std::size_t B = b.inputs.shape()[0];
    D x = reshape(per_sample_input(b.inputs), {B, kSteps * kIn});
    auto centre = [](const D& h) { return sub(h, mean(h, {0}, true)); };
    if (where_ == Centred::inputs) x = centre(x);
    D h = dense_.forward(x);
    if (where_ == Centred::hidden) h = centre(h);
    D logits = out_.forward(tanh(h));
    return where_ == Centred::logits ? centre(logits) : logits;
  }
  std::vector<D> parameters() const override {
    std::vector<D> p = dense_.parameters();
    for (auto& q : out_.parameters()) p.push_back(q);
    return p;
  }
  std::string name() const override { return "batch-centred"; }

 private:
  Centred where_;
  DenseT<double> dense_, out_;
};

BatchT<double> sequences(std::size_t b, Rng& rng) {
  BatchT<double> batch;
  batch.inputs = randn<double>({b, kSteps, kIn}, rng);
  for (std::size_t i = 0; i < b; ++i) batch.labels.push_back(std::int32_t(rng.below(kClasses)));
  return batch;
}

/// Every route refused with all of `fragments` in its message, or agrees with the loop.
PerSampleCheck refused_or_exact(ModelT<double>& model, std::size_t b, Rng& rng,
                                const std::vector<std::string>& fragments, bool must_refuse) {
  CAPTURE(model.name());
  CAPTURE(b);
  PerSampleCheck check = check_per_sample(model, sequences(b, rng));
  INFO(check.str());
  CHECK(check.routes.size() == 4);
  CHECK(check.never_silently_wrong(1e-9));
  for (const auto& r : check.routes) {
    CAPTURE(r.name);
    if (must_refuse) CHECK(r.refused);
    if (!r.refused) continue;
    for (const auto& f : fragments) {
      INFO("fragment: " << f);
      CHECK(r.error.find(f) != std::string::npos);
    }
  }
  return check;
}

}  // namespace

TEST_CASE("batch axis: a time-major Dense is refused or exact, whether or not B divides T") {
  for (std::size_t b : {2, 3}) {
    FastRng init(1), data(2 + b);
    TimeMajorDense model(init);
    PerSampleCheck c = refused_or_exact(
        model, b, data, {"parameter 'dense.", "used by linear on an input whose per-sample axis is 1, not 0"}, false);
    // linear handles it: its uses keep x and delta with the samples moved to axis 0
    INFO(c.str());
    CHECK(c.agrees(1e-9));
  }
}

TEST_CASE("batch axis: a time-major attention block is refused or exact") {
  for (std::size_t b : {2, 3}) {
    FastRng init(3), data(4 + b);
    TimeMajorAttention model(init);
    PerSampleCheck c = refused_or_exact(model, b, data, {"used by linear on an input whose per-sample axis is 1, not 0"}, false);
    INFO(c.str());
    CHECK(c.agrees(1e-9));
  }
}

TEST_CASE("batch axis: batch statistics are refused, wherever they are taken") {
  for (std::size_t b : {2, 3}) {
    FastRng init(5), data(6 + b);
    BatchCentred inputs(init, Centred::inputs);
    refused_or_exact(inputs, b, data, {"parameter 'dense.weight' is used by linear on an input that mixes samples", "GroupNorm"}, true);
    BatchCentred hidden(init, Centred::hidden);
    refused_or_exact(hidden, b, data, {"parameter 'out.weight' is used by linear on an input that mixes samples", "GroupNorm"}, true);
    BatchCentred logits(init, Centred::logits);
    refused_or_exact(logits, b, data, {"per-sample losses", "mixed samples", "GroupNorm"}, true);
  }
}

TEST_CASE("batch axis: the same layers batch-major agree with the per-example loop") {
  // the time-major Dense without the transposes: Dense over (B, T, d) is row by row
  class BatchMajorDense final : public ModelT<double> {
   public:
    explicit BatchMajorDense(Rng& rng) : dense_(kIn, kHidden, rng, "dense"), out_(kHidden, kClasses, rng, "out") {}
    D forward(const BatchT<double>& b) override {
      return out_.forward(mean(tanh(dense_.forward(per_sample_input(b.inputs))), {1}));
    }
    std::vector<D> parameters() const override {
      std::vector<D> p = dense_.parameters();
      for (auto& q : out_.parameters()) p.push_back(q);
      return p;
    }
    std::string name() const override { return "batch-major dense"; }

   private:
    DenseT<double> dense_, out_;
  };
  for (std::size_t b : {2, 3}) {
    FastRng init(7), data(8 + b);
    BatchMajorDense model(init);
    PerSampleCheck check = check_per_sample(model, sequences(b, data));
    INFO(check.str());
    CHECK(check.agrees(1e-9));
  }
}

namespace {

/// Self-attention laid out as PyTorch 1.13 exports nn.MultiheadAttention,
/// sequence-first: x (B, T, d) -> (T, B, d); q, k, v by one linear each;
/// (T, B, d) -> (T, B heads, d / heads) -> (B heads, T, d / heads) (the batch
/// outer); scores, softmax, mixing; -> (T, B heads, d / heads) -> (T B, d)
/// (the batch inner) -> the output projection -> (T, B, d) -> (B, T, d); then
/// mean over T and a Dense.
class SequenceFirstAttention final : public ModelT<double> {
 public:
  static constexpr std::size_t kHeads = 2, kDim = 4;
  explicit SequenceFirstAttention(Rng& rng)
      : in_(kIn, kDim, rng, "in"), q_(kDim, kDim, rng, "query"), k_(kDim, kDim, rng, "key"),
        v_(kDim, kDim, rng, "value"), proj_(kDim, kDim, rng, "out_proj"), out_(kDim, kClasses, rng, "out") {}
  D forward(const BatchT<double>& b) override {
    const std::size_t B = b.inputs.shape()[0], T = kSteps, dk = kDim / kHeads;
    D x = transpose(in_.forward(per_sample_input(b.inputs)), {1, 0, 2});  // (T, B, d)
    auto heads = [&](const D& t) { return transpose(reshape(t, {T, B * kHeads, dk}), {1, 0, 2}); };
    D q = heads(q_.forward(x)), k = heads(k_.forward(x)), v = heads(v_.forward(x));  // (B heads, T, dk)
    D mixed = matmul(softmax(scale(matmul(q, k, true), 1 / std::sqrt(double(dk))), 2), v);  // (B heads, T, dk)
    D rows = reshape(transpose(mixed, {1, 0, 2}), {T * B, kDim});  // (T B, d): the batch inner
    D y = transpose(reshape(proj_.forward(rows), {T, B, kDim}), {1, 0, 2});  // (B, T, d)
    return out_.forward(mean(tanh(y), {1}));
  }
  std::vector<D> parameters() const override {
    std::vector<D> p;
    for (const auto* l : {&in_, &q_, &k_, &v_, &proj_, &out_})
      for (auto& w : l->parameters()) p.push_back(w);
    return p;
  }
  std::string name() const override { return "sequence-first attention"; }

 private:
  DenseT<double> in_, q_, k_, v_, proj_, out_;
};

/// A reshape that mixes: (B, T, d) -> (T, B, d) -> (B, T d) as a reshape (not a
/// transpose), then a Dense: row i of the result holds parts of several samples.
class MixingReshape final : public ModelT<double> {
 public:
  explicit MixingReshape(Rng& rng) : dense_(kSteps * kIn, kClasses, rng, "dense") {}
  D forward(const BatchT<double>& b) override {
    const std::size_t B = b.inputs.shape()[0];
    D x = transpose(per_sample_input(b.inputs), {1, 0, 2});  // (T, B, d)
    return dense_.forward(tanh(reshape(x, {B, kSteps * kIn})));
  }
  std::vector<D> parameters() const override { return dense_.parameters(); }
  std::string name() const override { return "mixing reshape"; }

 private:
  DenseT<double> dense_;
};

}  // namespace

TEST_CASE("batch axis: attention exported sequence-first, with the batch merged outer and inner, is exact") {
  for (std::size_t b : {2, 3}) {
    FastRng init(9), data(10 + b);
    SequenceFirstAttention model(init);
    BatchT<double> batch = sequences(b, data);
    PerSampleCheck check = check_per_sample(model, batch);
    INFO(check.str());
    CHECK(check.agrees(1e-9));
  }
}

TEST_CASE("batch axis: a reshape that mixes samples is refused by every exact route") {
  for (std::size_t b : {2, 3}) {  // 2 divides T = 4 (rows hold two samples each), 3 does not
    FastRng init(11), data(12 + b);
    MixingReshape model(init);
    refused_or_exact(model, b, data, {"parameter 'dense."}, true);
  }
}
