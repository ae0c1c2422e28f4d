// Self-attention and the pre-LN transformer encoder block, from engine ops
// only (linear, the fused attention op, layer_norm, GELU):
// every parameter is a linear weight or an elementwise parameter, so every
// clipping strategy gets exact per-sample norms with no code here
// (docs/adding-a-layer.md). Attention mixes positions within a sequence, never
// the sequences of a batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/dense.hpp"
#include "layers/norm.hpp"

namespace dpgrad {

/// The key padding mask of sequences with these lengths, padded to `length`:
/// (B, 1, 1, length), 1 where a key is padding (position >= its length).
template <class T>
ArrayT<T> key_padding_mask(const std::vector<std::int32_t>& lengths, std::size_t length);

/// Multi-head self-attention: x (B, L, d) -> (B, L, d). Per head h of d / heads
/// dimensions, softmax(q k^T / sqrt(d / heads)) v with q, k, v linear maps of x;
/// keys where `mask` (B, 1, 1, L) is 1 get no weight; then an output projection.
template <class T>
class MultiHeadAttentionT final : public ModuleT<T> {
 public:
  /// Four Dense(dim, dim) projections, named NAME.query, NAME.key, NAME.value and
  /// NAME.out. Throws std::invalid_argument unless heads > 0 divides dim.
  MultiHeadAttentionT(std::size_t dim, std::size_t heads, Rng& rng, const std::string& name = "attention");
  /// x (B, L, dim) -> (B, L, dim); mask (B, 1, 1, L) as key_padding_mask makes it,
  /// or the default {} for none. Throws std::invalid_argument when x is not
  /// (B, L, dim).
  TensorT<T> forward(const TensorT<T>& x, const ArrayT<T>& mask = {});
  std::vector<TensorT<T>> parameters() const override;

 private:
  std::size_t dim_, heads_;
  DenseT<T> q_, k_, v_, out_;
};

/// Pre-LN encoder block: x + attention(LayerNorm(x)), then h + MLP(LayerNorm(h)),
/// the MLP Dense(d, hidden) GELU Dense(hidden, d).
template <class T>
class TransformerBlockT final : public ModuleT<T> {
 public:
  /// LayerNorms NAME.norm1 and NAME.norm2, attention NAME.attention (`heads`
  /// heads) and the MLP's layers NAME.mlp1 and NAME.mlp2. Throws
  /// std::invalid_argument on a size of 0 or when heads does not divide dim.
  TransformerBlockT(std::size_t dim, std::size_t heads, std::size_t hidden, Rng& rng,
                    const std::string& name = "block");
  /// x (B, L, dim) -> (B, L, dim); mask as for MultiHeadAttentionT::forward.
  TensorT<T> forward(const TensorT<T>& x, const ArrayT<T>& mask = {});
  std::vector<TensorT<T>> parameters() const override;

 private:
  LayerNormT<T> norm1_, norm2_;
  MultiHeadAttentionT<T> attention_;
  DenseT<T> up_, down_;
};

/// A learned table of positions (length, d), added to x (B, length, d): an
/// elementwise parameter (docs/per-sample.md), so exact for every strategy.
template <class T>
class PositionalEmbeddingT final : public LayerT<T> {
 public:
  /// The table (length, dim) drawn from N(0, 0.02^2), named NAME.table. Throws
  /// std::invalid_argument when length or dim is 0.
  PositionalEmbeddingT(std::size_t length, std::size_t dim, Rng& rng, const std::string& name = "positions");
  /// x (B, length, dim) -> x + table, the same shape. Throws std::invalid_argument
  /// on another shape (pad the sequences to the table's length).
  TensorT<T> forward(const TensorT<T>& x) override;
  std::vector<TensorT<T>> parameters() const override { return {table_}; }

 private:
  TensorT<T> table_;
};

}  // namespace dpgrad
