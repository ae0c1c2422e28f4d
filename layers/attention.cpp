// Attention and the transformer block (layers/attention.hpp).
#include "layers/attention.hpp"

#include <cmath>
#include <stdexcept>

#include "engine/ops.hpp"
#include "engine/random.hpp"

namespace dpgrad {

template <class T>
ArrayT<T> key_padding_mask(const std::vector<std::int32_t>& lengths, std::size_t length) {
  ArrayT<T> m = xt::zeros<T>({lengths.size(), std::size_t(1), std::size_t(1), length});
  for (std::size_t b = 0; b < lengths.size(); ++b)
    for (std::size_t t = std::size_t(std::max<std::int32_t>(lengths[b], 0)); t < length; ++t) m(b, 0, 0, t) = T(1);
  return m;
}

template <class T>
MultiHeadAttentionT<T>::MultiHeadAttentionT(std::size_t dim, std::size_t heads, Rng& rng, const std::string& name)
    : dim_(dim),
      heads_(heads),
      q_(dim, dim, rng, name + ".query"),
      k_(dim, dim, rng, name + ".key"),
      v_(dim, dim, rng, name + ".value"),
      out_(dim, dim, rng, name + ".out") {
  if (heads == 0 || dim % heads != 0)
    throw std::invalid_argument("attention: " + std::to_string(dim) + " dimensions do not split into " +
                                std::to_string(heads) + " heads");
}

template <class T>
TensorT<T> MultiHeadAttentionT<T>::forward(const TensorT<T>& x, const ArrayT<T>& mask) {
  if (x.dim() != 3 || x.shape()[2] != dim_)
    throw std::invalid_argument("attention(" + std::to_string(dim_) + "): input of shape " + shape_str(x.shape()) +
                                " is not (B, L, " + std::to_string(dim_) + ")");
  // one fused op reads each head's columns of q, k, v (B, L, d) in place and writes
  // the heads side by side, (B, L, d): no split or merge of the heads is copied
  const TensorT<T> mixed = attention(q_.forward(x), k_.forward(x), v_.forward(x), heads_, mask);
  return out_.forward(mixed);
}

template <class T>
std::vector<TensorT<T>> MultiHeadAttentionT<T>::parameters() const {
  std::vector<TensorT<T>> ps;
  for (const auto* d : {&q_, &k_, &v_, &out_})
    for (auto& p : d->parameters()) ps.push_back(p);
  return ps;
}

template <class T>
TransformerBlockT<T>::TransformerBlockT(std::size_t dim, std::size_t heads, std::size_t hidden, Rng& rng,
                                        const std::string& name)
    : norm1_(dim, name + ".norm1"),
      norm2_(dim, name + ".norm2"),
      attention_(dim, heads, rng, name + ".attention"),
      up_(dim, hidden, rng, name + ".mlp1"),
      down_(hidden, dim, rng, name + ".mlp2") {}

template <class T>
TensorT<T> TransformerBlockT<T>::forward(const TensorT<T>& x, const ArrayT<T>& mask) {
  const TensorT<T> h = add(x, attention_.forward(norm1_.forward(x), mask));
  return add(h, down_.forward(gelu(up_.forward(norm2_.forward(h)))));
}

template <class T>
std::vector<TensorT<T>> TransformerBlockT<T>::parameters() const {
  std::vector<TensorT<T>> ps = norm1_.parameters();
  for (auto& p : attention_.parameters()) ps.push_back(p);
  for (auto& p : norm2_.parameters()) ps.push_back(p);
  for (auto& p : up_.parameters()) ps.push_back(p);
  for (auto& p : down_.parameters()) ps.push_back(p);
  return ps;
}

template <class T>
PositionalEmbeddingT<T>::PositionalEmbeddingT(std::size_t length, std::size_t dim, Rng& rng, const std::string& name) {
  if (length == 0 || dim == 0) throw std::invalid_argument("positional embedding: sizes must be positive");
  ArrayT<T> t = ArrayT<T>::from_shape({length, dim});
  for (auto& v : t) v = T(0.02 * rng.normal());
  table_ = make_parameter<T>(name + ".table", std::move(t));
}

template <class T>
TensorT<T> PositionalEmbeddingT<T>::forward(const TensorT<T>& x) {
  const Shape& ts = table_.shape();
  if (x.dim() != 3 || x.shape()[1] != ts[0] || x.shape()[2] != ts[1])
    throw std::invalid_argument("positional embedding (" + std::to_string(ts[0]) + " positions of " +
                                std::to_string(ts[1]) + "): input of shape " + shape_str(x.shape()) +
                                " is not (B, " + std::to_string(ts[0]) + ", " + std::to_string(ts[1]) +
                                "); pad the sequences to the table's length");
  return add(x, table_);
}

template class MultiHeadAttentionT<float>;
template class MultiHeadAttentionT<double>;
template class TransformerBlockT<float>;
template class TransformerBlockT<double>;
template class PositionalEmbeddingT<float>;
template class PositionalEmbeddingT<double>;
template ArrayT<float> key_padding_mask(const std::vector<std::int32_t>&, std::size_t);
template ArrayT<double> key_padding_mask(const std::vector<std::int32_t>&, std::size_t);

}  // namespace dpgrad
