// LSTM and BiLSTM layers: one input projection for all steps, then a loop of
// engine ops per step (the fused cell ops lstm_gates, lstm_state, lstm_output)
// with masked state updates for padded sequences. No derivative and no
// per-sample rule is written here.
#include "layers/lstm.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/ops.hpp"
#include "layers/init.hpp"

namespace dpgrad {

namespace {

std::string shape_text(const Shape& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

/// Throws unless lengths has B entries, each in [1, L].
void check_lengths(const std::vector<std::int32_t>& lengths, std::size_t B, std::size_t L) {
  if (lengths.size() != B)
    throw std::invalid_argument("lstm: " + std::to_string(lengths.size()) + " lengths for a batch of " +
                                std::to_string(B));
  for (std::size_t i = 0; i < B; ++i)
    if (lengths[i] < 1 || std::size_t(lengths[i]) > L)
      throw std::invalid_argument("lstm: length " + std::to_string(lengths[i]) + " of sample " + std::to_string(i) +
                                  " is outside [1, " + std::to_string(L) + "] (L = padded length of x)");
}

}  // namespace

template <class T>
LstmOutputT<T> lstm_sequence(const TensorT<T>& x, const TensorT<T>& w_ih, const TensorT<T>& w_hh,
                             const TensorT<T>& b, const std::vector<std::int32_t>& lengths, bool reverse, bool keep_states) {
  if (!x.defined() || !w_ih.defined() || !w_hh.defined() || !b.defined())
    throw std::invalid_argument("lstm: x and all weights must be defined");
  const Shape xs = x.shape(), ws = w_hh.shape();
  if (ws.size() != 2 || ws[0] == 0 || ws[1] != 4 * ws[0])
    throw std::invalid_argument("lstm: w_hh " + shape_text(ws) + " must be (H, 4H) with H > 0");
  const std::size_t H = ws[0];
  if (xs.size() != 3)
    throw std::invalid_argument("lstm: x " + shape_text(xs) + " must be (B, L, input)");
  const std::size_t B = xs[0], L = xs[1], d = xs[2];
  if (w_ih.shape() != Shape{d, 4 * H})
    throw std::invalid_argument("lstm: w_ih " + shape_text(w_ih.shape()) + " must be " + shape_text({d, 4 * H}) +
                                " for x " + shape_text(xs) + " and H = " + std::to_string(H));
  if (b.shape() != Shape{4 * H})
    throw std::invalid_argument("lstm: bias " + shape_text(b.shape()) + " must be " + shape_text({4 * H}));
  check_lengths(lengths, B, L);
  if (B == 0) return {constant<T>(xt::zeros<T>({std::size_t(0), L, H})), constant<T>(xt::zeros<T>({std::size_t(0), H}))};

  // Steps from the longest length on are padding in every sample: never projected.
  const std::size_t steps = std::size_t(*std::max_element(lengths.begin(), lengths.end()));
  const TensorT<T> proj = linear(steps < L ? slice(x, 1, 0, steps) : x, w_ih, b);  // (B, steps, 4H)

  std::vector<TensorT<T>> states(keep_states ? L : 0);  // held only when asked for (their tangents too)
  TensorT<T> h, c;  // (B, H); undefined while every sample's state is still zero
  const auto blocks = sole_step_readers(steps);  // each step of proj is read once, below, and nowhere else
  for (std::size_t s = 0; s < steps; ++s) {
    const std::size_t t = reverse ? steps - 1 - s : s;
    // gates [i f g o] of x_t W_ih + b (read in place from proj) + h W_hh
    const TensorT<T> a = lstm_gates_at(proj, t, h.defined() ? linear(h, w_hh) : TensorT<T>(), blocks);
    TensorT<T> c_new = lstm_state(a, c);         // i g + f c (i g while c is zero)
    TensorT<T> h_new = lstm_output(a, c_new);    // o tanh(c_new)

    ArrayT<T> m = xt::zeros<T>({B, std::size_t(1)});  // (B, 1): 1 where t < length
    std::size_t active = 0;
    for (std::size_t n = 0; n < B; ++n)
      if (t < std::size_t(lengths[n])) m(n, 0) = T(1), ++active;
    if (active == B) {  // no padding at this step: plain update
      h = h_new;
      c = c_new;
      if (keep_states) states[t] = h;
    } else if (!h.defined()) {  // previous state zero: h = m h_new
      const TensorT<T> mask = constant<T>(m);
      h = mul(mask, h_new);
      c = mul(mask, c_new);
      if (keep_states) states[t] = h;
    } else {
      const TensorT<T> mask = constant<T>(m);
      const TensorT<T> keep = constant<T>(ArrayT<T>(T(1) - m));
      h = add(mul(mask, h_new), mul(keep, h));
      c = add(mul(mask, c_new), mul(keep, c));
      // Reverse: a padded sample has not started yet, so its state is still 0.
      if (keep_states) states[t] = reverse ? h : mul(mask, h);
    }
  }
  if (!keep_states) return {TensorT<T>(), h};
  for (std::size_t t = steps; t < L; ++t) states[t] = constant<T>(xt::zeros<T>({B, H}));
  return {stack(states, 1), h};
}

template <class T>
LstmT<T>::LstmT(std::size_t input, std::size_t hidden, Rng& rng, const std::string& name)
    : input_(input), hidden_(hidden) {
  if (input == 0 || hidden == 0) throw std::invalid_argument("LSTM: input and hidden sizes must be positive");
  w_ih_ = make_parameter<T>(name + ".weight_ih", fan_in_uniform<T>({input, 4 * hidden}, hidden, rng));
  w_hh_ = make_parameter<T>(name + ".weight_hh", fan_in_uniform<T>({hidden, 4 * hidden}, hidden, rng));
  b_ = make_parameter<T>(name + ".bias", fan_in_uniform<T>({4 * hidden}, hidden, rng));
}

template <class T>
typename LstmT<T>::Output LstmT<T>::forward(const TensorT<T>& x, const std::vector<std::int32_t>& lengths,
                                            bool reverse, bool keep_states) {
  return lstm_sequence(x, w_ih_, w_hh_, b_, lengths, reverse, keep_states);
}

template <class T>
std::vector<TensorT<T>> LstmT<T>::parameters() const {
  return {w_ih_, w_hh_, b_};
}

template LstmOutputT<float> lstm_sequence(const TensorT<float>&, const TensorT<float>&, const TensorT<float>&,
                                          const TensorT<float>&, const std::vector<std::int32_t>&, bool, bool);
template LstmOutputT<double> lstm_sequence(const TensorT<double>&, const TensorT<double>&, const TensorT<double>&,
                                           const TensorT<double>&, const std::vector<std::int32_t>&, bool, bool);
template class LstmT<float>;
template class LstmT<double>;

}  // namespace dpgrad
