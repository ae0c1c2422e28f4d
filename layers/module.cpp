// Module plumbing: parameter counting, Sequential, batch selection.
#include "layers/module.hpp"

#include <stdexcept>

#include "engine/array.hpp"
#include "engine/ops.hpp"
#include "layers/dropout.hpp"

namespace dpgrad {

template <class T>
std::size_t ModuleT<T>::parameter_count() const {
  std::size_t n = 0;
  for (const auto& p : parameters()) n += p.size();
  return n;
}

template <class T>
SequentialT<T>& SequentialT<T>::add(std::unique_ptr<LayerT<T>> layer) {
  if (!layer) throw std::invalid_argument("Sequential::add: null layer");
  layers_.push_back(std::move(layer));
  return *this;
}

template <class T>
TensorT<T> SequentialT<T>::forward(const TensorT<T>& x) {
  TensorT<T> h = x;
  for (auto& l : layers_) h = l->forward(h);
  return h;
}

template <class T>
std::vector<TensorT<T>> SequentialT<T>::parameters() const {
  std::vector<TensorT<T>> ps;
  for (const auto& l : layers_)
    for (auto& p : l->parameters()) ps.push_back(p);
  return ps;
}

template <class T>
void SequentialT<T>::set_training(bool on) {
  this->training_ = on;
  for (auto& l : layers_) l->set_training(on);
}

template <class T>
TensorT<T> ModelT<T>::row_losses(const TensorT<T>& outputs, const BatchT<T>& batch) const {
  if (loss_) return loss_(outputs, batch);
  if (batch.labels.empty())
    throw std::invalid_argument(name() + ": the batch has no class labels for the default cross-entropy loss; "
                                "set a loss for real-valued targets (mse_loss, bce_with_logits_loss)");
  return cross_entropy(outputs, batch.labels);
}

template <class T>
TensorT<T> FeatureModelT<T>::forward(const BatchT<T>& batch) {
  const DropoutRecords records(batch);  // dropout masks keyed by these rows' records (layers/dropout.hpp)
  return net_.forward(per_sample_input(batch.inputs));
}

template <class T>
void FeatureModelT<T>::set_training(bool on) {
  this->training_ = on;
  net_.set_training(on);
}

template class ModuleT<float>;
template class ModuleT<double>;
template class SequentialT<float>;
template class SequentialT<double>;
template class ModelT<float>;
template class ModelT<double>;
template class FeatureModelT<float>;
template class FeatureModelT<double>;

}  // namespace dpgrad
