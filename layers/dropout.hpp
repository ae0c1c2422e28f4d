// Dropout (Srivastava et al. 2014), inverted: in training mode each element is
// kept with probability 1 - p and scaled by 1/(1 - p); in evaluation mode it is
// the identity. The mask enters as a constant factor of `mul`, so no rule here.
#pragma once

#include <cstdint>

#include "engine/random.hpp"
#include "layers/module.hpp"

namespace dpgrad {

/// Inverted dropout as a layer (the top of this file says how it works).
template <class T>
class DropoutT final : public LayerT<T> {
 public:
  /// p in [0, 1): the probability of dropping an element. Masks come from a
  /// FastRng seeded with `seed` (a fresh mask per forward call).
  /// Throws std::invalid_argument when p is outside [0, 1).
  explicit DropoutT(double p, std::uint64_t seed = 0);
  /// x (B, ...) -> (B, ...): x * mask / (1 - p) in training, x in evaluation.
  TensorT<T> forward(const TensorT<T>& x) override;
  /// The probability of dropping an element.
  double p() const { return p_; }

 private:
  double p_;
  FastRng rng_;
};

/// The float instantiation.
using Dropout = DropoutT<float>;

}  // namespace dpgrad
