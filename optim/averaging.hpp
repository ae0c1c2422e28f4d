// An exponential moving average of the parameters (Polyak averaging): evaluate
// with the average of the last ~1/(1 - decay) iterates instead of the last
// noisy one. It only post-processes the private iterates, so it costs no privacy.
#pragma once

#include <vector>

#include "engine/tensor.hpp"

namespace dpgrad {

/// An exponential moving average of parameters (tensors are shared handles, so
/// these are the model's own): update() after each optimizer step, swap() to
/// evaluate with the averages.
template <class T>
class ParameterAverageT {
 public:
  /// decay in (0, 1). The first updates use min(decay, (1 + t) / (10 + t)) so the
  /// average is not dominated by the initial parameters.
  /// The averages start as copies of the parameters' values. Throws
  /// std::invalid_argument when decay is not in (0, 1).
  ParameterAverageT(std::vector<TensorT<T>> params, double decay);
  /// avg = d avg + (1 - d) p after each optimizer step.
  void update();
  /// Exchanges the averages and the parameters (call again to swap back).
  void swap();
  /// The averages, one per parameter, in the order and shapes of the parameters.
  std::vector<ArrayT<T>>& averages() { return avg_; }
  /// How many times update() ran (it sets the warm-up above); set_updates
  /// restores the count when a run resumes from a checkpoint.
  long updates() const { return t_; }
  void set_updates(long t) { t_ = t; }
  /// The decay given to the constructor.
  double decay() const { return decay_; }

 private:
  std::vector<TensorT<T>> params_;
  std::vector<ArrayT<T>> avg_;
  double decay_;
  long t_ = 0;
};

/// Swaps averages in for the lifetime of the scope (evaluation), then back.
template <class T>
class AveragedScopeT {
 public:
  /// Swaps now and again when destroyed; a null `avg` does nothing.
  explicit AveragedScopeT(ParameterAverageT<T>* avg) : avg_(avg) {
    if (avg_) avg_->swap();
  }
  ~AveragedScopeT() {
    if (avg_) avg_->swap();
  }
  AveragedScopeT(const AveragedScopeT&) = delete;
  AveragedScopeT& operator=(const AveragedScopeT&) = delete;

 private:
  ParameterAverageT<T>* avg_;
};

/// ParameterAverageT over float parameters.
using ParameterAverage = ParameterAverageT<float>;

}  // namespace dpgrad
