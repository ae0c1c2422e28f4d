// Per-sample rule of a parameter used by an elementwise op (docs/per-sample.md,
// "Elementwise parameters"): y = x * w, y = x + w or y = x - w, with w broadcast
// over the output's axis 0 (the samples' axis). A LayerNorm's gain and shift, a
// learned positional table, a user's scale: sample i's gradient is its rows of
// dout (times x for mul) summed onto w's elements, G_i[k] = sum over the
// elements e of sample i's rows that read w[k] of dout[e] (x[e]).
//
// G_i has w's size, which is at most a sample's share of the output: the rule
// builds G_i for norms (ghost and vanilla alike) and sums c_i G_i in one pass.
#include <algorithm>
#include <stdexcept>

#include <xtensor/xbroadcast.hpp>
#include <xtensor/xmanipulation.hpp>

#include "engine/per_sample_rule.hpp"

namespace dpgrad::detail {

namespace {

/// For every element of `out`, the element of `param` (numpy-broadcast against
/// out) that it reads.
std::vector<std::uint32_t> full_index(const Shape& param, const Shape& out) {
  const std::size_t nd = out.size(), lead = nd - param.size();
  std::vector<std::size_t> stride(nd, 0);
  for (std::size_t i = nd, s = 1; i-- > lead;) {
    const std::size_t len = param[i - lead];
    stride[i] = len == 1 ? 0 : s;
    s *= len;
  }
  std::vector<std::uint32_t> index(numel(out));
  std::vector<std::size_t> idx(nd, 0);
  for (std::size_t e = 0; e < index.size(); ++e) {
    std::size_t k = 0;
    for (std::size_t i = 0; i < nd; ++i) k += idx[i] * stride[i];
    index[e] = std::uint32_t(k);
    for (std::size_t i = nd; i-- > 0;)
      if (++idx[i] < out[i]) break;
      else idx[i] = 0;
  }
  return index;
}

/// For each element of one row of `out` (all axes but 0), the element of `param`
/// (numpy-broadcast against out) that it reads; null when param varies along
/// out's axis 0 (it would then read different elements for different samples).
std::shared_ptr<const std::vector<std::uint32_t>> row_index(const Shape& param, const Shape& out) {
  const std::size_t nd = out.size(), lead = nd - param.size();
  if (nd == 0 || param.size() > nd) return nullptr;
  if (lead == 0 && param[0] != 1) return nullptr;
  Shape row = out;  // param does not vary along axis 0: one row's index is every row's
  row[0] = 1;
  return std::make_shared<const std::vector<std::uint32_t>>(full_index(param, row));
}

/// The row index of a use whose samples are moved to the front by `order`:
/// sample 0's block of the moved index, when every sample's block reads the
/// same elements; null when the parameter varies with the sample.
std::shared_ptr<const std::vector<std::uint32_t>> moved_row_index(const Shape& param, const Shape& out,
                                                                 const SamplesToFront& order, std::size_t count) {
  if (param.size() > out.size() || count == 0) return nullptr;
  const std::vector<std::uint32_t> full = full_index(param, out);
  const xt::xarray<std::uint32_t> flat = xt::adapt(full, std::vector<std::size_t>{full.size()});
  const xt::xarray<std::uint32_t> moved = xt::transpose(xt::reshape_view(flat, order.split), order.perm);
  const std::size_t per = moved.size() / count;
  for (std::size_t i = 1; i < count; ++i)
    if (!std::equal(moved.data(), moved.data() + per, moved.data() + i * per)) return nullptr;
  return std::make_shared<const std::vector<std::uint32_t>>(moved.data(), moved.data() + per);
}

template <class T>
class ElementwiseRule final : public PerSampleRule<T> {
 public:
  void view(const ParamUse<T>& u, const Shape& ps, UseView<T>& v, std::size_t& d, std::size_t& p) const override {
    if (!u.row_index)
      throw std::invalid_argument(std::string("per-sample rule: a parameter of shape ") + shape_str(ps) +
                                  " is used by " + u.op +
                                  " along the samples' axis 0; an elementwise parameter must broadcast over it "
                                  "(give it a leading axis of 1, or fewer axes)");
    d = 1;
    p = numel(ps);
    v.a = u.input ? u.input->value.data() : nullptr;
    v.use = &u;
  }
  NormMethod cheaper_norm_method(const ParamUses<T>&) const override { return NormMethod::materialise; }

  ArrayT<T> norms_squared(const std::vector<UseView<T>>& vs, std::size_t batch, std::size_t d, std::size_t p,
                          NormMethod) const override {
    ArrayT<T> r = ArrayT<T>::from_shape({batch});
    for_samples(batch, [&](std::size_t i0, std::size_t i1) {
      std::vector<T> g(p);
      for (std::size_t i = i0; i < i1; ++i) {
        gradient(vs, i, batch, d, p, g.data());
        r.data()[i] = sq_norm(g.data(), p);
      }
    });
    return r;
  }
  void gradient(const std::vector<UseView<T>>& vs, std::size_t i, std::size_t, std::size_t, std::size_t p,
                T* g) const override {
    std::fill_n(g, p, T(0));
    for (const auto& v : vs) add_sample(v, i, p, T(1), g);
  }
  void weighted_sum(const std::vector<UseView<T>>& vs, const T* c, std::size_t batch, std::size_t, std::size_t p,
                    T* out) const override {
    parallel::sum_pieces(batch, 1, p, out, [&](std::size_t i0, std::size_t i1, T* acc) {
      for (std::size_t i = i0; i < i1; ++i)
        for (const auto& v : vs) add_sample(v, i, p, c[i], acc);
    });
  }

