// The handlers of the operators that carry parameters (onnx/compiler.hpp): Gemm,
// MatMul, Conv, pooling, batch and layer normalisation, LSTM and GRU. Each
// parameter is stored in the layout of the engine op it feeds, so that the op's
// per-sample rule applies to it directly (docs/onnx.md).
#include <algorithm>
#include <cmath>

#include "onnx/compiler.hpp"

namespace dpgrad::onnx::detail {

namespace {

/// The flat index map of a 2-D transpose: internal (c, r) from an initializer (r, c).
std::vector<std::size_t> transpose_source(std::size_t r, std::size_t c) {
  std::vector<std::size_t> s;
  s.reserve(r * c);
  for (std::size_t i = 0; i < c; ++i)
    for (std::size_t j = 0; j < r; ++j) s.push_back(j * c + i);
  return s;
}

}  // namespace

void Compiler::op_gemm() {
  only_attributes({"alpha", "beta", "transA", "transB"});
  const Value &a = in(0), &b = in(1), &c = in(2);
  const double alpha = attr_f("alpha", 1), beta = attr_f("beta", 1);
  const bool ta = attr_i("transA", 0) != 0, tb = attr_i("transB", 0) != 0;
  if (a.shape.size() != 2 || b.shape.size() != 2) fail("A and B must be matrices");
  int x = as_tensor(a);
  if (ta) {
    const int t = new_slot(false, {a.shape[1], a.shape[0]}, "");
    emit(Code::transpose, {x}, {t}).axes = {1, 0};
    x = t;
  }
  if (alpha != 1) {
    const int t = new_slot(false, prog->slots[std::size_t(x)].shape, "");
    Instr& i = emit(Code::unary, {x}, {t});
    i.ints = {std::int64_t(UnaryKind::scale)};
    i.reals = {alpha};
    x = t;
  }
  // W (K, N) = B or B^T, in the layout linear reads
  int w = -1;
  if (b.kind == Value::Kind::param) {
    const bool want_t = tb != b.transposed;  // the initializer itself transposed
    const Initializer& init = prog->initializers[std::size_t(b.init)];
    bool transposed = false;
    const int p = claim(b.init, want_t ? "transposed" : "identity", "",
                        [&](ParamSpec& s) {
                          s.shape = want_t ? Shape{init.dims[1], init.dims[0]} : init.dims;
                          if (want_t) s.source = transpose_source(init.dims[0], init.dims[1]);
                        },
                        &transposed);
    w = param_slot(p);
    if (transposed) {
      const int t = new_slot(false, {prog->slots[std::size_t(w)].shape[1], prog->slots[std::size_t(w)].shape[0]}, "");
      emit(Code::transpose, {w}, {t}).axes = {1, 0};
      w = t;
      inexact(p, "is transposed before this use (its first use reads it in the other orientation)");
    }
  } else {
    w = as_tensor(b);
    if (tb) {
      const SymShape& s = prog->slots[std::size_t(w)].shape;
      const int t = new_slot(false, {s[1], s[0]}, "");
      emit(Code::transpose, {w}, {t}).axes = {1, 0};
      w = t;
    }
  }
  const SymShape& ws = prog->slots[std::size_t(w)].shape;
  // C: a bias of N (or 1 x N) with beta 1 is linear's bias; anything else is added after
  int bias = -1;
  bool after = false;
  if (c.kind != Value::Kind::absent) {
    const bool vector = c.shape.size() == 1 || (c.shape.size() == 2 && c.shape[0] == Dim{1, 0});
    if (beta == 1 && vector && c.shape.back() == ws[1] && (c.kind == Value::Kind::param || c.kind == Value::Kind::const_float) &&
        !c.transposed) {
      if (c.kind == Value::Kind::param) {
        const Initializer& init = prog->initializers[std::size_t(c.init)];
        const int p = claim(c.init, c.shape.size() == 1 ? "identity" : "vector", "",
                            [&](ParamSpec& s) { s.shape = {init.dims.back()}; });
        bias = param_slot(p);
      } else {
        Value v = c;
        ArrayT<double> arr = *c.cf;
        arr.reshape({arr.size()});
        v.cf = std::make_shared<const ArrayT<double>>(std::move(arr));
        v.shape = {c.shape.back()};
        bias = as_tensor(v);
      }
    } else {
      after = true;
    }
  }
  int y = linear(x, w, bias);
  if (after) {
    int cc = as_tensor(c, beta == 1);
    if (beta != 1) {
      const int t = new_slot(false, c.shape, "");
      Instr& i = emit(Code::unary, {cc}, {t});
      i.ints = {std::int64_t(UnaryKind::scale)};
      i.reals = {beta};
      cc = t;
    }
    const SymShape out = broadcast(prog->slots[std::size_t(y)].shape, c.shape);
    const int t = new_slot(false, out, "");
    emit(Code::binary, {y, cc}, {t}).ints = {0};
    y = t;
  }
  define(0, tensor_value(y));
}

void Compiler::op_matmul() {
  const Value &a = in(0), &b = in(1);
  if (a.shape.empty() || b.shape.empty()) fail("scalars do not multiply");
  // x W with W a 2-D initializer (or constant): linear, with the next Add's bias folded in
  if ((b.kind == Value::Kind::param || b.kind == Value::Kind::const_float) && b.shape.size() == 2 &&
      a.kind == Value::Kind::tensor) {
    if (!(a.shape.back() == b.shape[0])) fail("shapes " + sym_str(a.shape) + " and " + sym_str(b.shape) + " do not multiply");
    const int w = as_tensor(b, true);
    int bias = -1;
    const Node* add = nullptr;
    Value bv;
    if (!node->outputs.empty() && bias_add_after(node->outputs[0], add, bv) && bv.shape[0] == b.shape[1]) {
      bias = as_tensor(bv, true);
      fuse(*add);
    }
    const int y = linear(a.shape.size() == 1 ? as_tensor(reshaped(a, {Dim{1, 0}, a.shape[0]})) : a.slot, w, bias);
    Value out = tensor_value(y);
    if (a.shape.size() == 1) out = reshaped(out, {b.shape[1]});
    if (add) {
      const std::string name = add->outputs[0];
      prog->slots[std::size_t(out.slot)].name = name;
      define_value(name, out);
    } else {
      define(0, out);
    }
    return;
  }
  // a product of two computed tensors (attention scores), numpy-broadcast over the leading axes
  if (a.shape.size() < 2 || b.shape.size() < 2) fail("a vector operand is supported only with a constant matrix");
  const SymShape la(a.shape.begin(), a.shape.end() - 2), lb(b.shape.begin(), b.shape.end() - 2);
  if (!(a.shape.back() == b.shape[b.shape.size() - 2]))
    fail("shapes " + sym_str(a.shape) + " and " + sym_str(b.shape) + " do not multiply");
  SymShape out = broadcast(la, lb);
  out.push_back(a.shape[a.shape.size() - 2]);
  out.push_back(b.shape.back());
  const int slot = new_slot(false, out, "");
  emit(Code::matmul, {as_tensor(a), as_tensor(b)}, {slot});
  define(0, tensor_value(slot));
}

void Compiler::op_conv() {
  only_attributes({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
  const Value &x = in(0), &w = in(1), &b = in(2);
  if (x.shape.size() != 4 || w.shape.size() != 4)
    fail("only 2-D convolutions (inputs (N, C, H, W)) are supported, not rank " + std::to_string(x.shape.size()));
  if (attr_i("group", 1) != 1) fail("attribute 'group' = " + std::to_string(attr_i("group", 1)) + " is not supported (groups 1 only)");
  for (auto d : attr_ints("dilations", {1, 1}))
    if (d != 1) fail("attribute 'dilations' other than 1 is not supported");
  if (w.kind != Value::Kind::param && w.kind != Value::Kind::const_float) fail("its kernel must be an initializer");
  if (w.transposed) fail("its kernel must be an initializer in ONNX's layout");
  for (const auto& d : w.shape)
    if (!d.fixed()) fail("its kernel has a batch-dependent shape");
  const std::size_t cout = std::size_t(w.shape[0].c), cin = std::size_t(w.shape[1].c);
  const std::size_t kh = std::size_t(w.shape[2].c), kw = std::size_t(w.shape[3].c);
  if (!(x.shape[1] == Dim{std::int64_t(cin), 0})) fail("input " + sym_str(x.shape) + " does not have the kernel's " + std::to_string(cin) + " channels");
  const auto ks = attr_ints("kernel_shape", {std::int64_t(kh), std::int64_t(kw)});
  if (ks.size() != 2 || ks[0] != std::int64_t(kh) || ks[1] != std::int64_t(kw)) fail("kernel_shape disagrees with the kernel");
  const auto strides = attr_ints("strides", {1, 1});
  if (strides.size() != 2 || strides[0] < 1 || strides[1] < 1) fail("strides must be two positive numbers");
  if (!x.shape[2].fixed() || !x.shape[3].fixed()) fail("its image size grows with the batch");
  const std::int64_t h = x.shape[2].c, wd = x.shape[3].c;
  std::vector<std::int64_t> pads = attr_ints("pads", {0, 0, 0, 0});
  const std::string auto_pad = attr_s("auto_pad", "NOTSET");
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    pads.assign(4, 0);
    for (int d = 0; d < 2; ++d) {
      const std::int64_t in = d == 0 ? h : wd, k = d == 0 ? std::int64_t(kh) : std::int64_t(kw), s = strides[std::size_t(d)];
      const std::int64_t out = (in + s - 1) / s, total = std::max<std::int64_t>(0, (out - 1) * s + k - in);
      const std::int64_t small = total / 2, large = total - small;
      pads[std::size_t(d)] = auto_pad == "SAME_UPPER" ? small : large;
      pads[std::size_t(d) + 2] = auto_pad == "SAME_UPPER" ? large : small;
    }
  } else if (auto_pad == "VALID") {
    pads.assign(4, 0);
  } else if (auto_pad != "NOTSET") {
    fail("auto_pad '" + auto_pad + "' is not supported");
  }
  if (pads.size() != 4 || std::any_of(pads.begin(), pads.end(), [](std::int64_t p) { return p < 0; }))
    fail("pads must be four numbers >= 0");
  const std::int64_t ho = (h + pads[0] + pads[2] - std::int64_t(kh)), wo = (wd + pads[1] + pads[3] - std::int64_t(kw));
  if (ho < 0 || wo < 0) fail("the kernel does not fit the padded image");
  const SymShape out{x.shape[0], Dim{std::int64_t(cout), 0}, Dim{ho / strides[0] + 1, 0}, Dim{wo / strides[1] + 1, 0}};
  // the kernel as (kh kw C, Cout), rows ordered (i, j, c): conv2d's layout
  auto conv_layout = [&](ParamSpec& s) {
    s.shape = {kh * kw * cin, cout};
    s.source.resize(kh * kw * cin * cout);
    for (std::size_t i = 0; i < kh; ++i)
      for (std::size_t j = 0; j < kw; ++j)
        for (std::size_t c = 0; c < cin; ++c)
          for (std::size_t o = 0; o < cout; ++o)
            s.source[((i * kw + j) * cin + c) * cout + o] = ((o * cin + c) * kh + i) * kw + j;
  };
  int wk;
  if (w.kind == Value::Kind::param) {
    wk = param_slot(claim(w.init, "conv kernel", "", conv_layout));
  } else {
    ParamSpec tmp;
    conv_layout(tmp);
    ArrayT<double> k = ArrayT<double>::from_shape(tmp.shape);
    for (std::size_t e = 0; e < tmp.source.size(); ++e) k.data()[e] = w.cf->data()[tmp.source[e]];
    Value v;
    v.kind = Value::Kind::const_float;
    v.shape = {Dim{std::int64_t(tmp.shape[0]), 0}, Dim{std::int64_t(cout), 0}};
    v.cf = std::make_shared<const ArrayT<double>>(std::move(k));
    wk = as_tensor(v);
  }
  std::vector<int> ins{as_tensor(x), wk};
  if (b.kind != Value::Kind::absent) {
    if (b.shape.size() != 1 || !(b.shape[0] == Dim{std::int64_t(cout), 0})) fail("its bias must have the kernel's outputs");
    ins.push_back(as_tensor(b, true));
  }
  const int slot = new_slot(false, out, "");
  emit(Code::conv, ins, {slot}).ints = {std::int64_t(kh), std::int64_t(kw), strides[0], strides[1],
                                         pads[0], pads[2], pads[1], pads[3]};
  define(0, tensor_value(slot));
}

void Compiler::op_pool() {
  const bool max = node->op == "MaxPool";
  if (max) only_attributes({"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"});
  else only_attributes({"auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"});
  if (max && needed(1)) fail("its Indices output is not supported");
  const Value& x = in(0);
  if (x.shape.size() != 4) fail("only 2-D pooling (inputs (N, C, H, W)) is supported");
  if (!x.shape[2].fixed() || !x.shape[3].fixed()) fail("its image size grows with the batch");
  const auto k = attr_ints("kernel_shape");
  if (k.size() != 2 || k[0] < 1 || k[1] < 1) fail("kernel_shape must be two positive numbers");
  if (max && k[0] * k[1] > 65536) fail("windows of more than 65536 elements are not supported");
  for (auto d : attr_ints("dilations", {1, 1}))
    if (d != 1) fail("attribute 'dilations' other than 1 is not supported");
  if (attr_i("storage_order", 0) != 0) fail("attribute 'storage_order' = 1 is not supported");
  const auto s = attr_ints("strides", {1, 1});
  if (s.size() != 2 || s[0] < 1 || s[1] < 1) fail("strides must be two positive numbers");
  std::vector<std::int64_t> pads = attr_ints("pads", {0, 0, 0, 0});
  const std::string auto_pad = attr_s("auto_pad", "NOTSET");
  const std::int64_t h = x.shape[2].c, w = x.shape[3].c;
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    pads.assign(4, 0);
    for (int d = 0; d < 2; ++d) {
      const std::int64_t in = d == 0 ? h : w, kk = k[std::size_t(d)], ss = s[std::size_t(d)];
      const std::int64_t out = (in + ss - 1) / ss, total = std::max<std::int64_t>(0, (out - 1) * ss + kk - in);
      pads[std::size_t(d)] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pads[std::size_t(d) + 2] = total - pads[std::size_t(d)];
    }
  } else if (auto_pad == "VALID") {
    pads.assign(4, 0);
  } else if (auto_pad != "NOTSET") {
    fail("auto_pad '" + auto_pad + "' is not supported");
  }
  if (pads.size() != 4 || std::any_of(pads.begin(), pads.end(), [](std::int64_t p) { return p < 0; }))
    fail("pads must be four numbers >= 0");
  if (pads[0] >= k[0] || pads[2] >= k[0] || pads[1] >= k[1] || pads[3] >= k[1]) fail("pads must be smaller than the window");
  std::int64_t size[2];
  for (int d = 0; d < 2; ++d) {
    const std::int64_t in = d == 0 ? h : w, before = pads[std::size_t(d)], after = pads[std::size_t(d) + 2];
    const std::int64_t span = in + before + after - k[std::size_t(d)];
    if (span < 0) fail("the window does not fit the padded image");
    std::int64_t out = span / s[std::size_t(d)] + 1;
    if (attr_i("ceil_mode", 0) != 0) {
      if (!max) fail("ceil_mode = 1 is supported for MaxPool only");
      std::int64_t up = (span + s[std::size_t(d)] - 1) / s[std::size_t(d)] + 1;
      if ((up - 1) * s[std::size_t(d)] >= in + before) --up;  // the last window starts inside the image
      pads[std::size_t(d) + 2] += std::max<std::int64_t>(0, (up - 1) * s[std::size_t(d)] + k[std::size_t(d)] - (in + before + after));
      out = up;
    }
    size[d] = out;
  }
  const SymShape out{x.shape[0], x.shape[1], Dim{size[0], 0}, Dim{size[1], 0}};
  const int slot = new_slot(false, out, "");
  Instr& i = emit(max ? Code::max_pool : Code::avg_pool, {as_tensor(x)}, {slot});
  i.ints = {k[0], k[1], s[0], s[1], pads[0], pads[2], pads[1], pads[3]};
  if (!max) i.ints.push_back(attr_i("count_include_pad", 0));
  define(0, tensor_value(slot));
}

void Compiler::op_global_avg_pool() {
  const Value& x = in(0);
  if (x.shape.size() < 3) fail("needs an input (N, C, spatial...)");
  SymShape out = x.shape;
  std::vector<std::size_t> axes;
  for (std::size_t i = 2; i < out.size(); ++i) {
    axes.push_back(i);
    out[i] = Dim{1, 0};
  }
  const int slot = new_slot(false, out, "");
  Instr& i = emit(Code::reduce, {as_tensor(x)}, {slot});
  i.axes = axes;
  i.ints = {1, 1};
  define(0, tensor_value(slot));
}

void Compiler::op_batch_norm() {
  only_attributes({"epsilon", "momentum", "training_mode"});
  if (attr_i("training_mode", 0) != 0 || needed(1) || needed(2) || node->outputs.size() > 1)
    fail("normalises with the statistics of the batch (training mode), which mixes samples: private training needs "
         "a normalisation within each sample; use GroupNorm (or LayerNorm) in the model, or export it in evaluation "
         "mode so that the statistics are frozen");
  const Value &x = in(0), &scale = in(1), &bias = in(2), &mean = in(3), &var = in(4);
  if (x.shape.size() < 2) fail("needs an input (N, C, ...)");
  const Dim c = x.shape[1];
  for (const Value* v : {&scale, &bias, &mean, &var})
    if (v->shape.size() != 1 || !(v->shape[0] == c)) fail("its scale, bias, mean and variance must have " + dim_str(c) + " values");
  auto stats = std::make_shared<const ArrayT<double>>(constant_array(mean));
  auto variance = std::make_shared<const ArrayT<double>>(constant_array(var));
  for (auto v : *variance)
    if (!(v >= 0)) fail("its variance holds a negative value");
  // the statistics are constants; the scale and bias are elementwise parameters (exact)
  const int slot = new_slot(false, x.shape, "");
  Instr& i = emit(Code::batch_norm, {as_tensor(x), as_tensor(scale, true), as_tensor(bias, true)}, {slot});
  i.data = stats;
  i.data2 = variance;
  i.reals = {attr_f("epsilon", 1e-5)};
  define(0, tensor_value(slot));
}

void Compiler::op_layer_norm() {
  only_attributes({"axis", "epsilon", "stash_type"});
  if (needed(1) || needed(2)) fail("its Mean and InvStdDev outputs are not supported");
  const Value& x = in(0);
  const std::size_t a = axis(attr_i("axis", -1), x.shape.size(), "axis");
  const SymShape norm(x.shape.begin() + std::ptrdiff_t(a), x.shape.end());
  std::vector<int> ins{as_tensor(x)};
  for (std::size_t k = 1; k <= 2; ++k) {
    if (!has_in(k)) {
      ins.push_back(-1);
      continue;
    }
    const Value& v = in(k);
    if (v.shape.size() > norm.size() || !(broadcast(v.shape, norm) == norm))
      fail("its scale and bias must broadcast to the normalised axes " + sym_str(norm));
    ins.push_back(as_tensor(v, true));
  }
  const int slot = new_slot(false, x.shape, "");
  Instr& i = emit(Code::layer_norm, ins, {slot});
  i.ints = {std::int64_t(a)};
  i.reals = {attr_f("epsilon", 1e-5)};
  define(0, tensor_value(slot));
}

void Compiler::op_rnn() {
  const bool lstm = node->op == "LSTM";
  if (lstm) only_attributes({"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
                             "input_forget", "layout"});
  else only_attributes({"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
                        "layout", "linear_before_reset"});
  if (attr("activations") || attr("activation_alpha") || attr("activation_beta"))
    fail("activations other than the defaults are not supported");
  if (attr("clip")) fail("attribute 'clip' is not supported");
  if (lstm && attr_i("input_forget", 0) != 0) fail("attribute 'input_forget' = 1 is not supported");
  if (!lstm && attr_i("linear_before_reset", 0) != 1)
    fail("linear_before_reset = 0 is not supported (PyTorch's GRU, which dpgrad runs, is linear_before_reset = 1)");
  if (has_in(4)) fail("input 'sequence_lens' (packed sequences) is not supported: export the RNN on padded sequences");
  if (lstm && has_in(7)) fail("peephole weights (input 'P') are not supported");
  const std::string direction = attr_s("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    fail("direction '" + direction + "' is unknown");
  const std::size_t dirs = direction == "bidirectional" ? 2 : 1;
  const std::int64_t layout = attr_i("layout", 0);
  if (layout != 0 && layout != 1) fail("layout " + std::to_string(layout) + " is unknown");
  const std::size_t gates = lstm ? 4 : 3;
  const std::int64_t hs = attr_i("hidden_size", 0);
  const Value &x = in(0), &wv = in(1), &rv = in(2), &bv = in(3);
  if (x.shape.size() != 3) fail("its input must be (length, batch, features) (or batch first with layout 1)");
  if (wv.kind != Value::Kind::param || rv.kind != Value::Kind::param || wv.transposed || rv.transposed)
    fail("its weights W and R must be initializers");
  const Initializer& W = prog->initializers[std::size_t(wv.init)];
  const Initializer& R = prog->initializers[std::size_t(rv.init)];
  if (W.dims.size() != 3 || W.dims[0] != dirs || W.dims[1] % gates != 0) fail("W has shape " + shape_str(W.dims));
  const std::size_t H = W.dims[1] / gates, d = W.dims[2];
  if (H == 0 || d == 0) fail("W has shape " + shape_str(W.dims) + ": no hidden units or no input features");
  if (hs > 0 && std::size_t(hs) != H) fail("hidden_size " + std::to_string(hs) + " disagrees with W " + shape_str(W.dims));
  if (R.dims != Shape{dirs, gates * H, H}) fail("R has shape " + shape_str(R.dims) + ", not " + shape_str({dirs, gates * H, H}));
  if (!(x.shape[2] == Dim{std::int64_t(d), 0})) fail("its input " + sym_str(x.shape) + " does not have W's " + std::to_string(d) + " features");
  if (bv.kind != Value::Kind::absent) {
    if (bv.kind != Value::Kind::param || bv.transposed) fail("its bias B must be an initializer");
    if (prog->initializers[std::size_t(bv.init)].dims != Shape{dirs, 2 * gates * H}) fail("B has the wrong shape");
  }
  // the engine's gate order: LSTM [i f g o] from ONNX's [i o f c]; GRU keeps ONNX's [z r h]
  const std::vector<std::size_t> order = lstm ? std::vector<std::size_t>{0, 2, 3, 1} : std::vector<std::size_t>{0, 1, 2};
  // PyTorch's names when the node's module is known: lstm.weight_ih_l0, lstm.bias_hh_l0_reverse, ...
  std::string module;
  std::string layer = "0";
  const auto rn = names_.find("@rnn:" + node->name);
  if (rn != names_.end()) {
    module = rn->second.substr(0, rn->second.find('|'));
    layer = rn->second.substr(rn->second.find('|') + 1);
  }
  auto pname = [&](const std::string& kind, std::size_t k, const std::string& onnx) {
    const bool reverse = direction == "reverse" || (dirs == 2 && k == 1);
    if (module.empty()) return onnx + "[" + kind + (reverse ? ", reverse" : "") + "]";
    return module + "." + kind + "_l" + layer + (reverse ? "_reverse" : "");
  };
  std::vector<int> ins{as_tensor(x)};
  for (std::size_t k = 0; k < dirs; ++k) {
    // w_ih (d, G H): column block g is ONNX's row block order[g] of W[k], transposed
    auto weight = [&](const Initializer& m, std::size_t cols, const std::string& kind) {
      return claim(int(&m - prog->initializers.data()), "rnn " + kind + " " + std::to_string(k), pname(kind, k, m.name),
                   [&](ParamSpec& s) {
                     s.shape = {cols, gates * H};
                     s.source.resize(cols * gates * H);
                     for (std::size_t c = 0; c < cols; ++c)
                       for (std::size_t g2 = 0; g2 < gates; ++g2)
                         for (std::size_t h = 0; h < H; ++h)
                           s.source[c * gates * H + g2 * H + h] = (k * gates * H + order[g2] * H + h) * cols + c;
                   });
    };
    ins.push_back(param_slot(weight(W, d, "weight_ih")));
    ins.push_back(param_slot(weight(R, H, "weight_hh")));
    if (bv.kind == Value::Kind::absent) {
      ins.push_back(-1);
      ins.push_back(-1);
      continue;
    }
    const Initializer& Bi = prog->initializers[std::size_t(bv.init)];
    for (std::size_t half = 0; half < 2; ++half) {
      const std::string kind = half == 0 ? "bias_ih" : "bias_hh";
      ins.push_back(param_slot(claim(bv.init, "rnn " + kind + " " + std::to_string(k), pname(kind, k, Bi.name),
                                     [&](ParamSpec& s) {
                                       s.shape = {gates * H};
                                       for (std::size_t g2 = 0; g2 < gates; ++g2)
                                         for (std::size_t h = 0; h < H; ++h)
                                           s.source.push_back(k * 2 * gates * H + half * gates * H + order[g2] * H + h);
                                     })));
    }
  }
  const Dim len = layout == 0 ? x.shape[0] : x.shape[1], batch = layout == 0 ? x.shape[1] : x.shape[0];
  if (!len.fixed()) fail("its sequence length grows with the batch");
  const Dim hd{std::int64_t(H), 0}, nd{std::int64_t(dirs), 0};
  const SymShape state = layout == 0 ? SymShape{nd, batch, hd} : SymShape{batch, nd, hd};
  for (std::size_t k = 5; k <= (lstm ? 6u : 5u); ++k) {
    if (!has_in(k)) {
      ins.push_back(-1);
      continue;
    }
    if (!(in(k).shape == state)) fail("its initial state " + sym_str(in(k).shape) + " is not " + sym_str(state));
    ins.push_back(as_tensor(in(k)));
  }
  std::vector<int> outs;
  const SymShape y = layout == 0 ? SymShape{len, nd, batch, hd} : SymShape{batch, len, nd, hd};
  for (std::size_t o = 0; o < (lstm ? 3u : 2u); ++o)
    outs.push_back(needed(o) ? new_slot(false, o == 0 ? y : state, "") : -1);
  Instr& i = emit(lstm ? Code::lstm : Code::gru, ins, outs);
  i.ints = {std::int64_t(dirs), layout, std::int64_t(H), direction == "reverse"};
  for (std::size_t o = 0; o < outs.size(); ++o)
    if (outs[o] >= 0) define(o, tensor_value(outs[o]));
}

}  // namespace dpgrad::onnx::detail
