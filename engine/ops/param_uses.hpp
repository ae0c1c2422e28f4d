// What a parametric op with a weight and an optional bias keeps for the
// per-sample rules (not installed): its uses of W and b on the tape, which
// share one output cotangent, and whether backward must still form the summed
// parameter gradients. Shared by linear and conv2d_direct.
#pragma once

#include <memory>
#include <span>

#include "engine/tape.hpp"

namespace dpgrad::detail {

template <class T>
struct WeightBiasUses {
  ParamUse<T>* w = nullptr;
  ParamUse<T>* b = nullptr;
  bool param_grads = true;

  /// From Op::on_record, inputs (x, W[, b]): notes the uses of those that are
  /// parameters, W's as `kind` with x as its input; both note where x's
  /// samples are (the output's rows are x's).
  void record(TapeT<T>& tape, std::span<const std::shared_ptr<Node<T>>> in, UseKind kind, bool has_bias,
              const char* op) {
    if (!tape.records_uses()) return;
    param_grads = tape.param_grads();
    const Samples samples = in[0]->samples;
    if (in[1]->is_parameter) {
      w = tape.add_use(in[1], kind);
      w->input = in[0];
      w->op = op;
      w->samples = samples;
    }
    if (has_bias && in[2]->is_parameter) {
      b = tape.add_use(in[2], UseKind::bias);
      b->op = op;
      b->samples = samples;
    }
  }
  /// Backward forms dW (db) unless the per-sample rules build it from the use.
  bool wants_weight_grad() const { return param_grads || !w; }
  bool wants_bias_grad() const { return param_grads || !b; }
  bool keeps_output_grad() const { return w || b; }
  void keep_output_grad(const std::shared_ptr<const ArrayT<T>>& dout) {
    if (w) w->delta = dout;
    if (b) b->delta = dout;
  }
};

}  // namespace dpgrad::detail
