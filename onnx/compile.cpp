// The compiler's core (onnx/compiler.hpp): values, symbolic shapes, the graph's
// input and output, parameters, and the elementwise, reduction and shape
// operators. Integers that do not depend on the data (exported reshapes'
// Shape/Gather/Concat chains) are folded here as affine functions of B; where
// one is read as data, or compared with a number, it is computed at run time
// and mixed by the batch size, which is private (onnx/batch_size.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <regex>

#include "onnx/compiler.hpp"

namespace dpgrad::onnx::detail {

// ---- dims ----

std::string dim_str(Dim d) {
  if (d.b == 0) return std::to_string(d.c);
  std::string r = d.b == 1 ? "B" : std::to_string(d.b) + "B";
  if (d.c > 0) r += "+" + std::to_string(d.c);
  if (d.c < 0) r += std::to_string(d.c);
  return r;
}

std::string sym_str(const SymShape& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + dim_str(s[i]);
  return r + ")";
}

Shape concrete(const SymShape& s, std::size_t batch) {
  Shape r;
  for (const auto& d : s) r.push_back(std::size_t(std::max<std::int64_t>(0, d.at(batch))));
  return r;
}

Dim dim_add(Dim a, Dim b) { return {a.c + b.c, a.b + b.b}; }
Dim dim_sub(Dim a, Dim b) { return {a.c - b.c, a.b - b.b}; }

Dim dim_mul(Dim a, Dim b, const std::string& where) {
  if (a.b != 0 && b.b != 0)
    throw OnnxError(where + ": the batch size enters a product twice (" + dim_str(a) + " times " + dim_str(b) +
                    "); dpgrad folds shapes that are affine in the batch size");
  constexpr std::int64_t big = std::int64_t(1) << 40;
  auto ok = [](std::int64_t x) { return x > -big && x < big; };
  if (!ok(a.c) || !ok(a.b) || !ok(b.c) || !ok(b.b)) throw OnnxError(where + ": a huge size in a shape computation");
  return {a.c * b.c, a.c * b.b + a.b * b.c};
}

Dim dim_div(Dim a, Dim b, const std::string& where) {
  if (b.b == 0) {
    if (b.c == 0) throw OnnxError(where + ": a division by zero in a shape computation");
    if (a.b == 0) return {a.c / b.c, 0};  // integer division of fixed values (truncating, as C)
    if (a.c % b.c == 0 && a.b % b.c == 0) return {a.c / b.c, a.b / b.c};
  } else if (b.c == 0 && a.c == 0 && a.b % b.b == 0) {
    return {a.b / b.b, 0};
  }
  throw OnnxError(where + ": " + dim_str(a) + " / " + dim_str(b) +
                  " does not divide for every batch size; dpgrad folds shapes that are affine in the batch size");
}

namespace {

bool dims_equal(Dim a, Dim b) { return a == b; }

/// Row-major strides of a fixed shape.
std::vector<std::size_t> strides_of(const Shape& s) {
  std::vector<std::size_t> st(s.size(), 1);
  for (std::size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

Shape fixed_shape(const SymShape& s) {
  Shape r;
  for (const auto& d : s) r.push_back(std::size_t(d.c));
  return r;
}
SymShape sym_shape(const Shape& s) {
  SymShape r;
  for (auto d : s) r.push_back(Dim{std::int64_t(d), 0});
  return r;
}
bool all_fixed(const SymShape& s) {
  return std::all_of(s.begin(), s.end(), [](Dim d) { return d.fixed(); });
}

/// Elementwise f over two small arrays broadcast to `out` (fixed shapes).
template <class A, class B, class F>
auto broadcast_apply(const std::vector<A>& a, const Shape& sa, const std::vector<B>& b, const Shape& sb,
                     const Shape& out, F f) {
  using R = decltype(f(a[0], b[0]));
  std::vector<R> r(numel(out));
  const auto so = strides_of(out);
  auto index = [&](const Shape& s, std::size_t flat) {
    const std::size_t lead = out.size() - s.size();
    const auto st = strides_of(s);
    std::size_t k = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const std::size_t coord = (flat / so[lead + i]) % out[lead + i];
      k += (s[i] == 1 ? 0 : coord) * st[i];
    }
    return k;
  };
  for (std::size_t e = 0; e < r.size(); ++e) r[e] = f(a[index(sa, e)], b[index(sb, e)]);
  return r;
}

/// Elements of `v` (fixed shape s) along `axis` at `index` (one each), row-major.
template <class E>
std::vector<E> take_along(const std::vector<E>& v, const Shape& s, std::size_t axis, const std::vector<std::size_t>& index) {
  std::size_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < axis; ++i) outer *= s[i];
  for (std::size_t i = axis + 1; i < s.size(); ++i) inner *= s[i];
  std::vector<E> r;
  r.reserve(outer * index.size() * inner);
  for (std::size_t o = 0; o < outer; ++o)
    for (auto k : index)
      for (std::size_t i = 0; i < inner; ++i) r.push_back(v[(o * s[axis] + k) * inner + i]);
  return r;
}

/// Transposes a small array.
template <class E>
std::vector<E> permute(const std::vector<E>& v, const Shape& s, const std::vector<std::size_t>& perm) {
  Shape out(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) out[i] = s[perm[i]];
  const auto si = strides_of(s), so = strides_of(out);
  std::vector<E> r(v.size());
  for (std::size_t e = 0; e < r.size(); ++e) {
    std::size_t k = 0;
    for (std::size_t i = 0; i < out.size(); ++i) k += ((e / so[i]) % out[i]) * si[perm[i]];
    r[e] = v[k];
  }
  return r;
}

}  // namespace

// ---- the compiler ----

Compiler::Compiler(const Graph& graph, const LoadOptions& o) : g(graph), opt(o), prog(std::make_shared<Program>()) {}

void Compiler::fail(const std::string& what) const {
  throw OnnxError(g.path + ": " + (node ? node->label() + ": " : std::string()) + what);
}

const Value& Compiler::in(std::size_t i) const {
  static const Value absent;
  if (i >= node->inputs.size() || node->inputs[i].empty()) return absent;
  const auto it = values_.find(node->inputs[i]);
  if (it == values_.end())
    fail("reads '" + node->inputs[i] + "', which no earlier node, graph input or initializer defines");
  return it->second;
}

bool Compiler::has_in(std::size_t i) const { return i < node->inputs.size() && !node->inputs[i].empty(); }

bool Compiler::needed(std::size_t out) const {
  return out < node->outputs.size() && !node->outputs[out].empty() && live_.count(node->outputs[out]);
}

std::size_t Compiler::uses(const std::string& value) const {
  const auto it = uses_.find(value);
  return it == uses_.end() ? 0 : it->second;
}

void Compiler::define(std::size_t out, Value v) {
  if (out >= node->outputs.size() || node->outputs[out].empty()) return;
  if (v.kind == Value::Kind::tensor || v.kind == Value::Kind::ints) check_size(v.shape, "output '" + node->outputs[out] + "'");
  charge_value(v);
  if (v.slot >= 0) prog->slots[std::size_t(v.slot)].name = node->outputs[out];
  values_[node->outputs[out]] = std::move(v);
}

const Attribute* Compiler::attr(const std::string& name) const {
  for (const auto& a : node->attributes)
    if (a.name == name) return &a;
  return nullptr;
}
std::int64_t Compiler::attr_i(const std::string& name, std::int64_t dflt) const {
  const Attribute* a = attr(name);
  return a ? a->i : dflt;
}
double Compiler::attr_f(const std::string& name, double dflt) const {
  const Attribute* a = attr(name);
  return a ? a->f : dflt;
}
std::string Compiler::attr_s(const std::string& name, const std::string& dflt) const {
  const Attribute* a = attr(name);
  return a ? a->s : dflt;
}
std::vector<std::int64_t> Compiler::attr_ints(const std::string& name, std::vector<std::int64_t> dflt) const {
  const Attribute* a = attr(name);
  return a ? a->ints : dflt;
}

void Compiler::only_attributes(std::initializer_list<const char*> supported) const {
  for (const auto& a : node->attributes)
    if (std::none_of(supported.begin(), supported.end(), [&](const char* s) { return a.name == s; }))
      fail("attribute '" + a.name + "' is not supported");
}

int Compiler::new_slot(bool ints, SymShape shape, const std::string& name) {
  prog->slots.push_back(Slot{ints, std::move(shape), name});
  return int(prog->slots.size()) - 1;
}

Instr& Compiler::emit(Code code, std::vector<int> ins, std::vector<int> outs) {
  Instr i;
  i.code = code;
  i.in = std::move(ins);
  i.out = std::move(outs);
  i.node = node ? node->label() : "graph";
  bool data = code == Code::input_features || code == Code::input_tokens;
  for (int s : i.in) data = data || (s >= 0 && prog->slots[std::size_t(s)].data);
  for (int s : i.out)
    if (s >= 0) prog->slots[std::size_t(s)].data = data;
  prog->instrs.push_back(std::move(i));
  return prog->instrs.back();
}

Value Compiler::tensor_value(int slot) const {
  Value v;
  v.kind = Value::Kind::tensor;
  v.slot = slot;
  v.shape = prog->slots[std::size_t(slot)].shape;
  return v;
}
Value Compiler::ints_value(int slot) const {
  Value v;
  v.kind = Value::Kind::ints;
  v.slot = slot;
  v.shape = prog->slots[std::size_t(slot)].shape;
  v.elem = kInt64;
  return v;
}

void Compiler::check_size(const SymShape& s, const std::string& what) const {
  Dim n{1, 0};
  for (const auto& d : s) {
    if (d.c < 0 || d.b < 0 || (d.b == 0 && d.c < 0)) fail(what + " has a negative dimension: " + sym_str(s));
    try {
      n = dim_mul(n, d, what);
    } catch (const OnnxError&) {
      fail(what + " grows faster than the batch size: " + sym_str(s));
    }
    const auto limit = std::int64_t(opt.max_tensor_elements);
    if (n.c > limit || n.b > limit)
      fail(what + " " + sym_str(s) + " has more than " + std::to_string(opt.max_tensor_elements) +
           " elements per example (a huge declared size)");
  }
}

std::size_t Compiler::axis(std::int64_t a, std::size_t rank, const std::string& what) const {
  const auto r = std::int64_t(rank);
  if (a < -r || a >= r) fail(what + " " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
  return std::size_t(a < 0 ? a + r : a);
}

SymShape Compiler::broadcast(const SymShape& a, const SymShape& b) const {
  SymShape r(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < r.size(); ++i) {
    const Dim one{1, 0};
    const Dim da = i < r.size() - a.size() ? one : a[i - (r.size() - a.size())];
    const Dim db = i < r.size() - b.size() ? one : b[i - (r.size() - b.size())];
    if (dims_equal(da, db) || db == one) r[i] = da;
    else if (da == one) r[i] = db;
    else fail("shapes " + sym_str(a) + " and " + sym_str(b) + " do not broadcast");
  }
  return r;
}

bool Compiler::scalar(const Value& v, double& out) const {
  if (v.kind == Value::Kind::const_float && v.cf->size() == 1) {
    out = *v.cf->data();
    return true;
  }
  if (v.kind == Value::Kind::static_ints && v.sints.size() == 1 && v.sints[0].fixed()) {
    out = double(v.sints[0].c);
    return true;
  }
  return false;
}

std::vector<std::int64_t> Compiler::fixed_ints(const Value& v, const std::string& what) const {
  if (v.kind == Value::Kind::absent) return {};
  if (v.kind != Value::Kind::static_ints)
    fail(what + " must be a constant known at load time (it depends on the data or on the batch size's value)");
  std::vector<std::int64_t> r;
  for (const auto& d : v.sints) {
    if (!d.fixed()) fail(what + " depends on the batch size (" + dim_str(d) + ")");
    r.push_back(d.c);
  }
  return r;
}

ArrayT<double> Compiler::constant_array(const Value& v) const {
  if (v.kind == Value::Kind::const_float) return *v.cf;
  if (v.kind == Value::Kind::static_ints) {
    ArrayT<double> a = ArrayT<double>::from_shape(fixed_shape(v.shape));
    const auto xs = fixed_ints(v, "a constant");
    std::copy(xs.begin(), xs.end(), a.begin());
    return a;
  }
  if (v.kind == Value::Kind::param) {  // an initializer read as a constant (batch-norm statistics)
    const Initializer& init = prog->initializers[std::size_t(v.init)];
    ArrayT<double> a = *init.values;
    if (v.transposed) a = xt::transpose(a);
    return a;
  }
  fail("expects a constant, not a value computed from the data");
}

int Compiler::param_slot(int param) {
  const auto it = param_slots_.find(param);
  if (it != param_slots_.end()) return it->second;
  const ParamSpec& p = prog->params[std::size_t(param)];
  SymShape s = sym_shape(p.shape);
  const int slot = new_slot(false, s, p.name);
  Instr& i = emit(Code::param, {}, {slot});
  i.param = param;
  param_slots_[param] = slot;
  return slot;
}

void Compiler::inexact(int param, const std::string& why) {
  if (!trainable(param)) return;
  const std::string msg = node->label() + ": parameter '" + prog->params[std::size_t(param)].name + "' " + why;
  if (std::find(prog->inexact.begin(), prog->inexact.end(), msg) == prog->inexact.end()) prog->inexact.push_back(msg);
}

int Compiler::claim(int init, const std::string& key, const std::string& name,
                    const std::function<void(ParamSpec&)>& make, bool* transposed) {
  auto& list = claims_[init];
  for (const auto& [k, p] : list)
    if (k == key) return p;
  const Initializer& src = prog->initializers[std::size_t(init)];
  // an RNN's W, R and B are cut into disjoint parts (one per direction and kind)
  const bool part = key.rfind("rnn ", 0) == 0 &&
                    std::all_of(list.begin(), list.end(), [](const auto& c) { return c.first.rfind("rnn ", 0) == 0; });
  if (!list.empty() && !part) {
    const std::string& other = list.front().first;
    if (transposed && ((key == "identity" && other == "transposed") || (key == "transposed" && other == "identity"))) {
      *transposed = true;
      return list.front().second;
    }
    fail("initializer '" + src.name + "' is read in two layouts (" + other + " by an earlier node, " + key +
         " here); dpgrad keeps one layout per initializer");
  }
  ParamSpec p;
  p.onnx_name = src.name;
  p.initializer = init;
  const auto rn = names_.find(src.name);
  p.name = !name.empty() ? name : rn != names_.end() ? rn->second : src.name;
  make(p);
  if (!opt.freeze.empty()) {
    const std::regex re(opt.freeze, std::regex::ECMAScript);
    p.frozen = std::regex_search(p.name, re) || std::regex_search(p.onnx_name, re);
  }
  if (!p.frozen) {
    const ArrayT<double>& v = *src.values;
    const std::size_t n = numel(p.shape);
    for (std::size_t k = 0; k < n; ++k)
      if (!std::isfinite(v.data()[p.source.empty() ? k : p.source[k]]))
        fail("initializer '" + src.name + "' holds a value that is not finite (NaN or infinite)");
  }
  for (const auto& q : prog->params)
    if (q.name == p.name) p.name = p.onnx_name + (p.name == p.onnx_name ? "#" + std::to_string(prog->params.size()) : "");
  prog->params.push_back(std::move(p));
  const int index = int(prog->params.size()) - 1;
  list.push_back({key, index});
  return index;
}

int Compiler::as_tensor(const Value& v, bool exact_use) {
  switch (v.kind) {
    case Value::Kind::tensor: return v.slot;
    case Value::Kind::const_float:
    case Value::Kind::static_ints: {
      if (batch_dependent(v)) {  // the batch size read as data: computed at run time, mixed by it
        const int slot = new_slot(false, v.shape, "batch size");
        emit(Code::to_float, {as_ints(v)}, {slot});
        return slot;
      }
      const std::string key = v.kind == Value::Kind::const_float
                                  ? "f" + std::to_string(reinterpret_cast<std::uintptr_t>(v.cf.get()))
                                  : "";
      if (!key.empty()) {
        const auto it = const_slots_.find(key);
        if (it != const_slots_.end()) return it->second;
      }
      if (key.empty()) charge_fold(v.shape, sizeof(double));  // static ints: a new array at each use
      auto data = std::make_shared<const ArrayT<double>>(constant_array(v));
      const int slot = new_slot(false, v.shape, "constant");
      Instr& i = emit(Code::constant, {}, {slot});
      i.data = data;
      if (!key.empty()) const_slots_[key] = slot;
      return slot;
    }
    case Value::Kind::param: {
      const Initializer& init = prog->initializers[std::size_t(v.init)];
      bool transposed = false;
      const int p = claim(v.init, v.transposed ? "transposed" : "identity", "",
                          [&](ParamSpec& s) {
                            s.shape = v.transposed ? Shape{init.dims[1], init.dims[0]} : init.dims;
                            if (v.transposed)
                              for (std::size_t i = 0; i < init.dims[1]; ++i)
                                for (std::size_t j = 0; j < init.dims[0]; ++j) s.source.push_back(j * init.dims[1] + i);
                          },
                          &transposed);
      int slot = param_slot(p);
      if (transposed) {
        const int t = new_slot(false, v.shape, "transposed");
        Instr& i = emit(Code::transpose, {slot}, {t});
        i.axes = {1, 0};
        slot = t;
        inexact(p, "is transposed before this use (its first use reads it in the other orientation)");
      } else if (!exact_use) {
        inexact(p, "is read by an operator with no per-sample rule");
      }
      return slot;
    }
    case Value::Kind::ints: fail("expects a float tensor; its input holds integers");
    case Value::Kind::absent: fail("a required input is missing");
  }
  return -1;
}

int Compiler::as_ints(const Value& v) {
  if (v.kind == Value::Kind::ints) return v.slot;
  if (v.kind == Value::Kind::static_ints) {
    charge_fold(v.shape, sizeof(Dim));  // a copy at each use
    const int slot = new_slot(true, v.shape, "integers");
    Instr& i = emit(Code::int_constant, {}, {slot});
    i.dims = v.sints;
    i.shape0 = v.shape;
    return slot;
  }
  fail("expects integers; its input is a float tensor");
}

Value Compiler::reshaped(const Value& v, const SymShape& to) {
  Value r = v;
  r.shape = to;
  switch (v.kind) {
    case Value::Kind::static_ints: return r;
    case Value::Kind::const_float: {
      ArrayT<double> a = *v.cf;
      a.reshape(fixed_shape(to));
      r.cf = std::make_shared<const ArrayT<double>>(std::move(a));
      return r;
    }
    case Value::Kind::ints: {
      const int slot = new_slot(true, to, "");
      emit(Code::reshape, {v.slot}, {slot}).shape0 = to;
      return ints_value(slot);
    }
    default: {
      const int x = as_tensor(v);
      const int slot = new_slot(false, to, "");
      emit(Code::reshape, {x}, {slot}).shape0 = to;
      return tensor_value(slot);
    }
  }
}

bool Compiler::bias_add_after(const std::string& out, const Node*& add, Value& bias) {
  if (uses(out) != 1) return false;
  for (std::size_t k = node_index_ + 1; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    const auto it = std::find(n.inputs.begin(), n.inputs.end(), out);
    if (it == n.inputs.end()) continue;
    if (n.op != "Add" || n.inputs.size() != 2 || fused_.count(n.name)) return false;
    const std::string& other = n.inputs[it == n.inputs.begin() ? 1 : 0];
    const auto v = values_.find(other);
    if (v == values_.end()) return false;
    const Value& b = v->second;
    if ((b.kind != Value::Kind::param && b.kind != Value::Kind::const_float) || b.shape.size() != 1) return false;
    add = &n;
    bias = b;
    return true;
  }
  return false;
}

int Compiler::linear(int x, int w, int b) {
  const SymShape& xs = prog->slots[std::size_t(x)].shape;
  const SymShape& ws = prog->slots[std::size_t(w)].shape;
  if (xs.empty() || ws.size() != 2 || !(xs.back() == ws[0]))
    fail("shapes " + sym_str(xs) + " and " + sym_str(ws) + " do not multiply");
  SymShape os = xs;
  os.back() = ws[1];
  const int slot = new_slot(false, os, "");
  std::vector<int> ins{x, w};
  if (b >= 0) ins.push_back(b);
  emit(Code::linear, ins, {slot});
  return slot;
}

// ---- run ----

std::shared_ptr<Program> Compiler::run() {
  names_ = recover_names(g);
  if (!opt.freeze.empty()) {
    try {
      std::regex re(opt.freeze, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw OnnxError("--freeze '" + opt.freeze + "' is not a regular expression: " + e.what());
    }
  }
  // initializers: floats of more than one element are parameters; others constants
  for (std::size_t k = 0; k < g.initializers.size(); ++k) {
    const TensorData& t = g.initializers[k];
    Initializer init;
    init.name = t.name;
    init.elem_type = t.elem_type;
    init.dims = t.dims;
    Value v;
    v.shape = sym_shape(t.dims);
    v.elem = t.elem_type;
    if (t.is_float()) {
      ArrayT<double> a = ArrayT<double>::from_shape(t.dims);
      std::copy(t.reals.begin(), t.reals.end(), a.begin());
      init.values = std::make_shared<const ArrayT<double>>(std::move(a));
      if (t.size() > 1) {
        v.kind = Value::Kind::param;
        v.init = int(k);
      } else {
        v.kind = Value::Kind::const_float;
        v.cf = init.values;
      }
    } else {
      v.kind = Value::Kind::static_ints;
      for (auto x : t.ints) v.sints.push_back(Dim{x, 0});
    }
    prog->initializers.push_back(std::move(init));
    if (values_.count(t.name)) throw OnnxError(g.path + ": initializer '" + t.name + "' is defined twice");
    values_[t.name] = std::move(v);
  }
  // the one input the batch feeds
  std::vector<const ValueInfo*> inputs;
  for (const auto& vi : g.inputs)
    if (!values_.count(vi.name)) inputs.push_back(&vi);
  if (inputs.size() != 1) {
    std::string names;
    for (const auto* vi : inputs) names += (names.empty() ? "" : ", ") + ("'" + vi->name + "'");
    throw OnnxError(g.path + ": the graph has " + std::to_string(inputs.size()) + " inputs besides its initializers (" +
                    names + "); dpgrad feeds it one: the batch's images, sequences or token ids");
  }
  const ValueInfo& vi = *inputs[0];
  const std::string who = g.path + ": input '" + vi.name + "'";
  if (!vi.has_shape || vi.dims.empty()) throw OnnxError(who + " has no shape; dpgrad needs (batch, ...)");
  const DimInfo& d0 = vi.dims[0];
  if (d0.has_value)
    throw OnnxError(who + " has a fixed batch size " + std::to_string(d0.value) +
                    " on axis 0; export it with a dynamic batch axis (PyTorch: dynamic_axes={'" + vi.name +
                    "': {0: 'batch'}})");
  SymShape in_shape{Dim{0, 1}};
  for (std::size_t i = 1; i < vi.dims.size(); ++i) {
    const DimInfo& d = vi.dims[i];
    if (!d.has_value || d.value < 1)
      throw OnnxError(who + " has a dynamic dimension" + (d.param.empty() ? "" : " '" + d.param + "'") + " on axis " +
                      std::to_string(i) + "; only the batch (axis 0) may be dynamic: export with fixed sizes elsewhere");
    in_shape.push_back(Dim{d.value, 0});
    prog->input.sample_shape.push_back(std::size_t(d.value));
  }
  prog->input.name = vi.name;
  check_size(in_shape, "input '" + vi.name + "'");
  if (vi.elem_type == kFloat || vi.elem_type == kDouble) {
    prog->input_slot = new_slot(false, in_shape, vi.name);
    emit(Code::input_features, {}, {prog->input_slot});
    values_[vi.name] = tensor_value(prog->input_slot);
  } else if (vi.elem_type == kInt64 || vi.elem_type == kInt32) {
    if (in_shape.size() != 2)
      throw OnnxError(who + ": token ids must be (batch, length), not rank " + std::to_string(in_shape.size()));
    prog->input.tokens = true;
    prog->input_slot = new_slot(true, in_shape, vi.name);
    emit(Code::input_tokens, {}, {prog->input_slot});
    values_[vi.name] = ints_value(prog->input_slot);
  } else {
    throw OnnxError(who + " has type " + type_name(vi.elem_type) +
                    "; dpgrad feeds float features (FLOAT) or token ids (INT64)");
  }
  // what the first output needs, backwards
  if (g.outputs.empty()) throw OnnxError(g.path + ": the graph has no output");
  const std::string& output = g.outputs[0].name;
  live_.insert(output);
  std::vector<bool> live_node(g.nodes.size(), false);
  for (std::size_t k = g.nodes.size(); k-- > 0;) {
    const Node& n = g.nodes[k];
    if (std::none_of(n.outputs.begin(), n.outputs.end(), [&](const std::string& o) { return live_.count(o) > 0; }))
      continue;
    live_node[k] = true;
    for (const auto& i : n.inputs)
      if (!i.empty()) live_.insert(i);
  }
  ++uses_[output];
  for (std::size_t k = 0; k < g.nodes.size(); ++k)
    if (live_node[k])
      for (const auto& i : g.nodes[k].inputs)
        if (!i.empty()) ++uses_[i];
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    if (!live_node[k] || fused_.count(g.nodes[k].name)) continue;
    node = &g.nodes[k];
    node_index_ = k;
    first_instr_ = prog->instrs.size();
    compile_node();
  }
  node = nullptr;
  const auto out = values_.find(output);
  if (out == values_.end()) throw OnnxError(g.path + ": no node computes the output '" + output + "'");
  if (!out->second.is_float())
    throw OnnxError(g.path + ": output '" + output + "' holds integers; dpgrad trains on float outputs (logits)");
  if (out->second.shape.empty() || !(out->second.shape[0] == Dim{0, 1}))
    throw OnnxError(g.path + ": output '" + output + "' has shape " + sym_str(out->second.shape) +
                    "; its first axis must be the batch");
  prog->output_slot = as_tensor(out->second, true);
  for (const auto& p : prog->params) prog->info.push_back(ParameterInfo{p.name, p.onnx_name, p.frozen});
  return prog;
}

void Compiler::compile_node() {
  using Handler = void (Compiler::*)();
  static const std::unordered_map<std::string, Handler> handlers = {
      {"Identity", &Compiler::op_identity},       {"Constant", &Compiler::op_constant},
      {"Shape", &Compiler::op_shape},             {"ConstantOfShape", &Compiler::op_constant_of_shape},
      {"Cast", &Compiler::op_cast},               {"Equal", &Compiler::op_compare},
      {"Not", &Compiler::op_not},                 {"And", &Compiler::op_logic},
      {"Or", &Compiler::op_logic},                {"Where", &Compiler::op_where},
      {"Add", &Compiler::op_arith},               {"Sub", &Compiler::op_arith},
      {"Mul", &Compiler::op_arith},               {"Div", &Compiler::op_arith},
      {"Relu", &Compiler::op_unary},              {"LeakyRelu", &Compiler::op_unary},
      {"Tanh", &Compiler::op_unary},              {"Sigmoid", &Compiler::op_unary},
      {"Erf", &Compiler::op_unary},               {"Sqrt", &Compiler::op_unary},
      {"Neg", &Compiler::op_unary},               {"Exp", &Compiler::op_unary},
      {"Log", &Compiler::op_unary},               {"Abs", &Compiler::op_unary},
      {"Pow", &Compiler::op_pow},                 {"Softmax", &Compiler::op_softmax},
      {"LogSoftmax", &Compiler::op_softmax},      {"ReduceMean", &Compiler::op_reduce},
      {"ReduceSum", &Compiler::op_reduce},        {"Reshape", &Compiler::op_reshape},
      {"Flatten", &Compiler::op_flatten},         {"Squeeze", &Compiler::op_squeeze},
      {"Unsqueeze", &Compiler::op_unsqueeze},     {"Transpose", &Compiler::op_transpose},
      {"Concat", &Compiler::op_concat},           {"Slice", &Compiler::op_slice},
      {"Gather", &Compiler::op_gather},           {"Expand", &Compiler::op_expand},
      {"Pad", &Compiler::op_pad},                 {"Dropout", &Compiler::op_dropout},
      {"Gemm", &Compiler::op_gemm},               {"MatMul", &Compiler::op_matmul},
      {"Conv", &Compiler::op_conv},               {"MaxPool", &Compiler::op_pool},
      {"AveragePool", &Compiler::op_pool},        {"GlobalAveragePool", &Compiler::op_global_avg_pool},
      {"BatchNormalization", &Compiler::op_batch_norm},
      {"LayerNormalization", &Compiler::op_layer_norm},
      {"LSTM", &Compiler::op_rnn},                {"GRU", &Compiler::op_rnn},
      {"Size", &Compiler::op_size},               {"Range", &Compiler::op_range},
  };
  const auto it = handlers.find(node->op);
  if (it == handlers.end())
    fail("operator " + node->op + " is not supported (docs/onnx.md lists the operators dpgrad reads)");
  // every input must be defined by now (the file's nodes are in topological order)
  for (std::size_t i = 0; i < node->inputs.size(); ++i) in(i);
  (this->*(it->second))();
}

// ---- handlers: values ----

void Compiler::op_identity() { define(0, in(0)); }

void Compiler::op_constant() {
  Value v;
  auto from_tensor = [&](const TensorData& t) {
    v.shape = sym_shape(t.dims);
    v.elem = t.elem_type;
    if (t.is_float()) {
      v.kind = Value::Kind::const_float;
      ArrayT<double> a = ArrayT<double>::from_shape(t.dims);
      std::copy(t.reals.begin(), t.reals.end(), a.begin());
      v.cf = std::make_shared<const ArrayT<double>>(std::move(a));
    } else {
      v.kind = Value::Kind::static_ints;
      for (auto x : t.ints) v.sints.push_back(Dim{x, 0});
    }
  };
  if (node->attributes.size() != 1) fail("needs exactly one value attribute");
  const Attribute& a = node->attributes[0];
  if (a.name == "value" && a.t) {
    from_tensor(*a.t);
  } else if (a.name == "value_float" || a.name == "value_floats") {
    TensorData t;
    t.elem_type = kFloat;
    t.reals = a.name == "value_float" ? std::vector<double>{a.f} : a.floats;
    if (a.name == "value_floats") t.dims = {t.reals.size()};
    from_tensor(t);
  } else if (a.name == "value_int" || a.name == "value_ints") {
    TensorData t;
    t.elem_type = kInt64;
    t.ints = a.name == "value_int" ? std::vector<std::int64_t>{a.i} : a.ints;
    if (a.name == "value_ints") t.dims = {t.ints.size()};
    from_tensor(t);
  } else {
    fail("attribute '" + a.name + "' is not supported (a tensor, float(s) or int(s) only)");
  }
  define(0, v);
}

void Compiler::op_shape() {
  only_attributes({"start", "end"});
  const Value& x = in(0);
  const auto r = std::int64_t(x.shape.size());
  auto clamp = [&](std::int64_t a) { return std::clamp<std::int64_t>(a < 0 ? a + r : a, 0, r); };
  const std::int64_t start = clamp(attr_i("start", 0)), end = clamp(attr_i("end", r));
  Value v;
  v.kind = Value::Kind::static_ints;
  v.elem = kInt64;
  for (std::int64_t i = start; i < end; ++i) v.sints.push_back(x.shape[std::size_t(i)]);
  v.shape = {Dim{std::int64_t(v.sints.size()), 0}};
  define(0, v);
}

void Compiler::op_constant_of_shape() {
  only_attributes({"value"});
  const Value& s = in(0);
  if (s.kind != Value::Kind::static_ints)
    fail("its shape must be known at load time (it depends on the data or on the batch size's value)");
  SymShape shape(s.sints.begin(), s.sints.end());
  check_size(shape, "its output");
  double fill = 0;
  int elem = kFloat;
  if (const Attribute* a = attr("value")) {
    if (!a->t || a->t->size() != 1) fail("attribute 'value' must hold one element");
    elem = a->t->elem_type;
    fill = a->t->is_float() ? a->t->reals[0] : double(a->t->ints[0]);
  }
  Value v;
  v.shape = shape;
  v.elem = elem;
  if (all_fixed(shape)) {
    check_fold(shape, is_float_type(elem) ? sizeof(double) : sizeof(Dim));
    if (is_float_type(elem)) {
      v.kind = Value::Kind::const_float;
      ArrayT<double> a = ArrayT<double>::from_shape(fixed_shape(shape));
      a.fill(fill);
      v.cf = std::make_shared<const ArrayT<double>>(std::move(a));
    } else {
      v.kind = Value::Kind::static_ints;
      v.sints.assign(numel(fixed_shape(shape)), Dim{std::int64_t(fill), 0});
    }
    define(0, v);
    return;
  }
  const bool ints = !is_float_type(elem);
  const int slot = new_slot(ints, shape, "");
  Instr& i = emit(ints ? Code::int_fill : Code::fill, {}, {slot});
  i.shape0 = shape;
  if (ints) i.ints = {std::int64_t(fill)};
  else i.reals = {fill};
  define(0, ints ? ints_value(slot) : tensor_value(slot));
}

void Compiler::op_cast() {
  only_attributes({"to", "saturate"});
  const int to = int(attr_i("to", kFloat));
  const Value& x = in(0);
  const bool to_float = is_float_type(to);
  if (!to_float && to != kInt64 && to != kInt32 && to != kBool && to != kInt8 && to != kUint8 && to != kInt16)
    fail("casts to " + type_name(to) + ", which dpgrad does not compute with");
  Value v = x;
  v.elem = to;
  if (batch_dependent(x) && (to_float || to == kBool)) {  // the batch size as a value: at run time
    v = to_float ? tensor_value(as_tensor(x)) : ints_value(new_slot(true, x.shape, ""));
    if (!to_float) emit(Code::int_unary, {as_ints(x)}, {v.slot}).ints = {2};
    v.elem = to;
    define(0, v);
    return;
  }
  switch (x.kind) {
    case Value::Kind::static_ints:
      if (to_float) {
        v.kind = Value::Kind::const_float;
        v.cf = std::make_shared<const ArrayT<double>>(constant_array(x));
      } else if (to == kBool) {
        for (auto& d : v.sints) d.c = d.c != 0;
      }
      break;
    case Value::Kind::const_float:
      if (!to_float) {
        v.kind = Value::Kind::static_ints;
        v.sints.clear();
        for (auto f : *x.cf) {
          if (!std::isfinite(f)) fail("casts a non-finite constant to an integer");
          v.sints.push_back(Dim{to == kBool ? std::int64_t(f != 0) : std::int64_t(f), 0});
        }
        v.cf.reset();
      }
      break;
    case Value::Kind::ints:
      if (to_float) {
        const int slot = new_slot(false, x.shape, "");
        emit(Code::to_float, {x.slot}, {slot});
        v = tensor_value(slot);
      } else if (to == kBool) {
        const int slot = new_slot(true, x.shape, "");
        emit(Code::int_unary, {x.slot}, {slot}).ints = {2};
        v = ints_value(slot);
        v.elem = kBool;
      }
      break;
    case Value::Kind::tensor:
    case Value::Kind::param:
      if (!to_float) {
        const int slot = new_slot(true, x.shape, "");
        emit(Code::to_ints, {as_tensor(x)}, {slot}).ints = {to == kBool};
        v = ints_value(slot);
        v.elem = to;
      }
      break;
    case Value::Kind::absent: fail("a required input is missing");
  }
  define(0, v);
}

void Compiler::op_compare() {
  const Value &a = in(0), &b = in(1);
  const SymShape out = broadcast(a.shape, b.shape);
  // c + b B = c' + b' B for no batch size B >= 0, for all, or for one: the last is the batch size as a value
  const auto known = [](Dim x, Dim y) {
    const Dim d = dim_sub(x, y);
    return d.b == 0 || d.c % d.b != 0 || -d.c / d.b < 0;
  };
  if (a.kind == Value::Kind::static_ints && b.kind == Value::Kind::static_ints) {
    check_fold(out, sizeof(Dim));
    bool folds = true;
    auto r = broadcast_apply(a.sints, fixed_shape(a.shape), b.sints, fixed_shape(b.shape), fixed_shape(out),
                             [&](Dim x, Dim y) {
                               folds = folds && known(x, y);
                               return Dim{x == y ? 1 : 0, 0};
                             });
    if (folds) {
      Value v;
      v.kind = Value::Kind::static_ints;
      v.elem = kBool;
      v.shape = out;
      v.sints = std::move(r);
      define(0, v);
      return;
    }
  }
  const bool ints = !a.is_float() && !b.is_float();
  const int slot = new_slot(true, out, "");
  if (ints) emit(Code::int_binary, {as_ints(a), as_ints(b)}, {slot}).ints = {4};
  else emit(Code::float_equal, {as_tensor(a), as_tensor(b)}, {slot});
  Value v = ints_value(slot);
  v.elem = kBool;
  define(0, v);
}

void Compiler::op_not() {
  const Value& a = in(0);
  if (a.kind == Value::Kind::static_ints && !batch_dependent(a)) {
    Value v = a;
    for (auto& d : v.sints) d.c = d.c == 0;
    define(0, v);
    return;
  }
  const int slot = new_slot(true, a.shape, "");
  emit(Code::int_unary, {as_ints(a)}, {slot}).ints = {0};
  Value v = ints_value(slot);
  v.elem = kBool;
  define(0, v);
}

void Compiler::op_logic() {
  const Value &a = in(0), &b = in(1);
  const SymShape out = broadcast(a.shape, b.shape);
  const int slot = new_slot(true, out, "");
  emit(Code::int_binary, {as_ints(a), as_ints(b)}, {slot}).ints = {node->op == "And" ? 5 : 6};
  Value v = ints_value(slot);
  v.elem = kBool;
  define(0, v);
}

void Compiler::op_where() {
  const Value &c = in(0), &x = in(1), &y = in(2);
  const SymShape out = broadcast(c.shape, broadcast(x.shape, y.shape));
  if (c.kind == Value::Kind::static_ints && !batch_dependent(c) && x.kind == Value::Kind::static_ints &&
      y.kind == Value::Kind::static_ints) {
    check_fold(out, 3 * sizeof(Dim));  // the pairs, then the result
    const Shape so = fixed_shape(out);
    const auto cx = broadcast_apply(c.sints, fixed_shape(c.shape), x.sints, fixed_shape(x.shape), so,
                                    [](Dim k, Dim a) { return std::pair<Dim, Dim>{k, a}; });
    std::vector<Dim> r = broadcast_apply(cx, so, y.sints, fixed_shape(y.shape), so,
                                         [&](std::pair<Dim, Dim> ka, Dim b) { return ka.first.c != 0 ? ka.second : b; });
    Value v;
    v.kind = Value::Kind::static_ints;
    v.shape = out;
    v.sints = std::move(r);
    define(0, v);
    return;
  }
  const int cond = as_ints(c);
  if (!x.is_float() && !y.is_float()) {
    const int slot = new_slot(true, out, "");
    emit(Code::where, {cond, as_ints(x), as_ints(y)}, {slot});
    define(0, ints_value(slot));
    return;
  }
  const int slot = new_slot(false, out, "");
  emit(Code::where, {cond, as_tensor(x), as_tensor(y)}, {slot});
  define(0, tensor_value(slot));
}

void Compiler::op_arith() {
  const Value &a = in(0), &b = in(1);
  const SymShape out = broadcast(a.shape, b.shape);
  const std::string& op = node->op;
  const int code = op == "Add" ? 0 : op == "Sub" ? 1 : op == "Mul" ? 2 : 3;
  if (a.kind == Value::Kind::static_ints && b.kind == Value::Kind::static_ints) {
    const std::string where = g.path + ": " + node->label();
    check_fold(out, sizeof(Dim));
    Value v;
    v.kind = Value::Kind::static_ints;
    v.shape = out;
    v.sints = broadcast_apply(a.sints, fixed_shape(a.shape), b.sints, fixed_shape(b.shape), fixed_shape(out),
                              [&](Dim x, Dim y) {
                                switch (code) {
                                  case 0: return dim_add(x, y);
                                  case 1: return dim_sub(x, y);
                                  case 2: return dim_mul(x, y, where);
                                  default: return dim_div(x, y, where);
                                }
                              });
    define(0, v);
    return;
  }
  if (!a.is_float() && !b.is_float()) {
    const int slot = new_slot(true, out, "");
    emit(Code::int_binary, {as_ints(a), as_ints(b)}, {slot}).ints = {code};
    define(0, ints_value(slot));
    return;
  }
  double c = 0;
  auto unary = [&](int x, UnaryKind k, double r) {
    const int slot = new_slot(false, out, "");
    Instr& i = emit(Code::unary, {x}, {slot});
    i.ints = {std::int64_t(k)};
    i.reals = {r};
    return slot;
  };
  // a scalar constant on one side: scale or shift (exact as the binary op: one rounding)
  if (code != 3 && scalar(b, c) && a.shape == out) {
    const int x = as_tensor(a);
    define(0, tensor_value(code == 2 ? unary(x, UnaryKind::scale, c) : unary(x, UnaryKind::shift, code == 0 ? c : -c)));
    return;
  }
  if (code != 3 && scalar(a, c) && b.shape == out) {
    const int x = as_tensor(b);
    if (code == 1) define(0, tensor_value(unary(unary(x, UnaryKind::neg, 0), UnaryKind::shift, c)));
    else define(0, tensor_value(code == 2 ? unary(x, UnaryKind::scale, c) : unary(x, UnaryKind::shift, c)));
    return;
  }
  // a parameter combined with the data by add, sub or mul has an exact rule
  // (the elementwise one); a divisor, or a parameter combined with a constant, none
  const bool data_a = a.kind == Value::Kind::tensor, data_b = b.kind == Value::Kind::tensor;
  const int x = as_tensor(a, code != 3 && data_b);
  const int y = as_tensor(b, code != 3 && data_a);
  const int slot = new_slot(false, out, "");
  emit(Code::binary, {x, y}, {slot}).ints = {code};
  define(0, tensor_value(slot));
}

void Compiler::op_unary() {
  const std::string& op = node->op;
  const Value& x = in(0);
  if (op == "Neg" && x.kind == Value::Kind::static_ints) {
    Value v = x;
    for (auto& d : v.sints) d = Dim{-d.c, -d.b};
    define(0, v);
    return;
  }
  static const std::unordered_map<std::string, UnaryKind> kinds = {
      {"Relu", UnaryKind::relu}, {"LeakyRelu", UnaryKind::leaky_relu}, {"Tanh", UnaryKind::tanh},
      {"Sigmoid", UnaryKind::sigmoid}, {"Erf", UnaryKind::erf}, {"Sqrt", UnaryKind::sqrt},
      {"Neg", UnaryKind::neg}, {"Exp", UnaryKind::exp}, {"Log", UnaryKind::log}, {"Abs", UnaryKind::abs}};
  only_attributes({"alpha"});
  const int slot = new_slot(false, x.shape, "");
  Instr& i = emit(Code::unary, {as_tensor(x)}, {slot});
  i.ints = {std::int64_t(kinds.at(op))};
  i.reals = {op == "LeakyRelu" ? attr_f("alpha", 0.01) : 0.0};
  define(0, tensor_value(slot));
}

void Compiler::op_pow() {
  double p = 0;
  if (!scalar(in(1), p)) fail("the exponent must be a scalar constant (a tensor exponent is not supported)");
  const Value& x = in(0);
  const int slot = new_slot(false, x.shape, "");
  Instr& i = emit(Code::unary, {as_tensor(x)}, {slot});
  i.ints = {std::int64_t(UnaryKind::pow)};
  i.reals = {p};
  define(0, tensor_value(slot));
}

void Compiler::op_softmax() {
  only_attributes({"axis"});
  const Value& x = in(0);
  const std::size_t a = axis(attr_i("axis", -1), x.shape.size(), "axis");
  const int slot = new_slot(false, x.shape, "");
  emit(Code::softmax, {as_tensor(x)}, {slot}).ints = {std::int64_t(a), node->op == "LogSoftmax"};
  define(0, tensor_value(slot));
}

void Compiler::op_reduce() {
  only_attributes({"axes", "keepdims", "noop_with_empty_axes"});
  const Value& x = in(0);
  std::vector<std::int64_t> raw = has_in(1) ? fixed_ints(in(1), "its axes") : attr_ints("axes");
  const bool keep = attr_i("keepdims", 1) != 0;
  if (raw.empty() && attr_i("noop_with_empty_axes", 0) != 0) {
    define(0, x);
    return;
  }
  std::vector<std::size_t> axes;
  for (auto a : raw) axes.push_back(axis(a, x.shape.size(), "axis"));
  if (axes.empty())
    for (std::size_t i = 0; i < x.shape.size(); ++i) axes.push_back(i);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) fail("an axis is repeated");
  SymShape out;
  for (std::size_t i = 0; i < x.shape.size(); ++i) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), i);
    if (!reduced) out.push_back(x.shape[i]);
    else if (keep) out.push_back(Dim{1, 0});
  }
  const int xs = as_tensor(x);
  // over a batch axis of rows no data fills (ones, a zero state): the result is a function of B alone,
  // whatever the batch size, even 1, at which the tracking sees nothing mixed
  const bool of_batch_size = !prog->slots[std::size_t(xs)].data &&
                             std::any_of(axes.begin(), axes.end(), [&](std::size_t a) { return !x.shape[a].fixed(); });
  const int slot = new_slot(false, out, "");
  Instr& i = emit(Code::reduce, {xs}, {slot});
  i.axes = axes;
  i.ints = {node->op == "ReduceMean", keep, of_batch_size};
  define(0, tensor_value(slot));
}

