// The clipping strategies of optim/clipping/clipping.hpp.
#include "optim/clipping/clipping.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <unordered_map>


#include "engine/blas.hpp"
#include "engine/ops.hpp"
#include "engine/per_sample.hpp"
#include "engine/runtime.hpp"
#include "engine/random.hpp"
#include "engine/tape.hpp"

namespace dpgrad {

template <class T>
TensorT<T> per_sample_losses(ModelT<T>& model, const BatchT<T>& batch) {
  TensorT<T> rows = model.row_losses(model.forward(batch), batch);
  if (batch.views == 1) return rows;
  // (R) -> (B, views) -> the mean over each example's views: (B); examples() checks R = B * views
  TensorT<T> grouped = reshape(rows, Shape{batch.examples(), batch.views});
  // With one example, (1, views) could as well be `views` samples along axis 1: the reshape cannot tell, the
  // batch can. The rows are that example's views, so the one sample is the whole (docs/per-sample.md).
  if (batch.examples() == 1 && grouped.node()->samples.kind == Samples::Kind::axis)
    grouped.node()->samples = Samples::at(0, 1);
  return mean(grouped, {1});
}

template <class T>
T clip_factor(double norm, double clip_norm, std::size_t coordinates) {
  if (!std::isfinite(norm))
    throw std::runtime_error("non-finite per-sample gradient norm (" + std::to_string(norm) +
                             "): the loss diverged; lower the learning rate");
  // kappa = 2 u_T + (P + 8) 2^-53 covers the rounding of the norm summed in
  // double, of the factor and of the products c g_j (docs/noise.md section 3)
  const double unit = std::numeric_limits<T>::epsilon() / 2;
  const double kappa = 2 * unit + (double(coordinates) + 8) * 0x1.0p-53;
  const double cap = clip_norm * (1 - kappa);
  if (!(norm > cap)) return T(1);
  const double c = cap / norm;
  T down = static_cast<T>(c);
  if (double(down) > c) down = std::nextafter(down, T(0));  // rounded towards 0
  return down;
}

template <class T>
double squared_norm(const T* g, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return s;
}

namespace {

template <class T>
std::vector<ArrayT<T>> zeros_like_params(const std::vector<TensorT<T>>& ps) {
  std::vector<ArrayT<T>> r;
  for (const auto& p : ps) r.push_back(xt::zeros<T>(p.value().shape()));
  return r;
}

template <class T>
void zero_grads(const std::vector<TensorT<T>>& ps) {
  for (auto p : ps) p.zero_grad();
}

/// Nothing to clip: zero sums, no norms.
template <class T>
ClipResult<T> empty_result(const std::vector<TensorT<T>>& ps) {
  ClipResult<T> r;
  r.sum = zeros_like_params(ps);
  r.norms = ArrayT<T>::from_shape({0});
  return r;
}

/// Per-layer clipping's layers (ClipSpec::Layers): each parameter's layer, in
/// order of first appearance, and each layer's share w_g of C (the w_g^2 sum to
/// at most 1). Flat clipping is one layer of share 1. `shares`: adaptive layers'
/// shares as set (empty: equal).
struct LayerSplit {
  std::vector<std::size_t> layer;  // per parameter
  std::vector<double> share;       // per layer
};

template <class T>
LayerSplit layer_split(const std::vector<TensorT<T>>& ps, ClipSpec::Layers how, const std::vector<double>& shares = {}) {
  LayerSplit s;
  if (how == ClipSpec::Layers::flat) {
    s.layer.assign(ps.size(), 0);
    s.share = {1.0};
    return s;
  }
  const std::vector<std::string> names = clip_layers(ps);
  std::vector<double> sizes(names.size(), 0.0);
  double total = 0;
  for (const auto& p : ps) {
    s.layer.push_back(std::size_t(std::find(names.begin(), names.end(), clip_layer_name(p.name())) - names.begin()));
    sizes[s.layer.back()] += double(p.value().size());
    total += double(p.value().size());
  }
  if (how == ClipSpec::Layers::adaptive && !shares.empty()) {
    if (shares.size() != names.size())
      throw std::invalid_argument("per-layer clipping: " + std::to_string(shares.size()) + " layer shares set for a model of " +
                                  std::to_string(names.size()) + " layers");
    s.share = shares;
    return s;
  }
  for (const double size : sizes)
    s.share.push_back(how == ClipSpec::Layers::size ? std::sqrt(size / total) : 1 / std::sqrt(double(sizes.size())));
  return s;
}

std::string layers_suffix(ClipSpec::Layers how) {
  switch (how) {
    case ClipSpec::Layers::equal: return "+layers";
    case ClipSpec::Layers::size: return "+layers:size";
    case ClipSpec::Layers::adaptive: return "+layers:adaptive";
    case ClipSpec::Layers::flat: break;
  }
  return "";
}

/// Shares to clip with: each finite and > 0, scaled so that their squares sum
/// to at most 1 whatever the rounding (the contributions' norm stays at most C).
std::vector<double> checked_shares(std::vector<double> shares) {
  double sq = 0;
  for (const double w : shares) {
    if (!(w > 0 && std::isfinite(w)))
      throw std::invalid_argument("per-layer clipping: a layer's share of C must be finite and > 0, got " +
                                  std::to_string(w));
    sq += w * w;
  }
  if (shares.empty() || !(std::abs(sq - 1) <= 1e-9))
    throw std::invalid_argument("per-layer clipping: the layers' shares of C must have squares summing to 1, got " +
                                std::to_string(sq));
  const double scale = (1 - 1e-12) / std::sqrt(sq);
  for (double& w : shares) w *= scale;
  return shares;
}

constexpr double kDroppedNorm = std::numeric_limits<double>::infinity();

/// A contribution whose loss or gradient is not finite is dropped: it adds
/// nothing, counts as clipped, and its norms (column i of res.layer_norms, when
/// i is given) are +infinity, above every C (docs/math.md section 1). Returns its norm.
template <class T>
T drop_contribution(ClipResult<T>& res, std::size_t i = std::size_t(-1)) {
  ++res.clipped;
  if (i != std::size_t(-1))
    for (std::size_t l = 0; l < res.layer_norms.shape(0); ++l) res.layer_norms(l, i) = T(kDroppedNorm);
  return T(kDroppedNorm);
}

/// The parameters' accumulated gradient is one contribution: each layer's part
/// clipped to its share of C and added to res.sum, its layers' norms kept in
/// column i of res.layer_norms (when i is given). Returns its norm. A gradient
/// with a coordinate that is not finite is dropped (drop_contribution).
template <class T>
T clip_and_accumulate(const std::vector<TensorT<T>>& ps, double clip_norm, ClipResult<T>& res,
                      const LayerSplit& split, std::size_t i = std::size_t(-1)) {
  std::vector<double> sq(split.share.size(), 0.0);
  std::size_t coordinates = 0;
  for (std::size_t j = 0; j < ps.size(); ++j) {
    const ArrayT<T>& g = ps[j].grad();
    sq[split.layer[j]] += squared_norm(g.data(), g.size());
    coordinates += g.size();
  }
  for (const double s : sq)
    if (!std::isfinite(s)) return drop_contribution(res, i);  // a NaN or infinite coordinate makes s NaN or infinite
  std::vector<T> c;
  bool clipped = false;
  double total = 0;
  for (std::size_t l = 0; l < sq.size(); ++l) {
    if (i != std::size_t(-1)) res.layer_norms(l, i) = T(std::sqrt(sq[l]));  // (microbatch:M keeps none)
    c.push_back(clip_factor<T>(std::sqrt(sq[l]), clip_norm * split.share[l], coordinates));
    clipped |= c.back() < T(1);
    total += sq[l];
  }
  if (clipped) ++res.clipped;
  for (std::size_t j = 0; j < ps.size(); ++j) res.sum[j] += c[split.layer[j]] * ps[j].grad();
  return T(std::sqrt(total));
}

/// The sum of the losses, for the strategy that is not private (none): a loss
/// that is not finite stops it.
template <class T>
double loss_total(const TensorT<T>& losses) {
  double s = 0;
  for (auto v : losses.value()) s += double(v);
  if (!std::isfinite(s)) throw std::runtime_error("non-finite loss (" + std::to_string(s) + "): lower the learning rate");
  return s;
}

/// The sum of the finite losses: a private strategy drops a record whose loss is
/// not finite, and its loss is no part of the sum either.
template <class T>
double finite_loss_sum(const TensorT<T>& losses) {
  double s = 0;
  for (auto v : losses.value())
    if (std::isfinite(double(v))) s += double(v);
  return s;
}

/// Whether every loss is finite.
template <class T>
bool all_finite(const TensorT<T>& losses) {
  for (auto v : losses.value())
    if (!std::isfinite(double(v))) return false;
  return true;
}

/// record_uses, returning the losses themselves: (B).
template <class T>
TensorT<T> record_use_losses(TapeT<T>& tape, ModelT<T>& model, const BatchT<T>& batch,
                             const std::vector<TensorT<T>>& ps);

}  // namespace

template <class T>
double record_uses(TapeT<T>& tape, ModelT<T>& model, const BatchT<T>& batch, const std::vector<TensorT<T>>& ps) {
  return finite_loss_sum(record_use_losses(tape, model, batch, ps));
}

namespace {

template <class T>
TensorT<T> record_use_losses(TapeT<T>& tape, ModelT<T>& model, const BatchT<T>& batch,
                             const std::vector<TensorT<T>>& ps) {
  zero_grads(ps);
  tape.record_uses(true, false);
  tape.release_during_backward(true);  // the uses keep what the rules read; the rest goes as backward runs
  RecordScope<T> scope(tape);
  TensorT<T> losses = per_sample_losses(model, batch);
  check_per_sample_tape(tape, losses, batch.examples());
  // a loss that is not finite makes only its own sample's cotangents so: its record is dropped after the norms
  tape.backward(sum(losses));
  for (const auto& p : ps)
    if (p.has_grad()) {
      // the ops that read p and recorded no use of it: those without a rule
      std::vector<std::string> with_rule;
      for (const auto& g : tape.uses())
        if (g.param.get() == p.node())
          for (const auto* u : g.uses) with_rule.emplace_back(u->op);
      std::string ops;
      for (const std::string& op : tape.ops_reading(p.node()))
        if (std::find(with_rule.begin(), with_rule.end(), op) == with_rule.end())
          ops += (ops.empty() ? "" : " and ") + op;
      throw std::invalid_argument("parameter '" + p.name() + "' is used by " + (ops.empty() ? std::string("an op") : ops) +
                                  ", which has no per-sample rule (linear, the convolutions, gather, and mul, add "
                                  "or sub by a parameter that broadcasts over the samples have one); the exact "
                                  "strategies cannot clip it. Use naive (exact, one example at a time) or jl:K "
                                  "(estimated norms; it too refuses a model that mixes samples), or apply the op to "
                                  "the data side (docs/per-sample.md)");
    }
  return losses;
}

}  // namespace

template <class T>
std::vector<std::string> clip_layers(const std::vector<TensorT<T>>& ps) {
  std::vector<std::string> names;
  for (const auto& p : ps) {
    std::string name = clip_layer_name(p.name());
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  }
  return names;
}

template <class T>
std::vector<const ParamUses<T>*> groups_by_param(const TapeT<T>& tape, const std::vector<TensorT<T>>& ps) {
  std::unordered_map<const Node<T>*, const ParamUses<T>*> m;
  for (const auto& g : tape.uses()) m[g.param.get()] = &g;
  std::vector<const ParamUses<T>*> r;
  for (const auto& p : ps) {
    auto it = m.find(p.node());
    r.push_back(it == m.end() ? nullptr : it->second);
  }
  return r;
}

namespace {

/// Each record's clip factor per layer (c[l](i), from its squared norm in that
/// layer, norms_sq[l](i), and the layer's share of C); its norm over every layer
/// in res.norms, and in res.clipped the records clipped in any layer.
template <class T>
std::vector<ArrayT<T>> layer_factors(const std::vector<ArrayT<T>>& norms_sq, const LayerSplit& split, double clip_norm,
                                     std::size_t coordinates, ClipResult<T>& res) {
  const std::size_t b = norms_sq.front().size();
  std::vector<ArrayT<T>> c;
  std::vector<double> total(b, 0.0);
  std::vector<char> clipped(b, 0);
  for (std::size_t l = 0; l < norms_sq.size(); ++l) {
    ArrayT<T> f = ArrayT<T>::from_shape({b});
    for (std::size_t i = 0; i < b; ++i) {
      const double sq = std::max(0.0, double(norms_sq[l](i)));
      f(i) = clip_factor<T>(std::sqrt(sq), clip_norm * split.share[l], coordinates);
      clipped[i] |= f(i) < T(1);
      total[i] += sq;
    }
    c.push_back(std::move(f));
  }
  res.layer_norms = ArrayT<T>::from_shape({norms_sq.size(), b});
  for (std::size_t l = 0; l < norms_sq.size(); ++l)
    for (std::size_t i = 0; i < b; ++i) res.layer_norms(l, i) = T(std::sqrt(std::max(0.0, double(norms_sq[l](i)))));
  res.norms = ArrayT<T>::from_shape({b});
  for (std::size_t i = 0; i < b; ++i) {
    res.norms(i) = T(std::sqrt(total[i]));
    res.clipped += clipped[i];
  }
  return c;
}

/// Flat clipping's factors: one layer.
template <class T>
ArrayT<T> factors(const ArrayT<T>& norms_sq, double clip_norm, std::size_t coordinates, ClipResult<T>& res) {
  return layer_factors<T>({norms_sq}, LayerSplit{{}, {1.0}}, clip_norm, coordinates, res).front();
}

/// The examples of a batch whose loss, or squared norm in any layer, is not
/// finite: losses (B), norms_sq[l] (B).
template <class T>
std::vector<std::size_t> nonfinite_records(const TensorT<T>& losses, const std::vector<ArrayT<T>>& norms_sq) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < losses.value().size(); ++i) {
    bool finite = std::isfinite(double(losses.value().data()[i]));
    for (const auto& sq : norms_sq) finite = finite && std::isfinite(double(sq(i)));
    if (!finite) out.push_back(i);
  }
  return out;
}

