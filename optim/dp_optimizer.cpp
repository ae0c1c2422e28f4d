// DP optimizer step: clip (strategy) -> noise -> normalise -> base update -> account.
#include "optim/dp_optimizer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>

#include <xtensor/xmath.hpp>

#include "engine/communicator.hpp"
#include "engine/random.hpp"
#include "engine/runtime.hpp"
#include "layers/dropout.hpp"
#include "optim/sampling/sampler.hpp"
#include "privacy/accountant.hpp"

namespace dpgrad {

template <class T>
double check_noise_settings(const DPConfig& c, const ClipStrategyT<T>& strategy, double expected_batch,
                            std::size_t layers) {
  if (strategy.adapts_layers() && !c.adaptive)
    throw std::invalid_argument(strategy.name() + " moves each layer's clip norm by a noised count of its own: it needs "
                                "adaptive clipping (DPConfig::adaptive: the quantile, the counts' noise and the step)");
  const bool noised = strategy.is_private() && c.noise_multiplier > 0;
  double count_noise = 0;
  if (c.adaptive) {
    const AdaptiveClipping& a = *c.adaptive;
    if (strategy.jl_dim() > 0)
      throw std::invalid_argument(
          "adaptive clipping cannot run with " + strategy.name() + ": its count of unclipped contributions is "
          "accounted with the clipped sum as one Gaussian mechanism, and jl:K's sum is accounted by the JL "
          "mechanism's own analysis (its clipping bound is random), which does not cover the joint release; use "
          "ghost, vanilla, naive or microbatch:M (docs/math.md section 8)");
    if (!noised)
      throw std::invalid_argument("adaptive clipping releases a noised count of unclipped contributions: it needs "
                                  "noise (a noise multiplier > 0)");
    if (!(a.quantile >= 0 && a.quantile <= 1))
      throw std::invalid_argument("adaptive clipping's quantile must be in [0, 1], got " + privacy::format_number(a.quantile, 6));
    if (!(a.lr >= 0 && a.lr <= 10))
      throw std::invalid_argument("adaptive clipping's learning rate must be in [0, 10], got " + privacy::format_number(a.lr, 6));
    // per layer: G counts, each layer starting from C / sqrt(G)
    const std::size_t counts = adaptive_counts(true, strategy, layers);
    const double G = double(counts), first = c.clip_norm / std::sqrt(G);
    if (!(a.min_clip_norm >= 1e-12 && a.min_clip_norm <= first && first <= a.max_clip_norm && a.max_clip_norm <= 1e6))
      throw std::invalid_argument(std::string("adaptive clipping keeps ") +
                                  (counts > 1 ? "each layer's C_g (first C / sqrt(layers))" : "C") +
                                  " in [min, max] with 1e-12 <= min <= C <= max <= 1e6; got "
                                  "[" + privacy::format_number(a.min_clip_norm, 6) + ", " +
                                  privacy::format_number(a.max_clip_norm, 6) + "] and " +
                                  (counts > 1 ? "C_g = " : "C = ") + privacy::format_number(first, 6));
    if (!(a.count_noise >= 0 && std::isfinite(a.count_noise)))
      throw std::invalid_argument("adaptive clipping's count noise must be >= 0 (0: the default), got " +
                                  privacy::format_number(a.count_noise, 6));
    count_noise = a.count_noise == 0 ? strategy.normaliser(expected_batch) / 20 : a.count_noise;  // the paper's choice
    // each count's sensitivity is 1/2 (its terms are b - 1/2), so the releases are one Gaussian
    // mechanism at sigma when sigma^-2 = sigma_g^-2 + G (2 sigma_b)^-2 (docs/math.md section 8)
    if (!(2 * count_noise > std::sqrt(G) * c.noise_multiplier * 1.0000001))
      throw std::invalid_argument(
          "adaptive clipping's count noise " + privacy::format_number(count_noise, 6) + " must exceed " +
          (counts > 1 ? "sqrt(layers) / 2 times" : "half") + " the noise multiplier (" +
          privacy::format_number(std::sqrt(G) * c.noise_multiplier / 2, 6) + "): the count" + (counts > 1 ? "s" : "") +
          " and the clipped sum share the run's sigma; give a larger count noise (the default is the expected "
          "contributions per batch / 20)");
  }
  if (noised) {
    // the grid adds noise to values below 2^52 grid steps, at least 2^27 sigma C (docs/noise.md): a batch's sum
    // of contributions of norm C reaches L C, with room for larger Poisson batches
    const double smallest = 4 * expected_batch * std::ldexp(1.0, -27);
    if (!(c.noise_multiplier >= smallest))
      throw std::invalid_argument("noise multiplier " + privacy::format_number(c.noise_multiplier, 6) +
                                  " is too small for the noise grid: a batch's clipped sum (about " +
                                  privacy::format_number(expected_batch, 6) + " contributions of norm up to C) needs at least " +
                                  privacy::format_number(smallest, 3) + " (docs/noise.md)");
  }
  return count_noise;
}

template <class T>
DPOptimizerT<T>::DPOptimizerT(ModelT<T>& model, OptimizerT<T>& base, ClipStrategyT<T>& strategy, DPConfig c,
                              const Sampler& sampler, Rng& noise_rng, Rng& aux_rng, privacy::Accountant* accountant)
    : model_(model), base_(base), strategy_(strategy), config_(c), sampler_(sampler), grid_clip_norm_(c.clip_norm),
      noise_rng_(noise_rng), aux_rng_(aux_rng), accountant_(accountant), energy_(model.parameters().size(), 0.0) {
  dropout_key_ = noise_rng.secure() ? random_hash_key() : hash_key_from_seed(0, "dpgrad-dropout-optimizer");
  const double L = sampler.expected_batch_size(), q = sampler.sampling_rate();
  if (!(L > 0 && std::isfinite(L)))
    throw std::invalid_argument("the sampler's expected batch size must be > 0, got " + std::to_string(L));
  if (!(c.max_parameter > 0))
    throw std::invalid_argument("the largest parameter magnitude must be > 0, got " + std::to_string(c.max_parameter));
  if (!(c.sat_rho >= 0 && std::isfinite(c.sat_rho)))
    throw std::invalid_argument("DP-SAT's rho must be >= 0, got " + std::to_string(c.sat_rho));
  if (c.sat_rho > 0)
    for (const auto& p : model.parameters()) sat_direction_.push_back(xt::zeros<T>(p.value().shape()));
  if (c.physical_batch > 0 && !strategy.splits_into_chunks())
    throw std::invalid_argument("physical batches of " + std::to_string(c.physical_batch) + " examples need a strategy "
                                "whose contributions are per example (naive, vanilla, ghost), not " + strategy.name());
  if (c.communicator && c.communicator->size() > 1 && !strategy.shards_across_processes())
    throw std::invalid_argument(strategy.name() + " cannot run on " + std::to_string(c.communicator->size()) +
                                " processes: its groups of examples would span them (docs/distributed.md); use "
                                "naive, vanilla, ghost or jl:K");
  if (!strategy.is_private()) return;
  if (!(c.clip_norm > 0 && std::isfinite(c.clip_norm)))
    throw std::invalid_argument("clip norm must be > 0, got " + std::to_string(c.clip_norm));
  if (!(c.noise_multiplier >= 0 && std::isfinite(c.noise_multiplier)))
    throw std::invalid_argument("noise multiplier must be >= 0, got " + std::to_string(c.noise_multiplier));
  if (c.noise_multiplier == 0 && !c.allow_no_noise)
    throw std::invalid_argument("noise multiplier 0 makes training NOT private; it must be asked for explicitly");
  if (!(q > 0 && q <= 1))
    throw std::invalid_argument("the sampler's sampling rate q must be in (0, 1], got " + std::to_string(q));
  require_private_generator(noise_rng, "noise");
  require_private_generator(aux_rng, "direction (aux)");
  if (accountant) {
    if (!accountant->upper_bound())
      throw std::invalid_argument("the " + accountant->name() + " accountant is an approximation, not an upper bound "
                                  "on epsilon: it cannot account a private optimizer (use pld, rdp, wor or shuffle)");
    check_accountant_matches(sampler, accountant->name());
    if (strategy.jl_dim() > 0 && !accountant->supports_jl())
      throw std::invalid_argument("the " + accountant->name() + " accountant cannot analyse " + strategy.name() +
                                  " (its clipping bound is random)");
  }
  gradient_sigma_ = c.noise_multiplier;
  expected_contributions_ = strategy.normaliser(L);
  const double count_noise = check_noise_settings(c, strategy, L, clip_layers(model.parameters()).size());
  if (c.adaptive) {
    AdaptiveClipping& a = *config_.adaptive;
    a.count_noise = count_noise;
    // per layer: G counts, each layer starting from C / sqrt(G)
    counts_ = adaptive_counts(true, strategy, clip_layers(model.parameters()).size());
    const double G = double(counts_), first = c.clip_norm / std::sqrt(G);
    // each count's sensitivity is 1/2 (its terms are b - 1/2), so the releases are one Gaussian
    // mechanism at sigma when sigma^-2 = sigma_g^-2 + G (2 sigma_b)^-2 (docs/math.md section 8)
    gradient_sigma_ =
        1 / std::sqrt(1 / (c.noise_multiplier * c.noise_multiplier) - G / (4 * a.count_noise * a.count_noise));
    clip_state_ = ArrayT<T>::from_shape({counts_});
    clip_state_.fill(T(counts_ > 1 ? first : c.clip_norm));
    // every C within reach is checked now, so that no step can be refused later
    set_clip_geometry(a.min_clip_norm * std::sqrt(G));
    set_clip_geometry(a.max_clip_norm * std::sqrt(G));
  }
  apply_clip_state();
}

template <class T>
double DPOptimizerT<T>::clip_norm() const {
  if (!config_.adaptive) return config_.clip_norm;
  if (counts_ == 1) return double(clip_state_(0));
  double sq = 0;
  for (const T c : clip_state_) sq += double(c) * double(c);
  return std::sqrt(sq);
}

template <class T>
std::vector<std::pair<std::string, double>> DPOptimizerT<T>::layer_clip_norms() const {
  if (!strategy_.adapts_layers()) return {};  // (the constructor made it adaptive: counts_ = G clip norms)
  const std::vector<std::string> names = clip_layers(model_.parameters());
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t g = 0; g < names.size(); ++g) out.emplace_back(names[g], double(clip_state_(g)));
  return out;
}

