// check_per_sample: the per-example loop as the oracle for every exact route.
#include "optim/check_per_sample.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <unordered_map>

#include "engine/ops.hpp"
#include "engine/per_sample.hpp"
#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "optim/clipping.hpp"

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

template PerSampleCheck check_per_sample(ModelT<float>&, const BatchT<float>&);
template PerSampleCheck check_per_sample(ModelT<double>&, const BatchT<double>&);

}  // namespace dpgrad
