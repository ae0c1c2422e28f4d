// OnnxModelT: a compiled ONNX graph run with engine ops on the tape, like any
// hand-written layer (onnx/program.hpp). A value may be held transposed: images
// stay channels-last between convolutions and pooling, and a Transpose costs
// nothing until an op needs the ONNX layout (docs/onnx.md).
#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <numeric>
#include <stdexcept>
#include <string>

#include "engine/conv.hpp"
#include "engine/ops.hpp"
#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "layers/dropout.hpp"
#include "layers/norm.hpp"
#include "onnx/program.hpp"

namespace dpgrad::onnx {

namespace detail {

using Perm = std::vector<std::size_t>;

/// An allocation failure in a forward pass, naming the model's file.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

template <class T>
struct Runtime {
  std::vector<TensorT<T>> params;     // every parameter: trainable ones, and frozen ones as constants
  std::vector<TensorT<T>> trainable;  // the trainable ones, in order
  std::vector<TensorT<T>> constants;  // per instruction (Code::constant), else undefined
  FastRng dropout{0};
};

namespace {

/// A value during one forward pass: a float tensor held in some layout (the
/// ONNX value is transpose(t, perm)), or integers with their samples.
template <class T>
struct Held {
  TensorT<T> t;
  Perm perm;  // empty: t is the value itself
  TensorT<T> logical_cache;
  ArrayT<std::int64_t> ints;
  Samples samples;
};

bool is_identity(const Perm& p) {
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i] != i) return false;
  return true;
}

Perm inverse(const Perm& p) {
  Perm r(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) r[p[i]] = i;
  return r;
}

/// A constant leaf holding `value` with the given samples (a constant's
/// elements depend on no example, so any labelling is sound: the label says
/// which example's rows they stand beside).
template <class T>
TensorT<T> labelled_constant(ArrayT<T> value, const Samples& s) {
  TensorT<T> t(std::move(value), false);
  t.node()->samples = s;
  return t;
}

template <class T>
class Executor {
 public:
  Executor(const Program& p, Runtime<T>& rt, const BatchT<T>& batch, bool training, const std::string& model)
      : p_(p), rt_(rt), batch_(batch), training_(training), model_(model), env_(p.slots.size()) {}

  TensorT<T> run() {
    for (std::size_t k = 0; k < p_.instrs.size(); ++k) {
      instr_ = &p_.instrs[k];
      const bool mixed_before = std::any_of(instr_->in.begin(), instr_->in.end(), [&](int s) {
        return s >= 0 && samples_at(s).kind == Samples::Kind::mixed;
      });
      try {
        exec(k);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(model_ + ": " + instr_->node + ": " + e.what());
      }
      for (int s : instr_->out)
        if (s >= 0) name_samples(s, mixed_before);
    }
    return logical(p_.output_slot);
  }

 private:
  const Program& p_;
  Runtime<T>& rt_;
  const BatchT<T>& batch_;
  bool training_;
  std::string model_;
  std::vector<Held<T>> env_;
  std::size_t b_ = 0;
  const Instr* instr_ = nullptr;

  Held<T>& at(int slot) { return env_[std::size_t(slot)]; }
  bool prog_slot_ints(int slot) const { return p_.slots[std::size_t(slot)].ints; }
  /// Where the slot's samples are (kept on the node for a float tensor).
  Samples& samples_at(int slot) {
    Held<T>& h = at(slot);
    if (prog_slot_ints(slot) || !h.t.defined()) return h.samples;
    return h.t.node()->samples;
  }
  /// After an instruction: samples it mixed get its node named (and the batch
  /// size as the reason when no input holds data); a tensor the batch size
  /// shapes that still holds no samples is mixed by the batch size, as nothing
  /// says how its rows line up with the samples (docs/per-sample.md).
  void name_samples(int slot, bool mixed_before) {
    Samples& s = samples_at(slot);
    for (int in : instr_->in)  // passed through: an input's (perhaps a constant's), not this instruction's
      if (in >= 0 && &samples_at(in) == &s) return;
    const Slot& info = p_.slots[std::size_t(slot)];
    if (s.kind == Samples::Kind::mixed && !mixed_before && !(s.by && !s.by->node.empty()))
      s = named_mixing(s, instr_->node, info.data);
    else if (s.is_none() && std::any_of(info.shape.begin(), info.shape.end(), [](Dim d) { return !d.fixed(); }))
      s = Samples::batch_size(instr_->node, "holds a tensor of shape " + sym_str(info.shape) +
                                                " that no sample's data fills, its rows in no known order");
  }
  void set(int slot, TensorT<T> t, Perm perm = {}) {
    if (slot < 0) return;
    Held<T>& h = at(slot);
    h = Held<T>{};
    h.t = std::move(t);
    if (!is_identity(perm)) h.perm = std::move(perm);
  }
  void set_ints(int slot, ArrayT<std::int64_t> v, Samples s) {
    Held<T>& h = at(slot);
    h = Held<T>{};
    h.ints = std::move(v);
    h.samples = s;
  }
  /// The value in the ONNX layout.
  TensorT<T> logical(int slot) {
    Held<T>& h = at(slot);
    if (h.perm.empty()) return h.t;
    if (!h.logical_cache.defined()) h.logical_cache = relayout(h.t, h.perm);
    return h.logical_cache;
  }
  /// How the value's axes are held (the identity when it is held as is).
  Perm perm_of(int slot) {
    Held<T>& h = at(slot);
    if (!h.perm.empty()) return h.perm;
    Perm id(h.t.dim());
    std::iota(id.begin(), id.end(), std::size_t(0));
    return id;
  }
  /// transpose(t, r), or a reshape when r moves only axes of length 1.
  static TensorT<T> relayout(const TensorT<T>& t, const Perm& r) {
    if (is_identity(r)) return t;
    const Shape s = t.shape();
    Shape to;
    for (auto a : r) to.push_back(s[a]);
    Perm moved;
    for (auto a : r)
      if (s[a] != 1) moved.push_back(a);
    if (std::is_sorted(moved.begin(), moved.end())) return reshape(t, to);
    return transpose(t, r);
  }
  /// The value held so that value = transpose(result, q).
  TensorT<T> physical_as(int slot, const Perm& q) {
    const Perm p = perm_of(slot);
    const Perm qi = inverse(q);
    Perm r(q.size());
    for (std::size_t j = 0; j < q.size(); ++j) r[j] = p[qi[j]];
    return relayout(at(slot).t, r);
  }
  TensorT<T> in(std::size_t i) { return logical(instr_->in[i]); }
  bool has(std::size_t i) const { return i < instr_->in.size() && instr_->in[i] >= 0; }
  Shape shape0() const { return concrete(instr_->shape0, b_); }