/// The examples of [0, b) not in `dropped` (ascending).
inline std::vector<std::size_t> others(const std::vector<std::size_t>& dropped, std::size_t b) {
  std::vector<std::size_t> kept;
  for (std::size_t i = 0, d = 0; i < b; ++i) {
    if (d < dropped.size() && dropped[d] == i) ++d;
    else kept.push_back(i);
  }
  return kept;
}

/// The result `part` for the examples `kept` of a batch of b, as the whole
/// batch's: the other examples were dropped (drop_contribution), their norms in
/// each of `layers` layers +infinity.
template <class T>
ClipResult<T> with_dropped(ClipResult<T> part, const std::vector<std::size_t>& kept, std::size_t b, std::size_t layers) {
  ClipResult<T> res;
  res.sum = std::move(part.sum);
  res.loss_sum = part.loss_sum;
  res.clipped = part.clipped + (b - kept.size());
  res.norms = ArrayT<T>::from_shape({b});
  res.norms.fill(T(kDroppedNorm));
  res.layer_norms = ArrayT<T>::from_shape({layers, b});
  res.layer_norms.fill(T(kDroppedNorm));
  const bool per_layer = part.layer_norms.dimension() == 2 && part.layer_norms.shape(0) == layers;
  for (std::size_t k = 0; k < kept.size(); ++k) {
    res.norms(kept[k]) = part.norms(k);
    for (std::size_t l = 0; per_layer && l < layers; ++l) res.layer_norms(l, kept[k]) = part.layer_norms(l, k);
  }
  return res;
}

