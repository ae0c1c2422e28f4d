// The primitive interface: every op knows its primal (forward), its reverse
// rule (vjp) and its forward rule (jvp). apply() runs the primal, pushes
// tangents when inputs carry them, and records the op on the current tape.
#pragma once

#include <initializer_list>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "engine/tensor.hpp"

namespace dpgrad {

template <class T>
class TapeT;

/// Where a vjp accumulates one input's cotangent. Empty when that input needs none.
template <class T>
class GradSlot {
 public:
  GradSlot() = default;
  /// The slot of `node`'s gradient; a default-constructed slot is empty (false).
  /// shape() is the input's shape.
  explicit GradSlot(Node<T>* node) : node_(node) {}
  explicit operator bool() const { return node_ != nullptr; }
  const Shape shape() const { return shape_of(node_->value); }

  /// grad += e (the first contribution is assigned, not added to zeros).
  template <class E>
  void add(const E& e) {
    if (!node_->has_grad) {
      node_->grad = e;
      node_->has_grad = true;
    } else {
      node_->grad += e;
    }
  }
  /// grad += e for an array the caller gives up: the first contribution takes it
  /// without a copy.
  void add(ArrayT<T>&& e) {
    if (!node_->has_grad) {
      node_->grad = std::move(e);
      node_->has_grad = true;
    } else {
      node_->grad += e;
    }
  }
  /// For kernels that accumulate themselves (BLAS beta): returns the gradient
  /// buffer, allocated with the input's shape; `fresh` says it holds garbage.
  ArrayT<T>& buffer(bool& fresh) {
    fresh = !node_->has_grad;
    if (fresh) {
      node_->grad = ArrayT<T>::from_shape(node_->value.shape());
      node_->has_grad = true;
    }
    return node_->grad;
  }
  Node<T>* node() const { return node_; }

 private:
  Node<T>* node_ = nullptr;
};

template <class T>
using Values = std::span<const ArrayT<T>* const>;     // input values
template <class T>
using Tangents = std::span<const ArrayT<T>* const>;   // input tangents (k, ...); nullptr = zero
template <class T>
using Slots = std::span<GradSlot<T>>;                 // input cotangents

/// A primitive on arrays of T: its primal and its two rules. apply() runs it;
/// an op that apply() records belongs to the tape from then on.
template <class T>
struct Op {
  virtual ~Op() = default;
  /// The op's name ("matmul"), for error messages and profiles. It must outlive
  /// the op (a string literal): the tape keeps the pointer.
  virtual const char* name() const = 0;
  /// The primal. Ops may keep what their rules need (masks, indices) in members.
  virtual ArrayT<T> forward(Values<T> x) = 0;
  /// Reverse rule: accumulates dout^T J into the slots of inputs that want it.
  virtual void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) = 0;
  /// Forward rule: J x_dot for k tangents at once; returns (k, ...out shape).
  virtual ArrayT<T> jvp(Values<T> x, Tangents<T> x_dot, const ArrayT<T>& out, std::size_t k) = 0;
  /// Where the output's samples are, from the inputs' (engine/samples.hpp);
  /// called after forward. An op without a rule of its own mixes the samples of
  /// any input that has some: it is never taken for per-sample by mistake.
  virtual Samples samples(std::span<const Samples> in, Values<T> /*x*/, const ArrayT<T>& /*out*/) const {
    return samples_unknown(in);
  }
  /// Called once the op is on a tape, with its input and output nodes: the
  /// parametric ops use it to record per-sample information.
  virtual void on_record(TapeT<T>&, std::span<const std::shared_ptr<Node<T>>>) {}
  /// Parametric ops that recorded a use keep their output's cotangent for the
  /// per-sample rules: after vjp the tape hands it over (moved, when the tape
  /// would free it anyway, so that no copy is made).
  virtual bool keeps_output_grad() const { return false; }
  virtual void keep_output_grad(std::shared_ptr<const ArrayT<T>>) {}
};

/// Runs `op` on `inputs`: the primal always, the jvp when any input has a
/// tangent, and records the op when a tape is active and any input requires grad.
template <class T>
TensorT<T> apply(std::unique_ptr<Op<T>> op, std::span<const TensorT<T>> inputs);

/// The same with the inputs in braces: apply<T>(std::move(op), {x, w}).
template <class T>
TensorT<T> apply(std::unique_ptr<Op<T>> op, std::initializer_list<TensorT<T>> inputs) {
  return apply<T>(std::move(op), std::span<const TensorT<T>>(inputs.begin(), inputs.size()));
}

/// apply() is compiled once, in engine/tape.cpp, for float and double.
extern template TensorT<float> apply(std::unique_ptr<Op<float>>, std::span<const TensorT<float>>);
extern template TensorT<double> apply(std::unique_ptr<Op<double>>, std::span<const TensorT<double>>);

}  // namespace dpgrad
