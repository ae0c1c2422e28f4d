// Bring your own model: an ONNX file (PyTorch's torch.onnx.export, and most
// tools) becomes a dpgrad model whose graph is engine ops on the tape, its
// initializers parameters (or constants, when frozen), trained privately like
// any built-in model and written back with the trained weights (docs/onnx.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "layers/module.hpp"

namespace dpgrad::onnx {

/// A model file dpgrad cannot read or will not run, with the node, op, tensor
/// or file named: always thrown before any training (and any privacy) starts.
class OnnxError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// How load() reads a model file.
struct LoadOptions {
  /// Initializers to keep as constants: no gradient, no clipping share, no
  /// noise. An ECMAScript regular expression searched in each parameter's
  /// name and in the name of the initializer it comes from ("conv" freezes
  /// conv1.weight and conv2.bias; "" freezes nothing).
  std::string freeze;
  /// Bounds on what a file may declare: its size with external data, and any
  /// one tensor's elements (at batch size 1 for tensors that grow with it).
  std::size_t max_file_bytes = std::size_t(1) << 31;
  std::size_t max_tensor_elements = std::size_t(1) << 28;
  /// Bounds on the memory a model may take, checked before it is built or run
  /// (docs/onnx.md, "Bad input"): the forward pass's tensors for each example
  /// (their part that grows with the batch), and the values computed at load
  /// time (folded constants) with the tensors of the forward pass that do not
  /// grow with the batch. The file's own tensors are bounded by max_file_bytes.
  std::size_t max_bytes_per_example = std::size_t(1) << 30;
  std::size_t max_constant_bytes = std::size_t(1) << 30;
  /// Seed of the dropout masks the model draws in training mode outside a private
  /// run (in one they are keyed per record: layers/dropout.hpp).
  std::uint64_t dropout_seed = 0;
};

/// What a loaded model reads: float features (B, ...) (images, sequences) or
/// token ids (B, L) (int64 in the file; batch.tokens in dpgrad).
struct InputSpec {
  std::string name;    // the graph input's name
  bool tokens = false;
  Shape sample_shape;  // the shape of one example, without the batch axis
};

/// One trainable or frozen tensor of an imported model.
struct ParameterInfo {
  std::string name;         // what dpgrad calls it (module names recovered where the graph allows)
  std::string onnx_name;    // the initializer it comes from (several parameters may share one: an RNN's directions)
  bool frozen = false;
};

template <class T>
class OnnxModelT;

/// Reads `path` (with its external data, if any, from the same folder),
/// checks it and compiles its graph into engine ops. Throws OnnxError.
template <class T>
std::unique_ptr<OnnxModelT<T>> load(const std::string& path, const LoadOptions& options = {});

/// Writes `model` to `path` (through engine/files.hpp's checked path), checked
/// by ONNX's checker: an imported model's graph, unchanged, with its current
/// weights as the initializers (inline, in each initializer's original type); a
/// built-in stack (mlp, logreg, cnn26k, cnn17m) as the ONNX ops that compute it,
/// reading examples of shape `example` (without the batch axis; required for
/// them). Throws OnnxError for a model save_problem refuses; std::runtime_error
/// on write failures.
template <class T>
void save(const ModelT<T>& model, const std::string& path, const Shape& example = {});

/// Why save() cannot write `model` ("" when it can), naming the model and the
/// layer or op without an ONNX equivalent: for the checks before any work.
template <class T>
std::string save_problem(const ModelT<T>& model);

namespace detail {
struct Program;
template <class T>
struct Runtime;
}  // namespace detail

/// A model read from an ONNX file: batch -> the graph's first output (logits
/// (B, classes)). Its parameters are the trainable initializers in file
/// order (an RNN's, one per direction and kind, in PyTorch's layout).
template <class T>
class OnnxModelT final : public ModelT<T> {
 public:
  /// A model running a compiled program (as load() makes it), with its parameters
  /// set from the program's initializers; `dropout_seed` seeds its dropout masks
  /// outside a private run.
  explicit OnnxModelT(std::shared_ptr<const detail::Program> program, std::uint64_t dropout_seed = 0);
  ~OnnxModelT() override;
  TensorT<T> forward(const BatchT<T>& batch) override;
  std::vector<TensorT<T>> parameters() const override;
  /// "onnx:FILE" (the file name without its folder).
  std::string name() const override;

  /// What the model reads: the graph input's name, features or tokens, one example's shape.
  const InputSpec& input() const;
  /// The size of the output's last axis when the output is (B, classes); 0 otherwise.
  std::size_t output_classes() const;
  /// Every parameter, trainable and frozen, in order (parameters() is the trainable part).
  const std::vector<ParameterInfo>& parameter_info() const;
  /// The current value of every parameter, trainable and frozen, in parameter_info() order.
  std::vector<ArrayT<T>> all_values() const;
  /// The ONNX node and op type of every use of a trainable parameter that no
  /// exact per-sample rule covers (vanilla and ghost refuse the model; naive
  /// and jl:K run). Empty for the exported models of the list.
  std::vector<std::string> inexact_uses() const;
  /// Refuses data the model cannot read (std::invalid_argument naming `data`):
  /// examples of `sample_shape` (one example's, without the batch axis) when the
  /// input takes another, or `classes` classes when the output has another number.
  void check_data(const Shape& sample_shape, std::size_t classes, const std::string& data) const;
  /// What a program shows of the model: "N parameters (P tensors), F frozen
  /// tensors", then a line for each of inexact_uses().
  std::vector<std::string> describe() const;
  /// Per-sample gradients in the file's layout: `internal`, one array per
  /// trainable parameter (B, ...parameter shape) in parameters() order, as
  /// the initializers they come from, (B, ...initializer shape), by name.
  std::vector<std::pair<std::string, ArrayT<T>>> to_initializer_layout(const std::vector<ArrayT<T>>& internal) const;
  const detail::Program& program() const { return *program_; }

 private:
  std::shared_ptr<const detail::Program> program_;
  std::unique_ptr<detail::Runtime<T>> runtime_;
};

/// The float model (OnnxModelT<double> is built too).
using OnnxModel = OnnxModelT<float>;

}  // namespace dpgrad::onnx
