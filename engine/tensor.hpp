// Tensors: shared handles to graph nodes holding a value, an accumulated
// gradient (reverse mode) and k stacked tangents (forward mode). Parameters are
// leaf tensors with a name that optimizers update in place.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "engine/array.hpp"
#include "engine/samples.hpp"

namespace dpgrad {

/// One value of the graph, shared by the TensorT handles on it and the tapes
/// that recorded it.
template <class T>
struct Node {
  ArrayT<T> value;         // the tensor's value
  ArrayT<T> grad;          // same shape as value, valid when has_grad
  ArrayT<T> tangent;       // (k, ...value shape), valid when has_tangent
  bool has_grad = false;
  bool has_tangent = false;
  bool requires_grad = false;
  bool is_parameter = false;
  std::string name;
  /// Where the batch's samples are in `value` (engine/samples.hpp): set by
  /// per_sample_input on the batch's data, by each op from its inputs.
  Samples samples;
  /// TensorT handles on this node. When the last one goes, no later op can take
  /// the node as an input, so its tangent is dropped even if a tape still holds
  /// the node for the backward pass (forward-mode memory stays that of a few
  /// layers, not of the whole recorded graph).
  std::atomic<int> handles{0};
};

/// A shared handle on a Node: copies refer to the same value, gradient and
/// tangents. Tensor is the float one.
template <class T>
class TensorT {
 public:
  TensorT() = default;
  /// A leaf. requires_grad: reverse mode computes its gradient.
  explicit TensorT(ArrayT<T> value, bool requires_grad = false);
  explicit TensorT(std::shared_ptr<Node<T>> node) : node_(std::move(node)) { acquire(); }
  TensorT(const TensorT& o) : node_(o.node_) { acquire(); }
  TensorT(TensorT&& o) noexcept : node_(std::move(o.node_)) {}
  TensorT& operator=(const TensorT& o) {
    if (node_ != o.node_) {
      release();
      node_ = o.node_;
      acquire();
    }
    return *this;
  }
  TensorT& operator=(TensorT&& o) noexcept {
    if (this != &o) {
      release();
      node_ = std::move(o.node_);
    }
    return *this;
  }
  ~TensorT() { release(); }

  /// Whether the handle has a node (a default-constructed one has none, and the
  /// accessors need one); then the value, its shape, number of axes and of elements.
  bool defined() const { return node_ != nullptr; }
  const ArrayT<T>& value() const { return node_->value; }
  /// For optimizers and loaders only: changing a value recorded on a live tape
  /// invalidates that tape.
  ArrayT<T>& mutable_value() { return node_->value; }
  Shape shape() const { return shape_of(node_->value); }
  std::size_t dim() const { return node_->value.dimension(); }
  std::size_t size() const { return node_->value.size(); }
  /// The value of a one-element tensor.
  T item() const;

  /// Whether reverse mode computes a gradient for it (a leaf that asked, or the
  /// output of an op a tape recorded), and whether one is held.
  bool requires_grad() const { return node_->requires_grad; }
  bool has_grad() const { return node_->has_grad; }
  /// The accumulated gradient; zeros if nothing reached this tensor.
  const ArrayT<T>& grad() const;
  void zero_grad();

  /// Whether it carries tangents (set_tangent at a leaf, or an op's jvp).
  bool has_tangent() const { return node_->has_tangent; }
  /// (k, ...shape): k directional derivatives pushed through forward mode.
  const ArrayT<T>& tangent() const;
  std::size_t tangent_count() const { return has_tangent() ? node_->tangent.shape()[0] : 0; }
  /// Seeds forward mode at this leaf: `tangent` has shape (k, ...shape).
  void set_tangent(ArrayT<T> tangent);
  void clear_tangent();

  /// Where the batch's samples are (none for parameters and constants).
  const Samples& samples() const { return node_->samples; }

  /// Whether it is a parameter (make_parameter) and its name; node() and
  /// shared() give the node itself, for the engine.
  bool is_parameter() const { return node_->is_parameter; }
  const std::string& name() const { return node_->name; }
  Node<T>* node() const { return node_.get(); }
  const std::shared_ptr<Node<T>>& shared() const { return node_; }

 private:
  void acquire() {
    if (node_) node_->handles.fetch_add(1, std::memory_order_relaxed);
  }
  void release() {
    if (node_ && node_->handles.fetch_sub(1, std::memory_order_acq_rel) == 1 && node_->has_tangent &&
        !node_->is_parameter && node_.use_count() > 1) {
      node_->tangent = ArrayT<T>();
      node_->has_tangent = false;
    }
  }
  std::shared_ptr<Node<T>> node_;
};

/// A trainable leaf with a name ("dense1.weight").
template <class T>
TensorT<T> make_parameter(std::string name, ArrayT<T> value);

/// The batch's data as a leaf: `axis` of `value` holds `count` samples in
/// consecutive blocks (count 0: one per index of that axis), which every op
/// tracks so that the per-sample rules can refuse a layer that moves or mixes
/// them (docs/per-sample.md). Throws unless count divides the axis's length.
template <class T>
TensorT<T> per_sample_input(ArrayT<T> value, std::size_t axis = 0, std::size_t count = 0);

/// The tensor of float32 training.
using Tensor = TensorT<float>;

/// Compiled once, in engine/tensor.cpp, for float and double.
extern template class TensorT<float>;
extern template class TensorT<double>;

}  // namespace dpgrad
