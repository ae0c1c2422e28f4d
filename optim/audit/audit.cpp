// Privacy audit runs (optim/audit/audit.hpp, docs/audit.md).
#include "optim/audit/audit.hpp"

#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <vector>

#include <xtensor/xbuilder.hpp>

#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "layers/models.hpp"
#include "layers/registry.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/dp_optimizer.hpp"
#include "optim/optimizer.hpp"
#include "optim/sampling/sampler.hpp"
#include "privacy/accountant.hpp"
#include "privacy/mechanisms.hpp"

namespace dpgrad {

namespace {

using T = double;
constexpr std::int64_t kCanaryId = 1 << 30;

/// The rate and expected batch size the optimizer and accountant are told.
class ClaimedSampler final : public Sampler {
 public:
  ClaimedSampler(double q, double expected) : q_(q), expected_(expected) {}
  std::string name() const override { return "poisson"; }
  long steps_per_epoch() const override { return 1; }
  double sampling_rate() const override { return q_; }
  double expected_batch_size() const override { return expected_; }
  std::vector<std::string> accountants() const override { return {"rdp", "pld", "gdp"}; }

 protected:
  std::vector<std::size_t> draw(Rng&) override { return {}; }

 private:
  double q_, expected_;
};

/// Broken on purpose: one clip factor for the whole batch, from its mean
/// gradient's norm, applied to the sum (so one example can move it by B C).
class BatchClipping final : public ClipStrategyT<T> {
 public:
  std::string name() const override { return "batch-clipping (broken)"; }
  ClipResult<T> clipped_sum(ModelT<T>& model, const BatchT<T>& batch, double clip_norm, Rng& rng) override {
    ClipResult<T> r = none_->clipped_sum(model, batch, clip_norm, rng);
    double n2 = 0;
    for (const auto& g : r.sum) n2 += double(xt::sum(g * g)());
    const double mean_norm = std::sqrt(n2) / double(std::max<std::size_t>(1, batch.examples()));
    if (mean_norm > clip_norm)
      for (auto& g : r.sum) g *= T(clip_norm / mean_norm);
    return r;
  }

 private:
  std::unique_ptr<ClipStrategyT<T>> none_ = make_clip_strategy<T>("none");
};

/// Broken on purpose: the canary's norm is reported at a tenth, so it is clipped to 10 C.
class UnderReportedNorm final : public ClipStrategyT<T> {
 public:
  explicit UnderReportedNorm(std::unique_ptr<ClipStrategyT<T>> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name() + " (canary norm halved, broken)"; }
  ClipResult<T> clipped_sum(ModelT<T>& model, const BatchT<T>& batch, double clip_norm, Rng& rng) override {
    std::vector<std::size_t> canary, rest;
    for (std::size_t i = 0; i < batch.examples(); ++i) (batch.ids[i] >= kCanaryId ? canary : rest).push_back(i);
    ClipResult<T> r = inner_->clipped_sum(model, batch.select(rest), clip_norm, rng);
    if (!canary.empty()) {
      const ClipResult<T> c = inner_->clipped_sum(model, batch.select(canary), 10 * clip_norm, rng);
      for (std::size_t j = 0; j < r.sum.size(); ++j) r.sum[j] += c.sum[j];
      r.loss_sum += c.loss_sum;
    }
    return r;
  }

