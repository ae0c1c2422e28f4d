// LayerNorm and GroupNorm (layers/norm.hpp), from engine ops only.
#include "layers/norm.hpp"

#include <algorithm>

#include <cmath>
#include <numeric>
#include <stdexcept>

#include "engine/ops.hpp"

namespace dpgrad {

template <class T>
TensorT<T> normalise(const TensorT<T>& x, std::vector<std::size_t> axes, double eps) {
  if (!(eps > 0)) throw std::invalid_argument("normalise: eps must be > 0");
  const TensorT<T> centred = sub(x, mean(x, axes, true));
  const TensorT<T> var = mean(mul(centred, centred), axes, true);
  return mul(centred, rsqrt(add_scalar(var, T(eps))));  // var + eps >= eps > 0
}

namespace {
/// A normalisation's gain (ones) and shift (zeros) over n channels.
template <class T>
void affine(const std::string& name, std::size_t n, TensorT<T>& gain, TensorT<T>& shift) {
  gain = make_parameter<T>(name + ".gain", xt::ones<T>({n}));
  shift = make_parameter<T>(name + ".shift", xt::zeros<T>({n}));
}
template <class T>
std::vector<TensorT<T>> affine_parameters(const TensorT<T>& gain, const TensorT<T>& shift) {
  if (!gain.defined()) return {};
  return {gain, shift};
}
}  // namespace

template <class T>
LayerNormT<T>::LayerNormT(std::size_t dim, const std::string& name, double eps, bool affine) : dim_(dim), eps_(eps) {
  if (dim == 0) throw std::invalid_argument("LayerNorm: the dimension must be positive");
  if (!(eps > 0)) throw std::invalid_argument("LayerNorm: eps must be > 0");
  if (affine) dpgrad::affine(name, dim, gain_, shift_);
}

template <class T>
TensorT<T> LayerNormT<T>::forward(const TensorT<T>& x) {
  if (x.dim() < 2 || x.shape().back() != dim_)
    throw std::invalid_argument("LayerNorm(" + std::to_string(dim_) + "): input of shape " + shape_str(x.shape()) +
                                " has no last axis of that size after the batch axis");
  return layer_norm(x, gain_, shift_, eps_);  // one fused op; gain and shift recorded as elementwise uses
}

template <class T>
std::vector<TensorT<T>> LayerNormT<T>::parameters() const {
  return affine_parameters(gain_, shift_);
}

template <class T>
GroupNormT<T>::GroupNormT(std::size_t channels, std::size_t groups, const std::string& name, double eps, bool affine)
    : channels_(channels), groups_(groups), eps_(eps) {
  if (channels == 0 || groups == 0 || channels % groups != 0)
    throw std::invalid_argument("GroupNorm: " + std::to_string(channels) + " channels do not split into " +
                                std::to_string(groups) + " equal groups");
  if (!(eps > 0)) throw std::invalid_argument("GroupNorm: eps must be > 0");
  if (affine) dpgrad::affine(name, channels, gain_, shift_);
}

template <class T>
TensorT<T> GroupNormT<T>::forward(const TensorT<T>& x) {
  if (x.dim() < 2 || x.shape().back() != channels_)
    throw std::invalid_argument("GroupNorm(" + std::to_string(channels_) + " channels): input of shape " +
                                shape_str(x.shape()) + " is not channels-last with that many channels");
  // (B, ..., C) -> (B, ..., G, C / G): normalised over every axis but the batch's and the group's
  Shape grouped = x.shape();
  grouped.pop_back();
  grouped.push_back(groups_);
  grouped.push_back(channels_ / groups_);
  std::vector<std::size_t> axes;
  for (std::size_t a = 1; a + 2 < grouped.size(); ++a) axes.push_back(a);
  axes.push_back(grouped.size() - 1);
  TensorT<T> y = reshape(normalise(reshape(x, grouped), axes, eps_), x.shape());
  if (gain_.defined()) y = add(mul(y, gain_), shift_);
  return y;
}

template <class T>
std::vector<TensorT<T>> GroupNormT<T>::parameters() const {
  return affine_parameters(gain_, shift_);
}

template <class T>
CentreT<T>::CentreT(ArrayT<T> centre) : centre_(std::move(centre)) {
  if (centre_.size() == 0) throw std::invalid_argument("Centre: the centre is empty");
  for (const T v : centre_)
    if (!std::isfinite(double(v))) throw std::invalid_argument("Centre: the centre has a non-finite entry");
  Shape s = shape_of(centre_);
  s.insert(s.begin(), 1);
  centre_.reshape(s);
}

template <class T>
void CentreT<T>::set_centre(const ArrayT<T>& centre) {
  if (centre.size() != centre_.size())
    throw std::invalid_argument("Centre: " + std::to_string(centre.size()) + " values for a centre of " +
                                std::to_string(centre_.size()));
  for (const T v : centre)
    if (!std::isfinite(double(v))) throw std::invalid_argument("Centre: the centre has a non-finite entry");
  std::copy(centre.begin(), centre.end(), centre_.begin());
}

template <class T>
TensorT<T> CentreT<T>::forward(const TensorT<T>& x) {
  Shape one = x.shape();
  if (one.empty()) throw std::invalid_argument("Centre: input has no batch axis");
  one[0] = 1;
  if (one != shape_of(centre_))
    throw std::invalid_argument("Centre: samples of shape " + shape_str(x.shape()) + " against a centre of shape " +
                                shape_str(shape_of(centre_)));
  return sub(x, constant(centre_));
}

template class LayerNormT<float>;
template class LayerNormT<double>;
template class GroupNormT<float>;
template class GroupNormT<double>;
template class CentreT<float>;
template class CentreT<double>;
template TensorT<float> normalise(const TensorT<float>&, std::vector<std::size_t>, double);
template TensorT<double> normalise(const TensorT<double>&, std::vector<std::size_t>, double);

}  // namespace dpgrad
