// DP-SGD / DP-Adam: one step = clipped sum from a clipping strategy, plus
// Gaussian noise N(0, sigma^2 C^2) once, divided by the expected batch size,
// then the base optimizer's update; the step is reported to an accountant
// (docs/math.md section 1; Bu et al. 2021 Algorithm 1 and Appendix A for JL).
// Optionally sharpness-aware (DP-SAT, Park et al. ICML 2023): the per-sample
// gradients are taken at theta + rho g / ||g||, g the previous step's noised
// gradient, which is already public: no privacy cost.
#pragma once

#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/random.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/optimizer.hpp"

namespace dpgrad {

class Communicator;
class Rng;
class Sampler;
struct NoiseGrid;
class NoiseAhead;
namespace privacy {
class Accountant;
}

/// Adaptive quantile clipping (Andrew, Thakkar, McMahan and Ramaswamy 2021;
/// docs/math.md section 8): each step also releases the count of contributions
/// whose norm was at most C, noised, and moves C towards the `quantile` of the
/// norms: C <- C exp(-lr (b - quantile)), b the noised fraction. The count and
/// the clipped sum are one Gaussian mechanism at the run's noise multiplier
/// sigma: the gradient's own noise multiplier is (sigma^-2 - (2 count_noise)^-2)^(-1/2),
/// a little above sigma, and the accountant sees sigma as without adaptation.
/// With a "+layers:adaptive" strategy each of the G layers has its own C_g, count
/// and step (the same quantile, noise and lr), the clip norm is C = sqrt(sum C_g^2),
/// and the gradient's noise multiplier (sigma^-2 - G (2 count_noise)^-2)^(-1/2).
struct AdaptiveClipping {
  double quantile = 0.5;     // gamma in [0, 1]: the fraction of contributions meant to stay unclipped
  double count_noise = 0;    // sigma_b, noise std of a count, > sigma sqrt(G) / 2 (0: the expected contributions / 20)
  double lr = 0.2;           // eta >= 0: the geometric step
  double min_clip_norm = 1e-9, max_clip_norm = 1e6;  // C (per layer: each C_g) is kept in this range (fixed in advance)
  /// The noised sum is also divided by the step's C (post-processing: C is
  /// public), so the base optimizer sees a mean of contributions of norm at most
  /// 1 and a learning rate means at every C what it means at C = 1; false: the
  /// step's size follows C as with a fixed clip norm.
  bool normalise = true;
};

/// The counts adaptive clipping noises each step beside the gradient: none
/// without it, one, or one per layer (`layers`: clip_layers' count) for a
/// "+layers:adaptive" strategy. The optimizer and the plan (optim/run) both count
/// them: the grid's allowance and its draws cover these coordinates too.
template <class T>
std::size_t adaptive_counts(bool adaptive, const ClipStrategyT<T>& strategy, std::size_t layers) {
  return !adaptive ? 0 : strategy.adapts_layers() ? layers : 1;
}

/// The sampling rate q and the expected batch size L are not settings: they come
/// from the sampler that draws the batches (DPOptimizerT's constructor).
struct DPConfig {
  double clip_norm = 1.0;         // C > 0
  double noise_multiplier = 1.0;  // sigma >= 0; 0 only with allow_no_noise
  bool allow_no_noise = false;    // sigma = 0 was asked for explicitly: not private
  double sat_rho = 0.0;           // DP-SAT's step towards the previous noised gradient (0: off)
  /// Physical batches: a logical batch of more examples is clipped in chunks of at
  /// most this many (0: in one piece), which bounds memory; the clipped sums are
  /// added up, and noise, the update and the accounting happen once per logical
  /// batch. Only strategies whose contributions are per example (naive, vanilla,
  /// ghost) split; others are refused.
  std::size_t physical_batch = 0;
  /// A data-parallel run (docs/distributed.md): each rank passes step() its share
  /// of the logical batch; the clipped sums are reduce-scattered, each rank noises
  /// the coordinates it owns (each coordinate once), and all-gathered, so every
  /// rank applies the same noised sum. `noise_rng` should then be the same stream
  /// on every rank (share_generator) for results that do not depend on the number
  /// of ranks; privacy needs only that each is secure. Null: one process, no messages.
  std::shared_ptr<Communicator> communicator{};
  /// Adaptive quantile clipping (clip_norm is then the first step's C); unset: C fixed.
  std::optional<AdaptiveClipping> adaptive{};
  /// A parameter whose magnitude exceeds this after a step, or that is not
  /// finite, stops the run with a DivergedError (infinity: only non-finite ones).
  double max_parameter = 1e6;
};

/// The private optimizer's checks of what its noise multiplier settles, which need
/// no model and no data: with adaptive clipping (c.adaptive), its settings for
/// `strategy` (`layers`: clip_layers' count), the first C (per layer: C /
/// sqrt(layers)) within [min, max], and the count-noise rule 2 sigma_b > sqrt(G)
/// sigma, sigma_b defaulting to the expected contributions / 20; and sigma within
/// the noise grid's range for batches of about `expected_batch` examples. Returns
/// the count noise (its default filled in; 0 without adaptive clipping). Throws
/// std::invalid_argument naming the problem. DPOptimizerT's constructor calls it; a
/// search's plan calls it for every configuration at its calibrated sigma, before
/// K is drawn (optim/run/tune.hpp).
template <class T>
double check_noise_settings(const DPConfig& c, const ClipStrategyT<T>& strategy, double expected_batch,
                            std::size_t layers);

/// Thrown by DPOptimizerT::step when the update left a parameter that is not
/// finite or larger in magnitude than DPConfig::max_parameter: the run has
/// diverged (a learning rate far too large, say). The step was taken and
/// accounted before the check, so the accountant's epsilon covers it; nothing
/// computed from the diverged parameters should be shown.
class DivergedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What one DPOptimizerT::step did.
struct StepStats {
  std::size_t batch = 0;      // examples in this batch
  double loss = 0;            // mean per-sample loss over the batch
  std::size_t clipped = 0;    // contributions that were clipped
  double noise_std = 0;       // std of the noise added to the sum
  double clip_norm = 0;       // the C this step clipped to (less the grid's allowance)
  /// Adaptive clipping: the released, noised fraction of contributions whose norm
  /// was at most C (covered by epsilon); per layer, the mean of the layers'; NaN otherwise.
  double unclipped_fraction = std::nan("");
  /// "+layers:adaptive": each layer's released fraction, in clip_layers() order.
  std::vector<double> layer_unclipped_fractions;
  double communication_seconds = 0;  // data-parallel runs: time spent summing and sending the gradient
  double wait_seconds = 0;           // data-parallel runs: time spent waiting for the slowest rank first
};

/// One parameter's gradient energy, averaged over the steps since the last reset.
struct GradientEnergy {
  std::string name;      // the parameter's (by layer: the layer's)
  std::size_t size = 0;  // coordinates
  double noised = 0;     // mean of ||g||^2, g as the base optimizer got it (noise included)
  double noise = 0;      // the noise's expected share of it: size (sigma C / normaliser)^2
  /// Signal over noise per coordinate: (noised - noise) / noise, an unbiased
  /// estimate of ||mean clipped gradient||^2 over the noise's energy (may come
  /// out below 0 when the signal is small); NaN without noise.
  double snr() const { return noise > 0 ? (noised - noise) / noise : std::nan(""); }
};

/// The private optimizer (see the top of this file): each step() clips the
/// batch's contributions with the strategy, noises their sum once when
/// adds_noise(), divides it by the strategy's normaliser of the expected batch
/// size (strategy none: by the batch's size), has the base optimizer update the
/// model's parameters, and records the noised step with the accountant, if any.
template <class T>
class DPOptimizerT {
 public:
  /// References must outlive the optimizer. `sampler` is the one that draws the
  /// batches passed to step(): the accountant sees its sampling rate, the noised
  /// sum is divided by its expected batch size, and `accountant` (which may be
  /// null: no accounting) must be one that analyses its sampling. `noise_rng`
  /// draws the noise and `aux_rng` the strategy's directions: each must be the
  /// secure generator, or a ReproducibleRng (then the run is NOT private, see
  /// is_private()). Everything is checked here, before any step.
  /// Throws std::invalid_argument on a setting, generator, sampler or accountant
  /// it refuses.
  DPOptimizerT(ModelT<T>& model, OptimizerT<T>& base, ClipStrategyT<T>& strategy, DPConfig config,
               const Sampler& sampler, Rng& noise_rng, Rng& aux_rng, privacy::Accountant* accountant);
  /// One step; throws DivergedError after the step (and its accounting) when
  /// the parameters have diverged (DPConfig::max_parameter).
  StepStats step(const BatchT<T>& batch);
  /// The noise multiplier the accountant sees (privacy::accounted_sensitivity): add/remove
  /// accountants sigma / sensitivity (microbatch: sigma / 2); replace-one accountants
  /// (wor, shuffle), whose 2C is built in, sigma for vanilla and microbatch alike.
  double accounted_noise_multiplier() const;
  /// Variance per coordinate of the noise in the gradient handed to the base
  /// optimizer: (sigma C / normaliser)^2; 0 when not private.
  double noise_variance() const;
  /// Noise is added to clipped per-sample contributions (the mechanism the
  /// accountant analyses; its steps are recorded).
  bool adds_noise() const;
  /// adds_noise() with noise and directions that nobody can recompute: false
  /// with a ReproducibleRng, whose runs say kNotPrivateReproducible.
  bool is_private() const;
  /// The noise or the direction generator is a ReproducibleRng.
  bool noise_reproducible() const;
  /// The sampler's sampling rate q and expected batch size L.
  double sampling_rate() const;
  double expected_batch_size() const;
  /// The norm the contributions are clipped to: C less the noise grid's rounding
  /// allowance grid (sqrt(P) + 1) (32 times that for jl:K) when noise is added
  /// (docs/noise.md), else C.
  double grid_clip_norm() const { return grid_clip_norm_; }
  /// The clip norm C of the next step: DPConfig::clip_norm, or where adaptive
  /// clipping has moved it (per layer: sqrt(sum C_g^2)).
  double clip_norm() const;
  /// "+layers:adaptive": each layer's name and C_g for the next step, in
  /// clip_layers() order; empty otherwise.
  std::vector<std::pair<std::string, double>> layer_clip_norms() const;
  /// The noise multiplier of the clipped sum's own noise (std / C): the run's
  /// sigma, or with adaptive clipping (sigma^-2 - G (2 sigma_b)^-2)^(-1/2), G the counts.
  double gradient_noise_multiplier() const { return gradient_sigma_; }
  /// Adaptive clipping's state: (1) C, or per layer (G) the C_g. A checkpoint
  /// saves and restores it in place; clip_state_restored() then checks it and applies it.
  ArrayT<T>& clip_state() { return clip_state_; }
  /// Checks a restored clip_state() (finite, within the configured range) and
  /// sets the next step's clipping from it; throws std::invalid_argument otherwise.
  void clip_state_restored();
  /// The settings given to the constructor.
  const DPConfig& config() const { return config_; }
  /// DP-SAT's direction, per parameter: the last step's noised gradient as the
  /// base optimizer got it (zeros before the first step, empty when sat_rho is
  /// 0). A checkpoint saves and restores it; its arrays keep their addresses.
  std::vector<ArrayT<T>>& sat_direction() { return sat_direction_; }
  /// Per parameter, how much of the noised gradient is signal, averaged over
  /// the steps since the last reset (or construction). Computed from the
  /// released gradients only: no privacy cost. Guides per-layer learning
  /// rates (OptimizerT::set_lr_scale): layers with a high ratio can move faster.
  std::vector<GradientEnergy> gradient_energy() const;
  /// The same per layer (a parameter's name up to its last '.'), in the layers' order.
  std::vector<GradientEnergy> gradient_energy_by_layer() const;
  /// Starts the averages of gradient_energy() afresh.
  void reset_gradient_energy();

