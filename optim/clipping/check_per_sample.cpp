// check_per_sample: the per-example loop as the oracle for every exact route.
#include "optim/clipping/check_per_sample.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>

#include "engine/ops.hpp"
#include "engine/per_sample.hpp"
#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "optim/clipping/clipping.hpp"
#include "privacy/accountant.hpp"

namespace dpgrad {

namespace {

/// max_i |got_i - want_i| / want_i (an exact zero against zero counts as 0).
double norm_error(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double diff = std::abs(got[i] - want[i]);
    e = std::max(e, diff == 0 ? 0.0 : diff / std::max(want[i], 1e-300));
  }
  return e;
}

template <class T>
std::vector<double> to_vector(const ArrayT<T>& a) {
  return std::vector<double>(a.begin(), a.end());
}

/// ||got - want|| / ||want|| over all parameters together.
template <class T>
double sum_error(const std::vector<ArrayT<T>>& got, const std::vector<ArrayT<T>>& want) {
  double num = 0, den = 0;
  for (std::size_t j = 0; j < want.size(); ++j) {
    num += double(xt::sum(xt::square(got[j] - want[j]))());
    den += double(xt::sum(xt::square(want[j]))());
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

/// The engine's rules taken directly: ||G_i|| by `method`, summed over parameters.
template <class T>
std::vector<double> rule_norms(ModelT<T>& model, const BatchT<T>& batch, NormMethod method) {
  auto ps = model.parameters();
  TapeT<T> tape;
  record_uses(tape, model, batch, ps);
  ArrayT<T> sq = xt::zeros<T>({batch.examples()});
  for (const ParamUses<T>* g : groups_by_param(tape, ps))
    if (g) sq += per_sample_norms_squared(*g, batch.examples(), method);
  std::vector<double> r;
  for (auto v : sq) r.push_back(std::sqrt(std::max(0.0, double(v))));
  return r;
}

/// Restores the model's training mode when the check ends, however it ends.
template <class T>
struct EvalMode {
  ModelT<T>& model;
  bool was;
  explicit EvalMode(ModelT<T>& m) : model(m), was(m.training()) { model.set_training(false); }
  ~EvalMode() { model.set_training(was); }
};

}  // namespace

bool PerSampleCheck::agrees(double tolerance) const {
  for (const auto& r : routes)
    if (r.refused || !(r.norm_error <= tolerance) || !(r.sum_error <= tolerance)) return false;
  return true;
}

bool PerSampleCheck::never_silently_wrong(double tolerance) const {
  for (const auto& r : routes)
    if (!r.refused && (!(r.norm_error <= tolerance) || !(r.sum_error <= tolerance))) return false;
  return true;
}

double PerSampleCheck::max_error() const {
  double e = 0;
  for (const auto& r : routes)
    if (!r.refused) e = std::max({e, r.norm_error, r.sum_error});
  return e;
}

std::string PerSampleCheck::str() const {
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return std::string(buf);
  };
  std::string s = "per-sample check, batch " + std::to_string(batch) + ", C " + num(clip_norm) + "\n";
  for (const auto& r : routes) {
    s += "  " + r.name + ": ";
    if (r.refused) s += "refused: " + r.error;
    else s += "norm error " + num(r.norm_error) + (r.has_sum ? ", clipped-sum error " + num(r.sum_error) : "");
    s += "\n";
  }
  return s;
}

template <class T>
PerSampleCheck check_per_sample(ModelT<T>& model, const BatchT<T>& batch) {
  const std::size_t b = batch.examples();
  if (b < 2)
    throw std::invalid_argument("check_per_sample: needs a batch of at least 2 examples (got " + std::to_string(b) +
                                "): with one, mixing samples cannot show");
  EvalMode<T> eval(model);
  FastRng rng(0);  // none of the exact strategies draws from it
  PerSampleCheck check;
  check.batch = b;
  auto naive = make_clip_strategy<T>("naive");
  check.naive_norms = to_vector(naive->clipped_sum(model, batch, 1e300, rng).norms);
  std::vector<double> sorted = check.naive_norms;
  std::sort(sorted.begin(), sorted.end());
  check.clip_norm = sorted[(b - 1) / 2];
  if (!(check.clip_norm > 0)) check.clip_norm = 1;
  const ClipResult<T> want = naive->clipped_sum(model, batch, check.clip_norm, rng);

  for (std::string s : {"vanilla", "ghost"}) {
    PerSampleRoute r;
    r.name = s;
    try {
      ClipResult<T> got = make_clip_strategy<T>(s)->clipped_sum(model, batch, check.clip_norm, rng);
      r.norm_error = norm_error(to_vector(got.norms), check.naive_norms);
      r.sum_error = sum_error(got.sum, want.sum);
      r.has_sum = true;
    } catch (const std::invalid_argument& e) {
      r.refused = true;
      r.error = e.what();
    }
    check.routes.push_back(r);
  }
  for (auto [name, method] : {std::pair{"rules (ghost norms)", NormMethod::ghost},
                              std::pair{"rules (materialised norms)", NormMethod::materialise}}) {
    PerSampleRoute r;
    r.name = name;
    try {
      r.norm_error = norm_error(rule_norms(model, batch, method), check.naive_norms);
    } catch (const std::invalid_argument& e) {
      r.refused = true;
      r.error = e.what();
    }
    check.routes.push_back(r);
  }
  for (auto& p : model.parameters()) p.zero_grad();
  return check;
}

template <class T>
BatchT<T> synthetic_records(const BatchT<T>& like, std::size_t examples, std::size_t classes, Rng& rng) {
  BatchT<T> b;
  b.views = like.views;
  const std::size_t rows = examples * like.views;
  auto normal_rows = [&](const ArrayT<T>& layout) {
    Shape s = shape_of(layout);
    s[0] = rows;
    ArrayT<T> a = ArrayT<T>::from_shape(s);
    for (auto& v : a) v = T(rng.normal());
    return a;
  };
  if (like.inputs.dimension() > 0) b.inputs = normal_rows(like.inputs);
  if (like.targets.dimension() > 0) b.targets = normal_rows(like.targets);
  if (like.tokens.dimension() > 0) {
    Shape s = shape_of(like.tokens);
    s[0] = rows;
    b.tokens = xt::zeros<std::int32_t>(s);
    const std::size_t length = s.size() > 1 ? s[1] : 1, row = b.tokens.size() / std::max<std::size_t>(rows, 1);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t n = length == 0 ? 0 : 1 + rng.next_u64() % length;
      for (std::size_t k = 0; k < n && k < row; ++k) b.tokens.data()[r * row + k] = std::int32_t(rng.next_u64() & 1);
      if (!like.lengths.empty()) b.lengths.push_back(std::int32_t(n));
    }
  }
  if (!like.labels.empty())
    for (std::size_t r = 0; r < rows; ++r)
      b.labels.push_back(std::int32_t(rng.next_u64() % std::max<std::size_t>(classes, 1)));
  for (std::size_t r = 0; r < rows; ++r) b.ids.push_back(std::int64_t(r / like.views));
  return b;
}

