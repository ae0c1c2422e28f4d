// Export: the graph an OnnxModelT was loaded from, unchanged, with each
// initializer rebuilt from the parameters that came from it (their elements
// put back where they were read from) in its original type; or a built-in
// model's stack of layers as the ONNX ops that compute it; checked by ONNX's
// checker and written through the one checked path for output files
// (engine/files.hpp: never over what is not a regular file, a scratch file
// created exclusively beside it, renamed into place once synced).
#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <typeinfo>

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include "engine/files.hpp"
#include "layers/conv.hpp"
#include "layers/dense.hpp"
#include "onnx/program.hpp"

namespace dpgrad::onnx {

namespace {

/// An imported model: its file's graph with the current weights.
template <class T>
::onnx::ModelProto imported_graph(const OnnxModelT<T>* m) {
  const detail::Program& p = m->program();
  ::onnx::ModelProto out = *p.proto;
  const std::vector<ArrayT<T>> values = m->all_values();
  // each initializer's elements: the file's, overwritten by its parameters' current values
  std::vector<std::vector<double>> data(p.initializers.size());
  std::vector<bool> touched(p.initializers.size(), false);
  for (std::size_t k = 0; k < p.params.size(); ++k) {
    const detail::ParamSpec& spec = p.params[k];
    const std::size_t i = std::size_t(spec.initializer);
    if (!touched[i]) {
      data[i].assign(p.initializers[i].values->begin(), p.initializers[i].values->end());
      touched[i] = true;
    }
    const ArrayT<T>& v = values[k];
    for (std::size_t e = 0; e < v.size(); ++e) data[i][spec.source.empty() ? e : spec.source[e]] = double(v.data()[e]);
  }
  auto* inits = out.mutable_graph()->mutable_initializer();
  for (int j = 0; j < inits->size(); ++j) {
    const std::size_t i = std::size_t(j);
    if (i >= touched.size() || !touched[i]) continue;
    ::onnx::TensorProto& t = (*inits)[j];
    if (t.name() != p.initializers[i].name) throw std::logic_error("save: initializers out of order");
    std::string raw;
    if (t.data_type() == 1) {  // FLOAT; else DOUBLE
      raw.resize(data[i].size() * 4);
      for (std::size_t e = 0; e < data[i].size(); ++e) {
        const float f = float(data[i][e]);
        std::memcpy(raw.data() + 4 * e, &f, 4);
      }
    } else {
      raw.resize(data[i].size() * 8);
      std::memcpy(raw.data(), data[i].data(), raw.size());
    }
    t.clear_float_data();
    t.clear_double_data();
    t.set_raw_data(std::move(raw));
  }
  return out;
}

// ---------------------------------------------------------------- built-in models
// A FeatureModel's Sequential stack, layer by layer, each as the ONNX ops that
// compute the same values from the same tensors in the same order: the tensor
// between layers keeps dpgrad's layout (channels last), Conv and MaxPool are
// wrapped in Transposes to ONNX's channels-first, Dense is a Gemm over its
// (in, out) weight, so the graph, imported again, runs the same kernels.

/// The graph being written: its nodes and initializers, and the current tensor.
template <class T>
struct GraphWriter {
  ::onnx::GraphProto& g;
  std::string x = "input";  // the current tensor's name
  Shape shape;              // its shape without the batch axis
  int nodes = 0;