 private:
  ClipResult<T> clipped_sum(const BatchT<T>& batch, Rng& aux);
  /// Data-parallel runs: every rank's sums and counts added up, each coordinate
  /// noised once by the rank that owns it, and gathered back to every rank
  /// (docs/distributed.md); sets the step's wait and communication times.
  void combine(ClipResult<T>& r, StepStats& st, NoiseAhead* noise);
  /// The step's grid noise (docs/noise.md) on the coordinates this process noises,
  /// its generators split off the noise generator now and its draws made while the
  /// step computes its sums ("Drawn ahead"); none without noise.
  std::unique_ptr<NoiseAhead> draw_noise_ahead();
  /// The sizes of the noise blocks of what a step releases: the parameters' sums, then
  /// adaptive clipping's counts (noise_block_sizes).
  std::vector<std::size_t> released_block_sizes() const;
  /// The next step's clipping at clip norm C: the grid's allowance taken off C
  /// and, with adaptive clipping, off the counts' share (docs/noise.md).
  void set_clip_geometry(double C);
  /// Adaptive clipping: the clip state (C, or the C_g) applied to the next
  /// step: its geometry and, per layer, the strategy's shares C_g / C.
  void apply_clip_state();
  /// Throws DivergedError naming the first parameter that is not finite or above max_parameter.
  void check_parameters() const;