template <class T>
class NoneStrategy final : public ClipStrategyT<T> {
 public:
  std::string name() const override { return "none"; }
  bool is_private() const override { return false; }
  bool runs_examples_alone() const override { return true; }
  ClipResult<T> clipped_sum(ModelT<T>& model, const BatchT<T>& batch, double, Rng&) override {
    auto ps = model.parameters();
    ClipResult<T> res;
    zero_grads(ps);
    if (batch.size() > 0) {
      TapeT<T> tape;
      tape.release_during_backward(true);  // activations freed as backward goes
      RecordScope<T> scope(tape);
      TensorT<T> losses = per_sample_losses(model, batch);
      res.loss_sum = loss_total(losses);
      tape.backward(sum(losses));
    }
    for (auto& p : ps) res.sum.push_back(p.grad());
    zero_grads(ps);
    return res;
  }
};

/// The strategies that clip per layer (naive, vanilla, ghost): their layers and,
/// with "+layers:adaptive", the shares the private optimizer sets.
template <class T>
class LayeredStrategy : public ClipStrategyT<T> {
 public:
  explicit LayeredStrategy(ClipSpec::Layers layers) : layers_(layers) {}
  bool adapts_layers() const override { return layers_ == ClipSpec::Layers::adaptive; }
  void set_layer_shares(std::vector<double> shares) override {
    if (!adapts_layers()) ClipStrategyT<T>::set_layer_shares(std::move(shares));
    shares_ = checked_shares(std::move(shares));
  }