 private:
  std::unique_ptr<ClipStrategyT<T>> inner_;
};

/// The model, the fixed examples and the canary.
struct Setup {
  std::unique_ptr<ModelT<T>> model;
  BatchT<T> others, with_canary;
};

BatchT<T> feature_batch(std::size_t n, const Shape& example, Rng& rng, double scale) {
  Shape s{n};
  s.insert(s.end(), example.begin(), example.end());
  BatchT<T> b;
  b.inputs = ArrayT<T>::from_shape(s);
  for (auto& v : b.inputs) v = T(scale * rng.normal());
  for (std::size_t i = 0; i < n; ++i) {
    b.labels.push_back(std::int32_t(i % 2));
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

BatchT<T> token_batch(std::size_t n, std::size_t len, std::size_t vocab, Rng& rng) {
  BatchT<T> b;
  b.tokens = xt::zeros<std::int32_t>({n, len});
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t t = 0; t < len; ++t) b.tokens(i, t) = std::int32_t(1 + rng.below(vocab - 1));
    b.lengths.push_back(std::int32_t(len));
    b.labels.push_back(std::int32_t(i % 2));
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

BatchT<T> join(const BatchT<T>& a, const BatchT<T>& b) {
  BatchT<T> r = a;
  if (a.inputs.dimension() > 0) r.inputs = xt::concatenate(xt::xtuple(a.inputs, b.inputs), 0);
  if (a.tokens.dimension() > 0) r.tokens = xt::concatenate(xt::xtuple(a.tokens, b.tokens), 0);
  r.lengths.insert(r.lengths.end(), b.lengths.begin(), b.lengths.end());
  r.labels.insert(r.labels.end(), b.labels.begin(), b.labels.end());
  r.ids.insert(r.ids.end(), b.ids.begin(), b.ids.end());
  return r;
}

/// The model, the fixed examples and `n` canaries (ids kCanaryId + i), each far
/// out and labelled with the class the model finds least likely.
Setup make_setup(const AuditConfig& c, std::size_t n = 1) {
  FastRng rng(c.seed);
  Setup s;
  BatchT<T> canary;
  ModelSpec spec;  // the bundled models, small: 10 features, 16 hidden units, 2 classes (cnn26k: its 10)
  spec.features = 10;
  spec.hidden = 16;
  spec.classes = c.model == "cnn26k" ? 10 : 2;
  spec.activation = Activation::tanh;
  if (c.model == "logreg" || c.model == "mlp") {
    s.model = build_model<T>(c.model, spec, rng);
    s.others = feature_batch(c.others, {10}, rng, 1.0);
    canary = feature_batch(n, {10}, rng, 100.0);  // far out: its gradient is far above any sensible C
  } else if (c.model == "cnn26k") {
    s.model = build_model<T>(c.model, spec, rng);
    s.others = feature_batch(c.others, {1, 28, 28}, rng, 1.0);
    canary = feature_batch(n, {1, 28, 28}, rng, 30.0);
  } else if (c.model == "lstm") {  // the audit's own: a bidirectional LSTM small enough for many trainings
    s.model = make_bilstm<T>(rng, 50, 8, 8, 8, 2);
    s.others = token_batch(c.others, 6, 50, rng);
    canary = token_batch(n, 6, 50, rng);
  } else {
    throw std::invalid_argument("unknown audit model '" + c.model + "' (logreg, mlp, cnn26k, lstm)");
  }
  canary.ids.clear();
  for (std::size_t i = 0; i < n; ++i) canary.ids.push_back(kCanaryId + std::int64_t(i));
  // labelled with the class the model finds least likely: its loss, and gradient, are large
  {
    NoRecordScope<T> none;
    const ArrayT<T> logits = s.model->forward(canary).value();
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t worst = 0;
      for (std::size_t k = 1; k < logits.shape()[1]; ++k)
        if (logits(i, k) < logits(i, worst)) worst = k;
      canary.labels[i] = std::int32_t(worst);
    }
  }
  s.with_canary = join(s.others, canary);
  return s;
}

/// The clipping strategy as run: the configured one, or a broken one.
std::unique_ptr<ClipStrategyT<T>> audited_strategy(const AuditConfig& c, double expected) {
  if (c.fault == AuditFault::batch_clipping) return std::make_unique<BatchClipping>();
  if (c.fault == AuditFault::under_reported_norm)
    return std::make_unique<UnderReportedNorm>(make_clip_strategy<T>(c.strategy, expected));
  return make_clip_strategy<T>(c.strategy, expected);
}

DPConfig audited_config(const AuditConfig& c) {
  DPConfig dc;
  dc.clip_norm = c.clip_norm;
  dc.noise_multiplier = c.fault == AuditFault::no_noise ? 0.0 : c.noise_multiplier;
  dc.allow_no_noise = c.fault == AuditFault::no_noise;
  return dc;
}

/// The unit gradient direction of each canary at the current parameters, and checks its norm reaches C.
std::vector<std::vector<ArrayT<T>>> canary_directions(ModelT<T>& model, const BatchT<T>& canaries, double clip_norm) {
  std::vector<std::vector<ArrayT<T>>> out;
  FastRng none(0);
  auto naive = make_clip_strategy<T>("naive");
  for (std::size_t i = 0; i < canaries.examples(); ++i) {
    ClipResult<T> g = naive->clipped_sum(model, canaries.select({i}), 1e300, none);
    double n2 = 0;
    for (const auto& a : g.sum) n2 += double(xt::sum(a * a)());
    if (!(n2 > 0)) throw std::logic_error("audit: a canary has no gradient");
    if (std::sqrt(n2) < clip_norm)
      throw std::invalid_argument("audit: a canary's gradient norm " + std::to_string(std::sqrt(n2)) +
                                  " is below C: choose a smaller clip norm");
    for (auto& a : g.sum) a /= T(std::sqrt(n2));
    out.push_back(std::move(g.sum));
  }
  return out;
}

double claimed_epsilon(const AuditConfig& c, const ClipStrategyT<T>& strategy, std::size_t parameters) {
  auto acc = privacy::make_accountant("pld");
  const double sens = privacy::accounted_sensitivity(strategy.sensitivity(), acc->neighbouring());
  acc->step(c.sampling_rate, c.noise_multiplier / sens, c.steps, strategy.jl_dim());
  return privacy::grid_noise_epsilon(*acc, c.delta, double(parameters));
}

/// Dirac canaries: canary i is a crafted per-sample gradient with all its mass on
/// one coordinate of the parameters, of norm C once clipped. The real strategy
/// clips the batch's examples; the canaries present in this step add C e_k each
/// (10 C when their norm is under-reported; under batch clipping they join the
/// batch's sum before its one clip factor).
class WithDiracCanaries final : public ClipStrategyT<T> {
 public:
  WithDiracCanaries(std::unique_ptr<ClipStrategyT<T>> inner, AuditFault fault, std::vector<std::pair<std::size_t, std::size_t>> where)
      : inner_(std::move(inner)), fault_(fault), where_(std::move(where)) {}
  std::vector<std::size_t> present;  // the canaries in this step's batch
  std::string name() const override { return inner_->name() + " + dirac canaries"; }
  double sensitivity() const override { return inner_->sensitivity(); }
  double normaliser(double expected) const override { return inner_->normaliser(expected); }
  int jl_dim() const override { return inner_->jl_dim(); }
  ClipResult<T> clipped_sum(ModelT<T>& model, const BatchT<T>& batch, double clip_norm, Rng& rng) override {
    ClipResult<T> r = inner_->clipped_sum(model, batch, clip_norm, rng);
    const double size = fault_ == AuditFault::under_reported_norm ? 10 * clip_norm : clip_norm;
    for (std::size_t i : present) r.sum[where_[i].first].data()[where_[i].second] += T(size);
    if (fault_ == AuditFault::batch_clipping) {  // one factor from the mean over examples and canaries
      double n2 = 0;
      for (const auto& g : r.sum) n2 += double(xt::sum(g * g)());
      const double mean_norm = std::sqrt(n2) / double(std::max<std::size_t>(1, batch.examples() + present.size()));
      if (mean_norm > clip_norm)
        for (auto& g : r.sum) g *= T(clip_norm / mean_norm);
    }
    return r;
  }

 private:
  std::unique_ptr<ClipStrategyT<T>> inner_;
  AuditFault fault_;
  std::vector<std::pair<std::size_t, std::size_t>> where_;  // (parameter, flat index) of each canary
};

/// Many canaries in one run (Steinke, Nasr, Jagielski 2023; docs/audit.md).
AuditResult run_one_run(const AuditConfig& c, const std::function<void(long, long)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  Setup s = make_setup(c);
  ModelT<T>& model = *s.model;
  auto params = model.parameters();
  const std::size_t total = model.parameter_count();
  if (c.canaries < 20 || std::size_t(c.canaries) > total)
    throw std::invalid_argument("audit: one-run needs between 20 canaries and one per parameter (" +
                                std::to_string(total) + ")");
  const std::size_t m = std::size_t(c.canaries);
  std::vector<ArrayT<T>> theta0;
  for (const auto& p : params) theta0.push_back(p.value());
  // canary i on coordinate i * total / m of the parameters, in order
  std::vector<std::pair<std::size_t, std::size_t>> where;
  for (std::size_t i = 0; i < m; ++i) {
    std::size_t flat = i * total / m, j = 0;
    while (flat >= params[j].value().size()) flat -= params[j++].value().size();
    where.emplace_back(j, flat);
  }
  SecureRng coins, secure_noise, secure_aux, secure_sampling;
  std::vector<bool> included(m);
  for (std::size_t i = 0; i < m; ++i) included[i] = coins.next_u64() & 1;
  const double expected = double(c.others) + 0.5 * double(m) * c.sampling_rate;
  ClaimedSampler sampler(c.sampling_rate, expected);
  const AuditFault inner_fault = c.fault == AuditFault::batch_clipping ? AuditFault::none : c.fault;
  AuditConfig inner_config = c;
  inner_config.fault = inner_fault;
  auto canaries = std::make_unique<WithDiracCanaries>(
      c.fault == AuditFault::batch_clipping ? make_clip_strategy<T>("none") : audited_strategy(inner_config, expected),
      c.fault, where);
  WithDiracCanaries& strategy = *canaries;
  const DPConfig dc = audited_config(c);
  SgdT<T> sgd(params, 1.0);
  const double q_actual = c.fault == AuditFault::wrong_sampling_rate ? 1.0 : c.sampling_rate;
  auto run = [&](bool with_canaries, Rng& noise) {
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_value() = theta0[i];
    DPOptimizerT<T> opt(model, sgd, strategy, dc, sampler, noise, secure_aux, nullptr);
    for (long t = 0; t < c.steps; ++t) {
      strategy.present.clear();
      if (with_canaries)
        for (std::size_t i = 0; i < m; ++i)
          if (included[i] && (q_actual >= 1 || secure_sampling.uniform() < q_actual)) strategy.present.push_back(i);
      opt.step(s.others);
      if (progress) progress(t + 1, c.steps);
    }
    std::vector<ArrayT<T>> delta;
    for (std::size_t i = 0; i < params.size(); ++i) delta.push_back(theta0[i] - params[i].value());
    return delta;
  };
  std::vector<ArrayT<T>> update;
  if (c.fault == AuditFault::known_seed_noise) {
    ReproducibleRng noise(7), replay(7);
    update = run(true, noise);
    const auto baseline = run(false, replay);  // the attacker subtracts the recomputed noise
    for (std::size_t j = 0; j < update.size(); ++j) update[j] -= baseline[j];
  } else {
    update = run(true, secure_noise);
  }
  for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_value() = theta0[i];
  std::vector<double> scores(m);
  for (std::size_t i = 0; i < m; ++i) scores[i] = double(update[where[i].first].data()[where[i].second]);
  AuditResult r;
  r.parameters = total;
  r.one_run = privacy::one_run_epsilon(scores, included, c.delta, c.confidence);
  r.epsilon_lower_bound = r.one_run.epsilon;
  r.confidence = r.one_run.confidence;
  r.accountant_epsilon = claimed_epsilon(c, strategy, r.parameters);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

AuditResult run_audit(const AuditConfig& c, const std::function<void(long, long)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  check_audit_config(c);
  if (c.method == "one-run") return run_one_run(c, progress);

  Setup s = make_setup(c);
  ModelT<T>& model = *s.model;
  auto params = model.parameters();
  std::vector<ArrayT<T>> theta0;
  for (const auto& p : params) theta0.push_back(p.value());

  // the canary's gradient direction at theta0 (public: the auditor chose both)
  const std::vector<ArrayT<T>> u =
      canary_directions(model, s.with_canary.select({s.with_canary.examples() - 1}), c.clip_norm).front();

  // the mechanism as run, and as claimed
  const bool q_wrong = c.fault == AuditFault::wrong_sampling_rate;
  const double q_actual = q_wrong ? 1.0 : c.sampling_rate;
  const double expected = double(c.others) + c.sampling_rate;
  ClaimedSampler sampler(c.sampling_rate, expected);
  auto strategy = audited_strategy(c, expected);
  const DPConfig dc = audited_config(c);

  SecureRng secure_noise, secure_aux, secure_sampling;
  SgdT<T> sgd(params, 1.0);
  auto reset = [&] {
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_value() = theta0[i];
  };
  // the released update's component along the canary's direction, after the trial's steps
  auto score = [&]() {
    double s = 0;
    for (std::size_t i = 0; i < params.size(); ++i) s += double(xt::sum((theta0[i] - params[i].value()) * u[i])());
    return s;
  };
  auto run_steps = [&](bool canary, Rng& noise) {
    DPOptimizerT<T> opt(model, sgd, *strategy, dc, sampler, noise, secure_aux, nullptr);
    for (long t = 0; t < c.steps; ++t) {
      const bool in = canary && (q_actual >= 1 || secure_sampling.uniform() < q_actual);
      opt.step(in ? s.with_canary : s.others);
    }
  };
  std::vector<double> negatives, positives;
  const long total = 2 * c.trials;
  for (long trial = 0; trial < total; ++trial) {
    const bool canary = trial % 2 == 1;
    reset();
    if (c.fault == AuditFault::known_seed_noise) {
      // the attacker knows the seed: it reruns the step without the canary with the
      // same noise and subtracts, leaving the canary's contribution bare
      const std::uint64_t seed = std::uint64_t(trial) + 1;
      ReproducibleRng noise(seed);
      run_steps(canary, noise);
      const double released = score();
      reset();
      ReproducibleRng replay(seed);
      run_steps(false, replay);
      (canary ? positives : negatives).push_back(released - score());
    } else {
      run_steps(canary, secure_noise);
      (canary ? positives : negatives).push_back(score());
    }
    if (progress) progress(trial + 1, total);
  }
  reset();

  AuditResult r;
  r.parameters = model.parameter_count();
  r.bound = privacy::audit_epsilon(negatives, positives, c.delta, c.confidence);
  r.epsilon_lower_bound = r.bound.epsilon;
  r.confidence = r.bound.confidence;
  r.accountant_epsilon = claimed_epsilon(c, *strategy, r.parameters);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace dpgrad
