// LSTM and bidirectional LSTM over padded batches, composed only of engine ops
// (linear, slice, sigmoid, tanh, mul, add). The parametric op `linear` records
// the uses of each weight, so per-sample gradients need no code here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/bidirectional.hpp"
#include "layers/module.hpp"

namespace dpgrad {

/// Output of one LSTM direction over a padded batch.
template <class T>
struct LstmOutputT {
  TensorT<T> states;  // (B, L, H) hidden state at every step, 0 at padded steps; undefined unless kept
  TensorT<T> final;   // (B, H) hidden state after each sequence's own last token
};

/// The LSTM recurrence as a function of its weights (the layer calls it; tests
/// gradcheck it with respect to every input). Gates in the order i, f, g, o
/// (PyTorch's), each a block of H columns of w_ih, w_hh and b:
///   z_t = x_t W_ih + b + h_{t-1} W_hh,  [i f g o] = [s s tanh s](z_t)
///   c_new = f * c_{t-1} + i * g,        h_new = o * tanh(c_new)
///   c_t = m_t c_new + (1 - m_t) c_{t-1}, h_t = m_t h_new + (1 - m_t) h_{t-1}
/// with mask m_t = [t < length] per sample and h, c starting at zero. reverse
/// runs t = L-1 .. 0, so each sequence starts at its own last token.
/// x: (B, L, d), w_ih: (d, 4H), w_hh: (H, 4H), b: (4H); lengths (B) in [1, L].
/// keep_states = false leaves `states` undefined: a caller that reads only the
/// final state (a classifier) then holds no per-step states, nor their tangents.
template <class T>
LstmOutputT<T> lstm_sequence(const TensorT<T>& x, const TensorT<T>& w_ih, const TensorT<T>& w_hh,
                             const TensorT<T>& b, const std::vector<std::int32_t>& lengths, bool reverse = false, bool keep_states = true);

/// One LSTM direction. Weights U(-1/sqrt(H), 1/sqrt(H)) as in PyTorch; the
/// single bias (PyTorch keeps two, b_ih + b_hh) is drawn from the same
/// uniform, forget-gate block included (no +1 forget bias offset).
template <class T>
class LstmT final : public ModuleT<T> {
 public:
  static constexpr const char* kBidirectionalName = "bilstm";  // BidirectionalT's default name
  /// Parameters named NAME.weight_ih, NAME.weight_hh and NAME.bias. Throws
  /// std::invalid_argument when input or hidden is 0.
  LstmT(std::size_t input, std::size_t hidden, Rng& rng, const std::string& name = "lstm");
  using Output = LstmOutputT<T>;
  /// x (B, L, input); lengths (B) in [1, L]. reverse = true runs from each
  /// sequence's own last token back to 0.
  Output forward(const TensorT<T>& x, const std::vector<std::int32_t>& lengths, bool reverse = false,
                 bool keep_states = true);
  /// {w_ih (input, 4H), w_hh (H, 4H), b (4H)}
  std::vector<TensorT<T>> parameters() const override;
  std::size_t input_size() const { return input_; }
  std::size_t hidden_size() const { return hidden_; }

 private:
  std::size_t input_, hidden_;
  TensorT<T> w_ih_, w_hh_, b_;
};

/// Two LSTM directions over the same input, outputs joined feature-wise
/// (layers/bidirectional.hpp); construct with a name, e.g. "bilstm".
template <class T>
using BiLstmT = BidirectionalT<T, LstmT<T>>;

/// The float instantiations.
using Lstm = LstmT<float>;
using BiLstm = BiLstmT<float>;

}  // namespace dpgrad
