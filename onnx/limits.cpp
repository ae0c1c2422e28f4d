// Bounds on the memory an imported model may take (docs/onnx.md, "Bad input"):
// what the compiler folds at load time is charged before it is built, and the
// compiled program's tensors are summed, per example for the part that grows
// with the batch and once for the rest, before the first forward pass. A few
// hundred bytes of ONNX can ask for gigabytes; these refuse them by node.
#include <cmath>
#include <cstdio>

#include "onnx/compiler.hpp"

namespace dpgrad::onnx::detail {

namespace {

/// The elements of a shape whose dims are c + b B: fixed + per_example B (a
/// product in which B enters twice counts as infinitely many per example;
/// check_size refuses such shapes before).
struct Count {
  double fixed = 1, per_example = 0;
};

Count elements(const SymShape& s) {
  Count n;
  double square = 0;
  for (const Dim& d : s) {
    const double c = double(std::max<std::int64_t>(0, d.c)), b = double(std::max<std::int64_t>(0, d.b));
    square = square * c + n.per_example * b;
    n.per_example = n.per_example * c + n.fixed * b;
    n.fixed *= c;
  }
  if (square > 0) n.per_example = INFINITY;
  return n;
}

/// "1600 bytes", "1073741828 bytes (1.0 GiB)".
std::string bytes_str(double bytes) {
  char text[96];
  if (!std::isfinite(bytes)) return "unboundedly many bytes";
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(text, sizeof text, "%.0f bytes (%.1f GiB)", bytes, bytes / (1024.0 * 1024 * 1024));
  else if (bytes >= 1024.0 * 1024)
    std::snprintf(text, sizeof text, "%.0f bytes (%.1f MiB)", bytes, bytes / (1024.0 * 1024));
  else
    std::snprintf(text, sizeof text, "%.0f bytes", bytes);
  return text;
}

}  // namespace

void Compiler::check_fold(const SymShape& s, std::size_t element_bytes) const {
  const Count n = elements(s);
  const double need = (n.fixed + n.per_example) * double(element_bytes);
  if (constant_bytes_ + need > double(opt.max_constant_bytes))
    fail("its output " + sym_str(s) + " would take " + bytes_str(need) + " at load time" +
         (constant_bytes_ > 0 ? " (besides " + bytes_str(constant_bytes_) + " of values computed before it)" : "") +
         ", more than the limit of " + bytes_str(double(opt.max_constant_bytes)) +
         " (LoadOptions::max_constant_bytes): refused before it is built");
}

void Compiler::charge_fold(const SymShape& s, std::size_t element_bytes) {
  check_fold(s, element_bytes);
  const Count n = elements(s);
  constant_bytes_ += (n.fixed + n.per_example) * double(element_bytes);
}

void Compiler::charge_value(const Value& v) {
  double bytes = 0;
  if (v.kind == Value::Kind::static_ints) bytes = double(v.sints.size()) * double(sizeof(Dim));
  else if (v.kind == Value::Kind::const_float && v.cf && charged_.insert(v.cf.get()).second)
    bytes = double(v.cf->size()) * double(sizeof(double));
  // a Constant node's value is the file's own data, bounded by max_file_bytes
  if (bytes == 0 || (node && node->op == "Constant")) return;
  constant_bytes_ += bytes;
  if (constant_bytes_ > double(opt.max_constant_bytes))
    fail("the values computed at load time take " + bytes_str(constant_bytes_) + " with its output " +
         sym_str(v.shape) + ", more than the limit of " + bytes_str(double(opt.max_constant_bytes)) +
         " (LoadOptions::max_constant_bytes)");
}

void check_memory(const Program& p, const LoadOptions& o, std::size_t float_bytes) {
  double per_example = 0, fixed = 0;
  for (const Instr& i : p.instrs) {
    // parameters are the file's initializers (max_file_bytes); constants were charged as they were folded
    if (i.code == Code::param || i.code == Code::constant || i.code == Code::int_constant) continue;
    for (const int out : i.out) {
      if (out < 0) continue;
      const Slot& slot = p.slots[std::size_t(out)];
      const double bytes = double(slot.ints ? sizeof(std::int64_t) : float_bytes);
      const Count n = elements(slot.shape);
      per_example += n.per_example * bytes;
      fixed += n.fixed * bytes;
      const bool input = i.code == Code::input_features || i.code == Code::input_tokens;
      const std::string who = input ? "input '" + slot.name + "'" : i.node;
      const std::string what = p.path + ": " + who + ": with its output " + sym_str(slot.shape) + " (" +
                               (slot.ints ? "int64" : float_bytes == 4 ? "float" : "double") + ")";
      if (per_example > double(o.max_bytes_per_example))
        throw OnnxError(what + ", the forward pass needs " + bytes_str(per_example) +
                        " per example, more than the limit of " + bytes_str(double(o.max_bytes_per_example)) +
                        " (LoadOptions::max_bytes_per_example)");
      if (fixed > double(o.max_constant_bytes))
        throw OnnxError(what + ", the forward pass needs " + bytes_str(fixed) +
                        " whatever the batch size, more than the limit of " + bytes_str(double(o.max_constant_bytes)) +
                        " (LoadOptions::max_constant_bytes)");
    }
  }
}

}  // namespace dpgrad::onnx::detail
