// Base optimizers: SGD, SGD with momentum, Adam. They take the gradient as an
// argument so that a DP optimizer can hand them the noised, clipped sum; the
// privacy of the update does not depend on what they do with it.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "engine/tensor.hpp"

namespace dpgrad {

/// The base of the optimizers: holds the parameters and the learning rate; a
/// step checks the gradients and has the derived class update each parameter.
template <class T>
class OptimizerT {
 public:
  /// Optimizes `params` in place (tensors are shared handles) at learning rate
  /// `lr`. Throws std::invalid_argument unless lr is finite and >= 0.
  OptimizerT(std::vector<TensorT<T>> params, double lr);
  virtual ~OptimizerT() = default;
  /// The optimizer's name: "sgd", "momentum", "adam" or "adambc" for the ones here.
  virtual std::string name() const = 0;

  /// One update with `grads` (one per parameter, same shapes).
  /// Throws std::invalid_argument when their number or a shape does not match.
  void step(const std::vector<ArrayT<T>>& grads);
  /// One update with the parameters' accumulated gradients.
  void step();
  /// Drops the parameters' accumulated gradients (they read as zeros after).
  void zero_grad();

  /// The learning rate. set_lr changes it for the next steps and throws
  /// std::invalid_argument unless it is finite and >= 0.
  double lr() const { return lr_; }
  void set_lr(double lr);
  /// Parameter i moves with lr * factor (1 unless set): a learning rate per
  /// layer. Like lr, it only changes what is done with the gradients.
  /// Throws std::invalid_argument when i is out of range or factor is not a
  /// finite number >= 0; lr_scale(i) reads it back.
  void set_lr_scale(std::size_t i, double factor);
  double lr_scale(std::size_t i) const { return lr_scale_.at(i); }
  /// The same for the parameter called `name` or, for a layer's name, every
  /// parameter "name.*"; returns how many there are and throws if none.
  std::size_t set_lr_scale(const std::string& name, double factor);
  /// The number of steps taken (or set by load_state); the parameters, in order.
  long steps() const { return t_; }
  const std::vector<TensorT<T>>& params() const { return params_; }

  /// The optimizer's own settings beyond lr (momentum, betas, weight decay...):
  /// what data-parallel ranks and a resumed run must agree on.
  virtual std::map<std::string, double> settings() const { return {}; }
  /// Everything a checkpoint needs to resume: named buffers and the step count.
  virtual std::map<std::string, ArrayT<T>> state() const { return {}; }
  /// Restores what state() returned and sets the step count to `steps`. SgdT and
  /// AdamT throw std::invalid_argument when a buffer is missing or misshapen.
  virtual void load_state(const std::map<std::string, ArrayT<T>>& s, long steps);

 protected:
  virtual void update(std::size_t i, TensorT<T>& p, const ArrayT<T>& g) = 0;
  /// The learning rate of parameter i: lr times its scale.
  double lr_of(std::size_t i) const { return lr_ * lr_scale_[i]; }
  std::vector<TensorT<T>> params_;
  double lr_;
  std::vector<double> lr_scale_;
  long t_ = 0;
};

/// p -= lr * (g + wd p), or with momentum mu: v = mu v + (g + wd p); p -= lr v.
template <class T>
class SgdT final : public OptimizerT<T> {
 public:
  /// momentum 0 is plain SGD. Throws std::invalid_argument unless momentum is in
  /// [0, 1), weight_decay >= 0, and lr finite and >= 0.
  SgdT(std::vector<TensorT<T>> params, double lr, double momentum = 0.0, double weight_decay = 0.0);
  std::string name() const override { return momentum_ > 0 ? "momentum" : "sgd"; }
  std::map<std::string, double> settings() const override {
    return {{"momentum", momentum_}, {"weight_decay", weight_decay_}};
  }
  std::map<std::string, ArrayT<T>> state() const override;
  void load_state(const std::map<std::string, ArrayT<T>>& s, long steps) override;

