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

/// ||a - b - c|| over all parameters (c may be null).
template <class T>
double distance(const std::vector<ArrayT<T>>& a, const std::vector<ArrayT<T>>& b, const std::vector<ArrayT<T>>* c) {
  double sq = 0;
  for (std::size_t j = 0; j < a.size(); ++j)
    for (std::size_t k = 0; k < a[j].size(); ++k) {
      const double d = double(a[j].data()[k]) - double(b[j].data()[k]) - (c ? double((*c)[j].data()[k]) : 0.0);
      sq += d * d;
    }
  return std::sqrt(sq);
}

/// ||a|| over all parameters.
template <class T>
double norm_of(const std::vector<ArrayT<T>>& a) {
  double sq = 0;
  for (const auto& x : a)
    for (auto v : x) sq += double(v) * double(v);
  return std::sqrt(sq);
}

/// ||got - want|| / ||want|| over all parameters together.
template <class T>
double sum_error(const std::vector<ArrayT<T>>& got, const std::vector<ArrayT<T>>& want) {
  const double off = distance<T>(got, want, nullptr), scale = norm_of(want);
  return scale == 0 ? off : off / scale;
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
  try {
    check.naive_norms = to_vector(naive->clipped_sum(model, batch, 1e300, rng).norms);
  } catch (const std::exception& e) {
    // one example alone fails: a parameter with a row per sample of this batch would explain it
    for (const auto& p : model.parameters())
      if (p.dim() >= 1 && p.shape()[0] == b)
        throw std::invalid_argument(
            "check_per_sample: parameter '" + p.name() + "' of shape " + shape_str(p.shape()) +
            " is shaped like the batch (axis 0 holds " + std::to_string(b) +
            ", the batch's examples): a parameter is shared by every sample, so one example alone cannot use it "
            "(the per-example loop failed: " + e.what() + "). Give it a leading axis of 1 to broadcast over the "
            "batch, or pass per-sample data with per_sample_input");
    throw;
  }
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

/// The strategy's clipped sum of `batch`, its draws from a fresh FastRng(draws):
/// two calls with the same `draws` see the same directions and keys.
template <class T>
ClipResult<T> clipped_with(ModelT<T>& model, ClipStrategyT<T>& strategy, const BatchT<T>& batch, double clip_norm,
                           std::uint64_t draws) {
  FastRng rng(draws);
  return strategy.clipped_sum(model, batch, clip_norm, rng);
}

/// 0, ..., n-1 without `skip`.
std::vector<std::size_t> all_but(std::size_t n, std::size_t skip) {
  std::vector<std::size_t> r;
  for (std::size_t i = 0; i < n; ++i)
    if (i != skip) r.push_back(i);
  return r;
}

template <class T>
constexpr double kSelfCheckTolerance = std::is_same_v<T, float> ? 1e-3 : 1e-7;
constexpr double kUnbounded = 1e300;  // a clip norm no gradient reaches: the sums are plain sums
constexpr std::uint64_t kDraws = 0x5e1fd7a3;  // the check's JL directions and keys: synthetic, public

const char* const kMixes = ": the model mixes samples where the engine does not see it (a value computed from the "
                           "batch or its size, or state shared between examples; docs/per-sample.md); use the naive "
                           "strategy";

std::string fmt(double v) { return privacy::format_number(v, 6); }

/// The self-check's records: `examples` synthetic records laid out like `like`,
/// their features scaled by `scale` (heavy-tailed when `scale` is 0: a normal
/// over the largest of |normal| and 0.01), each through `transform` alone.
template <class T>
BatchT<T> check_records(const BatchT<T>& like, std::size_t examples, std::size_t classes, double scale,
                        const std::function<BatchT<T>(const BatchT<T>&, long)>& transform, Rng& rng) {
  BatchT<T> records = synthetic_records(like, examples, classes, rng);
  for (auto& v : records.inputs) {
    if (scale > 0) v = T(double(v) * scale);
    else v = T(double(v) / std::max(std::abs(rng.normal()), 0.01));
  }
  if (transform) {
    std::vector<BatchT<T>> parts;
    for (std::size_t i = 0; i < examples; ++i) parts.push_back(transform(records.select({i}), 0));
    records = concat_batches(parts);
  }
  return records;
}

/// jl:K's projections of each record on two directions, batched (in `order`) and alone.
template <class T>
void check_projections(ModelT<T>& model, const std::string& name, const BatchT<T>& records,
                       const std::vector<std::size_t>& order, const std::vector<ArrayT<T>>& dirs) {
  const ArrayT<T> batched = jl_projections(model, records.select(order), dirs);  // (2, n)
  ArrayT<T> alone = ArrayT<T>::from_shape(batched.shape());
  for (std::size_t i = 0; i < order.size(); ++i) {
    const ArrayT<T> one = jl_projections(model, records.select({order[i]}), dirs);
    for (std::size_t j = 0; j < 2; ++j) alone(j, i) = one(j, 0);
  }
  const auto [at, error] = worst_difference(batched, alone);
  if (!(error <= kSelfCheckTolerance<T>))
    throw std::invalid_argument("structural self-check: " + name + "'s projection " + std::to_string(at / order.size()) +
                                " of synthetic record " + std::to_string(order[at % order.size()]) + " in a batch of " +
                                std::to_string(order.size()) + " is " + fmt(double(batched[at])) + " in the batch and " +
                                fmt(double(alone[at])) + " alone" + kMixes);
}

/// Each record's gradient itself (the batch's plain sum less the sum without
/// it), and for exact strategies its norm and per-layer norms, against the
/// per-example loop's, for the records of `records` taken in `order`. Returns
/// whether per-layer norms were compared (strategies that clip per layer).
template <class T>
bool check_record_gradients(ModelT<T>& model, ClipStrategyT<T>& strategy, const BatchT<T>& records,
                            const std::vector<std::size_t>& order, const std::vector<ClipResult<T>>& alone,
                            const std::vector<ClipResult<T>>& alone_layers) {
  const std::string name = strategy.name(), batch = " in a batch of " + std::to_string(order.size());
  const BatchT<T> b = records.select(order);
  const ClipResult<T> all = clipped_with(model, strategy, b, kUnbounded, kDraws);
  const double tol = kSelfCheckTolerance<T>;
  bool layered = false;
  double top = 0;  // the largest norm alone: what a tiny norm's error is measured against
  for (const auto& a : alone) top = std::max(top, double(a.norms(0)));
  for (std::size_t i = 0; i < order.size(); ++i) {
    const ClipResult<T>& want = alone[order[i]];
    const std::string record = " of synthetic record " + std::to_string(order[i]) + batch;
    if (strategy.jl_dim() == 0) {
      const double got = double(all.norms(i)), norm = double(want.norms(0));
      if (!(std::abs(got - norm) <= tol * (norm + 1e-3 * top)))
        throw std::invalid_argument("structural self-check: " + name + "'s per-sample gradient norm" + record + " is " +
                                    fmt(got) + "; the per-example loop's is " + fmt(norm) + kMixes);
      const ClipResult<T>& layers = alone_layers[order[i]];
      for (std::size_t l = 0; all.layer_norms.dimension() == 2 && l < all.layer_norms.shape()[0] &&
                              all.layer_norms.shape()[0] > 1 && l < layers.layer_norms.shape()[0];
           ++l) {
        layered = true;
        const double g = double(all.layer_norms(l, i)), w = double(layers.layer_norms(l, 0));
        if (!(std::abs(g - w) <= tol * (w + 1e-3 * top)))
          throw std::invalid_argument("structural self-check: " + name + "'s norm of layer " + std::to_string(l) +
                                      record + " is " + fmt(g) + "; the per-example loop's is " + fmt(w) + kMixes);
      }
    }
    const ClipResult<T> without = clipped_with(model, strategy, b.select(all_but(order.size(), i)), kUnbounded, kDraws);
    const double off = distance(all.sum, without.sum, &want.sum), scale = norm_of(all.sum) + norm_of(want.sum);
    if (!(off <= tol * scale))
      throw std::invalid_argument("structural self-check: " + name + "'s per-sample gradient" + record + " (the batch's "
                                  "sum less the sum without it) is " + fmt(off) + " away from the per-example loop's, "
                                  "whose norm is " + fmt(norm_of(want.sum)) + kMixes);
  }
  return layered;
}

/// The per-example loop's result for each record alone, C unbounded; with
/// `layered`, per-layer norms too (naive+layers).
template <class T>
std::vector<ClipResult<T>> each_alone(ModelT<T>& model, const BatchT<T>& records, bool layered) {
  auto naive = make_clip_strategy<T>(layered ? "naive+layers" : "naive");
  std::vector<ClipResult<T>> r;
  for (std::size_t i = 0; i < records.examples(); ++i)
    r.push_back(clipped_with(model, *naive, records.select({i}), kUnbounded, kDraws));
  return r;
}

/// The neighbour test at one scale, C the median of the records' norms alone.
/// Returns false, having checked nothing, when a record's loss is not finite at
/// this scale (synthetic records: skipping says nothing of the private data).
template <class T>
bool check_neighbours(ModelT<T>& model, ClipStrategyT<T>& strategy, const BatchT<T>& records,
                      const std::string& scale) {
  const std::size_t n = records.examples();
  std::vector<double> norms;
  try {
    for (const auto& r : each_alone(model, records, false)) norms.push_back(double(r.norms(0)));
  } catch (const std::runtime_error&) {
    return false;  // a non-finite loss or norm (std::invalid_argument, a refusal, is a logic_error and goes on)
  }
  for (const double v : norms)
    if (!std::isfinite(v)) return false;
  std::sort(norms.begin(), norms.end());
  double clip_norm = norms[(n - 1) / 2];
  if (!(clip_norm > 0)) clip_norm = 1;
  const NeighbourMove m = neighbour_test(model, strategy, records, {0, n / 2, n - 1}, clip_norm, kDraws);
  const double tol = kSelfCheckTolerance<T>, bound = strategy.sensitivity() * (1 + tol);
  const std::string where = " (synthetic record " + std::to_string(m.position) + " added to " +
                            std::to_string(n - 1) + " others, features at " + scale + ")";
  if (strategy.per_example_contributions() && !(m.excess <= tol * double(n)))
    throw std::invalid_argument("structural self-check: neighbour test: with " + strategy.name() + ", adding one record "
                                "changed the other records' clipped sum by " + fmt(m.excess) + " C" + where + kMixes);
  if ((strategy.jl_dim() == 0 || !strategy.per_example_contributions()) && !(m.moved <= bound))
    throw std::invalid_argument("structural self-check: neighbour test: with " + strategy.name() + ", adding one record "
                                "moved the clipped sum by " + fmt(m.moved) + " C, more than its sensitivity " +
                                fmt(strategy.sensitivity()) + " C" + where + kMixes);
  return true;
}

/// Two Gaussian directions over every parameter, for the projections' check.
template <class T>
std::vector<ArrayT<T>> two_directions(ModelT<T>& model, Rng& rng) {
  std::vector<ArrayT<T>> dirs;
  for (const auto& p : model.parameters()) {
    Shape s{2};
    for (auto d : p.value().shape()) s.push_back(d);
    ArrayT<T> v = ArrayT<T>::from_shape(s);
    rng.fill_normal(v.data(), v.size(), 1.0);
    dirs.push_back(std::move(v));
  }
  return dirs;
}

}  // namespace