 protected:
  /// The strategy's name with its layers' suffix, e.g. "ghost+layers:size".
  std::string named(const std::string& kind) const { return kind + layers_suffix(layers_); }
  LayerSplit split(const std::vector<TensorT<T>>& ps) const { return layer_split(ps, layers_, shares_); }

 private:
  const ClipSpec::Layers layers_;
  std::vector<double> shares_;  // +layers:adaptive: as set (empty: equal)
};

template <class T>
class NaiveStrategy final : public LayeredStrategy<T> {
 public:
  using LayeredStrategy<T>::LayeredStrategy;
  std::string name() const override { return this->named("naive"); }
  bool runs_examples_alone() const override { return true; }
  ClipResult<T> clipped_sum(ModelT<T>& model, const BatchT<T>& batch, double clip_norm, Rng&) override {
    auto ps = model.parameters();
    const LayerSplit split = this->split(ps);
    ClipResult<T> res;
    res.sum = zeros_like_params(ps);
    res.norms = ArrayT<T>::from_shape({batch.examples()});
    res.layer_norms = ArrayT<T>::from_shape({split.share.size(), batch.examples()});
    for (std::size_t i = 0; i < batch.examples(); ++i) {
      BatchT<T> one = batch.select({i});
      zero_grads(ps);
      TapeT<T> tape;
      tape.release_during_backward(true);
      RecordScope<T> scope(tape);
      TensorT<T> loss = per_sample_losses(model, one);
      if (!all_finite(loss)) {  // dropped, and no backward through it
        res.norms(i) = drop_contribution(res, i);
        continue;
      }
      tape.backward(sum(loss));
      res.norms(i) = clip_and_accumulate(ps, clip_norm, res, split, i);
      if (double(res.norms(i)) != kDroppedNorm) res.loss_sum += finite_loss_sum(loss);  // a dropped one's is not
    }
    zero_grads(ps);
    return res;
  }
};

/// The exact strategies: one forward and one backward with every parameter use
/// recorded, then per parameter either its per-sample gradients G_i, kept for
/// the clipped sum, or norms and the sum from the uses themselves (ghost or
/// one-sample-at-a-time norms, book-keeping sum). They differ in which they keep.
template <class T>
class RuleStrategy : public LayeredStrategy<T> {
 public:
  using LayeredStrategy<T>::LayeredStrategy;
  ClipResult<T> clipped_sum(ModelT<T>& model, const BatchT<T>& batch, double clip_norm, Rng& rng) override {
    auto ps = model.parameters();
    if (batch.examples() == 0) return empty_result(ps);
    std::vector<std::size_t> dropped;
    ClipResult<T> res = clip_batch(model, batch, ps, clip_norm, dropped);
    if (dropped.empty()) return res;
    // records whose loss or gradient is not finite: the sums are formed again without them, for the uses
    // hold their NaNs and 0 x NaN is NaN in the others' sum (docs/math.md section 1)
    const std::vector<std::size_t> kept = others(dropped, batch.examples());
    return with_dropped(clipped_sum(model, batch.select(kept), clip_norm, rng), kept, batch.examples(),
                        this->split(ps).share.size());
  }

