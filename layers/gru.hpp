// GRU and bidirectional GRU over padded batches, composed only of engine ops
// (linear, slice, sigmoid, tanh, mul, add, sub): the example of a layer added
// to dpgrad without a derivative or a per-sample rule of its own (README,
// "Adding a layer"). Every weight enters through `linear`, which records its uses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/bidirectional.hpp"
#include "layers/module.hpp"

namespace dpgrad {

/// Output of one GRU direction over a padded batch.
template <class T>
struct GruOutputT {
  TensorT<T> states;  // (B, L, H) hidden state at every step, 0 at padded steps; undefined unless kept
  TensorT<T> final;   // (B, H) hidden state after each sequence's own last token
};

/// The GRU recurrence as a function of its weights (the layer calls it; tests
/// gradcheck it with respect to every input). Gates in the order r, z, n
/// (PyTorch's), each a block of H columns of w_ih, w_hh, b_ih and b_hh:
///   [a_r a_z a_n] = x_t W_ih + b_ih,    [c_r c_z c_n] = h_{t-1} W_hh + b_hh
///   r = s(a_r + c_r),  z = s(a_z + c_z),  n = tanh(a_n + r * c_n)
///   h_new = (1 - z) * n + z * h_{t-1},   h_t = m_t h_new + (1 - m_t) h_{t-1}
/// with s the logistic sigmoid, mask m_t = [t < length] per sample and h
/// starting at zero. reverse runs t = L-1 .. 0, so each sequence starts at its
/// own last token. W_ih, W_hh are PyTorch's weight_ih, weight_hh transposed.
/// x: (B, L, d), w_ih: (d, 3H), w_hh: (H, 3H), b_ih: (3H), b_hh: (3H); lengths (B) in [1, L].
/// keep_states = false leaves `states` undefined: a caller that reads only the
/// final state (a classifier) then holds no per-step states, nor their tangents.
template <class T>
GruOutputT<T> gru_sequence(const TensorT<T>& x, const TensorT<T>& w_ih, const TensorT<T>& w_hh,
                           const TensorT<T>& b_ih, const TensorT<T>& b_hh, const std::vector<std::int32_t>& lengths,
                           bool reverse = false, bool keep_states = true);

/// One GRU direction. Weights and both biases U(-1/sqrt(H), 1/sqrt(H)) as in PyTorch.
template <class T>
class GruT final : public ModuleT<T> {
 public:
  static constexpr const char* kBidirectionalName = "bigru";  // BidirectionalT's default name
  /// Parameters named NAME.weight_ih, NAME.weight_hh, NAME.bias_ih and
  /// NAME.bias_hh. Throws std::invalid_argument when input or hidden is 0.
  GruT(std::size_t input, std::size_t hidden, Rng& rng, const std::string& name = "gru");
  using Output = GruOutputT<T>;
  /// x (B, L, input); lengths (B) in [1, L]. reverse = true runs from each
  /// sequence's own last token back to 0.
  Output forward(const TensorT<T>& x, const std::vector<std::int32_t>& lengths, bool reverse = false,
                 bool keep_states = true);
  /// {w_ih (input, 3H), w_hh (H, 3H), b_ih (3H), b_hh (3H)}
  std::vector<TensorT<T>> parameters() const override;
  std::size_t input_size() const { return input_; }
  std::size_t hidden_size() const { return hidden_; }

 private:
  std::size_t input_, hidden_;
  TensorT<T> w_ih_, w_hh_, b_ih_, b_hh_;
};

/// Two GRU directions over the same input, outputs joined feature-wise
/// (layers/bidirectional.hpp); construct with a name, e.g. "bigru".
template <class T>
using BiGruT = BidirectionalT<T, GruT<T>>;

/// The float instantiations.
using Gru = GruT<float>;
using BiGru = BiGruT<float>;

}  // namespace dpgrad
