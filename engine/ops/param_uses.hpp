// What a parametric op with a weight and an optional bias keeps for the
// per-sample rules (not installed): its uses of W and b on the tape, which
// share one output cotangent, and whether backward must still form the summed
// parameter gradients. Shared by linear and conv2d_direct.
#pragma once

#include <memory>
#include <numeric>
#include <span>

#include <xtensor/xmanipulation.hpp>

#include "engine/tape.hpp"

namespace dpgrad::detail {

template <class T>
struct WeightBiasUses {
  ParamUse<T>* w = nullptr;
  ParamUse<T>* b = nullptr;
  bool param_grads = true;
  std::size_t moved_axis = 0;  // > 0: the uses keep x and delta with this axis moved to the front

  /// From Op::on_record, inputs (x, W[, b]): notes the uses of those that are
  /// parameters, W's as `kind` with x as its input; both note where x's
  /// samples are (the output's rows are x's).
  void record(TapeT<T>& tape, std::span<const std::shared_ptr<Node<T>>> in, UseKind kind, bool has_bias,
              const char* op) {
    if (!tape.records_uses()) return;
    param_grads = tape.param_grads();
    Samples samples = in[0]->samples;
    std::shared_ptr<Node<T>> input = in[0];
    // a matmul row by row over the leading axes, with the samples on one of
    // them (time-major): the rules see x with that axis first, which puts
    // each sample's rows together (docs/per-sample.md)
    const bool movable = kind == UseKind::matmul && samples.kind == Samples::Kind::axis && samples.axis > 0 &&
                         samples.axis + 1 < in[0]->value.dimension();
    if (movable && (in[1]->is_parameter || (has_bias && in[2]->is_parameter))) {
      moved_axis = samples.axis;
      input = std::make_shared<Node<T>>();
      input->value = to_front(in[0]->value);
      samples.axis = 0;
      input->samples = samples;
    }
    if (in[1]->is_parameter) {
      w = tape.add_use(in[1], kind);
      w->input = input;
      w->op = op;
      w->samples = samples;
    }
    if (has_bias && in[2]->is_parameter) {
      b = tape.add_use(in[2], UseKind::bias);
      b->op = op;
      b->samples = samples;
    }
  }
  /// a with axis moved_axis first, the others in order (a contiguous copy).
  ArrayT<T> to_front(const ArrayT<T>& a) const {
    std::vector<std::size_t> perm(a.dimension());
    std::iota(perm.begin(), perm.end(), std::size_t(0));
    perm.erase(perm.begin() + std::ptrdiff_t(moved_axis));
    perm.insert(perm.begin(), moved_axis);
    return xt::transpose(a, perm);
  }
  /// Backward forms dW (db) unless the per-sample rules build it from the use.
  bool wants_weight_grad() const { return param_grads || !w; }
  bool wants_bias_grad() const { return param_grads || !b; }
  bool keeps_output_grad() const { return w || b; }
  void keep_output_grad(const std::shared_ptr<const ArrayT<T>>& dout) {
    const auto kept = moved_axis ? std::make_shared<const ArrayT<T>>(to_front(*dout)) : dout;
    if (w) w->delta = kept;
    if (b) b->delta = kept;
  }
};

}  // namespace dpgrad::detail