  ModelT<T>& model_;
  OptimizerT<T>& base_;
  ClipStrategyT<T>& strategy_;
  DPConfig config_;
  const Sampler& sampler_;
  double grid_clip_norm_ = 0;
  double gradient_sigma_ = 0;  // see gradient_noise_multiplier()
  double count_scale_ = 0;     // adaptive: a count coordinate's value per unit of count
  std::size_t counts_ = 0;     // adaptive: the noised counts a step, 1 or (per layer) G; else 0
  double expected_contributions_ = 0;
  ArrayT<T> clip_state_;       // adaptive: (counts_) C or the C_g
  Rng& noise_rng_;
  Rng& aux_rng_;
  privacy::Accountant* accountant_;
  std::vector<ArrayT<T>> sat_direction_;
  std::vector<double> energy_;  // sum over steps of ||g||^2, per parameter
  long energy_steps_ = 0;
  // dropout's masks keyed per record when step() runs outside a PrivateTrainer, which keys them itself
  // (layers/dropout.hpp): a key of this optimizer's, secure with a secure noise generator
  HashKey dropout_key_{};
  std::uint64_t dropout_steps_ = 0;
};

/// DPOptimizerT over float parameters.
using DPOptimizer = DPOptimizerT<float>;

}  // namespace dpgrad
