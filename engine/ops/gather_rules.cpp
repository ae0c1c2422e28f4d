// Per-sample rule of gather's uses: a table whose rows a sample's ids select
// (docs/math.md section 7); G_i is kept sparse, as the rows its ids touch.
#include <stdexcept>

#include "engine/per_sample_rule.hpp"

namespace dpgrad::detail {
namespace {

/// One sample's gradient of a table used by gather: the rows its ids touch, each
/// the sum of the cotangents at the positions that hold that id (in order of first
/// occurrence; padding, id -1, has none). No sort: a slot per table row.
template <class T>
class SampleRows {
 public:
  SampleRows(const std::vector<UseView<T>>& vs, std::size_t vocab, std::size_t p)
      : vs_(vs), p_(p), slot_(vocab, -1) {
    std::size_t steps = 0;
    for (const auto& v : vs) steps += v.steps;
    ids_.reserve(steps);
    rows_.reserve(steps * p);
  }
  void load(std::size_t i) {
    for (std::int32_t id : ids_) slot_[std::size_t(id)] = -1;
    ids_.clear();
    rows_.clear();
    for (const auto& v : vs_)
      for (std::size_t t = 0; t < v.steps; ++t) {
        std::int32_t id = v.ids[i * v.steps + t];
        if (id < 0) continue;
        const T* src = v.delta + (i * v.steps + t) * p_;
        std::int32_t& s = slot_[std::size_t(id)];
        if (s < 0) {
          s = std::int32_t(ids_.size());
          ids_.push_back(id);
          rows_.insert(rows_.end(), src, src + p_);
        } else {
          axpy(p_, T(1), src, rows_.data() + std::size_t(s) * p_);
        }
      }
  }
  std::size_t count() const { return ids_.size(); }
  const std::vector<std::int32_t>& ids() const { return ids_; }
  const T* rows() const { return rows_.data(); }  // (count, p)

 private:
  const std::vector<UseView<T>>& vs_;
  std::size_t p_;
  std::vector<std::int32_t> slot_;  // (V): row of each table row in rows_, or -1
  std::vector<std::int32_t> ids_;
  std::vector<T> rows_;
};

/// ||G_i||^2 for a table: sum over its distinct ids of ||sum of their delta_t||^2.
template <class T>
ArrayT<T> gather_norms(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t vocab, std::size_t p) {
  ArrayT<T> r = ArrayT<T>::from_shape({batch});
  for_samples(batch, [&](std::size_t i0, std::size_t i1) {
    SampleRows<T> rows(vs, vocab, p);
    for (std::size_t i = i0; i < i1; ++i) {
      rows.load(i);
      r.data()[i] = sq_norm(rows.rows(), rows.count() * p);
    }
  });
  return r;
}

template <class T>
class GatherRule final : public PerSampleRule<T> {
 public:
  void view(const ParamUse<T>& u, const Shape& ps, UseView<T>& v, std::size_t& d, std::size_t& p) const override {
    d = ps[0];  // vocabulary
    p = ps[1];
    v.ids = u.ids->data();
  }
  bool dense_gradients() const override { return false; }
  ArrayT<T> norms_squared(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d, std::size_t p,
                          NormMethod) const override {
    return gather_norms(vs, batch, d, p);
  }
  void gradient(const std::vector<UseView<T>>&, std::size_t, std::size_t, std::size_t, std::size_t, T*) const override {
    throw std::logic_error("per-sample rule: a table's gradients are sparse");
  }
  void sparse_gradients(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d, std::size_t p,
                        PerSampleGradients<T>& r) const override {
    r.sparse = true;
    r.offsets.assign(1, 0);
    std::size_t positions = 0;  // an upper bound on the rows kept
    for (const auto& v : vs) positions += batch * v.steps;
    r.row_ids.reserve(positions);
    r.rows.reserve(positions * p);
    SampleRows<T> rows(vs, d, p);
    for (std::size_t i = 0; i < batch; ++i) {
      rows.load(i);
      r.row_ids.insert(r.row_ids.end(), rows.ids().begin(), rows.ids().end());
      r.rows.insert(r.rows.end(), rows.rows(), rows.rows() + rows.count() * p);
      r.offsets.push_back(r.row_ids.size());
    }
  }
  void weighted_sum(const std::vector<UseView<T>>& vs, const T* ci, std::size_t batch, std::size_t vocab,
                    std::size_t p, T* out) const override {
    for_table_rows(vocab, [&](std::size_t lo, std::size_t hi) {
      for (const auto& v : vs)
        for (std::size_t i = 0; i < batch; ++i)
          for (std::size_t t = 0; t < v.steps; ++t) {
            const std::int32_t id = v.ids[i * v.steps + t];
            if (id < 0 || std::size_t(id) < lo || std::size_t(id) >= hi) continue;
            axpy(p, ci[i], v.delta + (i * v.steps + t) * p, out + std::size_t(id) * p);
          }
    });
  }
};

}  // namespace

template <class T>
const PerSampleRule<T>& gather_rule() {
  static const GatherRule<T> rule;
  return rule;
}
template const PerSampleRule<float>& gather_rule<float>();
template const PerSampleRule<double>& gather_rule<double>();

}  // namespace dpgrad::detail