// ---- handlers: shapes ----

void Compiler::op_reshape() {
  only_attributes({"allowzero"});
  const Value& x = in(0);
  const Value& s = in(1);
  if (s.kind != Value::Kind::static_ints)
    fail("its target shape must be known at load time (a shape computed from the data or from the batch size's "
         "value, such as Equal(B, 256), is not supported)");
  const bool allowzero = attr_i("allowzero", 0) != 0;
  const std::string where = g.path + ": " + node->label();
  SymShape to(s.sints.begin(), s.sints.end());
  int infer = -1;
  for (std::size_t i = 0; i < to.size(); ++i) {
    Dim& d = to[i];
    if (d.fixed() && d.c == 0 && !allowzero) {
      if (i >= x.shape.size()) fail("target dimension " + std::to_string(i) + " copies an input axis that does not exist");
      d = x.shape[i];
    } else if (d.fixed() && d.c == -1) {
      if (infer >= 0) fail("its target shape has two -1 dimensions");
      infer = int(i);
    } else if (d.c < 0 || d.b < 0) {
      fail("its target shape " + sym_str(to) + " has a negative dimension");
    }
  }
  Dim total{1, 0}, known{1, 0};
  for (const auto& d : x.shape) total = dim_mul(total, d, where);
  for (std::size_t i = 0; i < to.size(); ++i)
    if (int(i) != infer) known = dim_mul(known, to[i], where);
  if (infer >= 0) to[std::size_t(infer)] = dim_div(total, known, where);
  Dim check{1, 0};
  for (const auto& d : to) check = dim_mul(check, d, where);
  if (!(check == total)) fail("cannot reshape " + sym_str(x.shape) + " to " + sym_str(to));
  check_size(to, "its output");
  define(0, reshaped(x, to));
}

