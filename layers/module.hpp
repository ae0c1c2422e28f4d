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

template <class T>
class ModuleT {
 public:
  virtual ~ModuleT() = default;
  /// Trainable parameters in a fixed order (checkpoints and optimizers rely on it).
  virtual std::vector<TensorT<T>> parameters() const = 0;
  /// Training mode (dropout active) or evaluation mode.
  virtual void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }
  std::size_t parameter_count() const;

 protected:
  bool training_ = true;
};

template <class T>
class LayerT : public ModuleT<T> {
 public:
  virtual TensorT<T> forward(const TensorT<T>& x) = 0;
  TensorT<T> operator()(const TensorT<T>& x) { return forward(x); }
  std::vector<TensorT<T>> parameters() const override { return {}; }
};

/// Layers applied in order.
template <class T>
class SequentialT final : public LayerT<T> {
 public:
  SequentialT() = default;
  SequentialT& add(std::unique_ptr<LayerT<T>> layer);
  template <class L, class... Args>
  SequentialT& emplace(Args&&... args) {
    return add(std::make_unique<L>(std::forward<Args>(args)...));
  }
  TensorT<T> forward(const TensorT<T>& x) override;
  std::vector<TensorT<T>> parameters() const override;
  void set_training(bool on) override;
  std::size_t size() const { return layers_.size(); }
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
  std::string name;
  LossFnT<T> rows;
  /// The loss itself: one loss per row of `outputs` (it converts to LossFnT).
  TensorT<T> operator()(const TensorT<T>& outputs, const BatchT<T>& batch) const { return rows(outputs, batch); }
};

/// A whole network: batch -> outputs (B, ...), logits by default, and the loss
/// its training minimises (softmax cross-entropy against the labels unless set).
template <class T>
class ModelT : public ModuleT<T> {
 public:
  virtual TensorT<T> forward(const BatchT<T>& batch) = 0;
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
  FeatureModelT(std::string name, SequentialT<T> net) : name_(std::move(name)), net_(std::move(net)) {}
  TensorT<T> forward(const BatchT<T>& batch) override;
  std::vector<TensorT<T>> parameters() const override { return net_.parameters(); }
  void set_training(bool on) override;
  std::string name() const override { return name_; }
  SequentialT<T>& net() { return net_; }

 private:
  std::string name_;
  SequentialT<T> net_;
};

using Module = ModuleT<float>;
using Layer = LayerT<float>;
using Sequential = SequentialT<float>;
using Model = ModelT<float>;

}  // namespace dpgrad