  static TensorT<T> constant_of(const ArrayT<double>& a) { return constant<T>(ArrayT<T>(xt::cast<T>(a))); }

  void exec(std::size_t k);
  void exec_int(const Instr& i);
  void embedding(const Instr& i);
  void recurrent(const Instr& i, bool lstm);
  void where(const Instr& i);
};

/// Binary op on tensors a and b (numpy broadcasting), by kind.
template <class T>
TensorT<T> binary_op(BinaryKind k, const TensorT<T>& a, const TensorT<T>& b) {
  switch (k) {
    case BinaryKind::add: return add(a, b);
    case BinaryKind::sub: return sub(a, b);
    case BinaryKind::mul: return mul(a, b);
    case BinaryKind::div: return div(a, b);
  }
  throw std::logic_error("onnx: unknown binary kind");
}

template <class T>
TensorT<T> unary_op(UnaryKind k, const TensorT<T>& x, double c) {
  switch (k) {
    case UnaryKind::identity: return x;
    case UnaryKind::relu: return relu(x);
    case UnaryKind::leaky_relu: return leaky_relu(x, T(c));
    case UnaryKind::tanh: return tanh(x);
    case UnaryKind::sigmoid: return sigmoid(x);
    case UnaryKind::erf: return erf(x);
    case UnaryKind::sqrt: return sqrt(x);
    case UnaryKind::neg: return scale(x, T(-1));
    case UnaryKind::exp: return exp(x);
    case UnaryKind::log: return log(x);
    case UnaryKind::abs: return abs(x);
    case UnaryKind::pow: return pow(x, T(c));
    case UnaryKind::gelu: return gelu(x);
    case UnaryKind::scale: return scale(x, T(c));
    case UnaryKind::shift: return add_scalar(x, T(c));
  }
  throw std::logic_error("onnx: unknown unary kind");
}

/// x broadcast to `shape` (numpy rules): x + 0.
template <class T>
TensorT<T> broadcast_to(const TensorT<T>& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return add(x, constant<T>(xt::zeros<T>(shape)));
}

/// A copy of ints broadcast to `shape`.
ArrayT<std::int64_t> broadcast_ints(const ArrayT<std::int64_t>& a, const Shape& shape) {
  if (shape_of(a) == shape) return a;
  return xt::broadcast(a, shape);
}

template <class T>
void Executor<T>::exec(std::size_t k) {
  const Instr& i = *instr_;
  switch (i.code) {
    case Code::input_features: {
      const Shape s = shape_of(batch_.inputs);
      Shape want{s.empty() ? 0 : s[0]};
      want.insert(want.end(), p_.input.sample_shape.begin(), p_.input.sample_shape.end());
      if (batch_.inputs.dimension() == 0 || s != want)
        throw std::invalid_argument("the batch's inputs have shape " + shape_str(s) + "; the model reads (batch" +
                                    [&] {
                                      std::string r;
                                      for (auto d : p_.input.sample_shape) r += ", " + std::to_string(d);
                                      return r;
                                    }() + ")");
      b_ = s[0];
      set(i.out[0], per_sample_input(batch_.inputs));
      return;
    }
    case Code::input_tokens: {
      const Shape s = shape_of(batch_.tokens);
      if (s.size() != 2 || s[1] != p_.input.sample_shape[0])
        throw std::invalid_argument("the batch's token ids have shape " + shape_str(s) + "; the model reads (batch, " +
                                    std::to_string(p_.input.sample_shape[0]) + ")");
      b_ = s[0];
      set_ints(i.out[0], ArrayT<std::int64_t>(xt::cast<std::int64_t>(batch_.tokens)), Samples::at(0, b_));
      return;
    }
    case Code::constant: set(i.out[0], rt_.constants[k]); return;
    case Code::param: set(i.out[0], rt_.params[std::size_t(i.param)]); return;
    case Code::fill: {
      ArrayT<T> a = ArrayT<T>::from_shape(shape0());
      a.fill(T(i.reals[0]));
      set(i.out[0], labelled_constant<T>(std::move(a), filled_samples(i.shape0, b_, i.node)));
      return;
    }
    case Code::unary: {
      Held<T>& h = at(i.in[0]);
      set(i.out[0], unary_op(UnaryKind(i.ints[0]), h.t, i.reals.empty() ? 0.0 : i.reals[0]), h.perm);
      return;
    }
    case Code::binary: {
      Held<T>& a = at(i.in[0]);
      Held<T>& b = at(i.in[1]);
      const auto kind = BinaryKind(i.ints[0]);
      // held alike, or against a scalar: elementwise on what is held
      if (!a.perm.empty() && (a.perm == b.perm ? a.t.shape() == b.t.shape() : b.t.size() == 1 && b.perm.empty())) {
        set(i.out[0], binary_op(kind, a.t, b.t), a.perm);
        return;
      }
      if (!b.perm.empty() && a.t.size() == 1 && a.perm.empty()) {
        set(i.out[0], binary_op(kind, a.t, b.t), b.perm);
        return;
      }
      set(i.out[0], binary_op(kind, in(0), in(1)));
      return;
    }
    case Code::where: where(i); return;
    case Code::dropout: {
      Held<T>& h = at(i.in[0]);
      if (!training_) {
        set(i.out[0], h.t, h.perm);
        return;
      }
      // keyed per record in a private run, from the held layout's samples (layers/dropout.hpp)
      set(i.out[0], mul(h.t, constant<T>(dropout_mask(h.t, i.reals[0], rt_.dropout))), h.perm);
      return;
    }
    case Code::linear: set(i.out[0], linear(in(0), in(1), has(2) ? in(2) : TensorT<T>())); return;
    case Code::matmul: {
      TensorT<T> a = in(0);
      const Perm pb = perm_of(i.in[1]);
      const std::size_t r = pb.size();
      Perm swapped(r);
      std::iota(swapped.begin(), swapped.end(), std::size_t(0));
      if (r >= 2) std::swap(swapped[r - 2], swapped[r - 1]);
      bool tb = r >= 2 && pb == swapped;  // b held as its last two axes swapped: b^T is what is held
      TensorT<T> b = tb ? at(i.in[1]).t : in(1);
      const Shape sa = a.shape(), sb = b.shape();
      Shape la(sa.begin(), sa.end() - 2), lb(sb.begin(), sb.end() - 2);
      if (la != lb) {  // numpy broadcasting of the leading axes
        Shape lead(std::max(la.size(), lb.size()), 1);
        for (std::size_t j = 0; j < lead.size(); ++j) {
          const std::size_t da = j + la.size() < lead.size() ? 1 : la[j + la.size() - lead.size()];
          const std::size_t db = j + lb.size() < lead.size() ? 1 : lb[j + lb.size() - lead.size()];
          lead[j] = da == 1 ? db : da;
        }
        Shape fa = lead, fb = lead;
        fa.insert(fa.end(), sa.end() - 2, sa.end());
        fb.insert(fb.end(), sb.end() - 2, sb.end());
        a = broadcast_to(a, fa);
        b = broadcast_to(b, fb);
      }
      set(i.out[0], matmul(a, b, tb));
      return;
    }
    case Code::conv: {
      const Perm nhwc{0, 3, 1, 2};
      const TensorT<T> x = physical_as(i.in[0], nhwc);
      const auto& v = i.ints;
      const Pad2d pad{std::size_t(v[4]), std::size_t(v[5]), std::size_t(v[6]), std::size_t(v[7])};
      set(i.out[0], conv2d(x, in(1), has(2) ? in(2) : TensorT<T>(), std::size_t(v[0]), std::size_t(v[1]),
                           std::size_t(v[2]), std::size_t(v[3]), pad),
          nhwc);
      return;
    }
    case Code::max_pool:
    case Code::avg_pool: {
      const Perm nhwc{0, 3, 1, 2};
      TensorT<T> x = physical_as(i.in[0], nhwc);
      const auto& v = i.ints;
      const auto u = [&](std::size_t j) { return std::size_t(v[j]); };
      if (i.code == Code::max_pool) {
        if (u(4) || u(5) || u(6) || u(7))
          x = pad(x, {0, u(4), u(6), 0}, {0, u(5), u(7), 0}, -std::numeric_limits<T>::infinity());
        set(i.out[0], max_pool2d(x, u(0), u(1), u(2), u(3)), nhwc);
      } else {
        set(i.out[0], avg_pool2d(x, u(0), u(1), u(2), u(3), Pad2d{u(4), u(5), u(6), u(7)}, v[8] != 0), nhwc);
      }
      return;
    }
    case Code::batch_norm: {
      const std::size_t r = at(i.in[0]).t.dim();
      Perm last{0, r - 1};  // channels last: the parameters (C) broadcast over the rest
      for (std::size_t a = 1; a + 1 < r; ++a) last.push_back(a);
      const TensorT<T> x = physical_as(i.in[0], last);
      const double eps = i.reals[0];
      ArrayT<T> a = ArrayT<T>::from_shape({i.data->size()}), c = ArrayT<T>::from_shape({i.data->size()});
      for (std::size_t j = 0; j < a.size(); ++j) {
        const double inv = 1.0 / std::sqrt(i.data2->data()[j] + eps);
        a(j) = T(inv);
        c(j) = T(-i.data->data()[j] * inv);
      }
      const TensorT<T> xhat = add(mul(x, constant<T>(std::move(a))), constant<T>(std::move(c)));
      set(i.out[0], add(mul(xhat, in(1)), in(2)), last);
      return;
    }
    case Code::layer_norm: {
      const TensorT<T> x = in(0);
      std::vector<std::size_t> axes;
      for (std::size_t a = std::size_t(i.ints[0]); a < x.dim(); ++a) axes.push_back(a);
      TensorT<T> y = normalise(x, axes, i.reals[0]);
      if (has(1)) y = mul(y, in(1));
      if (has(2)) y = add(y, in(2));
      set(i.out[0], y);
      return;
    }
    case Code::reduce: {
      const Perm p = perm_of(i.in[0]);
      std::vector<std::size_t> axes;
      for (auto a : i.axes) axes.push_back(p[a]);
      std::sort(axes.begin(), axes.end());
      const bool keep = i.ints[1] != 0;
      const TensorT<T>& x = at(i.in[0]).t;
      TensorT<T> y = i.ints[0] ? mean(x, axes, keep) : sum(x, axes, keep);
      Perm out;
      if (keep) {
        out = p;
      } else {
        for (std::size_t a = 0; a < p.size(); ++a) {
          if (std::find(i.axes.begin(), i.axes.end(), a) != i.axes.end()) continue;
          out.push_back(p[a] - std::size_t(std::count_if(axes.begin(), axes.end(), [&](std::size_t q) { return q < p[a]; })));
        }
      }
      if (i.ints.size() > 2 && i.ints[2])
        y.node()->samples = Samples::batch_size(i.node, "reduces over rows that only the batch size made: "
                                                        "its value is a function of the batch size");
      set(i.out[0], y, out);
      return;
    }
    case Code::softmax: {
      Held<T>& h = at(i.in[0]);
      const std::size_t a = perm_of(i.in[0])[std::size_t(i.ints[0])];
      set(i.out[0], i.ints[1] ? log_softmax(h.t, a) : softmax(h.t, a), h.perm);
      return;
    }
    case Code::transpose:
      if (prog_slot_ints(i.in[0])) break;
      {
        const Perm p = perm_of(i.in[0]);
        Perm out;
        for (auto a : i.axes) out.push_back(p[a]);
        set(i.out[0], at(i.in[0]).t, out);
      }
      return;
    case Code::reshape:
      if (prog_slot_ints(i.in[0])) break;
      set(i.out[0], reshape(in(0), shape0()));
      return;
    case Code::slice:
      if (prog_slot_ints(i.in[0])) break;
      {
        Held<T>& h = at(i.in[0]);
        const Perm p = perm_of(i.in[0]);
        TensorT<T> t = h.t;
        for (std::size_t j = 0; j < i.axes.size(); ++j)
          t = slice(t, p[i.axes[j]], std::size_t(i.ints[2 * j]), std::size_t(i.ints[2 * j + 1]));
        set(i.out[0], t, h.perm);
      }
      return;
    case Code::concat:
      if (prog_slot_ints(i.in[0])) break;
      {
        const std::size_t a = std::size_t(i.ints[0]);
        const Perm p0 = at(i.in[0]).perm;
        bool alike = !p0.empty();
        for (int s : i.in) alike = alike && at(s).perm == p0;
        std::vector<TensorT<T>> xs;
        for (std::size_t j = 0; j < i.in.size(); ++j) xs.push_back(alike ? at(i.in[j]).t : in(j));
        if (alike) set(i.out[0], concat(xs, p0[a]), p0);
        else set(i.out[0], concat(xs, a));
      }
      return;
    case Code::pad: {
      Held<T>& h = at(i.in[0]);
      const Perm p = perm_of(i.in[0]);
      const std::size_t r = p.size();
      std::vector<std::size_t> before(r), after(r);
      for (std::size_t a = 0; a < r; ++a) {
        before[p[a]] = std::size_t(i.ints[a]);
        after[p[a]] = std::size_t(i.ints[a + r]);
      }
      set(i.out[0], pad(h.t, before, after, T(i.reals[0])), h.perm);
      return;
    }
    case Code::expand:
      if (prog_slot_ints(i.in[0])) break;
      {
        const TensorT<T> x = in(0);
        const Samples s = x.samples().is_none() ? filled_samples(i.shape0, b_, i.node) : Samples::none();
        if (s.is_none()) set(i.out[0], broadcast_to(x, shape0()));
        else set(i.out[0], add(x, labelled_constant<T>(xt::zeros<T>(shape0()), s)));  // its copies along the batch axis
      }
      return;
    case Code::take:
      if (prog_slot_ints(i.in[0])) break;
      {
        Held<T>& h = at(i.in[0]);
        const Perm p = perm_of(i.in[0]);
        const std::size_t a = p[std::size_t(i.ints[0])];
        std::vector<TensorT<T>> parts;
        for (std::size_t j = 2; j < i.ints.size(); ++j)
          parts.push_back(slice(h.t, a, std::size_t(i.ints[j]), std::size_t(i.ints[j]) + 1));
        TensorT<T> t = parts.size() == 1 ? parts[0] : concat(parts, a);
        Perm out = p;
        if (i.ints[1]) {  // a scalar index drops the axis
          Shape s = t.shape();
          s.erase(s.begin() + std::ptrdiff_t(a));
          t = reshape(t, s);
          out.clear();
          for (std::size_t q = 0; q < p.size(); ++q)
            if (q != std::size_t(i.ints[0])) out.push_back(p[q] - (p[q] > a));
        }
        set(i.out[0], t, out);
      }
      return;
    case Code::to_float: {
      const Held<T>& h = at(i.in[0]);
      set(i.out[0], labelled_constant<T>(ArrayT<T>(xt::cast<T>(h.ints)), h.samples));
      return;
    }
    case Code::embedding: embedding(i); return;
    case Code::lstm: recurrent(i, true); return;
    case Code::gru: recurrent(i, false); return;
    default: break;
  }
  exec_int(i);
}

template <class T>
void Executor<T>::exec_int(const Instr& i) {
  using I = ArrayT<std::int64_t>;
  auto held = [&](std::size_t j) -> Held<T>& { return at(i.in[j]); };
  auto samples_of = [&](std::initializer_list<std::size_t> js, const Shape& out) {
    std::vector<Samples> ss;
    std::vector<Shape> shapes;
    for (auto j : js) {
      ss.push_back(held(j).samples);
      shapes.push_back(shape_of(held(j).ints));
    }
    return samples_broadcast(ss, shapes, out);
  };
  switch (i.code) {
    case Code::int_constant: {
      I a = I::from_shape(shape0());
      bool batch = false;
      for (std::size_t e = 0; e < a.size(); ++e) {
        a.data()[e] = i.dims[e].at(b_);
        batch = batch || !i.dims[e].fixed();
      }
      set_ints(i.out[0], std::move(a),
               batch ? Samples::batch_size(i.node, "reads the batch size as a value (a shape or size read as data)")
                     : Samples::none());
      return;
    }
    case Code::int_fill: {
      I a = I::from_shape(shape0());
      a.fill(i.ints[0]);
      set_ints(i.out[0], std::move(a), filled_samples(i.shape0, b_, i.node));
      return;
    }
    case Code::range: {
      I a = I::from_shape(shape0());
      const std::int64_t start = i.dims[0].at(b_);
      for (std::size_t e = 0; e < a.size(); ++e) a.data()[e] = start + std::int64_t(e) * i.ints[0];
      set_ints(i.out[0], std::move(a),
               Samples::batch_size(i.node, "numbers rows up to the batch size: each value is a position in the "
                                           "batch, not one sample's"));
      return;
    }
    case Code::int_unary: {
      I a = held(0).ints;
      for (auto& v : a) v = i.ints[0] == 0 ? std::int64_t(v == 0) : i.ints[0] == 1 ? -v : std::int64_t(v != 0);
      set_ints(i.out[0], std::move(a), held(0).samples);
      return;
    }
    case Code::int_binary: {
      const Shape out = concrete(p_.slots[std::size_t(i.out[0])].shape, b_);
      const I a = broadcast_ints(held(0).ints, out), b = broadcast_ints(held(1).ints, out);
      I r = I::from_shape(out);
      for (std::size_t e = 0; e < r.size(); ++e) {
        const std::int64_t x = a.data()[e], y = b.data()[e];
        switch (i.ints[0]) {
          case 0: r.data()[e] = x + y; break;
          case 1: r.data()[e] = x - y; break;
          case 2: r.data()[e] = x * y; break;
          case 3:
            if (y == 0) throw std::invalid_argument("integer division by zero");
            r.data()[e] = x / y;
            break;
          case 4: r.data()[e] = x == y; break;
          case 5: r.data()[e] = (x != 0) && (y != 0); break;
          default: r.data()[e] = (x != 0) || (y != 0); break;
        }
      }
      set_ints(i.out[0], std::move(r), samples_of({0, 1}, out));
      return;
    }
    case Code::float_equal: {
      const TensorT<T> a = in(0), b = in(1);
      const Shape out = concrete(p_.slots[std::size_t(i.out[0])].shape, b_);
      const ArrayT<T> x = xt::broadcast(a.value(), out), y = xt::broadcast(b.value(), out);
      I r = I::from_shape(out);
      for (std::size_t e = 0; e < r.size(); ++e) r.data()[e] = x.data()[e] == y.data()[e];
      const Samples ss[2] = {a.samples(), b.samples()};
      const Shape shapes[2] = {a.shape(), b.shape()};
      set_ints(i.out[0], std::move(r), samples_broadcast(ss, shapes, out));
      return;
    }
    case Code::to_ints: {
      const TensorT<T> a = in(0);
      I r = I::from_shape(a.shape());
      for (std::size_t e = 0; e < r.size(); ++e) {
        const T v = a.value().data()[e];
        if (!std::isfinite(double(v))) throw std::invalid_argument("casts a value that is not finite to an integer");
        r.data()[e] = i.ints[0] ? std::int64_t(v != T(0)) : std::int64_t(v);
      }
      set_ints(i.out[0], std::move(r), a.samples());
      return;
    }
    case Code::where: where(i); return;
    case Code::reshape: {
      const Shape to = shape0();
      I a = held(0).ints;
      const Shape from = shape_of(a);
      a.reshape(to);
      set_ints(i.out[0], std::move(a), samples_reshaped(held(0).samples, from, to));
      return;
    }
    case Code::transpose: {
      set_ints(i.out[0], I(xt::transpose(held(0).ints, i.axes)), samples_transposed(held(0).samples, i.axes));
      return;
    }
    case Code::slice: {
      I a = held(0).ints;
      Samples s = held(0).samples;
      for (std::size_t j = 0; j < i.axes.size(); ++j) {
        const Shape from = shape_of(a);
        xt::xstrided_slice_vector sv(a.dimension(), xt::all());
        sv[i.axes[j]] = xt::range(std::size_t(i.ints[2 * j]), std::size_t(i.ints[2 * j + 1]));
        s = samples_sliced(s, from, i.axes[j], std::size_t(i.ints[2 * j]), std::size_t(i.ints[2 * j + 1]));
        a = I(xt::strided_view(a, sv));
      }
      set_ints(i.out[0], std::move(a), s);
      return;
    }
    case Code::concat: {
      const std::size_t axis = std::size_t(i.ints[0]);
      std::vector<Samples> ss;
      std::vector<Shape> shapes;
      Shape out = shape_of(held(0).ints);
      out[axis] = 0;
      for (std::size_t j = 0; j < i.in.size(); ++j) {
        ss.push_back(held(j).samples);
        shapes.push_back(shape_of(held(j).ints));
        out[axis] += shapes.back()[axis];
      }
      I r = I::from_shape(out);
      std::size_t outer = 1, inner = 1;
      for (std::size_t a = 0; a < axis; ++a) outer *= out[a];
      for (std::size_t a = axis + 1; a < out.size(); ++a) inner *= out[a];
      std::int64_t* dst = r.data();
      for (std::size_t o = 0; o < outer; ++o)
        for (std::size_t j = 0; j < i.in.size(); ++j) {
          const std::size_t run = shapes[j][axis] * inner;
          std::copy_n(held(j).ints.data() + o * run, run, dst);
          dst += run;
        }
      set_ints(i.out[0], std::move(r), samples_concatenated(ss, shapes, axis));
      return;
    }
    case Code::expand: {
      const Shape out = shape0();
      const Samples s = held(0).samples.is_none() ? filled_samples(i.shape0, b_, i.node) : samples_of({0}, out);
      set_ints(i.out[0], broadcast_ints(held(0).ints, out), s);
      return;
    }
    case Code::take: {
      const std::size_t axis = std::size_t(i.ints[0]);
      const I& a = held(0).ints;
      Shape s = shape_of(a);
      std::size_t outer = 1, inner = 1;
      for (std::size_t q = 0; q < axis; ++q) outer *= s[q];
      for (std::size_t q = axis + 1; q < s.size(); ++q) inner *= s[q];
      const std::size_t n = i.ints.size() - 2;
      Shape out = s;
      out[axis] = n;
      I r = I::from_shape(out);
      std::int64_t* dst = r.data();
      for (std::size_t o = 0; o < outer; ++o)
        for (std::size_t j = 0; j < n; ++j, dst += inner)
          std::copy_n(a.data() + (o * s[axis] + std::size_t(i.ints[j + 2])) * inner, inner, dst);
      Samples sm = held(0).samples;
      if (sm.kind != Samples::Kind::none && sm.axis == axis) sm = Samples::mixed();
      if (i.ints[1]) {
        const Shape from = out;
        out.erase(out.begin() + std::ptrdiff_t(axis));
        r.reshape(out);
        sm = samples_reshaped(sm, from, out);
      }
      set_ints(i.out[0], std::move(r), sm);
      return;
    }
    default: throw std::logic_error("onnx: instruction on the wrong kind of value");
  }
}

template <class T>
void Executor<T>::where(const Instr& i) {
  const Held<T>& c = at(i.in[0]);
  const Shape out = concrete(p_.slots[std::size_t(i.out[0])].shape, b_);
  if (p_.slots[std::size_t(i.out[0])].ints) {
    const auto cb = broadcast_ints(c.ints, out), xb = broadcast_ints(at(i.in[1]).ints, out),
               yb = broadcast_ints(at(i.in[2]).ints, out);
    ArrayT<std::int64_t> r = ArrayT<std::int64_t>::from_shape(out);
    for (std::size_t e = 0; e < r.size(); ++e) r.data()[e] = cb.data()[e] ? xb.data()[e] : yb.data()[e];
    const Samples ss[3] = {c.samples, at(i.in[1]).samples, at(i.in[2]).samples};
    const Shape shapes[3] = {shape_of(c.ints), shape_of(at(i.in[1]).ints), shape_of(at(i.in[2]).ints)};
    set_ints(i.out[0], std::move(r), samples_broadcast(ss, shapes, out));
    return;
  }
  const TensorT<T> x = in(1), y = in(2);
  const Shape sc = shape_of(c.ints);
  // the condition as a constant with its samples: keep = 1 where it holds
  ArrayT<T> keep = ArrayT<T>::from_shape(sc), drop = ArrayT<T>::from_shape(sc);
  for (std::size_t e = 0; e < keep.size(); ++e) {
    keep.data()[e] = c.ints.data()[e] != 0 ? T(1) : T(0);
    drop.data()[e] = T(1) - keep.data()[e];
  }
  // a branch that is a constant is selected exactly (no 0 * inf): where(c, x, 0) or where(c, 0, y)
  auto selected = [&](const TensorT<T>& v, bool when) {
    const Shape so = [&] {
      const Shape a = v.shape();
      Shape r(std::max(a.size(), sc.size()), 1);
      for (std::size_t q = 0; q < r.size(); ++q) {
        const std::size_t da = q + a.size() < r.size() ? 1 : a[q + a.size() - r.size()];
        const std::size_t dc = q + sc.size() < r.size() ? 1 : sc[q + sc.size() - r.size()];
        r[q] = da == 1 ? dc : da;
      }
      return r;
    }();
    const ArrayT<T> vb = xt::broadcast(v.value(), so);
    const ArrayT<std::int64_t> cb = broadcast_ints(c.ints, so);
    ArrayT<T> r = ArrayT<T>::from_shape(so);
    for (std::size_t e = 0; e < r.size(); ++e) r.data()[e] = (cb.data()[e] != 0) == when ? vb.data()[e] : T(0);
    const Samples ss[2] = {v.samples(), c.samples};
    const Shape shapes[2] = {v.shape(), sc};
    return labelled_constant<T>(std::move(r), samples_broadcast(ss, shapes, so));
  };
  const Samples cs = c.samples;
  TensorT<T> r;
  if (!x.requires_grad() && !y.requires_grad()) {
    r = add(selected(x, true), selected(y, false));
  } else if (!y.requires_grad()) {
    r = add(mul(x, labelled_constant<T>(keep, cs)), selected(y, false));
  } else if (!x.requires_grad()) {
    r = add(mul(y, labelled_constant<T>(drop, cs)), selected(x, true));
  } else {
    r = add(mul(x, labelled_constant<T>(keep, cs)), mul(y, labelled_constant<T>(drop, cs)));
  }
  set(i.out[0], broadcast_to(r, out));
}

template <class T>
void Executor<T>::embedding(const Instr& i) {
  const TensorT<T> table = in(0);
  const Held<T>& h = at(i.in[1]);
  const std::size_t vocab = table.shape()[0];
  const Samples& s = h.samples;
  // the rows of the output are the ids' rows: gather reads the samples on axis 0
  Perm front(h.ints.dimension());
  std::iota(front.begin(), front.end(), std::size_t(0));
  if (s.kind == Samples::Kind::axis && s.outer == 1 && s.axis > 0) {
    front.erase(front.begin() + std::ptrdiff_t(s.axis));
    front.insert(front.begin(), s.axis);
  } else if (s.kind != Samples::Kind::none && !s.blocks_on(0)) {
    if (TapeT<T>* tape = active_tape<T>(); tape && tape->records_uses())
      throw std::invalid_argument("the embedding's ids hold " + s.str() +
                                  ", not the batch's tokens: no exact per-sample rule applies (naive and jl:K run it)");
  }
  const ArrayT<std::int64_t> ids = is_identity(front) ? h.ints : ArrayT<std::int64_t>(xt::transpose(h.ints, front));
  ArrayT<std::int32_t> ids32 = ArrayT<std::int32_t>::from_shape(shape_of(ids));
  for (std::size_t e = 0; e < ids.size(); ++e) {
    const std::int64_t v = ids.data()[e];
    if (v < 0 || std::size_t(v) >= vocab)
      throw std::invalid_argument("token id " + std::to_string(v) + " is outside the embedding table of " +
                                  std::to_string(vocab) + " rows");
    ids32.data()[e] = std::int32_t(v);
  }
  TensorT<T> out = gather(table, ids32);
  if (s.kind == Samples::Kind::mixed) out.node()->samples = s;  // rows read at mixed ids (positions, the batch size)
  // value axis a of (ids..., p) is held at the position of a in `front`
  Perm perm(front.size() + 1);
  for (std::size_t q = 0; q < front.size(); ++q) perm[front[q]] = q;
  perm.back() = front.size();
  set(i.out[0], out, perm);
}

template <class T>
void Executor<T>::recurrent(const Instr& i, bool lstm) {
  const std::size_t dirs = std::size_t(i.ints[0]), H = std::size_t(i.ints[2]);
  const bool batch_first = i.ints[1] == 1, reverse_only = i.ints[3] != 0;
  const TensorT<T> x = physical_as(i.in[0], batch_first ? Perm{0, 1, 2} : Perm{1, 0, 2});  // (B, L, d)
  const std::size_t B = x.shape()[0], L = x.shape()[1];
  const std::size_t h0_at = 1 + 4 * dirs;
  const Samples xs = x.samples();
  // the initial state of direction k as (B, H): a constant holding no sample is
  // laid out like x's samples, so that its first use by linear is per-sample
  auto state = [&](std::size_t slot_index, std::size_t k) -> TensorT<T> {
    if (!has(slot_index)) {
      ArrayT<T> z = xt::zeros<T>({B, H});
      return xs.blocks_on(0) ? per_sample_input<T>(std::move(z), 0, xs.count) : constant<T>(std::move(z));
    }
    const TensorT<T> all = in(slot_index);  // (dirs, B, H), or (B, dirs, H) batch first
    TensorT<T> s = batch_first ? slice(all, 1, k, k + 1) : slice(all, 0, k, k + 1);
    s = reshape(s, {B, H});
    if (!s.requires_grad() && s.samples().is_none() && xs.blocks_on(0))
      return per_sample_input<T>(ArrayT<T>(s.value()), 0, xs.count);
    return s;
  };
  std::vector<TensorT<T>> ys, hs, cs;
  for (std::size_t k = 0; k < dirs; ++k) {
    const bool reverse = reverse_only || k == 1;
    const std::size_t w = 1 + 4 * k;
    const TensorT<T> w_ih = in(w), w_hh = in(w + 1);
    const TensorT<T> b_ih = has(w + 2) ? in(w + 2) : TensorT<T>(), b_hh = has(w + 3) ? in(w + 3) : TensorT<T>();
    TensorT<T> h = state(h0_at, k);
    TensorT<T> c = lstm ? state(h0_at + 1, k) : TensorT<T>();
    const bool keep = i.out[0] >= 0;
    std::vector<TensorT<T>> states(keep ? L : 0);
    const TensorT<T> proj = linear(x, w_ih, b_ih);  // (B, L, G H)
    if (lstm) {
      const auto blocks = sole_step_readers(L);
      for (std::size_t s = 0; s < L; ++s) {
        const std::size_t t = reverse ? L - 1 - s : s;
        const TensorT<T> a = lstm_gates_at(proj, t, linear(h, w_hh, b_hh), blocks);  // [i f g o]
        c = lstm_state(a, c);
        h = lstm_output(a, c);
        if (keep) states[t] = h;
      }
    } else {
      for (std::size_t s = 0; s < L; ++s) {
        const std::size_t t = reverse ? L - 1 - s : s;
        const TensorT<T> a = reshape(slice(proj, 1, t, t + 1), {B, 3 * H});  // x_t W + b_ih: [z r h]
        const TensorT<T> r = linear(h, w_hh, b_hh);                           // h W_hh + b_hh
        const TensorT<T> zr = sigmoid(add(slice(a, 1, 0, 2 * H), slice(r, 1, 0, 2 * H)));
        const TensorT<T> z = slice(zr, 1, 0, H), rg = slice(zr, 1, H, 2 * H);
        const TensorT<T> n = tanh(add(slice(a, 1, 2 * H, 3 * H), mul(rg, slice(r, 1, 2 * H, 3 * H))));
        h = add(n, mul(z, sub(h, n)));  // (1 - z) n + z h
        if (keep) states[t] = h;
      }
    }
    if (keep) ys.push_back(stack(states, 1));  // (B, L, H)
    hs.push_back(h);
    cs.push_back(c);
  }
  if (i.out[0] >= 0) {  // (B, L, dirs, H) held; ONNX's Y is (L, dirs, B, H), or that with layout 1
    const TensorT<T> y = stack(ys, 2);
    set(i.out[0], y, batch_first ? Perm{0, 1, 2, 3} : Perm{1, 2, 0, 3});
  }
  if (i.out.size() > 1 && i.out[1] >= 0) set(i.out[1], stack(hs, batch_first ? 1 : 0));
  if (lstm && i.out.size() > 2 && i.out[2] >= 0) set(i.out[2], stack(cs, batch_first ? 1 : 0));
}

}  // namespace

}  // namespace detail