void Compiler::op_flatten() {
  only_attributes({"axis"});
  const Value& x = in(0);
  const std::int64_t r = std::int64_t(x.shape.size());
  std::int64_t a = attr_i("axis", 1);
  if (a < -r || a > r) fail("axis " + std::to_string(a) + " is out of range");
  if (a < 0) a += r;
  const std::string where = g.path + ": " + node->label();
  Dim lead{1, 0}, rest{1, 0};
  for (std::int64_t i = 0; i < r; ++i) (i < a ? lead : rest) = dim_mul(i < a ? lead : rest, x.shape[std::size_t(i)], where);
  define(0, reshaped(x, {lead, rest}));
}

void Compiler::op_squeeze() {
  const Value& x = in(0);
  std::vector<std::size_t> axes;
  if (has_in(1)) {
    for (auto a : fixed_ints(in(1), "its axes")) axes.push_back(axis(a, x.shape.size(), "axis"));
  } else {
    for (std::size_t i = 0; i < x.shape.size(); ++i)
      if (x.shape[i] == Dim{1, 0}) axes.push_back(i);
  }
  SymShape to;
  for (std::size_t i = 0; i < x.shape.size(); ++i) {
    const bool drop = std::find(axes.begin(), axes.end(), i) != axes.end();
    if (drop && !(x.shape[i] == Dim{1, 0})) fail("axis " + std::to_string(i) + " of " + sym_str(x.shape) + " is not 1");
    if (!drop) to.push_back(x.shape[i]);
  }
  define(0, reshaped(x, to));
}

