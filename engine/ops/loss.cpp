// Per-sample softmax cross-entropy, computed with the row max subtracted so
// large logits neither overflow nor lose the loss to rounding.
#include <cmath>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad {
namespace {

template <class T>
struct CrossEntropyOp final : Op<T> {
  std::vector<std::int32_t> labels;
  ArrayT<T> probs;  // (B, C) softmax, kept for both rules
  const char* name() const override { return "cross_entropy"; }
  /// One loss per row of the logits.
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    return detail::rows_of_first(in, x);
  }

  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& z = *x[0];
    if (z.dimension() != 2 || z.shape()[0] != labels.size())
      throw std::invalid_argument("cross_entropy: logits " + detail::shape_str(shape_of(z)) + " need shape (B, C) with B = " +
                                  std::to_string(labels.size()) + " labels");
    std::size_t b = z.shape()[0], c = z.shape()[1];
    probs = ArrayT<T>::from_shape({b, c});
    ArrayT<T> loss = ArrayT<T>::from_shape({b});
    for (std::size_t i = 0; i < b; ++i) {
      std::int32_t y = labels[i];
      if (y < 0 || std::size_t(y) >= c)
        throw std::invalid_argument("cross_entropy: label " + std::to_string(y) + " outside [0, " + std::to_string(c) + ")");
      const T* zi = z.data() + i * c;
      T* pi = probs.data() + i * c;
      T mx = zi[0];
      for (std::size_t j = 1; j < c; ++j) mx = std::max(mx, zi[j]);
      T s = 0;
      for (std::size_t j = 0; j < c; ++j) s += (pi[j] = std::exp(zi[j] - mx));
      for (std::size_t j = 0; j < c; ++j) pi[j] /= s;
      loss(i) = std::log(s) + mx - zi[y];
    }
    return loss;
  }
  void vjp(const ArrayT<T>& dout, Values<T>, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    ArrayT<T> g = probs;
    std::size_t b = g.shape()[0], c = g.shape()[1];
    for (std::size_t i = 0; i < b; ++i) {
      T* gi = g.data() + i * c;
      gi[labels[i]] -= T(1);
      for (std::size_t j = 0; j < c; ++j) gi[j] *= dout(i);
    }
    dx[0].add(g);
  }
  ArrayT<T> jvp(Values<T>, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    std::size_t b = probs.shape()[0], c = probs.shape()[1];
    ArrayT<T> r = ArrayT<T>::from_shape({k, b});
    for (std::size_t j = 0; j < k; ++j)
      for (std::size_t i = 0; i < b; ++i) {
        const T* zd = dot[0]->data() + (j * b + i) * c;
        const T* pi = probs.data() + i * c;
        T s = 0;
        for (std::size_t l = 0; l < c; ++l) s += pi[l] * zd[l];
        r(j, i) = s - zd[labels[i]];
      }
    return r;
  }
};

}  // namespace

template <class T>
TensorT<T> cross_entropy(const TensorT<T>& logits, const std::vector<std::int32_t>& labels) {
  auto op = std::make_unique<CrossEntropyOp<T>>();
  op->labels = labels;
  return apply<T>(std::move(op), {logits});
}

template <class T>
TensorT<T> mean_cross_entropy(const TensorT<T>& logits, const std::vector<std::int32_t>& labels) {
  return mean(cross_entropy(logits, labels));
}

template TensorT<float> cross_entropy(const TensorT<float>&, const std::vector<std::int32_t>&);
template TensorT<double> cross_entropy(const TensorT<double>&, const std::vector<std::int32_t>&);
template TensorT<float> mean_cross_entropy(const TensorT<float>&, const std::vector<std::int32_t>&);
template TensorT<double> mean_cross_entropy(const TensorT<double>&, const std::vector<std::int32_t>&);

}  // namespace dpgrad
