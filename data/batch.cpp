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

namespace {
/// The rows of `parts`' arrays `field` stacked: all absent, or all (R_k, ...) with one row shape.
template <class V, class T>
ArrayT<V> stack_rows(const std::vector<BatchT<T>>& parts, ArrayT<V> BatchT<T>::*field, const char* name) {
  const ArrayT<V>& first = parts.front().*field;
  std::size_t rows = 0;
  for (const auto& p : parts) {
    const ArrayT<V>& a = p.*field;
    bool same = a.dimension() == first.dimension();
    for (std::size_t k = 1; same && k < a.dimension(); ++k) same = a.shape()[k] == first.shape()[k];
    if (!same)
      throw std::invalid_argument(std::string("concat_batches: the parts' ") + name + " have different row shapes");
    if (a.dimension() > 0) rows += a.shape()[0];
  }
  if (first.dimension() == 0) return first;
  Shape s = shape_of(first);
  s[0] = rows;
  ArrayT<V> r = ArrayT<V>::from_shape(s);
  V* out = r.data();
  for (const auto& p : parts) out = std::copy((p.*field).begin(), (p.*field).end(), out);
  return r;
}

template <class V>
void append(std::vector<V>& to, const std::vector<V>& from, bool expected, std::size_t rows, const char* name) {
  if (from.empty() ? expected && rows > 0 : !expected)
    throw std::invalid_argument(std::string("concat_batches: some parts have ") + name + " and others do not");
  to.insert(to.end(), from.begin(), from.end());
}
}  // namespace

template <class T>
BatchT<T> concat_batches(const std::vector<BatchT<T>>& parts) {
  BatchT<T> r;
  if (parts.empty()) return r;
  const BatchT<T>& first = parts.front();
  r.views = first.views;
  for (const auto& p : parts)
    if (p.views != first.views) throw std::invalid_argument("concat_batches: the parts have different views");
  r.inputs = stack_rows(parts, &BatchT<T>::inputs, "inputs");
  r.tokens = stack_rows(parts, &BatchT<T>::tokens, "tokens");
  r.targets = stack_rows(parts, &BatchT<T>::targets, "targets");
  for (const auto& p : parts) {
    const std::size_t rows = p.size();
    append(r.labels, p.labels, !first.labels.empty(), rows, "labels");
    append(r.lengths, p.lengths, !first.lengths.empty(), rows, "lengths");
    append(r.ids, p.ids, !first.ids.empty(), rows, "ids");
  }
  r.examples();  // whole examples, labels and targets agreeing
  return r;
}

template struct BatchT<float>;
template struct BatchT<double>;
template BatchT<float> concat_batches(const std::vector<BatchT<float>>&);
template BatchT<double> concat_batches(const std::vector<BatchT<double>>&);

}  // namespace dpgrad