// ---- the model ----

template <class T>
OnnxModelT<T>::OnnxModelT(std::shared_ptr<const detail::Program> program, std::uint64_t dropout_seed)
    : program_(std::move(program)), runtime_(std::make_unique<detail::Runtime<T>>()) {
  const detail::Program& p = *program_;
  runtime_->dropout = FastRng(dropout_seed);
  for (const auto& spec : p.params) {
    const ArrayT<double>& src = *p.initializers[std::size_t(spec.initializer)].values;
    ArrayT<T> v = ArrayT<T>::from_shape(spec.shape);
    for (std::size_t e = 0; e < v.size(); ++e) v.data()[e] = T(src.data()[spec.source.empty() ? e : spec.source[e]]);
    if (spec.frozen) {
      runtime_->params.push_back(constant<T>(std::move(v)));
    } else {
      runtime_->params.push_back(make_parameter<T>(spec.name, std::move(v)));
      runtime_->trainable.push_back(runtime_->params.back());
    }
  }
  runtime_->constants.resize(p.instrs.size());
  for (std::size_t k = 0; k < p.instrs.size(); ++k)
    if (p.instrs[k].code == detail::Code::constant)
      runtime_->constants[k] = constant<T>(ArrayT<T>(xt::cast<T>(*p.instrs[k].data)));
}