template <class T>
void DPOptimizerT<T>::apply_clip_state() {
  const double C = clip_norm();
  set_clip_geometry(C);
  if (!strategy_.adapts_layers()) return;
  std::vector<double> shares;
  for (const T c : clip_state_) shares.push_back(double(c) / C);
  strategy_.set_layer_shares(std::move(shares));
}

template <class T>
void DPOptimizerT<T>::set_clip_geometry(double C) {
  grid_clip_norm_ = C;
  if (!adds_noise()) return;
  // Rounding the sum to the grid moves it by at most grid / 2 per coordinate, so neighbouring sums' rounded
  // values differ by at most A = grid (sqrt(P) + 1) more than the sums (docs/noise.md section 3): the
  // contributions are clipped that much tighter. jl:K's contributions have norm up to C sqrt(K / X), below C
  // when X > K: there the allowance must shrink with them, and 32 A covers every X <= 1024 K (the rest, with
  // probability below e^-508 per step, is in the delta the run's epsilon reserves; docs/noise.md).
  const double noise_std = gradient_sigma_ * C;
  if (!(noise_std >= 0x1.0p-900 && noise_std <= 0x1.0p900))
    throw std::invalid_argument("the noise's standard deviation, noise multiplier " +
                                privacy::format_number(gradient_sigma_, 6) + " times clip norm " +
                                privacy::format_number(C, 6) + " = " + privacy::format_number(noise_std, 6) +
                                ", is outside the noise grid's range [2^-900, 2^900] (docs/noise.md): choose a clip "
                                "norm and noise multiplier whose product is in it");
  const NoiseGrid g = noise_grid(noise_std);
  const double coordinates = double(model_.parameter_count() + counts_);
  const double room = (config_.adaptive ? noise_std / config_.noise_multiplier : C) -
                      (strategy_.jl_dim() > 0 ? 32 : 1) * g.grid * (std::sqrt(coordinates) + 1.0);
  if (config_.adaptive) {
    // one more coordinate per count, at count_scale_ per unit: its noise is sigma_b in counts, and a
    // contribution's (gradient, counts' shares) has norm at most room = sigma_g C / sigma - A
    count_scale_ = noise_std / config_.adaptive->count_noise;
    const double shares = double(counts_) * (count_scale_ / 2) * (count_scale_ / 2);
    grid_clip_norm_ = room * room > shares ? std::sqrt(room * room - shares) : 0.0;
  } else {
    grid_clip_norm_ = room;
  }
  if (!(grid_clip_norm_ > 0.5 * C))
    throw std::invalid_argument("noise multiplier " + privacy::format_number(config_.noise_multiplier, 6) +
                                " too large for the noise grid of " + std::to_string(model_.parameter_count()) +
                                " parameters (docs/noise.md)");
}

