// BatchT: rows, examples and selection (data/batch.hpp).
#include "data/batch.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dpgrad {

namespace {
/// Rows of a (B, ...) array.
template <class V>
ArrayT<V> take_rows(const ArrayT<V>& a, const std::vector<std::size_t>& rows) {
  if (a.dimension() == 0) return a;  // absent (a default array is 0-d)
  Shape s = shape_of(a);
  std::size_t row = s[0] == 0 ? 0 : a.size() / s[0];
  s[0] = rows.size();
  ArrayT<V> r = ArrayT<V>::from_shape(s);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= a.shape()[0]) throw std::out_of_range("Batch::select: row " + std::to_string(rows[i]) + " out of range");
    std::copy_n(a.data() + rows[i] * row, row, r.data() + i * row);
  }
  return r;
}
}  // namespace

template <class T>
std::size_t BatchT<T>::size() const {
  if (!labels.empty() || targets.dimension() == 0) return labels.size();
  return targets.shape()[0];
}

template <class T>
std::size_t BatchT<T>::examples() const {
  const std::size_t rows = size();
  if (views == 0 || rows % views != 0)
    throw std::invalid_argument("Batch: " + std::to_string(rows) + " rows are not whole examples of " +
                                std::to_string(views) + " views");
  if (!labels.empty() && targets.dimension() > 0 && targets.shape()[0] != labels.size())
    throw std::invalid_argument("Batch: " + std::to_string(labels.size()) + " labels but " +
                                std::to_string(targets.shape()[0]) + " rows of targets");
  return rows / views;
}

template <class T>
BatchT<T> BatchT<T>::select(const std::vector<std::size_t>& index) const {
  const std::size_t count = examples();
  std::vector<std::size_t> rows;
  rows.reserve(index.size() * views);
  for (auto e : index) {
    if (e >= count) throw std::out_of_range("Batch::select: example " + std::to_string(e) + " out of range");
    for (std::size_t k = 0; k < views; ++k) rows.push_back(e * views + k);
  }
  BatchT<T> b;
  b.views = views;
  b.inputs = take_rows(inputs, rows);
  b.tokens = take_rows(tokens, rows);
  b.targets = take_rows(targets, rows);
  for (auto r : rows) {
    if (!labels.empty()) b.labels.push_back(labels[r]);
    if (!lengths.empty()) b.lengths.push_back(lengths[r]);
    if (!ids.empty()) b.ids.push_back(ids[r]);
  }
  return b;
}

template struct BatchT<float>;
template struct BatchT<double>;

}  // namespace dpgrad