template <class T>
OnnxModelT<T>::~OnnxModelT() = default;

template <class T>
TensorT<T> OnnxModelT<T>::forward(const BatchT<T>& batch) {
  const detail::Program& p = *program_;
  if (!p.inexact.empty())
    if (TapeT<T>* tape = active_tape<T>(); tape && tape->records_uses()) {
      std::string list;
      for (const auto& s : p.inexact) list += (list.empty() ? "" : "; ") + s;
      throw std::invalid_argument(name() + ": no exact per-sample rule covers " + list +
                                  ". The naive and jl:K strategies run this model; or freeze the parameter (--freeze)");
    }
  try {
    const DropoutRecords records(batch);  // dropout masks keyed by these rows' records
    detail::Executor<T> run(p, *runtime_, batch, this->training(), name());
    return run.run();
  } catch (const std::bad_alloc&) {  // still a std::bad_alloc (programs say how to need less), naming the file
    const std::size_t rows = batch.inputs.dimension() > 0   ? batch.inputs.shape()[0]
                             : batch.tokens.dimension() > 0 ? batch.tokens.shape()[0]
                                                            : batch.size();
    throw detail::OutOfMemory(name() + ": out of memory in the forward pass at batch size " + std::to_string(rows));
  }
}

template <class T>
std::vector<TensorT<T>> OnnxModelT<T>::parameters() const {
  return runtime_->trainable;
}