void Compiler::op_unsqueeze() {
  const Value& x = in(0);
  const auto raw = fixed_ints(in(1), "its axes");
  const std::size_t rank = x.shape.size() + raw.size();
  std::vector<std::size_t> axes;
  for (auto a : raw) axes.push_back(axis(a, rank, "axis"));
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) fail("an axis is repeated");
  SymShape to;
  for (std::size_t i = 0, k = 0; i < rank; ++i)
    to.push_back(std::binary_search(axes.begin(), axes.end(), i) ? Dim{1, 0} : x.shape[k++]);
  define(0, reshaped(x, to));
}

void Compiler::op_transpose() {
  only_attributes({"perm"});
  const Value& x = in(0);
  const std::size_t r = x.shape.size();
  std::vector<std::int64_t> raw = attr_ints("perm");
  if (raw.empty())
    for (std::size_t i = r; i-- > 0;) raw.push_back(std::int64_t(i));
  if (raw.size() != r) fail("perm has " + std::to_string(raw.size()) + " axes for rank " + std::to_string(r));
  std::vector<std::size_t> perm;
  for (auto a : raw) perm.push_back(axis(a, r, "perm axis"));
  std::vector<std::size_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < r; ++i)
    if (sorted[i] != i) fail("perm is not a permutation");
  SymShape out;
  for (auto p : perm) out.push_back(x.shape[p]);
  Value v = x;
  v.shape = out;
  switch (x.kind) {
    case Value::Kind::static_ints: v.sints = permute(x.sints, fixed_shape(x.shape), perm); break;
    case Value::Kind::const_float: v.cf = std::make_shared<const ArrayT<double>>(xt::transpose(*x.cf, perm)); break;
    case Value::Kind::param:
      if (r == 2 && perm[0] == 1) {  // a weight's transpose: a view the next op reads in its own layout
        v.transposed = !x.transposed;
        break;
      }
      [[fallthrough]];
    default: {
      const bool ints = x.kind == Value::Kind::ints;
      const int slot = new_slot(ints, out, "");
      emit(Code::transpose, {ints ? x.slot : as_tensor(x)}, {slot}).axes = perm;
      v = ints ? ints_value(slot) : tensor_value(slot);
    }
  }
  define(0, v);
}

