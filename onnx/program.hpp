// What an ONNX graph compiles to (internal to onnx/): instructions over value
// slots, shapes symbolic in the batch size B, everything that does not depend on
// the data folded at load time. No protobuf here (onnx/read.cpp has it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/array.hpp"
#include "engine/samples.hpp"
#include "onnx/onnx.hpp"

namespace onnx {
class ModelProto;
}

namespace dpgrad::onnx::detail {

/// c + b B: a dimension, or a static integer, as an affine function of the
/// batch size B.
struct Dim {
  std::int64_t c = 0, b = 0;
  bool fixed() const { return b == 0; }
  std::int64_t at(std::size_t batch) const { return c + b * std::int64_t(batch); }
  bool operator==(const Dim&) const = default;
};
using SymShape = std::vector<Dim>;
/// "(B, 3, 4)", "(2B, 1, 6)", ...
std::string sym_str(const SymShape& s);
Shape concrete(const SymShape& s, std::size_t batch);

enum class Code : std::uint16_t {
  // producers
  input_features,  // out: the batch's inputs (B, ...)
  input_tokens,    // out: the batch's tokens as ints (B, L)
  constant,        // out: data (float)
  int_constant,    // out: ints (dims: values as c + b B, mixed by the batch size when one has b != 0; shape in shape0)
  fill,            // out: float constant of symbolic shape0, value reals[0]
  int_fill,        // out: ints of symbolic shape0, value ints[0]
  range,           // out: ints of shape0 (n), ints[0] + k ints[1] for k < n: the batch size as values
  param,           // out: parameter `param`
  // elementwise
  unary,           // in: x; ints[0] = Unary kind; reals[0] = its constant
  binary,          // in: a, b; ints[0] = Binary kind
  where,           // in: cond (ints), x, y
  dropout,         // in: x; reals[0] = ratio
  // products
  linear,          // in: x, w, [b]
  matmul,          // in: a, b (runtime tensors, numpy-broadcast leading axes)
  conv,            // in: x (NCHW), w (kh kw C, Cout), [b]; ints: kh kw sh sw top bottom left right
  max_pool,        // in: x; ints: kh kw sh sw top bottom left right
  avg_pool,        // in: x; ints: kh kw sh sw top bottom left right count_include_pad
  global_avg_pool, // in: x (N, C, spatial...)
  batch_norm,      // in: x, scale, bias; data: mean (C), reals[0] = epsilon, data2: variance (C)
  layer_norm,      // in: x, [scale], [bias]; ints[0] = axis; reals[0] = epsilon
  // along axes
  reduce,          // in: x; axes; ints[0] = 1 for mean; ints[1] = keepdims; ints[2] = 1: over rows B alone made
  softmax,         // in: x; ints[0] = axis; ints[1] = 1 for log-softmax
  // shape
  reshape,         // in: x; shape0 = target
  transpose,       // in: x; axes = perm
  slice,           // in: x; axes, ints = begin, end per axis (clamped, >= 0)
  concat,          // in: xs...; ints[0] = axis
  pad,             // in: x; ints = before..., after...; reals[0] = value
  expand,          // in: x; shape0 = the broadcast shape
  take,            // in: x; ints[0] = axis; ints[1..] = indices; ints "drop axis" when reals[0] = 1
  // integers
  int_unary,       // in: a; ints[0]: 0 not, 1 neg, 2 to bool
  int_binary,      // in: a, b; ints[0]: 0 add, 1 sub, 2 mul, 3 div, 4 equal, 5 and, 6 or
  float_equal,     // in: a, b (tensors) -> ints
  to_float,        // in: ints -> a constant float tensor with the ints' samples
  to_ints,         // in: float tensor -> ints (no gradient)
  // gathers and recurrences
  embedding,       // in: table, ids (ints)
  lstm,            // in: x, w_ih, w_hh, b_ih, b_hh per direction (ints[0] directions), h0, c0; out: Y, Y_h, Y_c
  gru,             // in: x, w_ih, w_hh, b_ih, b_hh per direction, h0; out: Y, Y_h
};

/// Unary kinds (Code::unary).
enum class UnaryKind : std::int64_t { identity, relu, leaky_relu, tanh, sigmoid, erf, sqrt, neg, exp, log, abs,
                                      pow, gelu, scale, shift };
/// Binary kinds (Code::binary).
enum class BinaryKind : std::int64_t { add, sub, mul, div };

struct Instr {
  Code code;
  std::vector<int> in, out;          // value slots; -1: absent
  std::vector<std::int64_t> ints;
  std::vector<double> reals;
  std::vector<std::size_t> axes;
  SymShape shape0;
  std::vector<Dim> dims;             // int_constant: values
  std::shared_ptr<const ArrayT<double>> data, data2;
  int param = -1;
  std::string node;                  // "node 'NAME' (OP)", for errors
};

/// A slot's compile-time facts.
struct Slot {
  bool ints = false;  // an integer (or boolean) array, not a float tensor
  SymShape shape;
  std::string name;   // the ONNX value
  bool data = false;  // computed from the batch's input (else from constants, parameters and the batch size)
};

/// One parameter: the elements of an initializer, rearranged to the layout the
/// engine op it feeds wants (an RNN direction's gates in the engine's order, a
/// kernel as (kh kw C, Cout), a Gemm weight transposed).
struct ParamSpec {
  std::string name;       // recovered module name, or the initializer's
  std::string onnx_name;  // the initializer
  int initializer = -1;   // index in Program::initializers
  Shape shape;            // engine layout
  std::vector<std::size_t> source;  // for each element, its flat index in the initializer; empty: the same order
  bool frozen = false;
};

/// An initializer as the file holds it (kept for export).
struct Initializer {
  std::string name;
  int elem_type = 0;      // ONNX TensorProto data type
  Shape dims;
  std::shared_ptr<const ArrayT<double>> values;  // float and double initializers (others are not parameters)
};

struct Program {
  std::string path;
  InputSpec input;
  std::vector<Slot> slots;
  std::vector<Instr> instrs;
  int input_slot = -1, output_slot = -1;
  std::vector<ParamSpec> params;
  std::vector<Initializer> initializers;
  std::vector<ParameterInfo> info;  // params, as the model reports them
  /// Uses of trainable parameters no exact per-sample rule covers, each
  /// "node 'NAME' (OP): why": vanilla and ghost refuse the model with them.
  std::vector<std::string> inexact;
  std::shared_ptr<const ::onnx::ModelProto> proto;  // the file, with external data inlined (export writes it back)
};

/// The samples of a tensor of shape `s` at batch size `batch` that holds no
/// sample's data and is alike along its batch axis (a fill, a broadcast): each
/// row along that axis stands beside one sample; a shape the batch size enters
/// otherwise is mixed by the batch size at `node` (onnx/batch_size.cpp).
Samples filled_samples(const SymShape& s, std::size_t batch, const std::string& node);
/// `s`, mixed by the instruction of `node`, with the node named; `data` false
/// (no input holds the batch's data): mixed by the batch size.
Samples named_mixing(const Samples& s, const std::string& node, bool data);

/// Reads and checks the file, then compiles its graph (onnx/read.cpp, onnx/compile.cpp).
std::shared_ptr<const Program> read_program(const std::string& path, const LoadOptions& options);

/// Refuses a program whose forward pass needs more than max_bytes_per_example
/// for each example, or more than max_constant_bytes whatever the batch size,
/// with `float_bytes` per float (onnx/limits.cpp): the node that passes the limit named.
void check_memory(const Program& p, const LoadOptions& options, std::size_t float_bytes);

}  // namespace dpgrad::onnx::detail
