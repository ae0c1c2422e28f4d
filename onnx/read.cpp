// Reading an ONNX file without trusting it (docs/onnx.md, "Bad input"): size
// bounded, protobuf parsed with limits, external data only from inside the
// model's folder, every tensor checked against its dims, opsets 13-17, then
// ONNX's checker. Errors name the file and the tensor or node.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include "onnx/graph.hpp"
#include "onnx/program.hpp"

namespace dpgrad::onnx::detail {

namespace fs = std::filesystem;

bool is_float_type(int t) { return t == kFloat || t == kDouble; }

std::string type_name(int t) {
  switch (t) {
    case 1: return "FLOAT";
    case 2: return "UINT8";
    case 3: return "INT8";
    case 4: return "UINT16";
    case 5: return "INT16";
    case 6: return "INT32";
    case 7: return "INT64";
    case 8: return "STRING";
    case 9: return "BOOL";
    case 10: return "FLOAT16";
    case 11: return "DOUBLE";
    case 12: return "UINT32";
    case 13: return "UINT64";
    case 16: return "BFLOAT16";
  }
  return "type " + std::to_string(t);
}

std::string Node::label() const { return "node '" + name + "' (" + op + ")"; }

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw OnnxError(path + ": " + what); }

std::size_t element_bytes(int t) {
  switch (t) {
    case kFloat: case kInt32: return 4;
    case kDouble: case kInt64: return 8;
    case kInt16: case kUint16: return 2;
    case kInt8: case kUint8: case kBool: return 1;
  }
  return 0;
}

/// The whole file, refusing one larger than `limit` before reading it.
std::string read_bounded(const std::string& path, std::size_t limit) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail(path, "no such file");
  if (!fs::is_regular_file(st)) fail(path, "not a regular file");
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) fail(path, "cannot read its size: " + ec.message());
  if (size > limit)
    fail(path, "the file has " + std::to_string(size) + " bytes, more than the limit of " + std::to_string(limit));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open it");
  std::string bytes(std::size_t(size), '\0');
  if (size && !in.read(bytes.data(), std::streamsize(size))) fail(path, "cannot read it");
  return bytes;
}

/// Inlines a tensor's external data: `location` relative to the model's folder
/// and inside it (after resolving links), the declared offset and length within
/// the file, the length what the tensor needs.
void inline_external(::onnx::TensorProto& t, const fs::path& folder, const std::string& path, std::size_t& budget) {
  std::string location;
  std::uint64_t offset = 0, length = 0;
  bool has_length = false;
  auto number = [&](const std::string& key, const std::string& v) {
    if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
      fail(path, "tensor '" + t.name() + "': external data " + key + " '" + v + "' is not a number");
    return std::uint64_t(std::stoull(v));
  };
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = number("offset", kv.value());
    else if (kv.key() == "length") { length = number("length", kv.value()); has_length = true; }
    else if (kv.key() != "checksum")
      fail(path, "tensor '" + t.name() + "': unknown external data key '" + kv.key() + "'");
  }
  if (location.empty()) fail(path, "tensor '" + t.name() + "': external data without a location");
  const fs::path rel(location);
  if (rel.is_absolute() || location.find('\0') != std::string::npos)
    fail(path, "tensor '" + t.name() + "': external data file '" + location +
                   "' is outside the model's folder (an absolute path)");
  std::error_code ec;
  const fs::path base = fs::canonical(folder, ec);
  if (ec) fail(path, "cannot resolve the model's folder: " + ec.message());
  const fs::path target = fs::weakly_canonical(base / rel, ec);
  if (ec) fail(path, "tensor '" + t.name() + "': cannot resolve external data file '" + location + "'");
  const auto [b_end, t_it] = std::mismatch(base.begin(), base.end(), target.begin(), target.end());
  if (b_end != base.end() || t_it == target.end())
    fail(path, "tensor '" + t.name() + "': external data file '" + location + "' is outside the model's folder " +
                   base.string());
  if (!fs::is_regular_file(target, ec))
    fail(path, "tensor '" + t.name() + "': external data file '" + location + "' does not exist or is not a file");
  const std::uintmax_t size = fs::file_size(target, ec);
  if (ec) fail(path, "tensor '" + t.name() + "': cannot read the size of '" + location + "'");
  const std::size_t elem = element_bytes(t.data_type());
  if (elem == 0) fail(path, "tensor '" + t.name() + "' has type " + type_name(t.data_type()) + ", which dpgrad does not read");
  std::uint64_t count = 1;
  for (auto d : t.dims()) {
    if (d < 0 || (d != 0 && count > std::numeric_limits<std::uint64_t>::max() / std::uint64_t(d) / 16))
      fail(path, "tensor '" + t.name() + "' declares a huge or negative size");
    count *= std::uint64_t(d);
  }
  const std::uint64_t need = count * elem;
  if (has_length && length != need)
    fail(path, "tensor '" + t.name() + "': external data length " + std::to_string(length) + " disagrees with its dims (" +
                   std::to_string(need) + " bytes)");
  if (offset > size || need > size - offset)
    fail(path, "tensor '" + t.name() + "': external data [" + std::to_string(offset) + ", +" + std::to_string(need) +
                   ") lies beyond the end of '" + location + "' (" + std::to_string(size) + " bytes)");
  if (need > budget)
    fail(path, "tensor '" + t.name() + "': external data beyond the limit of the model's total size");
  budget -= std::size_t(need);
  std::ifstream in(target, std::ios::binary);
  std::string bytes(std::size_t(need), '\0');
  if (!in || !in.seekg(std::streamoff(offset)) || (need && !in.read(bytes.data(), std::streamsize(need))))
    fail(path, "tensor '" + t.name() + "': cannot read external data from '" + location + "'");
  t.clear_external_data();
  t.clear_data_location();
  t.set_raw_data(std::move(bytes));
}