void Compiler::op_concat() {
  only_attributes({"axis"});
  std::vector<const Value*> xs;
  for (std::size_t i = 0; i < node->inputs.size(); ++i)
    if (has_in(i)) xs.push_back(&in(i));
  if (xs.empty()) fail("has no inputs");
  const std::size_t r = xs[0]->shape.size();
  const std::size_t a = axis(attr_i("axis", 0), r, "axis");
  SymShape out = xs[0]->shape;
  out[a] = Dim{0, 0};
  for (const Value* x : xs) {
    if (x->shape.size() != r) fail("inputs of different ranks");
    for (std::size_t i = 0; i < r; ++i)
      if (i != a && !(x->shape[i] == out[i])) fail("shapes " + sym_str(xs[0]->shape) + " and " + sym_str(x->shape) + " differ off the axis");
    out[a] = dim_add(out[a], x->shape[a]);
  }
  const bool all_static = std::all_of(xs.begin(), xs.end(), [](const Value* x) { return x->kind == Value::Kind::static_ints; });
  if (all_static) {
    if (!all_fixed(out)) fail("joins batch-dependent shapes of integers");
    check_fold(out, sizeof(Dim));
    Value v;
    v.kind = Value::Kind::static_ints;
    v.shape = out;
    const Shape so = fixed_shape(out);
    std::size_t outer = 1;
    for (std::size_t i = 0; i < a; ++i) outer *= so[i];
    for (std::size_t o = 0; o < outer; ++o)
      for (const Value* x : xs) {
        const Shape sx = fixed_shape(x->shape);
        const std::size_t run = numel(sx) / std::max<std::size_t>(1, outer);
        v.sints.insert(v.sints.end(), x->sints.begin() + std::ptrdiff_t(o * run), x->sints.begin() + std::ptrdiff_t((o + 1) * run));
      }
    define(0, v);
    return;
  }
  const bool ints = std::none_of(xs.begin(), xs.end(), [](const Value* x) { return x->is_float(); });
  std::vector<int> slots;
  for (const Value* x : xs) slots.push_back(ints ? as_ints(*x) : as_tensor(*x));
  const int slot = new_slot(ints, out, "");
  emit(Code::concat, slots, {slot}).ints = {std::int64_t(a)};
  define(0, ints ? ints_value(slot) : tensor_value(slot));
}

