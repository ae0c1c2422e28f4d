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
  MultiHeadAttentionT(std::size_t dim, std::size_t heads, Rng& rng, const std::string& name = "attention");
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
  TransformerBlockT(std::size_t dim, std::size_t heads, std::size_t hidden, Rng& rng,
                    const std::string& name = "block");
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
  PositionalEmbeddingT(std::size_t length, std::size_t dim, Rng& rng, const std::string& name = "positions");
  TensorT<T> forward(const TensorT<T>& x) override;
  std::vector<TensorT<T>> parameters() const override { return {table_}; }

 private:
  TensorT<T> table_;
};

}  // namespace dpgrad