template <class T>
void DPOptimizerT<T>::clip_state_restored() {
  if (!config_.adaptive) return;
  const AdaptiveClipping& a = *config_.adaptive;
  if (clip_state_.size() != counts_)
    throw std::invalid_argument("the checkpoint holds " + std::to_string(clip_state_.size()) +
                                " adaptive clip norms, the run " + std::to_string(counts_));
  for (const T c : clip_state_)
    if (!(double(c) >= double(T(a.min_clip_norm)) && double(c) <= double(T(a.max_clip_norm))))
      throw std::invalid_argument("the checkpoint's adaptive clip norm " + privacy::format_number(double(c), 6) +
                                  " is outside the run's range [" + privacy::format_number(a.min_clip_norm, 6) + ", " +
                                  privacy::format_number(a.max_clip_norm, 6) + "]");
  apply_clip_state();
}

template <class T>
bool DPOptimizerT<T>::adds_noise() const {
  return strategy_.is_private() && config_.noise_multiplier > 0;
}

template <class T>
bool DPOptimizerT<T>::noise_reproducible() const {
  return noise_rng_.reproducible_opt_in() || aux_rng_.reproducible_opt_in();
}


template <class T>
bool DPOptimizerT<T>::is_private() const {
  return adds_noise() && !noise_reproducible();
}

