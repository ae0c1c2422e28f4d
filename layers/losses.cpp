// The per-sample losses of layers/losses.hpp, composed from engine ops.
#include "layers/losses.hpp"

#include <stdexcept>
#include <string>

#include "engine/array.hpp"
#include "engine/ops.hpp"

namespace dpgrad {

namespace {

/// The batch's targets as a constant of the outputs' shape; throws naming the loss.
template <class T>
TensorT<T> targets_like(const TensorT<T>& outputs, const BatchT<T>& batch, const char* loss) {
  if (batch.targets.dimension() == 0)
    throw std::invalid_argument(std::string(loss) + ": the batch has no targets (BatchT::targets)");
  if (shape_of(batch.targets) != shape_of(outputs.value()))
    throw std::invalid_argument(std::string(loss) + ": targets of shape " + shape_str(shape_of(batch.targets)) +
                                " for outputs of shape " + shape_str(shape_of(outputs.value())));
  return constant<T>(batch.targets);
}

/// The mean over every axis but the first: (R, ...) -> (R).
template <class T>
TensorT<T> row_mean(const TensorT<T>& x) {
  const std::size_t d = x.value().dimension();
  if (d < 1) throw std::invalid_argument("per-sample loss: outputs need a row axis");
  if (d == 1) return x;
  std::vector<std::size_t> axes;
  for (std::size_t a = 1; a < d; ++a) axes.push_back(a);
  return mean(x, axes);
}

}  // namespace

template <class T>
NamedLossT<T> cross_entropy_loss() {
  return {"cross_entropy", [](const TensorT<T>& outputs, const BatchT<T>& batch) {
    if (batch.labels.empty()) throw std::invalid_argument("cross_entropy_loss: the batch has no class labels");
    return cross_entropy(outputs, batch.labels);
  }};
}

template <class T>
NamedLossT<T> mse_loss() {
  return {"mse", [](const TensorT<T>& outputs, const BatchT<T>& batch) {
    const TensorT<T> diff = sub(outputs, targets_like(outputs, batch, "mse_loss"));
    return row_mean(mul(diff, diff));
  }};
}

template <class T>
NamedLossT<T> bce_with_logits_loss() {
  return {"bce_with_logits", [](const TensorT<T>& z, const BatchT<T>& batch) {
    const TensorT<T> y = targets_like(z, batch, "bce_with_logits_loss");
    for (const T v : batch.targets)
      if (!(v >= T(0) && v <= T(1)))
        throw std::invalid_argument("bce_with_logits_loss: targets must be in [0, 1], got " + std::to_string(double(v)));
    // softplus(z) = -log(1 - s(z)) = -log_softmax([z, 0])[1]: stable for any z and
    // smooth at 0, where max(z, 0) + log(1 + e^-|z|) would pass relu's and |z|'s
    // kinks on as a gradient of -y instead of s(0) - y (a zero-initialised head)
    Shape col = z.shape();
    col.push_back(1);
    const std::size_t last = col.size() - 1;
    const TensorT<T> pair = concat<T>({reshape(z, col), constant<T>(xt::zeros<T>(col))}, last);
    const TensorT<T> softplus = scale(reshape(slice(log_softmax(pair, last), last, 1, 2), z.shape()), T(-1));
    return row_mean(sub(softplus, mul(z, y)));
  }};
}

template NamedLossT<float> cross_entropy_loss<float>();
template NamedLossT<double> cross_entropy_loss<double>();
template NamedLossT<float> mse_loss<float>();
template NamedLossT<double> mse_loss<double>();
template NamedLossT<float> bce_with_logits_loss<float>();
template NamedLossT<double> bce_with_logits_loss<double>();

}  // namespace dpgrad