  ::onnx::NodeProto& node(const std::string& op, std::vector<std::string> ins) {
    auto* n = g.add_node();
    n->set_op_type(op);
    n->set_name("/" + op + "_" + std::to_string(++nodes));
    ins.insert(ins.begin(), x);
    for (const auto& i : ins) n->add_input(i);
    x = n->name().substr(1);
    n->add_output(x);
    return *n;
  }
  static void ints(::onnx::NodeProto& n, const char* name, const std::vector<std::int64_t>& v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    if (v.size() == 1 && std::string(name) != "kernel_shape" && std::string(name) != "strides") {
      a->set_type(::onnx::AttributeProto_AttributeType_INT);
      a->set_i(v[0]);
      return;
    }
    a->set_type(::onnx::AttributeProto_AttributeType_INTS);
    for (auto e : v) a->add_ints(e);
  }
  /// An initializer of T (FLOAT or DOUBLE), elements in row-major order of `dims`.
  void tensor(const std::string& name, const Shape& dims, const T* values) {
    auto* t = g.add_initializer();
    t->set_name(name);
    t->set_data_type(std::is_same_v<T, float> ? 1 : 11);
    std::size_t n = 1;
    for (auto d : dims) t->add_dims(std::int64_t(d)), n *= d;
    t->set_raw_data(std::string(reinterpret_cast<const char*>(values), n * sizeof(T)));
  }
  void int_tensor(const std::string& name, const std::vector<std::int64_t>& values) {
    auto* t = g.add_initializer();
    t->set_name(name);
    t->set_data_type(7);
    t->add_dims(std::int64_t(values.size()));
    for (auto v : values) t->add_int64_data(v);
  }
  void transpose(const std::vector<std::int64_t>& perm) {
    ints(node("Transpose", {}), "perm", perm);
  }
};

/// The class of `x` without namespaces and template arguments ("GroupNormT"), for messages.
template <class X>
std::string class_name(const X& x) {
  int status = 0;
  char* d = abi::__cxa_demangle(typeid(x).name(), nullptr, nullptr, &status);
  std::string n = status == 0 && d ? d : typeid(x).name();
  std::free(d);
  if (const auto lt = n.find('<'); lt != std::string::npos) n.resize(lt);
  if (const auto colon = n.rfind("::"); colon != std::string::npos) n = n.substr(colon + 2);
  return n;
}

/// The layer's op without an ONNX equivalent ("" when every one has one).
template <class T>
std::string layer_problem(const LayerT<T>& l) {
  if (dynamic_cast<const FlattenT<T>*>(&l) || dynamic_cast<const DenseT<T>*>(&l) ||
      dynamic_cast<const ActivationT<T>*>(&l) || dynamic_cast<const ReshapeT<T>*>(&l) ||
      dynamic_cast<const Conv2dT<T>*>(&l) || dynamic_cast<const MaxPool2dT<T>*>(&l))
    return "";
  return class_name(l);
}

/// Dense: Gemm(x, W (in, out), b), the weight in the orientation linear reads.
template <class T>
void write_dense(GraphWriter<T>& w, const DenseT<T>& d) {
  if (w.shape.size() != 1) throw OnnxError("save: Dense on inputs of more than one axis per example");
  const TensorT<T>& weight = d.weight();
  w.tensor(weight.name(), weight.shape(), weight.value().data());
  std::vector<std::string> ins{weight.name()};
  if (d.bias().defined()) {
    w.tensor(d.bias().name(), d.bias().shape(), d.bias().value().data());
    ins.push_back(d.bias().name());
  }
  w.node("Gemm", ins);
  w.shape = {weight.shape()[1]};
}

/// Conv2d on (H, W, Cin): Transpose to (Cin, H, W), Conv with the kernel in ONNX's
/// (Cout, Cin, kh, kw) layout and the layer's own padding, Transpose back.
template <class T>
void write_conv(GraphWriter<T>& w, const Conv2dT<T>& c) {
  if (w.shape.size() != 3) throw OnnxError("save: Conv2d needs images (H, W, C) per example");
  const Shape in{1, w.shape[0], w.shape[1], w.shape[2]};
  const Pad2d pad = c.padding_of(in);
  const std::size_t kh = c.kernel_h(), kw = c.kernel_w(), cin = w.shape[2], cout = c.weight().shape()[1];
  const ArrayT<T>& k = c.weight().value();  // (kh kw cin, cout), rows ordered (i, j, c)
  std::vector<T> onnx_k(k.size());
  for (std::size_t i = 0; i < kh; ++i)
    for (std::size_t j = 0; j < kw; ++j)
      for (std::size_t ch = 0; ch < cin; ++ch)
        for (std::size_t o = 0; o < cout; ++o)
          onnx_k[((o * cin + ch) * kh + i) * kw + j] = k.data()[((i * kw + j) * cin + ch) * cout + o];
  w.tensor(c.weight().name(), {cout, cin, kh, kw}, onnx_k.data());
  std::vector<std::string> ins{c.weight().name()};
  if (c.bias().defined()) {
    w.tensor(c.bias().name(), c.bias().shape(), c.bias().value().data());
    ins.push_back(c.bias().name());
  }
  w.transpose({0, 3, 1, 2});
  auto& n = w.node("Conv", ins);
  GraphWriter<T>::ints(n, "kernel_shape", {std::int64_t(kh), std::int64_t(kw)});
  GraphWriter<T>::ints(n, "strides", {std::int64_t(c.stride()), std::int64_t(c.stride())});
  GraphWriter<T>::ints(n, "pads", {std::int64_t(pad.top), std::int64_t(pad.left), std::int64_t(pad.bottom),
                                   std::int64_t(pad.right)});
  w.transpose({0, 2, 3, 1});
  const Shape out = c.output_shape(in);
  w.shape = {out[1], out[2], out[3]};
}

template <class T>
void write_layer(GraphWriter<T>& w, const LayerT<T>& l) {
  if (dynamic_cast<const FlattenT<T>*>(&l)) {
    GraphWriter<T>::ints(w.node("Flatten", {}), "axis", {1});
    std::size_t n = 1;
    for (auto d : w.shape) n *= d;
    w.shape = {n};
  } else if (const auto* d = dynamic_cast<const DenseT<T>*>(&l)) {
    write_dense(w, *d);
  } else if (const auto* a = dynamic_cast<const ActivationT<T>*>(&l)) {
    w.node(a->activation() == Activation::relu ? "Relu" : a->activation() == Activation::tanh ? "Tanh" : "Sigmoid", {});
  } else if (const auto* r = dynamic_cast<const ReshapeT<T>*>(&l)) {
    std::vector<std::int64_t> target{-1};
    for (auto e : r->sample_shape()) target.push_back(std::int64_t(e));
    const std::string name = "shape_" + std::to_string(w.nodes + 1);
    w.int_tensor(name, target);
    w.node("Reshape", {name});
    w.shape = r->sample_shape();
  } else if (const auto* c = dynamic_cast<const Conv2dT<T>*>(&l)) {
    write_conv(w, *c);
  } else if (const auto* p = dynamic_cast<const MaxPool2dT<T>*>(&l)) {
    if (w.shape.size() != 3) throw OnnxError("save: MaxPool2d needs images (H, W, C) per example");
    const auto k = std::int64_t(p->kernel()), s = std::int64_t(p->stride());
    w.transpose({0, 3, 1, 2});
    auto& n = w.node("MaxPool", {});
    GraphWriter<T>::ints(n, "kernel_shape", {k, k});
    GraphWriter<T>::ints(n, "strides", {s, s});
    w.transpose({0, 2, 3, 1});
    w.shape = {std::size_t((std::int64_t(w.shape[0]) - k) / s + 1), std::size_t((std::int64_t(w.shape[1]) - k) / s + 1),
               w.shape[2]};
  } else {
    throw std::logic_error("save: layer " + class_name(l) + " has no writer");
  }
}

void value_info(::onnx::ValueInfoProto* v, const std::string& name, int elem, const Shape& sample) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* shape = tt->mutable_shape();
  shape->add_dim()->set_dim_param("batch");
  for (auto d : sample) shape->add_dim()->set_dim_value(std::int64_t(d));
}

/// A built-in FeatureModel reading examples of shape `example` (without the batch axis).
template <class T>
::onnx::ModelProto builtin_graph(const FeatureModelT<T>& m, const Shape& example) {
  if (example.empty())
    throw OnnxError("save: model '" + m.name() + "' is built in: give the shape of one example it reads");
  ::onnx::ModelProto out;
  out.set_ir_version(8);
  out.set_producer_name("dpgrad");
  auto* opset = out.add_opset_import();
  opset->set_domain("");
  opset->set_version(13);
  ::onnx::GraphProto& g = *out.mutable_graph();
  g.set_name(m.name());
  const int elem = std::is_same_v<T, float> ? 1 : 11;
  value_info(g.add_input(), "input", elem, example);
  GraphWriter<T> w{g};
  w.shape = example;
  for (std::size_t i = 0; i < m.net().size(); ++i) write_layer(w, m.net().layer(i));
  if (w.shape.size() != 1) throw OnnxError("save: model '" + m.name() + "' does not end in one vector per example");
  auto* id = g.add_node();  // the output under its own name
  id->set_op_type("Identity");
  id->set_name("/output");
  id->add_input(w.x);
  id->add_output("logits");
  value_info(g.add_output(), "logits", elem, w.shape);
  return out;
}

}  // namespace