template <class T>
double DPOptimizerT<T>::sampling_rate() const {
  return sampler_.sampling_rate();
}

template <class T>
double DPOptimizerT<T>::expected_batch_size() const {
  return sampler_.expected_batch_size();
}

template <class T>
double DPOptimizerT<T>::accounted_noise_multiplier() const {
  // Without an accountant: the add/remove figure.
  const auto rel = accountant_ ? accountant_->neighbouring() : privacy::Neighbouring::add_remove;
  return config_.noise_multiplier / privacy::accounted_sensitivity(strategy_.sensitivity(), rel);
}

template <class T>
double DPOptimizerT<T>::noise_variance() const {
  if (!adds_noise()) return 0.0;
  const double sd = gradient_sigma_ * (config_.adaptive && config_.adaptive->normalise ? 1.0 : clip_norm()) /
                    strategy_.normaliser(expected_batch_size());
  return sd * sd;
}

namespace {

/// The noise blocks a rank of a data-parallel run noises, [first, last): block b goes to
/// the rank its first coordinate falls to when the coordinates are cut in equal parts.
/// `shares`: each rank's count of coordinates.
struct OwnedBlocks {
  std::size_t first = 0, last = 0;
  std::vector<std::size_t> shares;
};
OwnedBlocks owned_blocks(const std::vector<std::size_t>& sizes, std::size_t ranks, std::size_t rank) {
  std::size_t total = 0;
  for (const std::size_t n : sizes) total += n;
  OwnedBlocks o;
  o.shares.assign(ranks, 0);
  o.first = sizes.size();
  for (std::size_t b = 0, start = 0; b < sizes.size(); start += sizes[b], ++b) {
    const std::size_t owner = std::min(ranks - 1, std::size_t((long double)(start) * ranks / total));
    o.shares[owner] += sizes[b];
    if (owner == rank) {
      o.first = std::min(o.first, b);
      o.last = b + 1;
    }
  }
  if (o.first > o.last) o.first = o.last;
  return o;
}

}  // namespace

template <class T>
std::vector<std::size_t> DPOptimizerT<T>::released_block_sizes() const {
  std::vector<std::size_t> parts;
  for (const auto& p : model_.parameters()) parts.push_back(p.value().size());
  if (config_.adaptive) parts.push_back(counts_);
  return noise_block_sizes(parts);
}

template <class T>
std::unique_ptr<NoiseAhead> DPOptimizerT<T>::draw_noise_ahead() {
  if (!adds_noise()) return nullptr;
  const std::vector<std::size_t> sizes = released_block_sizes();
  std::size_t first = 0, last = sizes.size();
  if (config_.communicator) {
    const OwnedBlocks o = owned_blocks(sizes, std::size_t(config_.communicator->size()),
                                       std::size_t(config_.communicator->rank()));
    first = o.first;
    last = o.last;
  }
  return std::make_unique<NoiseAhead>(noise_rng_, noise_grid(gradient_sigma_ * clip_norm()), sizes, first, last);
}