 protected:
  virtual bool keeps_per_sample_gradients(const ParamUses<T>& group, std::size_t b) const = 0;

 private:
  /// The clipped sum of a batch, unless some records' loss or norm is not
  /// finite: then nothing is summed and `dropped` lists them.
  ClipResult<T> clip_batch(ModelT<T>& model, const BatchT<T>& batch, const std::vector<TensorT<T>>& ps,
                           double clip_norm, std::vector<std::size_t>& dropped) const {
    ClipResult<T> res;
    TapeT<T> tape;
    const std::size_t b = batch.examples();
    // the per-sample gradients this strategy keeps are built while backward runs, as soon as a parameter's
    // uses are complete, and its uses (their activations and cotangents) are released at once: they are
    // never all held together (docs/per-sample.md)
    std::vector<std::optional<PerSampleGradients<T>>> kept(ps.size());
    std::unordered_map<const Node<T>*, std::size_t> index;
    for (std::size_t j = 0; j < ps.size(); ++j) index.emplace(ps[j].node(), j);
    tape.on_uses_complete([&](ParamUses<T>& group) {
      const auto j = index.find(group.param.get());
      if (j == index.end() || !keeps_per_sample_gradients(group, b)) return;
      kept[j->second] = materialise_per_sample_gradients(group, b);
      for (ParamUse<T>* u : group.uses) u->release();
    });
    const TensorT<T> losses = record_use_losses(tape, model, batch, ps);
    res.loss_sum = finite_loss_sum(losses);
    const LayerSplit split = this->split(ps);
    const auto groups = groups_by_param(tape, ps);
    const std::vector<ArrayT<T>> norms_sq = layer_norms_squared(groups, kept, split, b);
    dropped = nonfinite_records(losses, norms_sq);
    if (!dropped.empty()) return res;
    const std::vector<ArrayT<T>> c = layer_factors(norms_sq, split, clip_norm, model.parameter_count(), res);
    for (std::size_t j = 0; j < ps.size(); ++j) {
      if (kept[j]) res.sum.push_back(kept[j]->weighted_sum(c[split.layer[j]]));
      else if (groups[j]) res.sum.push_back(weighted_gradient_sum(*groups[j], c[split.layer[j]]));
      else res.sum.push_back(xt::zeros<T>(ps[j].value().shape()));
      kept[j].reset();  // freed as soon as its sum is formed
    }
    return res;
  }

  /// Per layer of `split`, each record's squared norm ||G_i||^2 summed over the layer's parameters: groups[j]
  /// the uses of parameter j (nullptr: unused, zero gradient); kept[j] its per-sample gradients when they were
  /// built from those uses already (which were then released).
  static std::vector<ArrayT<T>> layer_norms_squared(const std::vector<const ParamUses<T>*>& groups,
                                                    const std::vector<std::optional<PerSampleGradients<T>>>& kept,
                                                    const LayerSplit& split, std::size_t b) {
    std::vector<ArrayT<T>> norms_sq(split.share.size(), xt::zeros<T>({b}));
    for (std::size_t j = 0; j < groups.size(); ++j) {
      if (!groups[j]) continue;
      ArrayT<T>& sq = norms_sq[split.layer[j]];
      if (kept[j]) sq += kept[j]->norms_squared();
      else sq += per_sample_norms_squared(*groups[j], b);
    }
    return norms_sq;
  }
};

/// Every parameter's G_i, materialised (B x P values in all).
template <class T>
class VanillaStrategy final : public RuleStrategy<T> {
 public:
  using RuleStrategy<T>::RuleStrategy;
  std::string name() const override { return this->named("vanilla"); }

 private:
  bool keeps_per_sample_gradients(const ParamUses<T>&, std::size_t) const override { return true; }
};

/// Only the G_i that are small next to their uses (a convolution kernel's); the
/// rest never exist, not even one sample's at a time where the ghost norm is cheaper.
template <class T>
class GhostStrategy final : public RuleStrategy<T> {
 public:
  using RuleStrategy<T>::RuleStrategy;
  std::string name() const override { return this->named("ghost"); }

 private:
  bool keeps_per_sample_gradients(const ParamUses<T>& group, std::size_t b) const override {
    return per_sample_gradients_are_small(group, b);
  }
};

