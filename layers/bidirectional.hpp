// Two directions of one recurrent cell over the same input, outputs joined
// feature-wise: BidirectionalT<T, LstmT<T>> (BiLstmT) and
// BidirectionalT<T, GruT<T>> (BiGruT). A cell type needs a constructor
// (input, hidden, rng, name), a default name kBidirectionalName, forward(x, lengths, reverse, keep_states)
// returning {states, final}, parameters() and hidden_size().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/module.hpp"

namespace dpgrad {

/// A forward and a backward Cell over the same input, their outputs joined
/// feature-wise, [forward, backward]: hidden size H per direction, 2H joined.
template <class T, class Cell>
class BidirectionalT final : public ModuleT<T> {
 public:
  /// Two cells Cell(input, hidden), named NAME.forward and NAME.backward; the
  /// default NAME is Cell::kBidirectionalName ("bilstm", "bigru").
  BidirectionalT(std::size_t input, std::size_t hidden, Rng& rng, const std::string& name = Cell::kBidirectionalName);
  /// What forward returns: both directions' states and final states.
  struct Output {
    TensorT<T> states;  // (B, L, 2H): [forward, backward] per step (0 at padded steps); undefined unless kept
    TensorT<T> final;   // (B, 2H): [forward final, backward final]
  };
  /// x (B, L, input); lengths (B) in [1, L]. The backward final state is the
  /// state after reading each sequence from its own last token down to 0.
  Output forward(const TensorT<T>& x, const std::vector<std::int32_t>& lengths, bool keep_states = true);
  /// The forward direction's parameters, then the backward direction's (named
  /// NAME.forward.* and NAME.backward.*).
  std::vector<TensorT<T>> parameters() const override;
  /// H, one direction's hidden size.
  std::size_t hidden_size() const { return fwd_.hidden_size(); }

 private:
  Cell fwd_, bwd_;
};

}  // namespace dpgrad