/// A TensorProto as checked data: a known type, dims >= 0 and bounded, and
/// exactly the elements the dims declare.
TensorData convert_tensor(const ::onnx::TensorProto& t, const std::string& path, const LoadOptions& o,
                          const std::string& what) {
  TensorData r;
  r.name = t.name();
  r.elem_type = t.data_type();
  const std::string who = what + " '" + t.name() + "'";
  if (t.data_location() == ::onnx::TensorProto_DataLocation_EXTERNAL)
    fail(path, who + ": external data is only read for initializers");
  if (t.has_segment()) fail(path, who + ": segmented tensors are not supported");
  const std::size_t elem = element_bytes(r.elem_type);
  if (elem == 0) fail(path, who + " has type " + type_name(r.elem_type) + ", which dpgrad does not read");
  if (t.dims_size() > 8) fail(path, who + " has " + std::to_string(t.dims_size()) + " dimensions (at most 8)");
  std::size_t count = 1;
  for (auto d : t.dims()) {
    if (d < 0) fail(path, who + " has a negative dimension " + std::to_string(d));
    if (d != 0 && count > o.max_tensor_elements / std::size_t(d))
      fail(path, who + " declares more than " + std::to_string(o.max_tensor_elements) + " elements (a huge size)");
    count *= std::size_t(d);
    r.dims.push_back(std::size_t(d));
  }
  auto disagree = [&](std::size_t have) {
    fail(path, who + " holds " + std::to_string(have) + " values but its dims " + shape_str(r.dims) + " declare " +
                   std::to_string(count));
  };
  const bool raw = t.has_raw_data();
  const std::size_t typed = std::size_t(t.float_data_size() + t.double_data_size() + t.int32_data_size() +
                                        t.int64_data_size() + t.uint64_data_size() + t.string_data_size());
  if (raw && typed) fail(path, who + " holds both raw and typed data");
  if (raw) {
    const std::string& b = t.raw_data();
    if (b.size() != count * elem) {
      if (b.size() % elem == 0) disagree(b.size() / elem);
      fail(path, who + " holds " + std::to_string(b.size()) + " bytes of raw data, not a whole number of " +
                     type_name(r.elem_type) + " values");
    }
    const char* p = b.data();
    if (is_float_type(r.elem_type)) {
      r.reals.resize(count);
      for (std::size_t i = 0; i < count; ++i, p += elem) {
        if (r.elem_type == kFloat) {
          float v;
          std::memcpy(&v, p, 4);
          r.reals[i] = v;
        } else {
          std::memcpy(&r.reals[i], p, 8);
        }
      }
    } else {
      r.ints.resize(count);
      for (std::size_t i = 0; i < count; ++i, p += elem) {
        switch (r.elem_type) {
          case kInt64: std::memcpy(&r.ints[i], p, 8); break;
          case kInt32: { std::int32_t v; std::memcpy(&v, p, 4); r.ints[i] = v; break; }
          case kInt16: { std::int16_t v; std::memcpy(&v, p, 2); r.ints[i] = v; break; }
          case kUint16: { std::uint16_t v; std::memcpy(&v, p, 2); r.ints[i] = v; break; }
          case kInt8: r.ints[i] = static_cast<std::int8_t>(*p); break;
          case kUint8: r.ints[i] = static_cast<std::uint8_t>(*p); break;
          case kBool: r.ints[i] = *p != 0; break;
        }
      }
    }
    return r;
  }
  switch (r.elem_type) {
    case kFloat:
      if (std::size_t(t.float_data_size()) != count || typed != count) disagree(typed);
      r.reals.assign(t.float_data().begin(), t.float_data().end());
      break;
    case kDouble:
      if (std::size_t(t.double_data_size()) != count || typed != count) disagree(typed);
      r.reals.assign(t.double_data().begin(), t.double_data().end());
      break;
    case kInt64:
      if (std::size_t(t.int64_data_size()) != count || typed != count) disagree(typed);
      r.ints.assign(t.int64_data().begin(), t.int64_data().end());
      break;
    default:  // int32_data holds the narrower integer types and BOOL
      if (std::size_t(t.int32_data_size()) != count || typed != count) disagree(typed);
      r.ints.assign(t.int32_data().begin(), t.int32_data().end());
      if (r.elem_type == kBool)
        for (auto& v : r.ints) v = v != 0;
  }
  return r;
}

