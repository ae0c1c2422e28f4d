// Small ONNX models built in C++ for the tests of onnx/ (no Python at test
// time): a builder over ONNX's protobuf classes that declares inputs, outputs,
// initializers and nodes, and writes the model to a file.
#pragma once

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "engine/array.hpp"

namespace dpgrad::test {

class OnnxGraph {
 public:
  static constexpr std::int64_t kBatch = -1;  // a dimension named "batch"

  explicit OnnxGraph(std::int64_t opset = 13) {
    model_.set_ir_version(8);
    model_.set_producer_name("dpgrad tests");
    auto* o = model_.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    graph().set_name("test");
  }
  ::onnx::GraphProto& graph() { return *model_.mutable_graph(); }
  ::onnx::ModelProto& model() { return model_; }

  /// Dims: kBatch for the batch, a string name via dim_param for others (dynamic), values otherwise.
  void input(const std::string& name, std::vector<std::int64_t> dims, int elem = 1,
             const std::vector<std::string>& params = {}) {
    value_info(graph().add_input(), name, dims, elem, params);
  }
  void output(const std::string& name, std::vector<std::int64_t> dims, int elem = 1) {
    value_info(graph().add_output(), name, dims, elem, {});
  }
  ::onnx::TensorProto* init(const std::string& name, const Shape& dims, const std::vector<float>& values) {
    ::onnx::TensorProto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(1);
    for (auto d : dims) t->add_dims(std::int64_t(d));
    std::string raw(values.size() * 4, '\0');
    std::memcpy(raw.data(), values.data(), raw.size());
    t->set_raw_data(raw);
    return t;
  }
  ::onnx::TensorProto* init_ints(const std::string& name, const Shape& dims, const std::vector<std::int64_t>& values) {
    ::onnx::TensorProto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(7);
    for (auto d : dims) t->add_dims(std::int64_t(d));
    for (auto v : values) t->add_int64_data(v);
    return t;
  }
  ::onnx::NodeProto* node(const std::string& op, const std::vector<std::string>& in, const std::vector<std::string>& out,
                          const std::string& name = "") {
    ::onnx::NodeProto* n = graph().add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? op + "_" + std::to_string(graph().node_size()) : name);
    for (const auto& s : in) n->add_input(s);
    for (const auto& s : out) n->add_output(s);
    return n;
  }
  static void attr(::onnx::NodeProto* n, const std::string& name, std::int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto_AttributeType_INT);
    a->set_i(v);
  }
  static void attr(::onnx::NodeProto* n, const std::string& name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto_AttributeType_FLOAT);
    a->set_f(v);
  }
  static void attr(::onnx::NodeProto* n, const std::string& name, const std::vector<std::int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto_AttributeType_INTS);
    for (auto x : v) a->add_ints(x);
  }
  static void attr(::onnx::NodeProto* n, const std::string& name, const std::string& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto_AttributeType_STRING);
    a->set_s(v);
  }
  /// A Constant node holding int64 values (1-D, or a scalar when `scalar`).
  void constant_ints(const std::string& out, const std::vector<std::int64_t>& v, bool scalar = false) {
    auto* n = node("Constant", {}, {out});
    auto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(::onnx::AttributeProto_AttributeType_TENSOR);
    auto* t = a->mutable_t();
    t->set_data_type(7);
    if (!scalar) t->add_dims(std::int64_t(v.size()));
    for (auto x : v) t->add_int64_data(x);
  }
  void constant_float(const std::string& out, float v) {
    auto* n = node("Constant", {}, {out});
    auto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(::onnx::AttributeProto_AttributeType_TENSOR);
    auto* t = a->mutable_t();
    t->set_data_type(1);
    t->add_float_data(v);
  }
  std::string bytes() const { return model_.SerializeAsString(); }
  void save(const std::string& path) const {
    std::ofstream f(path, std::ios::binary);
    f << bytes();
  }

 private:
  static void value_info(::onnx::ValueInfoProto* v, const std::string& name, const std::vector<std::int64_t>& dims,
                         int elem, const std::vector<std::string>& params) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    auto* shape = tt->mutable_shape();
    for (std::size_t i = 0; i < dims.size(); ++i) {
      auto* d = shape->add_dim();
      if (dims[i] == kBatch) d->set_dim_param("batch");
      else if (i < params.size() && !params[i].empty()) d->set_dim_param(params[i]);
      else d->set_dim_value(dims[i]);
    }
  }
  ::onnx::ModelProto model_;
};

/// features x (batch, 3) -> Gemm (node "fc", weight (2, 3) = 1..6, transB): y (batch, 2).
inline OnnxGraph linear_gemm_graph() {
  OnnxGraph g;
  g.input("x", {OnnxGraph::kBatch, 3});
  g.output("y", {OnnxGraph::kBatch, 2});
  g.init("w", {2, 3}, {1, 2, 3, 4, 5, 6});
  OnnxGraph::attr(g.node("Gemm", {"x", "w"}, {"y"}, "fc"), "transB", std::int64_t(1));
  return g;
}

}  // namespace dpgrad::test