/// Bu et al. 2021, Algorithm 1: K Gaussian directions over all parameters,
/// the K jvps of the per-sample losses, M_i = sqrt(mean_j P_ij^2). The primal
/// runs once, on a tape; the jvps are pushed along the tape afterwards in
/// chunks of directions, so that only one chunk's tangents exist at a time.
/// Direction j is drawn parameter by parameter after directions 0..j-1
/// whatever the chunks, so chunking changes memory and time, not the result.
template <class T>
class JlStrategy final : public ClipStrategyT<T> {
 public:
  /// chunk: directions per pass along the tape (0: chosen from the tape's size).
  JlStrategy(int k, int chunk) : k_(k), chunk_(chunk) {}
  std::string name() const override { return "jl:" + std::to_string(k_) + (chunk_ ? "/" + std::to_string(chunk_) : ""); }
  bool splits_into_chunks() const override { return false; }
  int jl_dim() const override { return k_; }
  ClipResult<T> clipped_sum(ModelT<T>& model, const BatchT<T>& batch, double clip_norm, Rng& rng) override {
    auto ps = model.parameters();
    const std::size_t b = batch.examples();
    if (b == 0) return empty_result(ps);
    zero_grads(ps);
    std::optional<TapeT<T>> tape(std::in_place);
    std::optional<RecordScope<T>> scope(std::in_place, *tape);
    TensorT<T> losses = per_sample_losses(model, batch);
    // the projections are each example's only if each loss is its own sample's (docs/per-sample.md)
    check_per_sample_losses(losses, b);
    const ArrayT<T> norms_sq = projected_norms_squared(*tape, ps, losses, rng);
    const std::vector<std::size_t> dropped = nonfinite_records(losses, {norms_sq});
    ClipResult<T> res;
    if (dropped.empty()) {
      res.loss_sum = finite_loss_sum(losses);
      const ArrayT<T> c = factors(norms_sq, clip_norm, model.parameter_count(), res);
      profile::Scope timed("jl weighted backward (all vjps)");
      tape->release_during_backward(true);
      tape->backward(losses, c);  // one backward of sum_i c_i loss_i
      for (auto& p : ps) res.sum.push_back(p.grad());
      zero_grads(ps);
      return res;
    }
    // records whose loss or projections are not finite: the weighted backward runs on the batch without them,
    // for their cotangents would be NaN whatever their weight (0 x NaN is NaN; docs/math.md section 1)
    scope.reset();
    tape.reset();
    const std::vector<std::size_t> kept = others(dropped, b);
    ArrayT<T> kept_sq = ArrayT<T>::from_shape({kept.size()});
    for (std::size_t k = 0; k < kept.size(); ++k) kept_sq(k) = norms_sq(kept[k]);
    const ArrayT<T> c = factors(kept_sq, clip_norm, model.parameter_count(), res);
    const BatchT<T> rest = batch.select(kept);
    if (kept.empty()) {
      res.sum = zeros_like_params(ps);
    } else {
      zero_grads(ps);
      TapeT<T> again;
      RecordScope<T> again_scope(again);
      TensorT<T> again_losses = per_sample_losses(model, rest);
      check_per_sample_losses(again_losses, kept.size());
      if (!all_finite(again_losses))  // not seen: the same records, the same values; clipped afresh if ever
        return with_dropped(clipped_sum(model, rest, clip_norm, rng), kept, b, 1);
      res.loss_sum = finite_loss_sum(again_losses);
      again.release_during_backward(true);
      again.backward(again_losses, c);
      for (auto& p : ps) res.sum.push_back(p.grad());
      zero_grads(ps);
    }
    return with_dropped(std::move(res), kept, b, 1);
  }

 private:
  /// M_i^2 = mean_j P_ij^2 over the K directions, drawn from `rng` chunk by chunk: (B).
  ArrayT<T> projected_norms_squared(const TapeT<T>& tape, const std::vector<TensorT<T>>& ps, const TensorT<T>& losses,
                                    Rng& rng) const {
    const std::size_t b = losses.value().size();
    const std::size_t k = std::size_t(k_), chunk = std::min(k, chunk_ ? std::size_t(chunk_) : auto_chunk(tape));
    ArrayT<T> norms_sq = xt::zeros<T>({b});
    std::vector<ArrayT<T>> dirs(ps.size());
    std::vector<std::pair<const Node<T>*, const ArrayT<T>*>> seeds;
    for (std::size_t j0 = 0; j0 < k; j0 += chunk) {
      const std::size_t c = std::min(chunk, k - j0);
      seeds.clear();
      for (std::size_t p = 0; p < ps.size(); ++p) {
        Shape s{c};
        for (auto d : ps[p].value().shape()) s.push_back(d);
        if (shape_of(dirs[p]) != s) dirs[p] = ArrayT<T>::from_shape(s);
        seeds.emplace_back(ps[p].node(), &dirs[p]);
      }
      {
        profile::Scope timed("jl directions");
        for (std::size_t j = 0; j < c; ++j)
          for (std::size_t p = 0; p < ps.size(); ++p) {
            const std::size_t n = ps[p].value().size();
            rng.fill_normal(dirs[p].data() + j * n, n, 1.0);
          }
      }
      profile::Scope timed("jl tangents (all jvps)");
      const ArrayT<T> proj = tape.push_tangents(seeds, losses, c);  // (c, B): P_ji = <g_i, v_j>
      for (std::size_t j = 0; j < c; ++j)
        for (std::size_t i = 0; i < b; ++i) norms_sq(i) += proj(j, i) * proj(j, i) / T(k_);
    }
    return norms_sq;
  }

  /// As many directions as keep their tangents within a quarter of what the
  /// tape holds, counting three of the largest recorded value per direction
  /// (an op's input, its output and one intermediate), and at least one.
  static std::size_t auto_chunk(const TapeT<T>& tape) {
    const std::size_t per_direction = 3 * std::max<std::size_t>(1, tape.largest_recorded());
    return std::max<std::size_t>(1, tape.recorded_elements() / 4 / per_direction);
  }

  int k_, chunk_;
};

