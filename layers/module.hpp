// The layer interfaces: a Module owns parameters; a Layer maps a tensor to a
// tensor; a Model maps a batch (features or token sequences) to logits.
// Layers compose engine ops and never write a derivative.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/batch.hpp"
#include "engine/tensor.hpp"

namespace dpgrad {

class Rng;

/// A part of a network that owns parameters, in training mode (from the start)
/// or evaluation mode: the base of layers and models.
template <class T>
class ModuleT {
 public:
  virtual ~ModuleT() = default;
  /// Trainable parameters in a fixed order (checkpoints and optimizers rely on it).
  virtual std::vector<TensorT<T>> parameters() const = 0;
  /// Training mode (dropout active) or evaluation mode.
  virtual void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }
  /// The number of parameter values: the sum of the sizes of parameters().
  std::size_t parameter_count() const;

 protected:
  bool training_ = true;
};

/// A module that maps a tensor to a tensor; it has no parameters unless it
/// overrides parameters().
template <class T>
class LayerT : public ModuleT<T> {
 public:
  /// The layer's output for x (B, ...), the batch along the first axis;
  /// operator() is the same call.
  virtual TensorT<T> forward(const TensorT<T>& x) = 0;
  TensorT<T> operator()(const TensorT<T>& x) { return forward(x); }
  std::vector<TensorT<T>> parameters() const override { return {}; }
};

/// Layers applied in order.
template <class T>
class SequentialT final : public LayerT<T> {
 public:
  SequentialT() = default;
  /// Appends `layer`, applied after those already added; returns *this. Throws
  /// std::invalid_argument on a null layer.
  SequentialT& add(std::unique_ptr<LayerT<T>> layer);
  /// Appends a new L made from `args`; returns *this.
  template <class L, class... Args>
  SequentialT& emplace(Args&&... args) {
    return add(std::make_unique<L>(std::forward<Args>(args)...));
  }
  TensorT<T> forward(const TensorT<T>& x) override;
  std::vector<TensorT<T>> parameters() const override;
  void set_training(bool on) override;
  /// The number of layers.
  std::size_t size() const { return layers_.size(); }
  /// Layer i, in order (i < size()): e.g. for writing the stack to ONNX.
  const LayerT<T>& layer(std::size_t i) const { return *layers_.at(i); }
  /// The first layer of type L (null if there is none).
  template <class L>
  L* find() {
    for (auto& l : layers_)
      if (auto* p = dynamic_cast<L*>(l.get())) return p;
    return nullptr;
  }

 private:
  std::vector<std::unique_ptr<LayerT<T>>> layers_;
};

/// A per-sample loss: the model's outputs (R, ...) and the batch they came from
/// -> one loss per row (R). Built from engine ops only, so that every clipping
/// strategy differentiates it (layers/losses.hpp has the usual ones).
template <class T>
using LossFnT = std::function<TensorT<T>(const TensorT<T>& outputs, const BatchT<T>& batch)>;

/// A per-sample loss with its name, as layers/losses.hpp makes them: the name
/// tells evaluation which metrics fit it ("cross_entropy": accuracy;
/// "bce_with_logits": accuracy at 0.5 and AUC; "mse": MSE and MAE).
template <class T>
struct NamedLossT {
  std::string name;  // what evaluation goes by, e.g. "mse"
  LossFnT<T> rows;   // the loss: one loss per row of the outputs
  /// The loss itself: one loss per row of `outputs` (it converts to LossFnT).
  TensorT<T> operator()(const TensorT<T>& outputs, const BatchT<T>& batch) const { return rows(outputs, batch); }
};

/// A whole network: batch -> outputs (B, ...), logits by default, and the loss
/// its training minimises (softmax cross-entropy against the labels unless set).
template <class T>
class ModelT : public ModuleT<T> {
 public:
  /// The outputs (B, ...) for `batch`. A model with dropout layers holds a
  /// DropoutRecords(batch) here (layers/dropout.hpp), so that in a private run
  /// their masks are keyed by each row's record; FeatureModel does.
  virtual TensorT<T> forward(const BatchT<T>& batch) = 0;
  /// The model's name, e.g. "cnn26k"; error messages use it.
  virtual std::string name() const = 0;
  /// Replaces the loss (an empty function restores cross-entropy). A loss of
  /// one's own is named "custom": evaluation then reports the loss and the
  /// metrics registered with it, no built-in metric.
  void set_loss(LossFnT<T> loss) {
    loss_name_ = loss ? "custom" : "cross_entropy";
    loss_ = std::move(loss);
  }
  /// Replaces the loss with a named one (layers/losses.hpp).
  void set_loss(NamedLossT<T> loss) {
    loss_name_ = loss.rows ? std::move(loss.name) : "cross_entropy";
    loss_ = std::move(loss.rows);
  }
  /// "cross_entropy" (the default), a named loss's name, or "custom".
  const std::string& loss_name() const { return loss_name_; }
  /// Per-row losses of `outputs` for `batch`: (R).
  TensorT<T> row_losses(const TensorT<T>& outputs, const BatchT<T>& batch) const;

 private:
  LossFnT<T> loss_;
  std::string loss_name_ = "cross_entropy";
};

/// A model over dense features: a Sequential stack applied to batch.inputs.
template <class T>
class FeatureModelT final : public ModelT<T> {
 public:
  /// The model `name` whose outputs are net(batch.inputs), the inputs taken as
  /// one sample per index of their first axis (per_sample_input).
  FeatureModelT(std::string name, SequentialT<T> net) : name_(std::move(name)), net_(std::move(net)) {}
  TensorT<T> forward(const BatchT<T>& batch) override;
  std::vector<TensorT<T>> parameters() const override { return net_.parameters(); }
  void set_training(bool on) override;
  std::string name() const override { return name_; }
  /// The stack itself, e.g. to find() one of its layers.
  SequentialT<T>& net() { return net_; }
  const SequentialT<T>& net() const { return net_; }

 private:
  std::string name_;
  SequentialT<T> net_;
};

/// The float instantiations.
using Module = ModuleT<float>;
using Layer = LayerT<float>;
using Sequential = SequentialT<float>;
using Model = ModelT<float>;

}  // namespace dpgrad