void Compiler::op_slice() {
  const Value& x = in(0);
  const auto starts = fixed_ints(in(1), "its starts"), ends = fixed_ints(in(2), "its ends");
  auto axes_raw = has_in(3) ? fixed_ints(in(3), "its axes") : std::vector<std::int64_t>{};
  const auto steps = has_in(4) ? fixed_ints(in(4), "its steps") : std::vector<std::int64_t>{};
  if (starts.size() != ends.size()) fail("starts and ends differ in length");
  if (axes_raw.empty())
    for (std::size_t i = 0; i < starts.size(); ++i) axes_raw.push_back(std::int64_t(i));
  if (axes_raw.size() != starts.size() || (!steps.empty() && steps.size() != starts.size()))
    fail("starts, ends, axes and steps differ in length");
  for (auto s : steps)
    if (s != 1) fail("step " + std::to_string(s) + " is not supported (steps of 1 only)");
  SymShape out = x.shape;
  std::vector<std::size_t> axes;
  std::vector<std::int64_t> begin_end;
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const std::size_t a = axis(axes_raw[k], x.shape.size(), "axis");
    const Dim d = x.shape[a];
    if (!d.fixed()) {  // along a batch-dependent axis: only the whole axis
      if (starts[k] != 0 || ends[k] < std::numeric_limits<std::int32_t>::max())
        fail("slices axis " + std::to_string(a) + " of " + sym_str(x.shape) + ", which grows with the batch");
      continue;
    }
    auto clamp = [&](std::int64_t v) {
      if (v < 0) v += d.c;
      return std::clamp<std::int64_t>(v, 0, d.c);
    };
    const std::int64_t b = clamp(starts[k]), e = std::max(b, clamp(ends[k]));
    out[a] = Dim{e - b, 0};
    axes.push_back(a);
    begin_end.push_back(b);
    begin_end.push_back(e);
  }
  if (axes.empty()) {
    define(0, x);
    return;
  }
  if (x.kind == Value::Kind::static_ints || x.kind == Value::Kind::const_float) {
    Shape s = fixed_shape(x.shape);
    std::vector<Dim> vi = x.sints;
    std::vector<double> vf;
    if (x.kind == Value::Kind::const_float) vf.assign(x.cf->begin(), x.cf->end());
    for (std::size_t k = 0; k < axes.size(); ++k) {
      std::vector<std::size_t> index;
      for (auto i = begin_end[2 * k]; i < begin_end[2 * k + 1]; ++i) index.push_back(std::size_t(i));
      if (x.kind == Value::Kind::static_ints) vi = take_along(vi, s, axes[k], index);
      else vf = take_along(vf, s, axes[k], index);
      s[axes[k]] = index.size();
    }
    Value v = x;
    v.shape = out;
    if (x.kind == Value::Kind::static_ints) v.sints = vi;
    else {
      ArrayT<double> a = ArrayT<double>::from_shape(s);
      std::copy(vf.begin(), vf.end(), a.begin());
      v.cf = std::make_shared<const ArrayT<double>>(std::move(a));
    }
    define(0, v);
    return;
  }
  const bool ints = x.kind == Value::Kind::ints;
  const int slot = new_slot(ints, out, "");
  Instr& i = emit(Code::slice, {ints ? x.slot : as_tensor(x)}, {slot});
  i.axes = axes;
  i.ints = begin_end;
  define(0, ints ? ints_value(slot) : tensor_value(slot));
}

