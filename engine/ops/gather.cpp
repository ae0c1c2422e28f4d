// gather: rows of a table selected by integer ids (embedding lookup). The
// parametric op behind Embedding; records its uses for the per-sample rules.
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/tape.hpp"

namespace dpgrad {
namespace {

template <class T>
struct GatherOp final : Op<T> {
  std::shared_ptr<const std::vector<std::int32_t>> ids;  // flattened; -1 marks padding (no row, no gradient)
  Shape id_shape;
  std::size_t vocab = 0, p = 0;
  ParamUse<T>* use = nullptr;
  bool param_grads = true;
  const char* name() const override { return "gather"; }
  /// ids are the batch's tokens: (B, ...), one sample per index of axis 0.
  Samples samples(std::span<const Samples> in, Values<T>, const ArrayT<T>&) const override {
    if (in[0].kind == Samples::Kind::mixed) return in[0];
    if (!in[0].is_none())
      return Samples::mixed(MixedBy::What::product, "reads rows of a table that holds samples (" + in[0].str() + ")");
    if (id_shape.empty()) return Samples::none();
    return Samples::at(0, id_shape[0]);
  }

  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& w = *x[0];
    if (w.dimension() != 2) throw std::invalid_argument("gather: table must be (V, p), got " + detail::shape_str(shape_of(w)));
    vocab = w.shape()[0];
    p = w.shape()[1];
    Shape os = id_shape;
    os.push_back(p);
    ArrayT<T> out = ArrayT<T>::from_shape(os);
    for (std::size_t i = 0; i < ids->size(); ++i) {
      std::int32_t id = (*ids)[i];
      if (id == -1) {
        std::fill_n(out.data() + i * p, p, T(0));
        continue;
      }
      if (id < 0 || std::size_t(id) >= vocab)
        throw std::invalid_argument("gather: id " + std::to_string(id) + " outside [0, " + std::to_string(vocab) + ")");
      std::copy_n(w.data() + std::size_t(id) * p, p, out.data() + i * p);
    }
    return out;
  }
  void vjp(const ArrayT<T>& dout, Values<T>, const ArrayT<T>&, Slots<T> dx) override {
    if (!dx[0] || (use && !param_grads)) return;
    bool fresh;
    ArrayT<T>& g = dx[0].buffer(fresh);
    if (fresh) g.fill(T(0));
    for (std::size_t i = 0; i < ids->size(); ++i) {
      if ((*ids)[i] < 0) continue;
      T* row = g.data() + std::size_t((*ids)[i]) * p;
      const T* src = dout.data() + i * p;
      for (std::size_t j = 0; j < p; ++j) row[j] += src[j];
    }
  }
  bool keeps_output_grad() const override { return use != nullptr; }
  void keep_output_grad(std::shared_ptr<const ArrayT<T>> dout) override { use->delta = std::move(dout); }
  ArrayT<T> jvp(Values<T>, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    std::size_t n = ids->size();
    for (std::size_t j = 0; j < k; ++j)
      for (std::size_t i = 0; i < n; ++i) {
        if ((*ids)[i] < 0) std::fill_n(r.data() + (j * n + i) * p, p, T(0));
        else std::copy_n(dot[0]->data() + (j * vocab + std::size_t((*ids)[i])) * p, p, r.data() + (j * n + i) * p);
      }
    return r;
  }
  void on_record(TapeT<T>& tape, std::span<const std::shared_ptr<Node<T>>> in) override {
    if (!tape.records_uses() || !in[0]->is_parameter) return;
    param_grads = tape.param_grads();
    use = tape.add_use(in[0], UseKind::gather);
    use->ids = ids;
    use->op = name();
    use->samples = id_shape.empty() ? Samples::none() : Samples::at(0, id_shape[0]);
  }
};

}  // namespace

template <class T>
TensorT<T> gather(const TensorT<T>& w, const ArrayT<std::int32_t>& ids, std::int32_t padding_id) {
  auto op = std::make_unique<GatherOp<T>>();
  auto flat = std::make_shared<std::vector<std::int32_t>>(ids.begin(), ids.end());
  for (auto& id : *flat) {
    if (id < 0) throw std::invalid_argument("gather: id " + std::to_string(id) + " is negative");
    if (id == padding_id) id = -1;
  }
  op->ids = flat;
  op->id_shape = shape_of(ids);
  return apply<T>(std::move(op), {w});
}

template TensorT<float> gather(const TensorT<float>&, const ArrayT<std::int32_t>&, std::int32_t);
template TensorT<double> gather(const TensorT<double>&, const ArrayT<std::int32_t>&, std::int32_t);

}  // namespace dpgrad
