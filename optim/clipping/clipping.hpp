// Clipping strategies: each computes sum_i c_i g_i with c_i = min(1, C / ||g_i||)
// for a batch, by a different route to the per-sample norms (docs/math.md sections 1, 2, 7):
// naive (per-example loop), vanilla (materialised), ghost (norms without
// materialising, book-keeping sum; only per-sample gradients much smaller than
// their activations, a convolution kernel's, are kept), jl:K (K forward-mode projections),
// microbatch:M (clipped microbatch means), none (plain sum, not private).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "layers/module.hpp"
#include "optim/clipping/clip_spec.hpp"

namespace dpgrad {

class Rng;

/// What a clipping strategy computed for one batch (strategy none: the plain
/// sum, no norms).
template <class T>
struct ClipResult {
  std::vector<ArrayT<T>> sum;  // per parameter, model.parameters() order: sum of clipped contributions
  ArrayT<T> norms;             // (contributions) the norms that were clipped (exact or JL estimates); +inf: dropped
  double loss_sum = 0;         // sum of per-sample losses (a dropped contribution's not included)
  std::size_t clipped = 0;     // contributions with c < 1, the dropped included
  // A contribution whose loss or gradient is not finite is dropped by every private
  // strategy: it adds nothing and counts as clipped (docs/math.md section 1).
  /// Naive, vanilla and ghost (flat: one layer): (layers, contributions), the
  /// norm of each layer's part of each contribution; empty for the others.
  ArrayT<T> layer_norms;
};

/// One route to a batch's sum of clipped contributions (the list at the top of
/// this file); make_clip_strategy or the functions of namespace clipping make one.
template <class T>
class ClipStrategyT {
 public:
  virtual ~ClipStrategyT() = default;
  /// The strategy's text, as parse_clip_spec reads it: "ghost", "jl:K", "microbatch:M", ...
  virtual std::string name() const = 0;
  /// Sum of clipped contributions for `batch` (which may be empty). `rng` draws
  /// any randomness the strategy needs (JL directions).
  virtual ClipResult<T> clipped_sum(ModelT<T>& model, const BatchT<T>& batch, double clip_norm, Rng& rng) = 0;
  /// Sensitivity of the clipped sum in units of C under add/remove-one.
  virtual double sensitivity() const { return 1.0; }
  /// What the noised sum is divided by, given the expected batch size L.
  virtual double normaliser(double expected_batch) const { return expected_batch; }
  /// False only for `none`.
  virtual bool is_private() const { return true; }
  /// JL dimension K for the accountant (0: exact norms).
  virtual int jl_dim() const { return 0; }
  /// Whether a batch may be clipped in chunks whose sums add up to the batch's:
  /// true when each contribution is one example's own (not jl:K, whose directions
  /// are shared by the batch, nor microbatch:M, whose groups span it).
  virtual bool splits_into_chunks() const { return true; }
  /// Whether ranks of a data-parallel run may each clip their share of a batch
  /// (docs/distributed.md): true unless contributions group examples (microbatch:M,
  /// whose groups would span ranks). jl:K shards, its directions drawn alike everywhere.
  virtual bool shards_across_processes() const { return true; }
  /// Whether every example's gradient is computed on its own, never in a batch
  /// with another (naive, none): the structural self-check then has no batched
  /// route to compare with the per-example loop and runs only its neighbour test.
  /// False by default, so that a new strategy is checked in full.
  virtual bool runs_examples_alone() const { return false; }
  /// Whether each contribution to the clipped sum is one example's own, given
  /// the step's draws (JL directions, keys): the sum of a batch is then the sum
  /// of its examples' sums alone. False where contributions group examples
  /// (microbatch:M); the neighbour test then bounds the move by sensitivity().
  virtual bool per_example_contributions() const { return true; }
  /// Per-layer clipping whose layers' shares of C the private optimizer moves
  /// ("+layers:adaptive"): true there only.
  virtual bool adapts_layers() const { return false; }
  /// The layers' shares w_g of C for the next clipped sums, in clip_layers()
  /// order, their squares summing to 1 (adapts_layers() strategies only; until
  /// set, the layers share C equally). Throws std::logic_error elsewhere.
  virtual void set_layer_shares(std::vector<double> shares) {
    (void)shares;
    throw std::logic_error(name() + " has no layer shares to set");
  }
};

/// The strategy `spec` describes; `expected_batch` fixes the number of
/// microbatches of microbatch:M. Throws std::invalid_argument on a bad spec.
template <class T>
std::unique_ptr<ClipStrategyT<T>> make_clip_strategy(const ClipSpec& spec, double expected_batch = 0);
/// The same from its text: "none", "naive", "vanilla", "ghost", "jl:K", "jl:K/C"
/// (C directions per pass along the tape; jl:K picks C from the tape's size),
/// "microbatch:M" (parse_clip_spec; throws on others).
template <class T>
std::unique_ptr<ClipStrategyT<T>> make_clip_strategy(const std::string& spec, double expected_batch = 0);

/// Typed clipping strategies.
namespace clipping {
/// The naive, vanilla and ghost strategies (the list at the top of this file).
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> naive();
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> vanilla();
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> ghost();
/// K random projections per example (DP-SGD-JL); `chunk` directions per pass (0: automatic).
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> jl(int k, int chunk = 0);
/// Microbatches of M examples each (TF Privacy's microbatches): ceil(expected_batch / M)
/// microbatches a step, each clipped as one contribution (sensitivity 2C).
template <class T = float>
std::shared_ptr<ClipStrategyT<T>> microbatch(int m, double expected_batch);
}  // namespace clipping

template <class T>
class TapeT;
template <class T>
struct ParamUses;

/// Runs `model` on `batch` recording every parameter use on `tape` (a fresh one),
/// checks that each loss is one example's, and runs the backward pass of the
/// summed losses, which fills the uses' output gradients and no parameter
/// gradient; refuses a model whose parameters the per-sample rules do not cover.
/// Returns the sum of the finite losses. `ps`: model.parameters().
template <class T>
double record_uses(TapeT<T>& tape, ModelT<T>& model, const BatchT<T>& batch, const std::vector<TensorT<T>>& ps);

/// The layer of a parameter called `parameter`, as per-layer clipping and the
/// per-layer statistics group them: its name up to the last '.'.
inline std::string clip_layer_name(const std::string& parameter) { return parameter.substr(0, parameter.rfind('.')); }

/// Per-layer clipping's layers: clip_layer_name of each parameter, each once, in
/// order of first appearance.
template <class T>
std::vector<std::string> clip_layers(const std::vector<TensorT<T>>& ps);

/// Per parameter of `ps`, in order, its grouped uses on `tape` (null: unused).
template <class T>
std::vector<const ParamUses<T>*> groups_by_param(const TapeT<T>& tape, const std::vector<TensorT<T>>& ps);

/// Per-example losses (B = batch.examples()) of the model on a batch: the model's
/// loss (ModelT::set_loss; softmax cross-entropy by default), averaged over each
/// example's views.
template <class T>
TensorT<T> per_sample_losses(ModelT<T>& model, const BatchT<T>& batch);

/// The projections P_ji = <g_i, v_j> of each example's gradient g_i (over all
/// parameters) on K directions v_j, as jl:K computes them (one forward, K jvps):
/// (K, B). dirs: per parameter of model.parameters(), (K, ...its shape). Throws
/// std::invalid_argument when the losses are not one per example, each of its
/// own sample only (docs/per-sample.md).
template <class T>
ArrayT<T> jl_projections(ModelT<T>& model, const BatchT<T>& batch, const std::vector<ArrayT<T>>& dirs);

/// The clip factor for a contribution of `norm` (its coordinates' squares summed
/// in double, as squared_norm does): min(1, C (1 - kappa) / norm) rounded down
/// to T, kappa = 2 u_T + (P + 8) 2^-53 with P = `coordinates` and u_T the unit
/// roundoff of T. Then the contribution c g, computed in T, has norm <= C
/// exactly, for P < 2^50 (docs/noise.md section 3). Throws on a non-finite norm
/// (the strategies drop such a contribution before they clip).
template <class T>
T clip_factor(double norm, double clip_norm, std::size_t coordinates);

/// sum_j g_j^2 in double. g: (n)
template <class T>
double squared_norm(const T* g, std::size_t n);

/// ClipStrategyT over float parameters.
using ClipStrategy = ClipStrategyT<float>;

}  // namespace dpgrad