std::string SelfCheckReport::str() const {
  if (ran.empty()) return "structural self-check of " + strategy + ": not run (nothing to compare)";
  std::string s = "structural self-check of " + strategy + " on synthetic records (";
  for (std::size_t i = 0; i < ran.size(); ++i) s += (i ? "; " : "") + ran[i];
  return s + "): passed";
}

template <class T>
NeighbourMove neighbour_test(ModelT<T>& model, ClipStrategyT<T>& strategy, const BatchT<T>& records,
                             const std::vector<std::size_t>& positions, double clip_norm, std::uint64_t draws) {
  const std::size_t n = records.examples();
  if (n < 2) throw std::invalid_argument("neighbour_test: needs at least 2 records, got " + std::to_string(n));
  const ClipResult<T> with = clipped_with(model, strategy, records, clip_norm, draws);
  NeighbourMove worst;
  for (const std::size_t e : positions) {
    if (e >= n) throw std::invalid_argument("neighbour_test: position " + std::to_string(e) + " out of range");
    const ClipResult<T> without = clipped_with(model, strategy, records.select(all_but(n, e)), clip_norm, draws);
    const double moved = distance<T>(with.sum, without.sum, nullptr) / clip_norm;
    double excess = 0;
    if (strategy.per_example_contributions()) {
      const ClipResult<T> alone = clipped_with(model, strategy, records.select({e}), clip_norm, draws);
      excess = distance(with.sum, without.sum, &alone.sum) / clip_norm;
    }
    if (!(moved <= worst.moved) || !(excess <= worst.excess)) worst.position = e;
    worst.moved = std::isnan(moved) ? moved : std::max(worst.moved, moved);
    worst.excess = std::isnan(excess) ? excess : std::max(worst.excess, excess);
  }
  for (auto& p : model.parameters()) p.zero_grad();
  return worst;
}

