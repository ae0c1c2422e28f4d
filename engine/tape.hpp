// The tape: op applications in construction order. backward() is one reverse
// loop over it (no graph sort), accumulating cotangents into nodes. The tape
// also keeps what the per-sample rules need from each use of a parameter.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/op.hpp"

namespace dpgrad {

/// How a parametric op used a parameter W (docs/math.md section 7). B is the
/// leading (batch) axis of every recorded array; the middle axes are "time".
enum class UseKind {
  matmul,  // y = a W:            a (B, ..., d), delta (B, ..., p), W (d, p)
  bias,    // y = z + b:          delta (B, ..., p), b (p)
  gather,  // y = W[ids]:         ids (B, ...), delta (B, ..., p), W (V, p)
  conv,    // y = conv(x, W):      x (B, H, W, C), delta (B, Ho, Wo, p), W (kh*kw*C, p); the
           //                      op builds G_i itself (sample_gradient), no patches are kept
  elementwise,  // y = x * w or y = x + w (or -): w broadcast over the samples' axis 0;
                //   G_i = sample i's dout (times x) summed over what w broadcasts over
};

/// One use of a parameter by a parametric op, noted on the tape when the op is
/// recorded (record_uses) and read by the per-sample rules (engine/per_sample.hpp).
/// Which fields are set depends on `kind`.
template <class T>
struct ParamUse {
  UseKind kind;  // how the op used the parameter: the rule that reads this use
  std::shared_ptr<Node<T>> input;             // matmul: the activations a (kept alive, not copied)
  std::shared_ptr<const std::vector<std::int32_t>> ids;  // gather: flattened ids, B * steps of them; -1 = padding
  std::shared_ptr<const ArrayT<T>> delta;     // dLoss/dy, filled by backward (shared by W and b)
  // conv: g (W's shape) += G_i, example i's gradient, from its images and their rows
  // of delta (an example of `batch` is B / batch consecutive images: its views)
  std::function<void(std::size_t i, std::size_t batch, T* g)> sample_gradient;
  /// Drops what the rules read (input, ids, cotangent, the per-sample function):
  /// for a parameter whose per-sample gradients were built from its uses already.
  void release() {
    input.reset();
    ids.reset();
    delta.reset();
    sample_gradient = nullptr;
    row_index.reset();
  }
  const char* op = "";  // the op's name, for errors
  Samples samples;      // where its input's samples were (the rules need them on axis 0)
  // elementwise: for each element of one output row (every axis but 0), the
  // parameter's element it reads; null when the parameter varies along axis 0
  std::shared_ptr<const std::vector<std::uint32_t>> row_index;
  // elementwise: q when row_index[e] is e mod q for every e (q the parameter's size:
  // a gain over the last axis, a table over the last two), else 0
  std::size_t row_period = 0;
  bool negated = false;  // elementwise: y = x - w
};

/// Every use of one parameter in one forward pass: one per-sample gradient.
template <class T>
struct ParamUses {
  /// The parameter, and its uses in the order the tape noted them.
  std::shared_ptr<Node<T>> param;
  std::vector<ParamUse<T>*> uses;
};

/// The ops applied while this tape was active (RecordScope) to an input that
/// requires grad, in order, with their inputs and outputs: reverse mode
/// (backward) and forward mode after the fact (push_tangents) run over them.
/// Not copyable. Tape is the float one.
template <class T>
class TapeT {
 public:
  TapeT() = default;
  TapeT(const TapeT&) = delete;
  TapeT& operator=(const TapeT&) = delete;

  /// Appends `op` applied to `inputs` with result `output`, then calls the op's
  /// on_record. apply() calls it for every op it records.
  void record(std::unique_ptr<Op<T>> op, std::vector<std::shared_ptr<Node<T>>> inputs,
              std::shared_ptr<Node<T>> output);

  /// Reverse mode from a one-element loss (seed 1).
  void backward(const TensorT<T>& loss);
  /// Reverse mode with an explicit cotangent for `out` (same shape as out).
  void backward(const TensorT<T>& out, const ArrayT<T>& seed);