template <class T>
ClipResult<T> DPOptimizerT<T>::clipped_sum(const BatchT<T>& batch, Rng& aux) {
  const std::size_t examples = batch.examples(), chunk = config_.physical_batch;
  if (chunk == 0 || examples <= chunk) return strategy_.clipped_sum(model_, batch, grid_clip_norm_, aux);
  ClipResult<T> total;
  std::vector<T> norms;
  std::vector<ArrayT<T>> layer_norms;  // the chunks'
  std::vector<std::size_t> index;
  for (std::size_t start = 0; start < examples; start += chunk) {
    index.clear();
    for (std::size_t i = start; i < std::min(examples, start + chunk); ++i) index.push_back(i);
    ClipResult<T> part = strategy_.clipped_sum(model_, batch.select(index), grid_clip_norm_, aux);
    if (total.sum.empty()) {
      total.sum = std::move(part.sum);
    } else {
      for (std::size_t j = 0; j < total.sum.size(); ++j) total.sum[j] += part.sum[j];
    }
    total.loss_sum += part.loss_sum;
    total.clipped += part.clipped;
    norms.insert(norms.end(), part.norms.begin(), part.norms.end());
    layer_norms.push_back(std::move(part.layer_norms));
  }
  total.norms = ArrayT<T>::from_shape({norms.size()});
  std::copy(norms.begin(), norms.end(), total.norms.begin());
  if (!layer_norms.empty() && layer_norms.front().dimension() == 2) {  // (layers, contributions), side by side
    total.layer_norms = ArrayT<T>::from_shape({layer_norms.front().shape(0), norms.size()});
    std::size_t at = 0;
    for (const ArrayT<T>& part : layer_norms) {
      for (std::size_t g = 0; g < part.shape(0); ++g)
        for (std::size_t i = 0; i < part.shape(1); ++i) total.layer_norms(g, at + i) = part(g, i);
      at += part.shape(1);
    }
  }
  return total;
}

template <class T>
void DPOptimizerT<T>::combine(ClipResult<T>& r, StepStats& st, NoiseAhead* noise) {
  Communicator& comm = *config_.communicator;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  // the counts' small message returns when the slowest rank has clipped its share
  double counts[3] = {double(st.batch), r.loss_sum, double(r.clipped)};
  comm.allreduce_sum(counts, 3);
  const auto synced = clock::now();
  st.wait_seconds = std::chrono::duration<double>(synced - start).count();
  st.batch = std::size_t(counts[0]);
  r.loss_sum = counts[1];
  r.clipped = std::size_t(counts[2]);
  // Every coordinate is summed onto the rank that owns its noise block, noised
  // there once, and gathered back to every rank: a reduce-scatter and an
  // all-gather, which move what one all-reduce moves and share the noise's
  // drawing among the ranks (docs/distributed.md).
  std::vector<T> flat;
  flat.reserve(model_.parameter_count());
  for (const auto& g : r.sum) flat.insert(flat.end(), g.begin(), g.end());
  const std::size_t coordinates = model_.parameter_count() + counts_;  // the counts'
  if (flat.size() != coordinates)
    throw std::logic_error("data-parallel step: the clipped sum has " + std::to_string(flat.size()) +
                           " coordinates, the model " + std::to_string(coordinates));
  std::vector<std::span<T>> parts;
  for (std::size_t at = 0; const auto& g : r.sum) {
    parts.emplace_back(flat.data() + at, g.size());
    at += g.size();
  }
  const std::vector<std::span<T>> blocks = noise_blocks(parts);
  const OwnedBlocks owned =
      owned_blocks(released_block_sizes(), std::size_t(comm.size()), std::size_t(comm.rank()));
  comm.reduce_scatter_sum(flat.data(), owned.shares);
  const auto noise_start = clock::now();
  if (noise) noise->add(blocks);  // its blocks [first, last) are this rank's (draw_noise_ahead)
  const double noising = std::chrono::duration<double>(clock::now() - noise_start).count();
  comm.allgather(flat.data(), owned.shares);
  std::size_t at = 0;
  for (auto& g : r.sum) {
    std::copy(flat.begin() + std::ptrdiff_t(at), flat.begin() + std::ptrdiff_t(at + g.size()), g.begin());
    at += g.size();
  }
  st.communication_seconds = std::chrono::duration<double>(clock::now() - synced).count() - noising;
}