void Compiler::op_gather() {
  only_attributes({"axis"});
  const Value &x = in(0), &ids = in(1);
  const std::size_t a = axis(attr_i("axis", 0), x.shape.size(), "axis");
  SymShape out(x.shape.begin(), x.shape.begin() + std::ptrdiff_t(a));
  out.insert(out.end(), ids.shape.begin(), ids.shape.end());
  out.insert(out.end(), x.shape.begin() + std::ptrdiff_t(a) + 1, x.shape.end());
  if (ids.kind == Value::Kind::static_ints) {
    const Dim d = x.shape[a];
    if (!d.fixed()) fail("gathers along axis " + std::to_string(a) + ", which grows with the batch");
    std::vector<std::size_t> index;
    for (auto i : fixed_ints(ids, "its indices")) {
      if (i < -d.c || i >= d.c) fail("index " + std::to_string(i) + " is out of range for axis of " + std::to_string(d.c));
      index.push_back(std::size_t(i < 0 ? i + d.c : i));
    }
    if (x.kind == Value::Kind::static_ints) {
      check_fold(out, sizeof(Dim));
      Value v = x;
      v.shape = out;
      v.sints = take_along(x.sints, fixed_shape(x.shape), a, index);
      define(0, v);
      return;
    }
    if (x.kind == Value::Kind::param && a == 0 && x.shape.size() == 2 && !x.transposed) {
      // a table read at constant rows (positions): no exact rule (the rows are no sample's)
      const int table = as_tensor(x, true);
      for (std::size_t p = 0; p < prog->params.size(); ++p)
        if (prog->params[p].initializer == x.init) inexact(int(p), "is read by a Gather at constant indices, which no per-sample rule covers");
      const int slot = new_slot(false, out, "");
      emit(Code::embedding, {table, as_ints(ids)}, {slot});
      define(0, tensor_value(slot));
      return;
    }
    if (ids.shape.size() > 1) fail("indices of rank " + std::to_string(ids.shape.size()) + " on computed data are not supported");
    const bool ints = x.kind == Value::Kind::ints;
    const int slot = new_slot(ints, out, "");
    Instr& i = emit(Code::take, {ints ? x.slot : as_tensor(x)}, {slot});
    i.ints = {std::int64_t(a), ids.shape.empty()};
    for (auto k : index) i.ints.push_back(std::int64_t(k));
    define(0, ints ? ints_value(slot) : tensor_value(slot));
    return;
  }
  if (ids.kind != Value::Kind::ints) fail("its indices must be integers");
  if (a != 0 || x.shape.size() != 2 || !(x.kind == Value::Kind::param || x.kind == Value::Kind::const_float))
    fail("gathers a computed tensor at data-dependent indices; only an embedding (a 2-D table, axis 0) is supported");
  const int table = x.kind == Value::Kind::param && x.transposed ? as_tensor(x, false) : as_tensor(x, true);
  const int slot = new_slot(false, out, "");
  emit(Code::embedding, {table, ids.slot}, {slot});
  define(0, tensor_value(slot));
}