 private:
  /// g += c G_i's part from one use: sample i's rows of dout (times x) onto w.
  static void add_sample(const UseView<T>& v, std::size_t i, std::size_t p, T c, T* g) {
    const std::vector<std::uint32_t>& index = *v.use->row_index;
    const std::size_t m = index.size(), block = v.steps * p, rows = m ? block / m : 0;
    if (v.use->negated) c = -c;
    const T* delta = v.delta + i * block;
    const T* x = v.a ? v.a + i * block : nullptr;
    if (const std::size_t q = v.use->row_period) {  // g[e mod q] += ...: runs of q in order, no gather
      for (std::size_t e0 = 0; e0 < block; e0 += q) {
        const T* __restrict dr = delta + e0;
        T* __restrict gr = g;
        if (x) {
          const T* __restrict xr = x + e0;
          for (std::size_t e = 0; e < q; ++e) gr[e] += c * dr[e] * xr[e];
        } else {
          for (std::size_t e = 0; e < q; ++e) gr[e] += c * dr[e];
        }
      }
      return;
    }
    for (std::size_t r = 0; r < rows; ++r, delta += m) {
      if (x) {
        for (std::size_t e = 0; e < m; ++e) g[index[e]] += c * delta[e] * x[e];
        x += m;
      } else {
        for (std::size_t e = 0; e < m; ++e) g[index[e]] += c * delta[e];
      }
    }
  }
};

}  // namespace

template <class T>
ParamUse<T>* record_elementwise_use(TapeT<T>& tape, const std::shared_ptr<Node<T>>& param,
                                    const std::shared_ptr<Node<T>>& other, bool multiplies, bool negated,
                                    const Shape& out, const char* op, SamplesToFront& moved) {
  ParamUse<T>* u = tape.add_use(param, UseKind::elementwise);
  u->op = op;
  u->negated = negated;
  u->samples = other->samples;
  moved = SamplesToFront{};
  // where other's samples are on the output's axes, and whether they are off
  // axis 0 or interleaved along it: then the rule reads them moved to the front
  Samples where = other->samples;
  const Shape os = shape_of(other->value), ps = shape_of(param->value);
  bool movable = false;
  if (where.kind == Samples::Kind::axis && where.count > 1 && os.size() <= out.size()) {
    where.axis += out.size() - os.size();
    movable = os[other->samples.axis] == out[where.axis] && (where.axis > 0 || where.outer > 1);
  }
  if (movable) {
    moved = samples_to_front(where, out);
    u->samples = Samples::at(0, where.count);
    u->row_index = moved_row_index(ps, out, moved, where.count);
  } else {
    u->row_index = row_index(ps, out);
  }
  if (u->row_index) {  // the common layout: a row reads the parameter whole, over and over
    const std::vector<std::uint32_t>& index = *u->row_index;
    const std::size_t q = numel(ps);
    bool periodic = q > 0 && index.size() % q == 0;
    for (std::size_t e = 0; periodic && e < index.size(); ++e) periodic = index[e] == e % q;
    u->row_period = periodic ? q : 0;
  }
  if (multiplies) {
    if (os == out && moved.identity) {
      u->input = other;  // kept alive, not copied
    } else {  // x broadcast too (x (B, 1, d) against w (L, d)), or moved: the rule reads it at the output's shape
      auto expanded = std::make_shared<Node<T>>();
      expanded->value = xt::broadcast(other->value, out);
      if (!moved.identity) expanded->value = samples_in_front<T>(expanded->value, moved);
      expanded->samples = u->samples;
      u->input = expanded;
    }
  }
  return u;
}

template <class T>
ArrayT<T> samples_in_front(const ArrayT<T>& a, const SamplesToFront& order) {
  return xt::transpose(xt::reshape_view(a, order.split), order.perm);
}

template <class T>
const PerSampleRule<T>& elementwise_rule() {
  static const ElementwiseRule<T> rule;
  return rule;
}

#define DPGRAD_INSTANTIATE(T)                                                                                  \
  template ParamUse<T>* record_elementwise_use(TapeT<T>&, const std::shared_ptr<Node<T>>&,                     \
                                               const std::shared_ptr<Node<T>>&, bool, bool, const Shape&,      \
                                               const char*, SamplesToFront&);                                  \
  template ArrayT<T> samples_in_front(const ArrayT<T>&, const SamplesToFront&);                                \
  template const PerSampleRule<T>& elementwise_rule<T>();
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)
#undef DPGRAD_INSTANTIATE

}  // namespace dpgrad::detail