template <class T>
StepStats DPOptimizerT<T>::step(const BatchT<T>& batch) {
  // a record's dropout masks depend on it alone: keyed here unless the caller (PrivateTrainer) keys them
  std::optional<DropoutKeyScope> keyed;
  if (!dropout_keyed()) keyed.emplace(dropout_key_, dropout_steps_);
  ++dropout_steps_;
  StepStats st;
  st.batch = batch.examples();
  const std::unique_ptr<NoiseAhead> noise = draw_noise_ahead();
  // DP-SAT: the gradients at theta + rho g / ||g||, then theta back exactly as it
  // was, also when the strategy throws (a NaN loss, say)
  auto ps = model_.parameters();
  std::vector<ArrayT<T>> theta;
  struct Restore {
    std::vector<TensorT<T>>& ps;
    std::vector<ArrayT<T>>& theta;
    ~Restore() {
      for (std::size_t i = 0; i < theta.size(); ++i) ps[i].mutable_value() = std::move(theta[i]);
    }
  };
  std::optional<Restore> restore;
  if (config_.sat_rho > 0) {
    double norm2 = 0;
    for (const auto& g : sat_direction_) norm2 += double(xt::sum(g * g)());
    if (norm2 > 0 && std::isfinite(norm2)) {
      const T scale = T(config_.sat_rho / std::sqrt(norm2));
      for (std::size_t i = 0; i < ps.size(); ++i) {
        theta.push_back(ps[i].value());
        ps[i].mutable_value() += scale * sat_direction_[i];
      }
      restore.emplace(ps, theta);  // in place: a temporary would restore at once
    }
  }
  // a data-parallel run's strategy draws from a generator split off the shared
  // one: the same on every rank, however much each rank's share makes it draw
  std::unique_ptr<Rng> step_aux = config_.communicator ? aux_rng_.split() : nullptr;
  ClipResult<T> r = clipped_sum(batch, step_aux ? *step_aux : aux_rng_);
  restore.reset();
  const double C = clip_norm();
  const bool per_layer = strategy_.adapts_layers();
  st.clip_norm = grid_clip_norm_;
  if (config_.adaptive) {  // the counts of unclipped contributions, centred (terms b - 1/2), as more coordinates
    ArrayT<T> count = ArrayT<T>::from_shape({counts_});
    for (std::size_t g = 0; g < counts_; ++g) {
      double centred = 0;
      if (!per_layer) {
        for (const T n : r.norms) centred += double(n) <= grid_clip_norm_ ? 0.5 : -0.5;
      } else {  // per layer: the contributions whose layer-g part was not clipped (layer g's share: C_g / C)
        const double limit = grid_clip_norm_ * double(clip_state_(g)) / C;
        if (r.layer_norms.dimension() == 2)  // (an empty batch has none)
          for (std::size_t i = 0; i < r.layer_norms.shape(1); ++i)
            centred += double(r.layer_norms(g, i)) <= limit ? 0.5 : -0.5;
      }
      count(g) = T(count_scale_ * centred);
    }
    r.sum.push_back(std::move(count));
  }
  // the sum rounded to the grid plus grid * k, k ~ N_Z(0, s^2) drawn exactly and
  // added in integers: what is released minus the rounded sum does not depend on
  // the data (docs/noise.md)
  if (noise) {
    const NoiseGrid grid = noise_grid(gradient_sigma_ * C);
    if (grid.grid != noise->grid().grid || grid.scale != noise->grid().scale)
      throw std::logic_error("the step's noise grid changed while the step ran");
    st.noise_std = double(grid.scale) * grid.grid;
  }
  if (config_.communicator) {
    combine(r, st, noise.get());
  } else if (noise) {
    std::vector<std::span<T>> parts;
    for (auto& g : r.sum) parts.emplace_back(g.data(), g.size());
    noise->add(noise_blocks(parts));
  }
  if (config_.adaptive) {  // the released counts move C (the C_g) for the next step (post-processing)
    const AdaptiveClipping& a = *config_.adaptive;
    double mean = 0;
    for (std::size_t g = 0; g < counts_; ++g) {
      const double released = double(r.sum.back()(g)) / count_scale_;  // sum of (b - 1/2), noised
      const double fraction = released / expected_contributions_ + 0.5;
      mean += fraction / double(counts_);
      if (per_layer) st.layer_unclipped_fractions.push_back(fraction);
      clip_state_(g) = T(std::clamp(double(clip_state_(g)) * std::exp(-a.lr * (fraction - a.quantile)), a.min_clip_norm,
                                    a.max_clip_norm));
    }
    r.sum.pop_back();
    st.unclipped_fraction = mean;
    apply_clip_state();
  }
  st.loss = st.batch ? r.loss_sum / double(st.batch) : 0.0;
  st.clipped = r.clipped;
  double denom;
  if (strategy_.is_private()) {
    // the true batch size is itself private: divide by the expected one
    denom = strategy_.normaliser(expected_batch_size());
    if (config_.adaptive && config_.adaptive->normalise) denom *= C;  // in units of this step's C
  } else {
    denom = std::max<double>(1.0, double(st.batch));
  }
  for (auto& g : r.sum) g /= T(denom);
  base_.step(r.sum);  // checks one gradient per parameter
  for (std::size_t i = 0; i < r.sum.size(); ++i) {
    double e = 0;
    for (const T v : r.sum[i]) e += double(v) * double(v);
    energy_[i] += e;
  }
  ++energy_steps_;
  // the next step's direction, moved array by array: checkpoints hold pointers to these arrays
  if (config_.sat_rho > 0)
    for (std::size_t i = 0; i < r.sum.size(); ++i) sat_direction_[i] = std::move(r.sum[i]);
  if (accountant_ && adds_noise())
    accountant_->step(sampling_rate(), accounted_noise_multiplier(), 1, strategy_.jl_dim());
  check_parameters();  // after the accounting: a diverged step was taken, and counts
  back_heap_with_huge_pages();  // the heap the step before this one left, into huge pages (engine/runtime.hpp)
  return st;
}

