// Parameter averaging: see averaging.hpp.
#include "optim/averaging.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace dpgrad {

template <class T>
ParameterAverageT<T>::ParameterAverageT(std::vector<TensorT<T>> params, double decay)
    : params_(std::move(params)), decay_(decay) {
  if (!(decay > 0 && decay < 1))
    throw std::invalid_argument("parameter average: decay must be in (0, 1), got " + std::to_string(decay));
  for (const auto& p : params_) avg_.push_back(p.value());
}

template <class T>
void ParameterAverageT<T>::update() {
  const double d = std::min(decay_, (1.0 + double(t_)) / (10.0 + double(t_)));
  ++t_;
  const T a = T(d), b = T(1 - d);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    T* m = avg_[i].data();
    const T* p = params_[i].value().data();
    for (std::size_t k = 0, n = avg_[i].size(); k < n; ++k) m[k] = a * m[k] + b * p[k];
  }
}

template <class T>
void ParameterAverageT<T>::swap() {
  for (std::size_t i = 0; i < params_.size(); ++i) std::swap(params_[i].mutable_value(), avg_[i]);
}

template class ParameterAverageT<float>;
template class ParameterAverageT<double>;

}  // namespace dpgrad