Attribute convert_attribute(const ::onnx::AttributeProto& a, const Node& node, const std::string& path,
                            const LoadOptions& o) {
  Attribute r;
  r.name = a.name();
  r.type = a.type();
  if (!a.ref_attr_name().empty()) fail(path, node.label() + ": attribute '" + a.name() + "' refers to a function's attribute");
  switch (a.type()) {
    case ::onnx::AttributeProto_AttributeType_FLOAT: r.f = a.f(); break;
    case ::onnx::AttributeProto_AttributeType_INT: r.i = a.i(); break;
    case ::onnx::AttributeProto_AttributeType_STRING: r.s = a.s(); break;
    case ::onnx::AttributeProto_AttributeType_TENSOR:
      r.t = std::make_shared<const TensorData>(convert_tensor(a.t(), path, o, node.label() + ": attribute '" + a.name() + "', tensor"));
      break;
    case ::onnx::AttributeProto_AttributeType_FLOATS: r.floats.assign(a.floats().begin(), a.floats().end()); break;
    case ::onnx::AttributeProto_AttributeType_INTS: r.ints.assign(a.ints().begin(), a.ints().end()); break;
    case ::onnx::AttributeProto_AttributeType_STRINGS: break;  // none of the supported ops reads one
    default:
      fail(path, node.label() + ": attribute '" + a.name() + "' is of a kind (graph, sparse tensor, type) dpgrad does not read");
  }
  return r;
}

ValueInfo convert_value_info(const ::onnx::ValueInfoProto& v) {
  ValueInfo r;
  r.name = v.name();
  if (!v.has_type() || !v.type().has_tensor_type()) return r;
  const auto& tt = v.type().tensor_type();
  r.elem_type = tt.elem_type();
  r.has_shape = tt.has_shape();
  for (const auto& d : tt.shape().dim()) {
    DimInfo di;
    di.has_value = d.has_dim_value();
    di.value = d.dim_value();
    di.param = d.dim_param();
    r.dims.push_back(di);
  }
  return r;
}

}  // namespace