template <class T>
SelfCheckReport structural_self_check(ModelT<T>& model, ClipStrategyT<T>& strategy, const BatchT<T>& like,
                                      const std::function<BatchT<T>(const BatchT<T>&, long)>& transform) {
  SelfCheckReport report;
  report.strategy = strategy.name();
  if (!strategy.is_private()) return report;
  EvalMode<T> eval(model);
  FastRng rng(0x5e1fc4ec);  // the records are synthetic: nothing to keep secret, the same on every rank
  std::size_t classes = 1;  // the outputs' width fixes the labels' range
  {
    NoRecordScope<T> none;
    const BatchT<T> probe = synthetic_records(like, 1, 1, rng);
    const TensorT<T> out = model.forward(probe);  // kept: value() refers into the tensor's node
    if (out.value().dimension() >= 2) classes = out.value().shape()[1];
  }
  const BatchT<T> records = check_records(like, 5, classes, 1.0, transform, rng);
  if (!strategy.runs_examples_alone() && strategy.per_example_contributions()) {
    const std::vector<std::vector<std::size_t>> orders{{0, 1, 2}, {2, 0, 1}, {0, 1, 2, 3, 4}, {4, 2, 0, 3, 1}};
    const std::vector<ClipResult<T>> alone = each_alone(model, records, false);
    const std::vector<ClipResult<T>> layers = each_alone(model, records, clip_layers(model.parameters()).size() > 1);
    bool layered = false;
    for (const auto& order : orders) layered |= check_record_gradients(model, strategy, records, order, alone, layers);
    report.ran.push_back(std::string(strategy.jl_dim() ? "per-record gradients"
                                     : layered         ? "per-record gradients, norms and per-layer norms"
                                                       : "per-record gradients and norms") +
                         " against the per-example loop at batch sizes 3 and 5, two orders each");
    if (strategy.jl_dim() > 0) {
      const std::vector<ArrayT<T>> dirs = two_directions(model, rng);
      for (const auto& order : orders) check_projections(model, report.strategy, records, order, dirs);
      report.ran.push_back("projections on two directions, batched and alone");
    }
  }
  // the neighbour test at four scales of the features (token ids do not scale: one is enough)
  std::string scales;
  for (const double scale : {1.0, 1e-3, 1e3, 0.0}) {
    if (scale != 1.0 && like.inputs.dimension() == 0) break;
    const std::string name = scale == 0 ? std::string("heavy-tailed") : fmt(scale);
    const bool ran = check_neighbours(model, strategy, scale == 1.0 ? records : check_records(like, 5, classes, scale,
                                                                                              transform, rng),
                                      "scale " + name);
    if (ran) scales += (scales.empty() ? "" : ", ") + name;
  }
  report.ran.push_back("the neighbour test (one record added first, in the middle and last" +
                       (scales.empty() ? std::string(": no scale had finite losses") : ", features at " + scales) + ")");
  for (auto& p : model.parameters()) p.zero_grad();
  return report;
}

