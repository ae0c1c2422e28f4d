// Parameter initialisers: uniform fan-in/fan-out schemes drawn from a dpgrad Rng.
#pragma once

#include "engine/array.hpp"
#include "engine/random.hpp"

namespace dpgrad {

/// U(-b, b) with b = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010).
template <class T>
ArrayT<T> glorot_uniform(const Shape& shape, std::size_t fan_in, std::size_t fan_out, Rng& rng);
/// U(-b, b) with b = 1 / sqrt(fan_in) (PyTorch's default for linear and conv layers).
template <class T>
ArrayT<T> fan_in_uniform(const Shape& shape, std::size_t fan_in, Rng& rng);

}  // namespace dpgrad
