// A check for users' models: every exact route to per-sample gradient norms
// (the vanilla and ghost strategies, the engine's rules taken directly) against
// the per-example loop, on one batch. A route either agrees or refuses; the
// report says which, and by how much (docs/per-sample.md). Also the structural
// self-check a private run makes before its first step, and its neighbour test:
// does one record move the clipped sum by more than the strategy's sensitivity,
// or move another record's contribution? Both read synthetic records only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "layers/module.hpp"

namespace dpgrad {

/// One route compared with the per-example loop.
struct PerSampleRoute {
  std::string name;          // "vanilla", "ghost", "rules (ghost norms)", "rules (materialised norms)"
  bool refused = false;      // threw std::invalid_argument: `error` says why
  std::string error;         // the refusal's message (empty unless refused)
  double norm_error = 0;     // max over samples of |n_i - naive_i| / naive_i
  double sum_error = 0;      // ||clipped sum - naive's|| / ||naive's||, over all parameters
  bool has_sum = false;      // the strategies form a clipped sum; the rules taken directly only norms
};

/// What check_per_sample found: the per-example loop's norms, and every exact
/// route compared with the loop.
struct PerSampleCheck {
  std::size_t batch = 0;             // examples
  double clip_norm = 0;              // the C both clipped sums used
  std::vector<double> naive_norms;   // (batch) the per-example loop's ||g_i||
  std::vector<PerSampleRoute> routes;  // in the order of PerSampleRoute::name's list

  /// Every route ran and agrees within `tolerance` (relative).
  bool agrees(double tolerance) const;
  /// Every route either refused or agrees within `tolerance`: none is silently wrong.
  bool never_silently_wrong(double tolerance) const;
  /// The largest error of the routes that ran (0 if none ran).
  double max_error() const;
  /// One line per route, for test output.
  std::string str() const;
};

/// Runs `model` on `batch` (at least 2 examples) by the per-example loop and by
/// every exact route, in evaluation mode (the model's mode is restored). The
/// clipped sums use C = the median of the loop's norms, so that some samples
/// are clipped and some are not. Throws std::invalid_argument for batches of
/// fewer than 2 examples; a route that refuses the model is reported, not thrown.
template <class T>
PerSampleCheck check_per_sample(ModelT<T>& model, const BatchT<T>& batch);

template <class T>
class ClipStrategyT;
class Rng;

/// Each example's gradient norm ||g_i|| over every parameter of `model` on
/// `batch`, by `strategy` (docs/per-sample.md, "Per-sample norms of your own"):
/// "naive", "vanilla" or "ghost" (exact; the last two refuse a model their rules
/// do not cover, naming the op), or "jl:K" (estimates, from directions of a fixed
/// seed). (B). No clipping, no noise and nothing accounted: for inspecting a
/// model, never for releasing anything about private data. The parameters'
/// gradients are left zero.
template <class T>
ArrayT<T> per_sample_gradient_norms(ModelT<T>& model, const BatchT<T>& batch, const std::string& strategy = "ghost");

/// Each example's gradient itself, per parameter in model.parameters() order,
/// each (B, ...the parameter's shape), by the per-example loop (exact for any
/// model; B times the parameters' memory). As per_sample_gradient_norms:
/// nothing is clipped, noised or accounted.
template <class T>
std::vector<ArrayT<T>> per_sample_gradients(ModelT<T>& model, const BatchT<T>& batch);

/// `examples` records laid out like those of `like` (the same fields, the same
/// row shapes, the same views) whose values come from `rng` alone: inputs and
/// targets standard normal, token ids 0 or 1 up to a random length, labels in
/// [0, classes), ids 0, 1, ... Only the layout of `like` is read, never a value,
/// so the records are data-independent even when `like` is private.
template <class T>
BatchT<T> synthetic_records(const BatchT<T>& like, std::size_t examples, std::size_t classes, Rng& rng);

/// What structural_self_check ran: its parts in words (empty when nothing was
/// needed), for the run's header. A part that did not run is never listed.
struct SelfCheckReport {
  std::string strategy;             // the strategy's name
  std::vector<std::string> ran;     // e.g. "per-record gradients and norms at batch sizes 3 and 5, two orders"
  /// One line: "structural self-check of S (parts): passed" or "... not run (why)".
  std::string str() const;
};

/// How far adding one record moved a clipped sum (neighbour_test), in units of C.
struct NeighbourMove {
  double moved = 0;   // max over the insertions of ||sum(S + x) - sum(S)|| / C
  /// Strategies whose contributions are each an example's own: max of
  /// ||sum(S + x) - sum(S) - sum({x})|| / C, what x did to the others (0 elsewhere).
  double excess = 0;
  std::size_t position = 0;  // the insertion (an index into `records`) where the worst was seen
};

/// The neighbour test: for each position e of `positions` in `records` (n + 1
/// examples), S = the records without e, S + x = all of them (x = record e,
/// first, in the middle or last), the strategy's clipped sums at `clip_norm`
/// compared, every random draw of a call (JL directions, keys) from a fresh
/// FastRng(draws) so that both sums see the same draws. Valid runs keep `moved` at
/// most strategy.sensitivity() (per-example strategies with exact norms) and
/// `excess` at rounding level; whatever channel lets one record move another (the
/// batch size, an order, a statistic, a draw) shows here without being named.
template <class T>
NeighbourMove neighbour_test(ModelT<T>& model, ClipStrategyT<T>& strategy, const BatchT<T>& records,
                             const std::vector<std::size_t>& positions, double clip_norm, std::uint64_t draws);

/// The structural self-check (docs/per-sample.md): synthetic records
/// (synthetic_records: the layout of `like`, never its values), each passed
/// through `transform` on its own when there is one, in evaluation mode.
/// - Strategies that batch examples (not runs_examples_alone()): each record's
///   gradient itself (the batch's sum less the sum without it, C unbounded), its
///   norm and per-layer norms (exact strategies) or its projections (jl:K),
///   against the per-example loop, at batch sizes 3 and 5 in two orders.
/// - Every private strategy: the neighbour test at four scales of the records
///   (1e-3, 1, 1e3 and heavy-tailed), C the median norm so that some clip.
/// Which parts run follows from the strategy's declared capabilities, never its
/// name. Throws std::invalid_argument naming the strategy, the part, the record
/// and the two values; returns what ran.
template <class T>
SelfCheckReport structural_self_check(ModelT<T>& model, ClipStrategyT<T>& strategy, const BatchT<T>& like,
                                      const std::function<BatchT<T>(const BatchT<T>&, long)>& transform);

}  // namespace dpgrad