template <class T>
ArrayT<T> per_sample_gradient_norms(ModelT<T>& model, const BatchT<T>& batch, const std::string& strategy) {
  auto s = make_clip_strategy<T>(strategy, double(std::max<std::size_t>(batch.examples(), 1)));
  if (!s->is_private() || !s->per_example_contributions())
    throw std::invalid_argument("per_sample_gradient_norms: strategy '" + strategy + "' gives no per-example norms "
                                "(naive, vanilla, ghost and jl:K do)");
  FastRng rng(0x9e3779b97f4a7c15);  // jl:K's directions: any fixed ones serve an estimate
  ArrayT<T> norms = s->clipped_sum(model, batch, 1e300, rng).norms;
  for (auto& p : model.parameters()) p.zero_grad();
  return norms;
}

template <class T>
std::vector<ArrayT<T>> per_sample_gradients(ModelT<T>& model, const BatchT<T>& batch) {
  const std::size_t b = batch.examples();
  auto ps = model.parameters();
  std::vector<ArrayT<T>> g;
  for (const auto& p : ps) {
    Shape s{b};
    for (auto d : p.value().shape()) s.push_back(d);
    g.push_back(xt::zeros<T>(s));
  }
  auto naive = make_clip_strategy<T>("naive");
  FastRng rng(0);  // naive draws nothing
  for (std::size_t i = 0; i < b; ++i) {
    const ClipResult<T> one = naive->clipped_sum(model, batch.select({i}), 1e300, rng);
    for (std::size_t j = 0; j < ps.size(); ++j)
      std::copy(one.sum[j].begin(), one.sum[j].end(), g[j].data() + i * one.sum[j].size());
  }
  for (auto& p : ps) p.zero_grad();
  return g;
}