template <class T>
std::string save_problem(const ModelT<T>& model) {
  if (dynamic_cast<const OnnxModelT<T>*>(&model)) return "";
  const auto* f = dynamic_cast<const FeatureModelT<T>*>(&model);
  if (!f)
    return "model '" + model.name() + "' (" + class_name(model) + ") has no ONNX export: only imported models and " +
           "the built-in stacks of Dense, Conv2d, MaxPool2d, activations, Flatten and Reshape (mlp, logreg, cnn26k, " +
           "cnn17m) are written";
  for (std::size_t i = 0; i < f->net().size(); ++i)
    if (const std::string op = layer_problem(f->net().layer(i)); !op.empty())
      return "model '" + model.name() + "' has no ONNX export: its layer " + std::to_string(i + 1) + ", " + op +
             ", has no ONNX equivalent here";
  return "";
}

template <class T>
void save(const ModelT<T>& model, const std::string& path, const Shape& example) {
  if (const std::string problem = save_problem(model); !problem.empty()) throw OnnxError("save: " + problem);
  ::onnx::ModelProto out;
  if (const auto* m = dynamic_cast<const OnnxModelT<T>*>(&model)) out = imported_graph(m);
  else out = builtin_graph(dynamic_cast<const FeatureModelT<T>&>(model), example);
  try {
    ::onnx::checker::check_model(out);
  } catch (const std::exception& e) {
    throw OnnxError("save: ONNX's checker refuses the exported model: " + std::string(e.what()));
  }
  std::string bytes;
  if (!out.SerializeToString(&bytes)) throw std::runtime_error("save: cannot serialise the model for " + path);
  write_output_file(path, bytes, "onnx::save");
}

template std::string save_problem(const ModelT<float>&);
template std::string save_problem(const ModelT<double>&);
template void save(const ModelT<float>&, const std::string&, const Shape&);
template void save(const ModelT<double>&, const std::string&, const Shape&);

}  // namespace dpgrad::onnx