void Compiler::op_expand() {
  const Value& x = in(0);
  const Value& s = in(1);
  if (s.kind != Value::Kind::static_ints) fail("its shape must be known at load time");
  const SymShape target(s.sints.begin(), s.sints.end());
  const SymShape out = broadcast(x.shape, target);
  check_size(out, "its output");
  if (x.kind == Value::Kind::static_ints) {
    if (!all_fixed(out)) fail("expands integers to a batch-dependent shape");
    check_fold(out, sizeof(Dim));
    Value v = x;
    v.shape = out;
    const std::vector<Dim> zero(1, Dim{0, 0});
    v.sints = broadcast_apply(x.sints, fixed_shape(x.shape), zero, Shape{}, fixed_shape(out),
                              [](Dim a, Dim) { return a; });
    define(0, v);
    return;
  }
  const bool ints = x.kind == Value::Kind::ints;
  const int slot = new_slot(ints, out, "");
  emit(Code::expand, {ints ? x.slot : as_tensor(x)}, {slot}).shape0 = out;
  define(0, ints ? ints_value(slot) : tensor_value(slot));
}

void Compiler::op_pad() {
  only_attributes({"mode"});
  if (attr_s("mode", "constant") != "constant") fail("mode '" + attr_s("mode", "") + "' is not supported (constant only)");
  const Value& x = in(0);
  const auto pads = fixed_ints(in(1), "its pads");
  const std::size_t r = x.shape.size();
  if (pads.size() != 2 * r) fail("needs " + std::to_string(2 * r) + " pads, has " + std::to_string(pads.size()));
  if (has_in(3)) fail("input 'axes' is not supported");
  double value = 0;
  if (has_in(2) && !scalar(in(2), value)) fail("its constant value must be a scalar constant");
  SymShape out = x.shape;
  bool any = false;
  for (std::size_t i = 0; i < r; ++i) {
    if (pads[i] < 0 || pads[i + r] < 0) fail("negative pads (cropping) are not supported");
    if ((pads[i] || pads[i + r]) && !x.shape[i].fixed()) fail("pads axis " + std::to_string(i) + ", which grows with the batch");
    out[i] = dim_add(out[i], Dim{pads[i] + pads[i + r], 0});
    any = any || pads[i] || pads[i + r];
  }
  if (!any) {
    define(0, x);
    return;
  }
  const int slot = new_slot(false, out, "");
  Instr& i = emit(Code::pad, {as_tensor(x)}, {slot});
  i.ints = pads;
  i.reals = {value};
  define(0, tensor_value(slot));
}

void Compiler::op_dropout() {
  only_attributes({"seed"});
  if (needed(1)) fail("its mask output is not supported");
  double ratio = 0.5;
  if (has_in(1) && !scalar(in(1), ratio)) fail("its ratio must be a scalar constant");
  if (!(ratio >= 0 && ratio < 1)) fail("ratio " + std::to_string(ratio) + " is outside [0, 1)");
  const Value& x = in(0);
  if (ratio == 0) {
    define(0, x);
    return;
  }
  const int slot = new_slot(false, x.shape, "");
  emit(Code::dropout, {as_tensor(x)}, {slot}).reals = {ratio};
  define(0, tensor_value(slot));
}

std::shared_ptr<Program> compile(const Graph& graph, const LoadOptions& options) {
  Compiler c(graph, options);
  return c.run();
}

}  // namespace dpgrad::onnx::detail
