// The compiler from a checked ONNX graph to a program (internal to onnx/):
// what it knows about each ONNX value at load time, and the handlers of the
// operators (onnx/compile.cpp: values, shapes and the shape-computing ops;
// onnx/compile_nn.cpp: products, convolutions, pooling, normalisation, RNNs).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "onnx/graph.hpp"
#include "onnx/program.hpp"

namespace dpgrad::onnx::detail {

/// What the compiler knows about one ONNX value.
struct Value {
  enum class Kind { absent, tensor, ints, static_ints, const_float, param } kind = Kind::absent;
  SymShape shape;
  int slot = -1;                                 // tensor, ints: the runtime slot
  std::vector<Dim> sints;                        // static_ints: the values, row-major
  std::shared_ptr<const ArrayT<double>> cf;      // const_float: the values
  int init = -1;                                 // param: the initializer
  bool transposed = false;                       // param: the value is the (2-D) initializer transposed
  int elem = kFloat;                             // ONNX element type
  bool is_float() const { return kind == Kind::tensor || kind == Kind::const_float || kind == Kind::param; }
  bool is_static() const { return kind == Kind::static_ints || kind == Kind::const_float; }
};

/// a + b, a - b, a b, a / b (exact or of fixed values), as affine functions of B;
/// throws naming `where` when the batch size would enter non-linearly.
Dim dim_add(Dim a, Dim b);
Dim dim_sub(Dim a, Dim b);
Dim dim_mul(Dim a, Dim b, const std::string& where);
Dim dim_div(Dim a, Dim b, const std::string& where);
std::string dim_str(Dim d);
/// Static integers with the batch size in them (onnx/batch_size.cpp).
bool batch_dependent(const Value& v);

class Compiler {
 public:
  Compiler(const Graph& g, const LoadOptions& o);
  std::shared_ptr<Program> run();

  // ---- used by the handlers ----
  const Graph& g;
  const LoadOptions& opt;
  std::shared_ptr<Program> prog;
  const Node* node = nullptr;  // the node being compiled

  [[noreturn]] void fail(const std::string& what) const;  // names the file and the node
  const Value& in(std::size_t i) const;                    // input i (absent when missing or "")
  bool has_in(std::size_t i) const;
  bool needed(std::size_t out) const;                      // output `out` is read downstream
  void define(std::size_t out, Value v);
  std::size_t uses(const std::string& value) const;        // how many live nodes read it

  // attributes (the checker has already checked their names and types against the schema)
  const Attribute* attr(const std::string& name) const;
  std::int64_t attr_i(const std::string& name, std::int64_t dflt) const;
  double attr_f(const std::string& name, double dflt) const;
  std::string attr_s(const std::string& name, const std::string& dflt) const;
  std::vector<std::int64_t> attr_ints(const std::string& name, std::vector<std::int64_t> dflt = {}) const;
  /// Refuses every attribute of the node not in `supported` (with its value).
  void only_attributes(std::initializer_list<const char*> supported) const;

  int new_slot(bool ints, SymShape shape, const std::string& name);
  Instr& emit(Code code, std::vector<int> ins, std::vector<int> outs);
  Value tensor_value(int slot) const;
  Value ints_value(int slot) const;

  /// The value as a runtime float tensor. A trainable parameter read by an op
  /// with no per-sample rule (exact_use = false) marks the node inexact.
  int as_tensor(const Value& v, bool exact_use = false);
  int as_ints(const Value& v);
  /// A scalar constant's value (const_float or fixed static_ints of one element).
  bool scalar(const Value& v, double& out) const;
  /// Static integers as plain numbers (each fixed), refusing batch-dependent ones.
  std::vector<std::int64_t> fixed_ints(const Value& v, const std::string& what) const;
  /// The constant's values (const_float or fixed static_ints).
  ArrayT<double> constant_array(const Value& v) const;
  /// Normalises an axis in [-rank, rank).
  std::size_t axis(std::int64_t a, std::size_t rank, const std::string& what) const;
  SymShape broadcast(const SymShape& a, const SymShape& b) const;
  /// Refuses a shape with more than `max_tensor_elements` at batch 1, or per unit of B.
  void check_size(const SymShape& s, const std::string& what) const;