/// TF Privacy's microbatches, with examples assigned by a rule fixed per
/// example, so that one example moves one microbatch (docs/data-privacy.md): each
/// step draws a 16-byte key from `rng`, and the example with record id `id`
/// joins microbatch SipHash-2-4(key, id) mod the number of microbatches. Its
/// microbatch depends on its id and the key alone, not on its position or on
/// any other example; the key is secret when `rng` is (docs/data-privacy.md).
/// microbatch:1 clips every example alone (the per-sample rule), as the naive
/// strategy does.
template <class T>
class MicrobatchStrategy final : public ClipStrategyT<T> {
 public:
  bool splits_into_chunks() const override { return false; }
  bool shards_across_processes() const override { return false; }
  // microbatch:1 clips every example alone, as naive does
  bool runs_examples_alone() const override { return m_ == 1; }
  bool per_example_contributions() const override { return m_ == 1; }
  MicrobatchStrategy(int m, double expected_batch)
      : m_(m), count_(std::max<std::size_t>(1, std::size_t(std::ceil(expected_batch / m)))) {}
  std::string name() const override { return "microbatch:" + std::to_string(m_); }
  double sensitivity() const override { return 2.0; }
  double normaliser(double) const override { return double(count_); }
  ClipResult<T> clipped_sum(ModelT<T>& model, const BatchT<T>& batch, double clip_norm, Rng& rng) override {
    auto ps = model.parameters();
    ClipResult<T> res;
    res.sum = zeros_like_params(ps);
    if (batch.size() > 0 && batch.ids.size() != batch.size())
      throw std::invalid_argument("microbatch strategy needs the record id of every example (Batch::ids)");
    std::vector<std::vector<std::size_t>> members(m_ == 1 ? batch.examples() : count_);
    HashKey key{};
    for (std::size_t w = 0; m_ > 1 && w < key.size(); w += 8) {
      const std::uint64_t r = rng.next_u64();
      for (std::size_t j = 0; j < 8; ++j) key[w + j] = static_cast<unsigned char>(r >> (8 * j));
    }
    for (std::size_t i = 0; i < batch.examples(); ++i)
      members[m_ == 1 ? i : keyed_bucket(key, batch.ids[i * batch.views], count_)].push_back(i);
    std::vector<T> norms;
    const LayerSplit flat = layer_split(ps, ClipSpec::Layers::flat);
    for (const auto& index : members) {
      if (index.empty()) continue;
      zero_grads(ps);
      TapeT<T> tape;
      tape.release_during_backward(true);
      RecordScope<T> scope(tape);
      TensorT<T> losses = per_sample_losses(model, batch.select(index));
      if (!all_finite(losses)) {  // the microbatch is the contribution: it is dropped whole
        norms.push_back(drop_contribution(res));
        continue;
      }
      tape.backward(mean(losses));
      norms.push_back(clip_and_accumulate(ps, clip_norm, res, flat));
      if (double(norms.back()) != kDroppedNorm) res.loss_sum += finite_loss_sum(losses);  // a dropped one's is not
    }
    zero_grads(ps);
    res.norms = xt::adapt(norms, {norms.size()});
    return res;
  }

 private:
  int m_;
  std::size_t count_;
};

}  // namespace

template <class T>
ArrayT<T> jl_projections(ModelT<T>& model, const BatchT<T>& batch, const std::vector<ArrayT<T>>& dirs) {
  auto ps = model.parameters();
  if (dirs.size() != ps.size())
    throw std::invalid_argument("jl_projections: " + std::to_string(dirs.size()) + " direction arrays for " +
                                std::to_string(ps.size()) + " parameters");
  const std::size_t b = batch.examples();
  const std::size_t k = dirs.empty() || dirs[0].dimension() == 0 ? 0 : dirs[0].shape()[0];
  std::vector<std::pair<const Node<T>*, const ArrayT<T>*>> seeds;
  for (std::size_t p = 0; p < ps.size(); ++p) {
    Shape want{k};
    for (auto d : ps[p].value().shape()) want.push_back(d);
    if (shape_of(dirs[p]) != want)
      throw std::invalid_argument("jl_projections: the directions of '" + ps[p].name() + "' are " +
                                  shape_str(shape_of(dirs[p])) + ", not " + shape_str(want));
    seeds.emplace_back(ps[p].node(), &dirs[p]);
  }
  if (b == 0 || k == 0) return xt::zeros<T>({k, b});
  zero_grads(ps);
  TapeT<T> tape;
  RecordScope<T> scope(tape);
  TensorT<T> losses = per_sample_losses(model, batch);
  check_per_sample_losses(losses, b);
  loss_total(losses);
  return tape.push_tangents(seeds, losses, k);
}

template <class T>
std::unique_ptr<ClipStrategyT<T>> make_clip_strategy(const std::string& spec, double expected_batch) {
  return make_clip_strategy<T>(parse_clip_spec(spec), expected_batch);
}

