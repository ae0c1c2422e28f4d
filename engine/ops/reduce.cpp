// Sum over axes (mean is a composite): d sum = 1, broadcast back over the axes.
#include <algorithm>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"

namespace dpgrad {
namespace {

template <class T>
struct SumOp final : Op<T> {
  std::vector<std::size_t> axes;  // sorted, unique, all when given empty
  bool keepdims = false;
  Shape kept;                     // the output shape with the summed axes kept as 1
  const char* name() const override { return "sum"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    return samples_reduced(in[0], axes, keepdims, x[0]->dimension());
  }

  void resolve(const Shape& xs) {
    if (axes.empty())
      for (std::size_t i = 0; i < xs.size(); ++i) axes.push_back(i);
    std::sort(axes.begin(), axes.end());
    axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
    for (auto a : axes)
      if (a >= xs.size())
        throw std::invalid_argument("sum: axis " + std::to_string(a) + " out of range for shape " +
                                    detail::shape_str(xs));
    kept = xs;
    for (auto a : axes) kept[a] = 1;
  }
  ArrayT<T> forward(Values<T> x) override {
    const Shape xs = shape_of(*x[0]);
    resolve(xs);
    std::vector<bool> reduced(xs.size(), false);
    Shape out;
    for (auto a : axes) reduced[a] = true;
    for (std::size_t i = 0; i < xs.size(); ++i)
      if (!reduced[i]) out.push_back(xs[i]);
    return detail::sum_axes(*x[0], reduced, keepdims ? kept : out);
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0]) return;
    ArrayT<T> d = dout;  // (the kept shape: a few values)
    d.reshape(kept);
    dx[0].add(detail::expand(d, shape_of(*x[0])));
  }
  ArrayT<T> jvp(Values<T>, Tangents<T> d, const ArrayT<T>&, std::size_t) override {
    std::vector<std::size_t> shifted;
    for (auto a : axes) shifted.push_back(a + 1);
    ArrayT<T> r = xt::sum(*d[0], shifted);
    if (keepdims) r.reshape(detail::with_k(d[0]->shape()[0], kept));
    return r;
  }
};

}  // namespace

template <class T>
TensorT<T> sum(const TensorT<T>& x, std::vector<std::size_t> axes, bool keepdims) {
  auto op = std::make_unique<SumOp<T>>();
  op->axes = std::move(axes);
  op->keepdims = keepdims;
  return apply<T>(std::move(op), {x});
}

template <class T>
TensorT<T> mean(const TensorT<T>& x, std::vector<std::size_t> axes, bool keepdims) {
  Shape xs = x.shape();
  std::size_t count = 1;
  if (axes.empty()) count = x.size();
  else
    for (auto a : axes) count *= a < xs.size() ? xs[a] : 1;
  TensorT<T> s = sum(x, std::move(axes), keepdims);
  return count == 0 ? s : scale(s, T(1) / T(count));
}

template TensorT<float> sum(const TensorT<float>&, std::vector<std::size_t>, bool);
template TensorT<double> sum(const TensorT<double>&, std::vector<std::size_t>, bool);
template TensorT<float> mean(const TensorT<float>&, std::vector<std::size_t>, bool);
template TensorT<double> mean(const TensorT<double>&, std::vector<std::size_t>, bool);

}  // namespace dpgrad
