// Tensor handles: accessors that check their preconditions.
#include "engine/tensor.hpp"

#include <stdexcept>

namespace dpgrad {

template <class T>
TensorT<T>::TensorT(ArrayT<T> value, bool requires_grad) : node_(std::make_shared<Node<T>>()) {
  acquire();
  node_->value = std::move(value);
  node_->requires_grad = requires_grad;
}

template <class T>
T TensorT<T>::item() const {
  if (size() != 1)
    throw std::invalid_argument("item(): tensor has " + std::to_string(size()) + " elements, not 1");
  return *node_->value.data();
}

template <class T>
const ArrayT<T>& TensorT<T>::grad() const {
  if (!node_->has_grad) {
    node_->grad = xt::zeros<T>(node_->value.shape());
    node_->has_grad = true;
  }
  return node_->grad;
}

template <class T>
void TensorT<T>::zero_grad() {
  node_->has_grad = false;
  node_->grad = ArrayT<T>();
}

template <class T>
const ArrayT<T>& TensorT<T>::tangent() const {
  if (!node_->has_tangent) throw std::logic_error("tangent(): tensor '" + node_->name + "' has no tangent");
  return node_->tangent;
}

template <class T>
void TensorT<T>::set_tangent(ArrayT<T> tangent) {
  const auto& v = node_->value.shape();
  const auto& t = tangent.shape();
  bool ok = t.size() == v.size() + 1 && t[0] >= 1 && std::equal(v.begin(), v.end(), t.begin() + 1);
  if (!ok) throw std::invalid_argument("set_tangent: tangent must have shape (k, ...value shape)");
  node_->tangent = std::move(tangent);
  node_->has_tangent = true;
}

template <class T>
void TensorT<T>::clear_tangent() {
  node_->tangent = ArrayT<T>();
  node_->has_tangent = false;
}

template <class T>
TensorT<T> make_parameter(std::string name, ArrayT<T> value) {
  TensorT<T> p(std::move(value), true);
  p.node()->is_parameter = true;
  p.node()->name = std::move(name);
  return p;
}

template <class T>
TensorT<T> per_sample_input(ArrayT<T> value, std::size_t axis, std::size_t count) {
  if (axis >= value.dimension())
    throw std::invalid_argument("per_sample_input: axis " + std::to_string(axis) + " out of range for shape " +
                                shape_str(shape_of(value)));
  const std::size_t extent = value.shape()[axis];
  if (count == 0) count = extent;
  if (count == 0 ? extent != 0 : extent % count != 0)
    throw std::invalid_argument("per_sample_input: " + std::to_string(count) + " samples do not divide axis " +
                                std::to_string(axis) + " of length " + std::to_string(extent));
  TensorT<T> x(std::move(value), false);
  x.node()->samples = Samples::at(axis, count);
  return x;
}

template class TensorT<float>;
template class TensorT<double>;
template TensorT<float> per_sample_input(ArrayT<float>, std::size_t, std::size_t);
template TensorT<double> per_sample_input(ArrayT<double>, std::size_t, std::size_t);
template TensorT<float> make_parameter(std::string, ArrayT<float>);
template TensorT<double> make_parameter(std::string, ArrayT<double>);

}  // namespace dpgrad