template <class T>
std::unique_ptr<ClipStrategyT<T>> make_clip_strategy(const ClipSpec& s, double expected_batch) {
  if (s.kind == ClipSpec::Kind::jl && (s.directions < 1 || s.directions > kMaxJlDirections || s.chunk < 0))
    throw std::invalid_argument("jl:K needs K in [1, " + std::to_string(kMaxJlDirections) + "] and a chunk >= 0, got K " +
                                std::to_string(s.directions) + ", chunk " + std::to_string(s.chunk));
  if (s.layers != ClipSpec::Layers::flat && s.kind != ClipSpec::Kind::naive && s.kind != ClipSpec::Kind::vanilla &&
      s.kind != ClipSpec::Kind::ghost)
    throw std::invalid_argument("per-layer clipping applies to naive, vanilla and ghost");
  if (s.kind == ClipSpec::Kind::microbatch && s.group_size < 1)
    throw std::invalid_argument("microbatch:M needs M >= 1, got " + std::to_string(s.group_size));
  switch (s.kind) {
    case ClipSpec::Kind::none: return std::make_unique<NoneStrategy<T>>();
    case ClipSpec::Kind::naive: return std::make_unique<NaiveStrategy<T>>(s.layers);
    case ClipSpec::Kind::vanilla: return std::make_unique<VanillaStrategy<T>>(s.layers);
    case ClipSpec::Kind::ghost: return std::make_unique<GhostStrategy<T>>(s.layers);
    case ClipSpec::Kind::jl: return std::make_unique<JlStrategy<T>>(s.directions, s.chunk);
    case ClipSpec::Kind::microbatch:
      if (!(expected_batch >= 1)) throw std::invalid_argument("microbatch strategy needs the expected batch size");
      return std::make_unique<MicrobatchStrategy<T>>(s.group_size, expected_batch);
  }
  throw std::invalid_argument("unknown clip strategy");
}

namespace clipping {
template <class T>
std::shared_ptr<ClipStrategyT<T>> naive() {
  return make_clip_strategy<T>(ClipSpec{ClipSpec::Kind::naive});
}
template <class T>
std::shared_ptr<ClipStrategyT<T>> vanilla() {
  return make_clip_strategy<T>(ClipSpec{ClipSpec::Kind::vanilla});
}
template <class T>
std::shared_ptr<ClipStrategyT<T>> ghost() {
  return make_clip_strategy<T>(ClipSpec{ClipSpec::Kind::ghost});
}
template <class T>
std::shared_ptr<ClipStrategyT<T>> jl(int k, int chunk) {
  ClipSpec s{ClipSpec::Kind::jl};
  s.directions = k;
  s.chunk = chunk;
  return make_clip_strategy<T>(s);
}
template <class T>
std::shared_ptr<ClipStrategyT<T>> microbatch(int m, double expected_batch) {
  ClipSpec s{ClipSpec::Kind::microbatch};
  s.group_size = m;
  return make_clip_strategy<T>(s, expected_batch);
}
#define DPGRAD_CLIPPING(T)                                                  \
  template std::shared_ptr<ClipStrategyT<T>> naive<T>();                    \
  template std::shared_ptr<ClipStrategyT<T>> vanilla<T>();                  \
  template std::shared_ptr<ClipStrategyT<T>> ghost<T>();                    \
  template std::shared_ptr<ClipStrategyT<T>> jl<T>(int, int);               \
  template std::shared_ptr<ClipStrategyT<T>> microbatch<T>(int, double);
DPGRAD_CLIPPING(float)
DPGRAD_CLIPPING(double)
#undef DPGRAD_CLIPPING
}  // namespace clipping

template float clip_factor<float>(double, double, std::size_t);
template double clip_factor<double>(double, double, std::size_t);
template double squared_norm(const float*, std::size_t);
template double squared_norm(const double*, std::size_t);
template double record_uses(TapeT<float>&, ModelT<float>&, const BatchT<float>&, const std::vector<TensorT<float>>&);
template double record_uses(TapeT<double>&, ModelT<double>&, const BatchT<double>&, const std::vector<TensorT<double>>&);
template std::vector<const ParamUses<float>*> groups_by_param(const TapeT<float>&, const std::vector<TensorT<float>>&);
template std::vector<const ParamUses<double>*> groups_by_param(const TapeT<double>&,
                                                               const std::vector<TensorT<double>>&);
template std::vector<std::string> clip_layers(const std::vector<TensorT<float>>&);
template std::vector<std::string> clip_layers(const std::vector<TensorT<double>>&);
template TensorT<float> per_sample_losses(ModelT<float>&, const BatchT<float>&);
template TensorT<double> per_sample_losses(ModelT<double>&, const BatchT<double>&);
template ArrayT<float> jl_projections(ModelT<float>&, const BatchT<float>&, const std::vector<ArrayT<float>>&);
template ArrayT<double> jl_projections(ModelT<double>&, const BatchT<double>&, const std::vector<ArrayT<double>>&);
template std::unique_ptr<ClipStrategyT<float>> make_clip_strategy(const std::string&, double);
template std::unique_ptr<ClipStrategyT<double>> make_clip_strategy(const std::string&, double);
template std::unique_ptr<ClipStrategyT<float>> make_clip_strategy(const ClipSpec&, double);
template std::unique_ptr<ClipStrategyT<double>> make_clip_strategy(const ClipSpec&, double);

}  // namespace dpgrad
