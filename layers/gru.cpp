// GRU and BiGRU layers: one input projection for all steps, then a loop of
// engine ops per step with masked state updates for padded sequences. No
// derivative and no per-sample rule is written here: the ops carry them.
#include "layers/gru.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/ops.hpp"
#include "layers/init.hpp"

namespace dpgrad {

namespace {

/// Throws unless lengths has B entries, each in [1, L].
void check_lengths(const std::vector<std::int32_t>& lengths, std::size_t B, std::size_t L) {
  if (lengths.size() != B)
    throw std::invalid_argument("gru: " + std::to_string(lengths.size()) + " lengths for a batch of " +
                                std::to_string(B));
  for (std::size_t i = 0; i < B; ++i)
    if (lengths[i] < 1 || std::size_t(lengths[i]) > L)
      throw std::invalid_argument("gru: length " + std::to_string(lengths[i]) + " of sample " + std::to_string(i) +
                                  " is outside [1, " + std::to_string(L) + "] (L = padded length of x)");
}

}  // namespace

template <class T>
GruOutputT<T> gru_sequence(const TensorT<T>& x, const TensorT<T>& w_ih, const TensorT<T>& w_hh,
                           const TensorT<T>& b_ih, const TensorT<T>& b_hh, const std::vector<std::int32_t>& lengths,
                           bool reverse, bool keep_states) {
  if (!x.defined() || !w_ih.defined() || !w_hh.defined() || !b_ih.defined() || !b_hh.defined())
    throw std::invalid_argument("gru: x and all weights must be defined");
  const Shape xs = x.shape(), ws = w_hh.shape();
  if (ws.size() != 2 || ws[0] == 0 || ws[1] != 3 * ws[0])
    throw std::invalid_argument("gru: w_hh " + shape_str(ws) + " must be (H, 3H) with H > 0");
  const std::size_t H = ws[0];
  if (xs.size() != 3) throw std::invalid_argument("gru: x " + shape_str(xs) + " must be (B, L, input)");
  const std::size_t B = xs[0], L = xs[1], d = xs[2];
  if (w_ih.shape() != Shape{d, 3 * H})
    throw std::invalid_argument("gru: w_ih " + shape_str(w_ih.shape()) + " must be " + shape_str({d, 3 * H}) +
                                " for x " + shape_str(xs) + " and H = " + std::to_string(H));
  for (const TensorT<T>* b : {&b_ih, &b_hh})
    if (b->shape() != Shape{3 * H})
      throw std::invalid_argument("gru: bias " + shape_str(b->shape()) + " must be " + shape_str({3 * H}));
  check_lengths(lengths, B, L);
  if (B == 0) return {constant<T>(xt::zeros<T>({std::size_t(0), L, H})), constant<T>(xt::zeros<T>({std::size_t(0), H}))};

  // Steps from the longest length on are padding in every sample: never projected.
  const std::size_t steps = std::size_t(*std::max_element(lengths.begin(), lengths.end()));
  const TensorT<T> proj = linear(steps < L ? slice(x, 1, 0, steps) : x, w_ih, b_ih);  // (B, steps, 3H)

  std::vector<TensorT<T>> states(keep_states ? L : 0);  // held only when asked for (their tangents too)
  // h_0 = 0 still goes through linear at the first step: b_hh must reach the
  // loss only through a parametric op, or its per-sample uses would be missing.
  // Its rows are the samples' own states: laid out like x's samples, so that
  // the per-sample rules accept that use (docs/per-sample.md).
  const Samples& xs_samples = x.samples();
  TensorT<T> h = xs_samples.blocks_on(0) ? per_sample_input<T>(xt::zeros<T>({B, H}), 0, xs_samples.count)
                                       : constant<T>(xt::zeros<T>({B, H}));  // (B, H)
  for (std::size_t s = 0; s < steps; ++s) {
    const std::size_t t = reverse ? steps - 1 - s : s;
    const TensorT<T> a = reshape(slice(proj, 1, t, t + 1), {B, 3 * H});  // (B, 3H): x_t W_ih + b_ih
    const TensorT<T> c = linear(h, w_hh, b_hh);                           // (B, 3H): h W_hh + b_hh
    const TensorT<T> rz = sigmoid(add(slice(a, 1, 0, 2 * H), slice(c, 1, 0, 2 * H)));  // (B, 2H): [r z]
    const TensorT<T> r = slice(rz, 1, 0, H);
    const TensorT<T> z = slice(rz, 1, H, 2 * H);
    const TensorT<T> n = tanh(add(slice(a, 1, 2 * H, 3 * H), mul(r, slice(c, 1, 2 * H, 3 * H))));
    const TensorT<T> h_new = add(n, mul(z, sub(h, n)));  // (1 - z) n + z h, in three ops

    ArrayT<T> m = xt::zeros<T>({B, std::size_t(1)});  // (B, 1): 1 where t < length
    std::size_t active = 0;
    for (std::size_t i = 0; i < B; ++i)
      if (t < std::size_t(lengths[i])) m(i, 0) = T(1), ++active;
    if (active == B) {  // no padding at this step: plain update
      h = h_new;
      if (keep_states) states[t] = h;
    } else {
      const TensorT<T> mask = constant<T>(m);
      const TensorT<T> keep = constant<T>(ArrayT<T>(T(1) - m));
      h = add(mul(mask, h_new), mul(keep, h));
      // Reverse: a padded sample has not started yet, so its state is still 0.
      if (keep_states) states[t] = reverse ? h : mul(mask, h);
    }
  }
  if (!keep_states) return {TensorT<T>(), h};
  for (std::size_t t = steps; t < L; ++t) states[t] = constant<T>(xt::zeros<T>({B, H}));
  return {stack(states, 1), h};
}

template <class T>
GruT<T>::GruT(std::size_t input, std::size_t hidden, Rng& rng, const std::string& name)
    : input_(input), hidden_(hidden) {
  if (input == 0 || hidden == 0) throw std::invalid_argument("GRU: input and hidden sizes must be positive");
  w_ih_ = make_parameter<T>(name + ".weight_ih", fan_in_uniform<T>({input, 3 * hidden}, hidden, rng));
  w_hh_ = make_parameter<T>(name + ".weight_hh", fan_in_uniform<T>({hidden, 3 * hidden}, hidden, rng));
  b_ih_ = make_parameter<T>(name + ".bias_ih", fan_in_uniform<T>({3 * hidden}, hidden, rng));
  b_hh_ = make_parameter<T>(name + ".bias_hh", fan_in_uniform<T>({3 * hidden}, hidden, rng));
}

template <class T>
typename GruT<T>::Output GruT<T>::forward(const TensorT<T>& x, const std::vector<std::int32_t>& lengths,
                                          bool reverse, bool keep_states) {
  return gru_sequence(x, w_ih_, w_hh_, b_ih_, b_hh_, lengths, reverse, keep_states);
}

template <class T>
std::vector<TensorT<T>> GruT<T>::parameters() const {
  return {w_ih_, w_hh_, b_ih_, b_hh_};
}

template GruOutputT<float> gru_sequence(const TensorT<float>&, const TensorT<float>&, const TensorT<float>&,
                                        const TensorT<float>&, const TensorT<float>&, const std::vector<std::int32_t>&,
                                        bool, bool);
template GruOutputT<double> gru_sequence(const TensorT<double>&, const TensorT<double>&, const TensorT<double>&,
                                         const TensorT<double>&, const TensorT<double>&,
                                         const std::vector<std::int32_t>&, bool, bool);
template class GruT<float>;
template class GruT<double>;

}  // namespace dpgrad