template <class T>
void DPOptimizerT<T>::check_parameters() const {
  const T limit = T(std::min<double>(config_.max_parameter, double(std::numeric_limits<T>::max())));
  for (const auto& p : model_.parameters()) {
    const ArrayT<T>& v = p.value();
    bool bad = false;
    for (const T x : v) bad |= !(std::abs(x) <= limit);  // NaN fails the comparison too
    if (!bad) continue;
    T worst = 0;
    for (const T x : v)
      if (!(std::abs(x) <= limit)) {
        worst = x;
        break;
      }
    throw DivergedError("the parameters diverged: " + p.name() + " holds " + privacy::format_number(double(worst), 4) +
                        " after this step (" +
                        (std::isfinite(double(worst)) ? "above " + privacy::format_number(config_.max_parameter, 4)
                                                      : std::string("not a finite number")) +
                        "); lower the learning rate");
  }
}

template <class T>
std::vector<GradientEnergy> DPOptimizerT<T>::gradient_energy() const {
  std::vector<GradientEnergy> r;
  const auto ps = model_.parameters();
  const double v = noise_variance(), n = double(std::max(energy_steps_, 1L));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    GradientEnergy e;
    e.name = ps[i].name();
    e.size = ps[i].value().size();
    e.noised = energy_[i] / n;
    e.noise = v * double(e.size);
    r.push_back(std::move(e));
  }
  return r;
}

template <class T>
std::vector<GradientEnergy> DPOptimizerT<T>::gradient_energy_by_layer() const {
  std::vector<GradientEnergy> layers;
  for (const auto& e : gradient_energy()) {
    const std::string layer = clip_layer_name(e.name);
    auto it = std::find_if(layers.begin(), layers.end(), [&](const GradientEnergy& l) { return l.name == layer; });
    if (it == layers.end()) it = layers.insert(layers.end(), GradientEnergy{layer});
    it->size += e.size;
    it->noised += e.noised;
    it->noise += e.noise;
  }
  return layers;
}

template <class T>
void DPOptimizerT<T>::reset_gradient_energy() {
  std::fill(energy_.begin(), energy_.end(), 0.0);
  energy_steps_ = 0;
}

template class DPOptimizerT<float>;
template class DPOptimizerT<double>;
template double check_noise_settings(const DPConfig&, const ClipStrategyT<float>&, double, std::size_t);
template double check_noise_settings(const DPConfig&, const ClipStrategyT<double>&, double, std::size_t);

}  // namespace dpgrad