namespace {

/// Where a and b differ most, relative to the largest |b|: (index, error).
template <class A, class B>
std::pair<std::size_t, double> worst_difference(const A& a, const B& b) {
  double scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(double(b[i])));
  std::pair<std::size_t, double> worst{0, 0.0};
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double diff = std::abs(double(a[i]) - double(b[i]));
    const double e = diff == 0 ? 0.0 : diff / std::max(scale, 1e-300);
    if (!(e <= worst.second)) worst = {i, e};
  }
  return worst;
}

}  // namespace

template <class T>
void structural_self_check(ModelT<T>& model, ClipStrategyT<T>& strategy, const BatchT<T>& like,
                           const std::function<BatchT<T>(const BatchT<T>&, long)>& transform) {
  const std::string name = strategy.name();
  const bool jl = strategy.jl_dim() > 0;
  if (!jl && name != "vanilla" && name != "ghost") return;  // naive, microbatch:M, none: each example (group) alone
  constexpr std::size_t kRecords = 4;
  const double tolerance = std::is_same_v<T, float> ? 1e-3 : 1e-7;
  EvalMode<T> eval(model);
  FastRng rng(0x5e1fc4ec);  // the records are synthetic: nothing to keep secret, the same on every rank
  // the outputs' width fixes the labels' range
  std::size_t classes = 1;
  {
    NoRecordScope<T> none;
    const BatchT<T> probe = synthetic_records(like, 1, 1, rng);
    const TensorT<T> out = model.forward(probe);  // kept: value() refers into the tensor's node
    if (out.value().dimension() >= 2) classes = out.value().shape()[1];
  }
  BatchT<T> records = synthetic_records(like, kRecords, classes, rng);
  if (transform) {
    std::vector<BatchT<T>> parts;
    for (std::size_t i = 0; i < kRecords; ++i) parts.push_back(transform(records.select({i}), 0));
    records = concat_batches(parts);
  }
  const std::string why = ": the model mixes samples where the engine does not see it (a constant computed from "
                          "the batch, or state shared between examples; docs/per-sample.md); use the naive strategy";
  auto fmt = [](double v) { return privacy::format_number(v, 6); };
  if (jl) {
    std::vector<ArrayT<T>> dirs;
    for (const auto& p : model.parameters()) {
      Shape s{2};
      for (auto d : p.value().shape()) s.push_back(d);
      ArrayT<T> v = ArrayT<T>::from_shape(s);
      rng.fill_normal(v.data(), v.size(), 1.0);
      dirs.push_back(std::move(v));
    }
    const ArrayT<T> batched = jl_projections(model, records, dirs);  // (2, B)
    ArrayT<T> alone = ArrayT<T>::from_shape(batched.shape());
    for (std::size_t i = 0; i < kRecords; ++i) {
      const ArrayT<T> one = jl_projections(model, records.select({i}), dirs);
      for (std::size_t j = 0; j < 2; ++j) alone(j, i) = one(j, 0);
    }
    const auto [at, error] = worst_difference(batched, alone);
    for (auto& p : model.parameters()) p.zero_grad();
    if (!(error <= tolerance))
      throw std::invalid_argument("structural self-check: " + name + "'s projection " + std::to_string(at / kRecords) +
                                  " of synthetic record " + std::to_string(at % kRecords) + " is " +
                                  fmt(double(batched[at])) + " in the batch and " + fmt(double(alone[at])) +
                                  " alone" + why);
    return;
  }
  auto naive = make_clip_strategy<T>("naive");
  const ArrayT<T> want = naive->clipped_sum(model, records, 1e300, rng).norms;
  const ArrayT<T> got = strategy.clipped_sum(model, records, 1e300, rng).norms;
  for (auto& p : model.parameters()) p.zero_grad();
  const auto [at, error] = worst_difference(got, want);
  if (!(error <= tolerance))
    throw std::invalid_argument("structural self-check: " + name + "'s per-sample gradient norm of synthetic record " +
                                std::to_string(at) + " is " + fmt(double(got[at])) + "; the per-example loop's is " +
                                fmt(double(want[at])) + why);
}

template PerSampleCheck check_per_sample(ModelT<float>&, const BatchT<float>&);
template PerSampleCheck check_per_sample(ModelT<double>&, const BatchT<double>&);
template BatchT<float> synthetic_records(const BatchT<float>&, std::size_t, std::size_t, Rng&);
template BatchT<double> synthetic_records(const BatchT<double>&, std::size_t, std::size_t, Rng&);
template void structural_self_check(ModelT<float>&, ClipStrategyT<float>&, const BatchT<float>&,
                                    const std::function<BatchT<float>(const BatchT<float>&, long)>&);
template void structural_self_check(ModelT<double>&, ClipStrategyT<double>&, const BatchT<double>&,
                                    const std::function<BatchT<double>(const BatchT<double>&, long)>&);

}  // namespace dpgrad
