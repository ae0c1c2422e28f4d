// An ONNX graph as onnx/read.cpp hands it to the compiler (internal to onnx/):
// every tensor already checked (its type known, its size bounded and equal to
// what its dims declare, external data read from inside the model's folder),
// every attribute converted. No protobuf types beyond this point.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/array.hpp"
#include "onnx/onnx.hpp"
#include "onnx/program.hpp"

namespace dpgrad::onnx::detail {

/// ONNX TensorProto data types dpgrad reads.
enum ElemType : int { kFloat = 1, kUint8 = 2, kInt8 = 3, kUint16 = 4, kInt16 = 5, kInt32 = 6, kInt64 = 7,
                      kBool = 9, kDouble = 11 };
bool is_float_type(int t);
/// "FLOAT", "INT64", ... (or the number).
std::string type_name(int t);

struct TensorData {
  std::string name;
  int elem_type = 0;
  Shape dims;
  std::vector<double> reals;        // float types
  std::vector<std::int64_t> ints;   // integer and boolean types
  bool is_float() const { return is_float_type(elem_type); }
  std::size_t size() const { return numel(dims); }
};

struct Attribute {
  std::string name;
  int type = 0;  // ONNX AttributeProto type: 1 FLOAT, 2 INT, 3 STRING, 4 TENSOR, 6 FLOATS, 7 INTS, 8 STRINGS
  double f = 0;
  std::int64_t i = 0;
  std::string s;
  std::vector<double> floats;
  std::vector<std::int64_t> ints;
  std::shared_ptr<const TensorData> t;
};

struct Node {
  std::string name, op, domain;
  std::vector<std::string> inputs, outputs;  // "" marks an absent optional input or output
  std::vector<Attribute> attributes;
  /// "node 'NAME' (OP)": how errors name it.
  std::string label() const;
};

struct DimInfo {
  bool has_value = false;
  std::int64_t value = 0;
  std::string param;  // symbolic name, when not a value
};

struct ValueInfo {
  std::string name;
  int elem_type = 0;
  bool has_shape = false;
  std::vector<DimInfo> dims;
};

struct Graph {
  std::string path;
  std::int64_t opset = 0;
  std::vector<Node> nodes;
  std::vector<TensorData> initializers;
  std::vector<ValueInfo> inputs, outputs;
};

/// The lowest and highest default-domain opsets dpgrad reads.
constexpr std::int64_t kMinOpset = 13, kMaxOpset = 17;

/// Reads `path`: bounded in size, parsed, external data inlined, checked by
/// ONNX's checker, converted. `proto` receives the parsed model (for export).
Graph read_graph(const std::string& path, const LoadOptions& options, std::shared_ptr<const ::onnx::ModelProto>& proto);

/// Compiles a graph into a program (onnx/compile.cpp).
std::shared_ptr<Program> compile(const Graph& graph, const LoadOptions& options);

}  // namespace dpgrad::onnx::detail