  // ---- memory bounds (onnx/limits.cpp) ----
  /// Refuses, before it is built, a value folded at load time of shape `s` and
  /// `element_bytes` per element that would take the values computed at load
  /// time past max_constant_bytes; charge_fold also counts it (a copy no value holds).
  void check_fold(const SymShape& s, std::size_t element_bytes) const;
  void charge_fold(const SymShape& s, std::size_t element_bytes);
  /// Counts a folded value the node defines (a const_float array once) against max_constant_bytes.
  void charge_value(const Value& v);

  // ---- parameters ----
  /// The parameter of initializer `init` in layout `key` (built by `make` on
  /// first use: its shape and source index map). Another layout of the same
  /// initializer: refused, unless `key` and the existing one are "identity" and
  /// "transposed" (then `transposed` is set: the caller transposes it).
  int claim(int init, const std::string& key, const std::string& name_suffix,
            const std::function<void(ParamSpec&)>& make, bool* transposed = nullptr);
  bool trainable(int param) const { return !prog->params[std::size_t(param)].frozen; }
  /// A slot holding parameter `param` (one instruction per parameter and forward pass).
  int param_slot(int param);
  /// Marks the current instructions of this node inexact for `param`.
  void inexact(int param, const std::string& why);

  // ---- handlers ----
  void compile_node();
  // onnx/compile.cpp
  void op_identity();
  void op_constant();
  void op_shape();
  void op_constant_of_shape();
  void op_cast();
  void op_compare();
  void op_not();
  void op_logic();
  void op_where();
  void op_arith();
  void op_unary();
  void op_pow();
  void op_softmax();
  void op_reduce();
  void op_reshape();
  void op_flatten();
  void op_squeeze();
  void op_unsqueeze();
  void op_transpose();
  void op_concat();
  void op_slice();
  void op_gather();
  void op_expand();
  void op_pad();
  void op_dropout();
  // onnx/batch_size.cpp
  void op_size();
  void op_range();
  // onnx/compile_nn.cpp
  void op_gemm();
  void op_matmul();
  void op_conv();
  void op_pool();
  void op_global_avg_pool();
  void op_batch_norm();
  void op_layer_norm();
  void op_rnn();

  // helpers shared by both files
  Value reshaped(const Value& v, const SymShape& to);
  int linear(int x, int w, int b);

 private:
  std::unordered_map<std::string, Value> values_;
  std::unordered_map<std::string, std::size_t> uses_;
  std::set<std::string> live_;
  std::unordered_map<std::string, int> init_index_;
  std::map<int, std::vector<std::pair<std::string, int>>> claims_;  // initializer -> (layout, param)
  std::unordered_map<int, int> param_slots_;
  std::unordered_map<std::string, int> const_slots_;
  std::map<std::string, std::string> names_;  // recovered names (onnx/names.cpp)
  std::set<std::string> fused_;               // nodes folded into an earlier one (a MatMul's bias Add)
  std::size_t first_instr_ = 0;               // the node's first instruction
  std::size_t node_index_ = 0;
  double constant_bytes_ = 0;                 // values computed at load time (onnx/limits.cpp)
  std::set<const void*> charged_;             // const_float arrays counted in constant_bytes_
  friend struct FusedAdd;

 public:
  /// A MatMul or Gemm whose only reader is an Add of a 1-D initializer: that
  /// Add's node, its bias operand and its output (for fusing into linear).
  bool bias_add_after(const std::string& out, const Node*& add, Value& bias);
  void fuse(const Node& n) { fused_.insert(n.name); }
  void define_value(const std::string& name, Value v) { values_[name] = std::move(v); }
};

/// Module names for initializers the exporter renamed (onnx/names.cpp): for
/// each initializer name the name to show, and for each RNN node its module
/// ("lstm") and layer index; see docs/onnx.md, "Parameter names".
std::map<std::string, std::string> recover_names(const Graph& g);

}  // namespace dpgrad::onnx::detail
