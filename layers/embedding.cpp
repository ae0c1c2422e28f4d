// Embedding: N(0, 1) table, lookup by the engine's gather.
#include "layers/embedding.hpp"

#include <stdexcept>

#include "engine/ops.hpp"
#include "engine/random.hpp"

namespace dpgrad {

template <class T>
EmbeddingT<T>::EmbeddingT(std::size_t vocab, std::size_t dim, Rng& rng, const std::string& name,
                          std::int32_t padding_id)
    : padding_id_(padding_id) {
  if (vocab == 0 || dim == 0) throw std::invalid_argument("Embedding '" + name + "': vocab and dim must be positive");
  if (padding_id >= 0 && std::size_t(padding_id) >= vocab)
    throw std::invalid_argument("Embedding '" + name + "': padding id " + std::to_string(padding_id) +
                                " outside [0, " + std::to_string(vocab) + ")");
  ArrayT<T> w = ArrayT<T>::from_shape({vocab, dim});
  rng.fill_normal(w.data(), w.size(), 1.0);
  if (padding_id >= 0) std::fill_n(w.data() + std::size_t(padding_id) * dim, dim, T(0));
  w_ = make_parameter<T>(name + ".weight", std::move(w));
}

template <class T>
void EmbeddingT<T>::freeze() {
  if (frozen_) return;
  w_ = TensorT<T>(w_.value(), false);
  frozen_ = true;
}

template <class T>
TensorT<T> EmbeddingT<T>::forward(const ArrayT<std::int32_t>& ids) {
  if (ids.dimension() != 2)
    throw std::invalid_argument("Embedding: ids must be (B, L), got " + std::to_string(ids.dimension()) + " axes");
  return gather(w_, ids, padding_id_);
}

template class EmbeddingT<float>;
template class EmbeddingT<double>;

}  // namespace dpgrad
