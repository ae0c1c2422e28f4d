// Per-sample losses for ModelT::set_loss: each maps the model's outputs (R, ...)
// and the batch to one loss per row (R), from engine ops only, so every clipping
// strategy (and every per-sample rule) sees an ordinary function of the outputs.
#pragma once

#include "layers/module.hpp"

namespace dpgrad {

/// Softmax cross-entropy of logits (R, classes) against batch.labels (the
/// default), named "cross_entropy".
template <class T>
NamedLossT<T> cross_entropy_loss();

/// Mean squared error per row: the mean over a row's coordinates of
/// (output - target)^2, against batch.targets of the outputs' shape; named "mse".
template <class T>
NamedLossT<T> mse_loss();

/// Binary cross-entropy of logits z against targets y in [0, 1] (batch.targets, the
/// outputs' shape), the mean over a row's coordinates of
/// softplus(z) - z y = max(z, 0) - z y + log(1 + exp(-|z|)), which is
/// -y log s(z) - (1 - y) log(1 - s(z)) computed without overflow; softplus comes
/// from log_softmax, so the gradient is s(z) - y everywhere, at z = 0 too;
/// named "bce_with_logits".
template <class T>
NamedLossT<T> bce_with_logits_loss();

}  // namespace dpgrad
