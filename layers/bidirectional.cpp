// BidirectionalT (layers/bidirectional.hpp), instantiated for the LSTM and GRU cells.
#include "layers/bidirectional.hpp"

#include "engine/ops.hpp"
#include "layers/gru.hpp"
#include "layers/lstm.hpp"

namespace dpgrad {

template <class T, class Cell>
BidirectionalT<T, Cell>::BidirectionalT(std::size_t input, std::size_t hidden, Rng& rng, const std::string& name)
    : fwd_(input, hidden, rng, name + ".forward"), bwd_(input, hidden, rng, name + ".backward") {}

template <class T, class Cell>
typename BidirectionalT<T, Cell>::Output BidirectionalT<T, Cell>::forward(const TensorT<T>& x,
                                                                          const std::vector<std::int32_t>& lengths,
                                                                          bool keep_states) {
  auto f = fwd_.forward(x, lengths, false, keep_states);
  auto r = bwd_.forward(x, lengths, true, keep_states);
  return {keep_states ? concat<T>({f.states, r.states}, 2) : TensorT<T>(), concat<T>({f.final, r.final}, 1)};
}

template <class T, class Cell>
std::vector<TensorT<T>> BidirectionalT<T, Cell>::parameters() const {
  std::vector<TensorT<T>> p = fwd_.parameters();
  for (auto& t : bwd_.parameters()) p.push_back(t);
  return p;
}

template class BidirectionalT<float, LstmT<float>>;
template class BidirectionalT<double, LstmT<double>>;
template class BidirectionalT<float, GruT<float>>;
template class BidirectionalT<double, GruT<double>>;

}  // namespace dpgrad