template <class T>
std::string OnnxModelT<T>::name() const {
  const std::string& path = program_->path;
  const std::size_t slash = path.find_last_of('/');
  return "onnx:" + (slash == std::string::npos ? path : path.substr(slash + 1));
}

template <class T>
const InputSpec& OnnxModelT<T>::input() const {
  return program_->input;
}

template <class T>
std::size_t OnnxModelT<T>::output_classes() const {
  const auto& s = program_->slots[std::size_t(program_->output_slot)].shape;
  return s.size() == 2 && s[1].fixed() ? std::size_t(s[1].c) : 0;
}

template <class T>
const std::vector<ParameterInfo>& OnnxModelT<T>::parameter_info() const {
  return program_->info;
}

template <class T>
std::vector<ArrayT<T>> OnnxModelT<T>::all_values() const {
  std::vector<ArrayT<T>> r;
  for (const auto& t : runtime_->params) r.push_back(t.value());
  return r;
}

template <class T>
std::vector<std::string> OnnxModelT<T>::inexact_uses() const {
  return program_->inexact;
}

template <class T>
void OnnxModelT<T>::check_data(const Shape& sample_shape, std::size_t classes, const std::string& data) const {
  const InputSpec& in = input();
  if (sample_shape != in.sample_shape)
    throw std::invalid_argument(name() + " reads examples of shape " + shape_str(in.sample_shape) + " (input '" +
                                in.name + "'), " + data + " gives " + shape_str(sample_shape) +
                                (in.tokens ? " (sequences of that length: export the model for it)" : ""));
  if (output_classes() != classes)
    throw std::invalid_argument(name() + " outputs " + std::to_string(output_classes()) + " classes, " + data + " has " +
                                std::to_string(classes) + " (keep only the classes it outputs: --classes)");
}

