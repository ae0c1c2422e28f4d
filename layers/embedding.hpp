// Embedding: rows of a (vocab, dim) table looked up by token ids, through the
// engine's parametric `gather` (which records per-sample uses). The padding id
// gives zero rows and receives no gradient.
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.hpp"

namespace dpgrad {

/// A Module, not a Layer: its input is integer ids, not a tensor.
template <class T>
class EmbeddingT final : public ModuleT<T> {
 public:
  /// W (vocab, dim) ~ N(0, 1) (PyTorch's default) with the padding row zero.
  /// padding_id < 0: no padding.
  /// The table is named NAME.weight. Throws std::invalid_argument when vocab or
  /// dim is 0 or padding_id >= vocab.
  EmbeddingT(std::size_t vocab, std::size_t dim, Rng& rng, const std::string& name = "embedding",
             std::int32_t padding_id = 0);
  /// ids (B, L) in [0, vocab) -> (B, L, dim). Throws on ids outside the table.
  TensorT<T> forward(const ArrayT<std::int32_t>& ids);
  TensorT<T> operator()(const ArrayT<std::int32_t>& ids) { return forward(ids); }
  /// From now on the table stays as it is: a constant, not a parameter. It gets
  /// no gradient and no noise; a table drawn from the seed alone (as the
  /// constructor draws it) is data-independent and costs no privacy.
  void freeze();
  bool frozen() const { return frozen_; }
  std::vector<TensorT<T>> parameters() const override {
    if (frozen_) return {};
    return {w_};
  }
  const TensorT<T>& weight() const { return w_; }
  std::int32_t padding_id() const { return padding_id_; }

 private:
  TensorT<T> w_;
  std::int32_t padding_id_;
  bool frozen_ = false;
};

/// The float instantiation.
using Embedding = EmbeddingT<float>;

}  // namespace dpgrad