template PerSampleCheck check_per_sample(ModelT<float>&, const BatchT<float>&);
template PerSampleCheck check_per_sample(ModelT<double>&, const BatchT<double>&);
template ArrayT<float> per_sample_gradient_norms(ModelT<float>&, const BatchT<float>&, const std::string&);
template ArrayT<double> per_sample_gradient_norms(ModelT<double>&, const BatchT<double>&, const std::string&);
template std::vector<ArrayT<float>> per_sample_gradients(ModelT<float>&, const BatchT<float>&);
template std::vector<ArrayT<double>> per_sample_gradients(ModelT<double>&, const BatchT<double>&);
template BatchT<float> synthetic_records(const BatchT<float>&, std::size_t, std::size_t, Rng&);
template BatchT<double> synthetic_records(const BatchT<double>&, std::size_t, std::size_t, Rng&);
template SelfCheckReport structural_self_check(ModelT<float>&, ClipStrategyT<float>&, const BatchT<float>&,
                                               const std::function<BatchT<float>(const BatchT<float>&, long)>&);
template SelfCheckReport structural_self_check(ModelT<double>&, ClipStrategyT<double>&, const BatchT<double>&,
                                               const std::function<BatchT<double>(const BatchT<double>&, long)>&);
template NeighbourMove neighbour_test(ModelT<float>&, ClipStrategyT<float>&, const BatchT<float>&,
                                      const std::vector<std::size_t>&, double, std::uint64_t);
template NeighbourMove neighbour_test(ModelT<double>&, ClipStrategyT<double>&, const BatchT<double>&,
                                      const std::vector<std::size_t>&, double, std::uint64_t);

}  // namespace dpgrad
