// Dropout (Srivastava et al. 2014), inverted: in training mode each element is
// kept with probability 1 - p and scaled by 1/(1 - p); in evaluation mode it is
// the identity. The mask enters as a constant factor of `mul`, so no rule here.
#pragma once

#include <cstdint>

#include "engine/random.hpp"
#include "layers/module.hpp"

namespace dpgrad {

template <class T>
class DropoutT final : public LayerT<T> {
 public:
  /// p in [0, 1): the probability of dropping an element. Masks come from a
  /// FastRng seeded with `seed` (a fresh mask per forward call).
  explicit DropoutT(double p, std::uint64_t seed = 0);
  /// x (B, ...) -> (B, ...): x * mask / (1 - p) in training, x in evaluation.
  TensorT<T> forward(const TensorT<T>& x) override;
  double p() const { return p_; }

 private:
  double p_;
  FastRng rng_;
};

using Dropout = DropoutT<float>;

}  // namespace dpgrad