 private:
  void update(std::size_t i, TensorT<T>& p, const ArrayT<T>& g) override;
  double momentum_, weight_decay_;
  std::vector<ArrayT<T>> velocity_;
};

/// Adam (Kingma & Ba 2015) with bias correction; weight decay added to g (L2).
template <class T>
class AdamT final : public OptimizerT<T> {
 public:
  /// Throws std::invalid_argument unless beta1 and beta2 are in [0, 1), eps > 0,
  /// weight_decay >= 0, and lr finite and >= 0.
  AdamT(std::vector<TensorT<T>> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 0.0);
  std::string name() const override { return noise_variance_ > 0 ? "adambc" : "adam"; }
  std::map<std::string, double> settings() const override {
    return {{"beta1", beta1_}, {"beta2", beta2_}, {"eps", eps_}, {"weight_decay", weight_decay_},
            {"noise_variance", noise_variance_}, {"noise_floor", floor_}};
  }
  std::map<std::string, ArrayT<T>> state() const override;
  void load_state(const std::map<std::string, ArrayT<T>>& s, long steps) override;
  /// DP-AdamBC (Tang, Shpilevskiy & Lecuyer, AAAI 2024): the gradients this
  /// optimizer receives carry independent noise of `variance` per coordinate
  /// (DPOptimizerT::noise_variance()), which inflates the second moment by that
  /// much. The step becomes lr m_hat / (sqrt(max(v_hat - variance, floor)) + eps).
  /// variance 0 is plain Adam. Post-processing of the noised gradients: the
  /// privacy of the run does not change.
  /// Throws std::invalid_argument unless variance is finite and >= 0 and floor
  /// finite and > 0.
  void correct_noise(double variance, double floor);

 private:
  void update(std::size_t i, TensorT<T>& p, const ArrayT<T>& g) override;
  double beta1_, beta2_, eps_, weight_decay_;
  double noise_variance_ = 0, floor_ = 0;
  std::vector<ArrayT<T>> m_, v_;
};

/// Per-layer learning-rate factors from their text, "LAYER=FACTOR,..." (a layer's
/// name, or one parameter's such as conv1.bias; factors decimal numbers >= 0), in
/// order; OptimizerT::set_lr_scale applies each. Throws std::invalid_argument
/// naming a bad or repeated item.
std::vector<std::pair<std::string, double>> parse_lr_scales(const std::string& spec);

/// A base optimizer by name: "sgd", "momentum", "adam", or "adambc" (Adam whose
/// second moment a DP run corrects for its noise: AdamT::correct_noise).
struct OptimizerSpec {
  std::string name = "sgd";       // one of optimizer_names()
  std::optional<double> lr;       // default: default_lr(name)
  double momentum = 0.9;          // momentum
  double weight_decay = 0.0;      // L2 weight decay, >= 0
};
/// The base optimizers' names, in the order help texts list them.
std::vector<std::string> optimizer_names();
/// 0.1 for sgd and momentum, 0.001 for adam and adambc; throws on unknown names.
double default_lr(const std::string& name);
/// Checks the spec (a known name, a learning rate > 0 and finite, momentum in
/// [0, 1), weight decay >= 0 and finite); throws std::invalid_argument naming
/// the problem. Needs no parameters: programs check before building anything.
void check_optimizer_spec(const OptimizerSpec& spec);
/// The optimizer `spec` describes, over `params`.
template <class T>
std::unique_ptr<OptimizerT<T>> make_optimizer(const OptimizerSpec& spec, std::vector<TensorT<T>> params);

/// The learning rate of a cosine schedule at `step` of `total`: `start` at step 0,
/// `end` at step `total` (Loshchilov & Hutter 2017, without restarts).
double cosine_lr(double start, double end, long step, long total);

/// The optimizers over float parameters.
using Optimizer = OptimizerT<float>;
using Sgd = SgdT<float>;
using Adam = AdamT<float>;

}  // namespace dpgrad