  /// Forward mode over the recorded ops, after the fact: the tangent (k, ...)
  /// of `out` when the leaves in `seeds` carry the given tangents (k, ...leaf
  /// shape) and every other leaf carries none. Each op's jvp runs on the values
  /// the tape kept, so no primal is computed again, and each tangent is freed
  /// right after the last recorded op that reads it. Running this once per
  /// chunk of directions keeps only one chunk's tangents in memory.
  ArrayT<T> push_tangents(const std::vector<std::pair<const Node<T>*, const ArrayT<T>*>>& seeds,
                          const TensorT<T>& out, std::size_t k) const;
  /// Elements of the values the ops recorded (their outputs), and of the
  /// largest one: what forward mode over this tape holds per direction.
  std::size_t recorded_elements() const;
  std::size_t largest_recorded() const;

  /// Drops every record (values are freed once no handle holds them).
  void clear();
  std::size_t size() const { return entries_.size(); }

  /// Keep intermediate gradients after backward (tests); by default they are
  /// freed as soon as they have been propagated.
  void retain_grads(bool on) { retain_grads_ = on; }

  /// Drop each record as soon as backward has run its vjp: the op, and the
  /// tape's hold on its output and on every input that is not a parameter, so
  /// that activations are freed while backward runs instead of after it. The
  /// tape then runs no second backward and pushes no tangents. Parameter uses
  /// keep what they hold (their inputs and cotangents). Off by default; the
  /// clipping strategies turn it on (one backward per tape).
  void release_during_backward(bool on) { release_ = on; }

  /// Per-sample recording: parametric ops note their uses of parameters.
  /// With param_grads = false they skip the summed parameter gradient too
  /// (strategies that build it from the uses themselves).
  void record_uses(bool on, bool param_grads = true) {
    record_uses_ = on;
    param_grads_ = param_grads;
  }
  bool records_uses() const { return record_uses_; }
  bool param_grads() const { return param_grads_; }
  ParamUse<T>* add_use(const std::shared_ptr<Node<T>>& param, UseKind kind);
  /// Grouped by parameter, in order of first use.
  const std::vector<ParamUses<T>>& uses() const { return grouped_; }
  /// Called during backward for each parameter's uses as soon as they are all
  /// complete (the earliest op that reads the parameter has run its vjp, so
  /// every use holds its cotangent): a strategy can build what it needs from
  /// them then and release them, instead of holding every use until the end.
  void on_uses_complete(std::function<void(ParamUses<T>&)> f) { uses_complete_ = std::move(f); }
  /// The names of the recorded ops that read `node` directly, each once, in tape order (for messages).
  std::vector<std::string> ops_reading(const Node<T>* node) const;

 private:
  struct Entry {
    std::unique_ptr<Op<T>> op;  // null once released
    std::vector<std::shared_ptr<Node<T>>> inputs;  // released: parameters only
    std::shared_ptr<Node<T>> output;
    const char* name = "";
  };
  void release(Entry& e);
  void check_not_released(const char* what) const;
  std::vector<Entry> entries_;
  bool retain_grads_ = false;
  bool release_ = false;
  bool released_ = false;  // some record was dropped
  bool record_uses_ = false;
  bool param_grads_ = true;
  std::deque<ParamUse<T>> use_store_;  // stable addresses
  std::vector<ParamUses<T>> grouped_;
  std::vector<std::size_t> group_first_entry_;  // the record that noted each group's first use
  std::function<void(ParamUses<T>&)> uses_complete_;
  std::unordered_map<Node<T>*, std::size_t> group_of_;
};

/// The tape ops record on in this thread (nullptr: none).
template <class T>
TapeT<T>* active_tape();

/// Makes `tape` the active tape of this thread for the scope's lifetime.
template <class T>
class RecordScope {
 public:
  /// Makes `tape` active; the destructor restores the tape that was active before.
  explicit RecordScope(TapeT<T>& tape);
  ~RecordScope();
  RecordScope(const RecordScope&) = delete;
  RecordScope& operator=(const RecordScope&) = delete;

 private:
  TapeT<T>* previous_;
};

/// Suspends recording (inference, evaluation) for the scope's lifetime.
template <class T>
class NoRecordScope {
 public:
  /// No tape is active; the destructor restores the tape that was active before.
  NoRecordScope();
  ~NoRecordScope();

 private:
  TapeT<T>* previous_;
};

/// The tape of float32 training.
using Tape = TapeT<float>;

/// Compiled once, in engine/tape.cpp, for float and double.
extern template class TapeT<float>;
extern template class TapeT<double>;
extern template class RecordScope<float>;
extern template class RecordScope<double>;
extern template class NoRecordScope<float>;
extern template class NoRecordScope<double>;

}  // namespace dpgrad
