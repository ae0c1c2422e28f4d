// The batch size B in an imported graph (docs/per-sample.md, "The batch size"):
// it may shape tensors, never reach a value. The compiler folds shapes as affine
// functions of B (onnx/compile.cpp); whatever turns B into a value (Shape,
// Size or Range read as data, a comparison of B with a number, a reduction
// over rows only B made) runs at run time, and the runtime labels it mixed by
// the batch size with its node, so that every exact strategy refuses it where
// it first meets a parameter's use or the losses, as any other mixing; naive,
// which runs each example alone, trains it. Here: the Size and Range handlers
// and the labels the runtime gives (onnx/run.cpp).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "onnx/compiler.hpp"

namespace dpgrad::onnx::detail {

bool batch_dependent(const Value& v) {
  return v.kind == Value::Kind::static_ints &&
         std::any_of(v.sints.begin(), v.sints.end(), [](Dim d) { return !d.fixed(); });
}

Samples filled_samples(const SymShape& s, std::size_t batch, const std::string& node) {
  std::size_t axis = s.size();
  for (std::size_t a = 0; a < s.size(); ++a) {
    if (s[a].fixed()) continue;
    if (axis < s.size() || s[a].c != 0 || s[a].b < 1)
      return Samples::batch_size(node, "fills a tensor of shape " + sym_str(s) +
                                           ", whose number of elements is not a whole number for each sample");
    axis = a;
  }
  if (axis == s.size()) return Samples::none();
  // the rows along the batch axis are alike (a fill, a broadcast): each stands beside one sample
  return Samples::at(axis, batch);
}

Samples named_mixing(const Samples& s, const std::string& node, bool data) {
  MixedBy by = s.by ? *s.by : MixedBy{};
  by.node = node;
  if (by.op.empty() && by.detail.empty()) by.detail = "combines several samples";
  if (!data) {  // no input holds data: the samples' blocks were made by the batch size alone
    by.what = MixedBy::What::batch_size;
    by.detail += ", over rows that only the batch size made (a value computed from the batch size)";
  }
  Samples r = s;
  r.by = std::make_shared<const MixedBy>(std::move(by));
  return r;
}

void Compiler::op_size() {
  const Value& x = in(0);
  const std::string where = g.path + ": " + node->label();
  Dim n{1, 0};
  for (const Dim& d : x.shape) n = dim_mul(n, d, where);
  Value v;
  v.kind = Value::Kind::static_ints;
  v.elem = kInt64;
  v.sints = {n};
  define(0, v);  // a scalar: affine in B, a shape value until something reads it as data
}

void Compiler::op_range() {
  const Value &start = in(0), &limit = in(1), &delta = in(2);
  for (const Value* v : {&start, &limit, &delta})
    if (!(v->kind == Value::Kind::static_ints || v->kind == Value::Kind::const_float) || !v->shape.empty())
      fail("its start, limit and delta must be scalars known at load time");
  const bool floats = start.kind == Value::Kind::const_float || limit.kind == Value::Kind::const_float ||
                      delta.kind == Value::Kind::const_float;
  constexpr std::int64_t big = std::int64_t(1) << 40;
  if (!floats)
    for (const Value* v : {&start, &limit, &delta})
      if (std::abs(v->sints[0].c) >= big || std::abs(v->sints[0].b) >= big) fail("a huge value in its start, limit or delta");
  if (!batch_dependent(start) && !batch_dependent(limit)) {  // fixed: folded
    double a = 0, b = 0, d = 0;
    scalar(start, a);
    scalar(limit, b);
    scalar(delta, d);
    if (d == 0 || !std::isfinite(a) || !std::isfinite(b) || !std::isfinite(d)) fail("its delta is 0, or a value is not finite");
    const double n = std::max(0.0, std::ceil((b - a) / d));
    check_size({Dim{std::int64_t(std::min(n, 9e15)), 0}}, "its output");
    check_fold({Dim{std::int64_t(n), 0}}, floats ? sizeof(double) : sizeof(Dim));  // before it is built
    Value v;
    v.shape = {Dim{std::int64_t(n), 0}};
    if (floats) {
      v.kind = Value::Kind::const_float;
      ArrayT<double> r = ArrayT<double>::from_shape({std::size_t(n)});
      for (std::size_t k = 0; k < r.size(); ++k) r(k) = a + double(k) * d;
      v.cf = std::make_shared<const ArrayT<double>>(std::move(r));
    } else {
      v.kind = Value::Kind::static_ints;
      v.elem = kInt64;
      for (std::int64_t k = 0; k < std::int64_t(n); ++k) v.sints.push_back(Dim{std::int64_t(a) + k * std::int64_t(d), 0});
    }
    define(0, v);
    return;
  }
  if (floats) fail("its start, limit and delta must be integers when they depend on the batch size");
  const Dim d = delta.sints[0];
  if (!d.fixed() || d.c == 0) fail("its delta must be a non-zero constant");
  // (limit - start) / delta elements, affine in B; the values start + k delta number the batch's rows
  const Dim n = dim_div(dim_sub(limit.sints[0], start.sints[0]), d, g.path + ": " + node->label());
  if (n.c < 0 || n.b < 0) fail("its length " + dim_str(n) + " is negative for some batch sizes");
  const SymShape shape{n};
  check_size(shape, "its output");
  const int slot = new_slot(true, shape, "");
  Instr& i = emit(Code::range, {}, {slot});
  i.shape0 = shape;
  i.dims = {start.sints[0]};
  i.ints = {d.c};
  define(0, ints_value(slot));
}

}  // namespace dpgrad::onnx::detail
