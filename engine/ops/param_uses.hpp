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
  bool moved = false;          // the uses keep x and delta with the samples moved to the front
  Samples where;               // moved: where x's (and so delta's) samples are

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
    // them (time-major), or interleaved with another axis (the batch inner of
    // (L B, d)): the rules see x with the samples moved to the front, which
    // puts each sample's rows together (docs/per-sample.md)
    const bool movable = kind == UseKind::matmul && samples.kind == Samples::Kind::axis &&
                         samples.axis + 1 < in[0]->value.dimension() && (samples.axis > 0 || samples.outer > 1);
    if (movable && (in[1]->is_parameter || (has_bias && in[2]->is_parameter))) {
      where = samples;
      moved = !samples_to_front(samples, shape_of(in[0]->value)).identity;
      if (moved) {
        input = std::make_shared<Node<T>>();
        input->value = to_front(in[0]->value);
      }
      samples = Samples::at(0, samples.count);
      if (moved) input->samples = samples;
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
  /// a (x, or delta: the same axes but the last) with its samples in front, a contiguous copy.
  ArrayT<T> to_front(const ArrayT<T>& a) const {
    const SamplesToFront order = samples_to_front(where, shape_of(a));
    return xt::transpose(xt::reshape_view(a, order.split), order.perm);
  }
  /// Backward forms dW (db) unless the per-sample rules build it from the use.
  bool wants_weight_grad() const { return param_grads || !w; }
  bool wants_bias_grad() const { return param_grads || !b; }
  bool keeps_output_grad() const { return w || b; }
  void keep_output_grad(const std::shared_ptr<const ArrayT<T>>& dout) {
    const auto kept = moved ? std::make_shared<const ArrayT<T>>(to_front(*dout)) : dout;
    if (w) w->delta = kept;
    if (b) b->delta = kept;
  }
};

}  // namespace dpgrad::detail