Graph read_graph(const std::string& path, const LoadOptions& o, std::shared_ptr<const ::onnx::ModelProto>& out) {
  std::string bytes = read_bounded(path, o.max_file_bytes);
  auto model = std::make_shared<::onnx::ModelProto>();
  {
    google::protobuf::io::ArrayInputStream stream(bytes.data(), int(bytes.size()));
    google::protobuf::io::CodedInputStream coded(&stream);
    coded.SetTotalBytesLimit(int(std::min<std::size_t>(bytes.size() + 1, std::numeric_limits<int>::max())));
    coded.SetRecursionLimit(64);
    if (!model->ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
      fail(path, "not a valid ONNX model: the protobuf does not parse (a truncated or malformed file)");
  }
  bytes.clear();
  bytes.shrink_to_fit();
  if (!model->has_graph()) fail(path, "not an ONNX model: it holds no graph (a truncated or foreign file)");

  Graph g;
  g.path = path;
  std::int64_t opset = -1;
  std::set<std::string> domains;  // a domain imported twice: which version holds would depend on the order
  for (const auto& imp : model->opset_import()) {
    const bool default_domain = imp.domain().empty() || imp.domain() == "ai.onnx";
    const std::string domain = default_domain ? "ai.onnx" : imp.domain();
    if (!domains.insert(domain).second)
      fail(path, "the model imports domain '" + domain + "' twice (opset " + std::to_string(imp.version()) +
                     " and an earlier one): one opset import per domain");
    if (default_domain) opset = imp.version();
  }
  if (opset < 0) fail(path, "the model imports no opset of the default ONNX domain");
  if (opset < kMinOpset || opset > kMaxOpset)
    fail(path, "the model uses opset " + std::to_string(opset) + " of the default domain; dpgrad reads opsets " +
                   std::to_string(kMinOpset) + " to " + std::to_string(kMaxOpset) +
                   " (PyTorch: torch.onnx.export(..., opset_version=13))");
  g.opset = opset;
  ::onnx::GraphProto* graph = model->mutable_graph();
  if (graph->sparse_initializer_size() > 0)
    fail(path, "sparse initializer '" + graph->sparse_initializer(0).values().name() + "' is not supported");

  // external data: inlined from the model's folder before anything reads the tensors
  std::size_t budget = o.max_file_bytes;
  const fs::path folder = fs::absolute(fs::path(path)).parent_path();
  for (auto& t : *graph->mutable_initializer())
    if (t.data_location() == ::onnx::TensorProto_DataLocation_EXTERNAL) inline_external(t, folder, path, budget);

  // our own checks first (each names what is wrong), then ONNX's checker
  for (const auto& t : graph->initializer()) g.initializers.push_back(convert_tensor(t, path, o, "initializer"));
  std::size_t index = 0;
  for (const auto& n : graph->node()) {
    Node node;
    node.name = n.name().empty() ? n.op_type() + "#" + std::to_string(index) : n.name();
    node.op = n.op_type();
    node.domain = n.domain() == "ai.onnx" ? "" : n.domain();
    node.inputs.assign(n.input().begin(), n.input().end());
    node.outputs.assign(n.output().begin(), n.output().end());
    if (!node.domain.empty())
      fail(path, node.label() + ": operators of domain '" + node.domain + "' are not supported (the default domain only)");
    for (const auto& a : n.attribute()) node.attributes.push_back(convert_attribute(a, node, path, o));
    g.nodes.push_back(std::move(node));
    ++index;
  }
  try {
    ::onnx::checker::check_model(*model);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.size() > 600) what = what.substr(0, 600) + "...";
    fail(path, "ONNX's checker refuses the model: " + what);
  }
  for (const auto& v : graph->input()) g.inputs.push_back(convert_value_info(v));
  for (const auto& v : graph->output()) g.outputs.push_back(convert_value_info(v));
  out = model;
  return g;
}

std::shared_ptr<const Program> read_program(const std::string& path, const LoadOptions& options) {
  std::shared_ptr<const ::onnx::ModelProto> proto;
  const Graph g = read_graph(path, options, proto);
  std::shared_ptr<Program> p = compile(g, options);
  p->path = path;
  p->proto = proto;
  return p;
}

}  // namespace dpgrad::onnx::detail