template <class T>
std::vector<std::string> OnnxModelT<T>::describe() const {
  std::size_t frozen = 0;
  for (const auto& p : parameter_info()) frozen += p.frozen;
  std::vector<std::string> lines{name() + ": " + std::to_string(this->parameter_count()) + " parameters (" +
                                 std::to_string(parameters().size()) + " tensors), " + std::to_string(frozen) +
                                 " frozen tensors"};
  for (const auto& u : inexact_uses()) lines.push_back("  no exact per-sample rule: " + u + " (naive and jl:K run it)");
  return lines;
}

template <class T>
std::vector<std::pair<std::string, ArrayT<T>>> OnnxModelT<T>::to_initializer_layout(
    const std::vector<ArrayT<T>>& internal) const {
  const detail::Program& p = *program_;
  std::vector<std::pair<std::string, ArrayT<T>>> out;
  std::vector<int> where(p.initializers.size(), -1);
  std::size_t k = 0;
  for (const auto& spec : p.params) {
    if (spec.frozen) continue;
    if (k >= internal.size()) throw std::invalid_argument("to_initializer_layout: too few arrays");
    const ArrayT<T>& g = internal[k++];
    const std::size_t n = numel(spec.shape);
    const std::size_t batch = n == 0 ? 0 : g.size() / n;
    if (g.size() != batch * n) throw std::invalid_argument("to_initializer_layout: " + spec.name + " has the wrong size");
    const detail::Initializer& init = p.initializers[std::size_t(spec.initializer)];
    int& w = where[std::size_t(spec.initializer)];
    if (w < 0) {
      Shape s{batch};
      s.insert(s.end(), init.dims.begin(), init.dims.end());
      out.push_back({init.name, xt::zeros<T>(s)});
      w = int(out.size()) - 1;
    }
    ArrayT<T>& dst = out[std::size_t(w)].second;
    const std::size_t m = numel(init.dims);
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t e = 0; e < n; ++e) dst.data()[b * m + (spec.source.empty() ? e : spec.source[e])] = g.data()[b * n + e];
  }
  return out;
}

template <class T>
std::unique_ptr<OnnxModelT<T>> load(const std::string& path, const LoadOptions& options) {
  try {
    std::shared_ptr<const detail::Program> program = detail::read_program(path, options);
    detail::check_memory(*program, options, sizeof(T));
    return std::make_unique<OnnxModelT<T>>(std::move(program), options.dropout_seed);
  } catch (const std::bad_alloc&) {
    throw OnnxError(path + ": out of memory while loading the model (its limits, LoadOptions::max_bytes_per_example "
                           "and max_constant_bytes, are above what this machine has)");
  }
}

template class OnnxModelT<float>;
template class OnnxModelT<double>;
template std::unique_ptr<OnnxModelT<float>> load(const std::string&, const LoadOptions&);
template std::unique_ptr<OnnxModelT<double>> load(const std::string&, const LoadOptions&);

}  // namespace dpgrad::onnx
