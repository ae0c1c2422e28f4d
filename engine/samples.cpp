// Propagation of the per-sample axis through ops (engine/samples.hpp). Every
// rule errs towards `mixed`: a tensor is per-sample only when its layout is
// known exactly.
#include "engine/samples.hpp"

#include <algorithm>
#include <numeric>

namespace dpgrad {

std::string MixedBy::str() const {
  std::string r = op.empty() && node.empty() ? std::string("an op") : op;
  if (!detail.empty()) r += (r.empty() ? "" : " ") + detail;
  if (!node.empty()) r = node + ": " + r;
  if (what == What::statistics)
    r += " (statistics over the batch, as batch normalisation takes, mix samples: GroupNorm and LayerNorm "
         "normalise within a sample)";
  if (what == What::batch_size)
    r += " (the batch size is private: one record changes it by one, so it may shape tensors along the "
         "per-sample axis but no value may depend on it; see docs/per-sample.md)";
  return r;
}

std::string mixing_explained(const Samples& s) {
  if (s.kind != Samples::Kind::mixed) return "";
  return s.by ? ": " + s.by->str() : std::string(" (an op combined several samples' data)");
}

Samples samples_named(Samples out, std::span<const Samples> in, const char* op) {
  if (out.kind != Samples::Kind::mixed) return out;
  if (out.by) {
    if (out.by->op.empty() && out.by->node.empty()) {  // mixed here: the rule said how, this is the op
      MixedBy by = *out.by;
      by.op = op;
      out.by = std::make_shared<const MixedBy>(std::move(by));
    }
    return out;
  }
  for (const auto& s : in)  // mixed before: keep the account of the op that did it
    if (s.kind == Samples::Kind::mixed && s.by) {
      out.by = s.by;
      return out;
    }
  for (const auto& s : in)
    if (!s.is_none() && s.kind != Samples::Kind::mixed) {
      out.by = std::make_shared<const MixedBy>(MixedBy{MixedBy::What::other, op, "mixes its input's " + s.str(), ""});
      return out;
    }
  return out;
}

std::string Samples::str() const {
  switch (kind) {
    case Kind::none: return "no samples";
    case Kind::axis:
      return "per-sample axis " + std::to_string(axis) + " (" + std::to_string(count) + " samples" +
             (outer > 1 ? ", interleaved: " + std::to_string(outer) + " runs of them" : std::string()) + ")";
    case Kind::mixed: return by ? "mixed samples (by " + by->str() + ")" : "mixed samples";
    case Kind::subset: return "a subset of the samples on axis " + std::to_string(axis);
  }
  return "?";
}

namespace {

std::size_t product(const Shape& s, std::size_t begin, std::size_t end) {
  std::size_t n = 1;
  for (std::size_t i = begin; i < end; ++i) n *= s[i];
  return n;
}

/// Two tensors' samples on the same axes of one output, whose axis
/// `a.axis` has `extent` elements: both per-sample there in blocks that a
/// common coarser blocking covers (views of one example are one block), or
/// one of them holds no samples. Interleaved layouts must repeat alike.
Samples agree(const Samples& a, const Samples& b, std::size_t extent) {
  if (a.is_none()) return b;
  if (b.is_none()) return a;
  if (a.kind == Samples::Kind::axis && b.kind == Samples::Kind::axis && a.count == 1 && b.count == 1)
    return Samples::at(std::min(a.axis, b.axis), 1);  // one sample owns everything, whichever axis it is said to lie on
  const auto differ = [&] {
    return Samples::mixed(MixedBy::What::other,
                          "combines inputs whose samples lie differently (" + a.str() + "; " + b.str() + ")");
  };
  if (a.kind == Samples::Kind::mixed) return a;
  if (b.kind == Samples::Kind::mixed) return b;
  if (a.kind != Samples::Kind::axis || b.kind != Samples::Kind::axis || a.axis != b.axis || a.outer != b.outer)
    return differ();
  if (a.count == b.count) return a;
  const std::size_t period = extent / a.outer;  // one run of blocks
  if (a.count == 0 || b.count == 0 || period == 0) return differ();
  const std::size_t block = std::lcm(period / a.count, period / b.count);
  if (period % block != 0) return differ();
  return Samples::interleaved(a.axis, period / block, a.outer);
}

}  // namespace

Samples samples_broadcast(std::span<const Samples> in, std::span<const Shape> shapes, const Shape& out) {
  Samples r;
  for (std::size_t i = 0; i < in.size(); ++i) {
    Samples s = in[i];
    if (s.is_none()) continue;
    if (s.kind == Samples::Kind::mixed) return s;
    s.axis += out.size() - shapes[i].size();
    const auto with_subset = [] {
      return Samples::mixed(MixedBy::What::other, "combines a subset of the samples with other samples' data");
    };
    if (s.kind == Samples::Kind::subset) {
      if (!r.is_none()) return with_subset();
      r = s;
      continue;
    }
    // a per-sample axis of length 1 broadcast: its one sample fills the output's axis
    if (shapes[i][in[i].axis] != out[s.axis] && s.count > 1)
      return Samples::mixed(MixedBy::What::other, "broadcasts the per-sample axis " + std::to_string(in[i].axis) +
                                                      " of " + shape_str(shapes[i]) + " to " + shape_str(out));
    if (r.kind == Samples::Kind::subset) return with_subset();
    r = agree(r, s, out[s.axis]);
    if (r.kind == Samples::Kind::mixed) return r;
  }
  return r;
}

Samples samples_rowwise(std::span<const Samples> in, std::span<const Shape> shapes) {
  Samples r;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i].is_none()) continue;
    if (in[i].kind == Samples::Kind::axis && in[i].count == 1 && !shapes[i].empty()) {  // one sample: its rows are its own
      r = agree(r, Samples::at(0, 1), shapes[i][0]);
      if (r.kind == Samples::Kind::mixed) return r;
      continue;
    }
    if (in[i].kind == Samples::Kind::mixed) return in[i];
    if (in[i].kind == Samples::Kind::subset)
      return Samples::mixed(MixedBy::What::other, "works row by row and reads a subset of the samples (sliced along axis " +
                                                      std::to_string(in[i].axis) + ")");
    if (!in[i].on_axis(0) || shapes[i].empty())
      return Samples::mixed(MixedBy::What::other,
                            "works row by row on axis 0 and combines the other axes, but input " + std::to_string(i) +
                                " " + shape_str(shapes[i]) + " holds its samples on axis " + std::to_string(in[i].axis));
    if (!r.is_none() && shapes[i][0] != shapes[0][0])
      return Samples::mixed(MixedBy::What::other, "combines inputs whose rows differ in number (" +
                                                      shape_str(shapes[0]) + ", " + shape_str(shapes[i]) + ")");
    r = agree(r, in[i], shapes[i][0]);
    if (r.kind == Samples::Kind::mixed) return r;
  }
  return r;
}

Samples samples_unknown(std::span<const Samples> in) {
  for (const auto& s : in)
    if (s.kind == Samples::Kind::mixed) return s;
  for (const auto& s : in)
    if (!s.is_none()) return Samples::mixed();  // apply() names the op
  return Samples::none();
}

Samples samples_reduced(const Samples& x, const std::vector<std::size_t>& axes, bool keepdims, std::size_t rank) {
  if (x.is_none() || x.kind == Samples::Kind::mixed) return x;
  if (x.kind == Samples::Kind::axis && x.count == 1) {  // a batch of one: nothing to mix
    const std::size_t out = keepdims ? rank : rank - std::min(rank, axes.size());
    return out > 0 ? Samples::at(0, 1) : Samples::mixed();
  }
  if (std::find(axes.begin(), axes.end(), x.axis) != axes.end())
    return Samples::mixed(MixedBy::What::statistics, "over the per-sample axis " + std::to_string(x.axis) + " (" +
                                                         std::to_string(x.count) + " samples)");
  Samples r = x;
  if (!keepdims) r.axis -= std::size_t(std::count_if(axes.begin(), axes.end(), [&](std::size_t a) { return a < x.axis; }));
  return r;
}

Samples samples_reshaped(const Samples& x, const Shape& from, const Shape& to) {
  if (x.is_none() || x.kind == Samples::Kind::mixed) return x;
  if (x.kind == Samples::Kind::subset)
    return Samples::mixed(MixedBy::What::reshape, "of " + shape_str(from) + " to " + shape_str(to) +
                                                      " regroups a subset of the samples (sliced along axis " +
                                                      std::to_string(x.axis) + ")");
  const std::size_t a = x.axis;
  const auto merged = [&] {
    return Samples::mixed(MixedBy::What::reshape,
                          "of " + shape_str(from) + " to " + shape_str(to) + " merges the per-sample axis " +
                              std::to_string(a) + " (" + std::to_string(x.count) +
                              " samples) with another axis: no axis of the result holds whole samples in order");
  };
  if (from[a] == 0) {  // an empty batch: the output's first empty axis
    for (std::size_t i = 0; i < to.size(); ++i)
      if (to[i] == 0) return Samples::at(i, 0);
    return merged();
  }
  if (numel(from) == 0 || x.count == 0) return merged();
  if (x.count == 1) return to.empty() ? Samples::mixed() : Samples::at(0, 1);  // one sample owns everything
  // Row-major order is what a reshape keeps. In the flat index f of an element,
  // its sample is one mixed-radix digit: s = (f / R) % count, with R the
  // elements of one sample's block along axis a times everything after a. That
  // holds however the run of blocks repeats (outer). An output axis b, with pb
  // elements after it, holds the digit whole when pb divides R and R count
  // divides pb to[b]: the samples are then blocks of R / pb along b, repeated
  // to[b] pb / (R count) times. When no axis holds the digit whole, m
  // consecutive samples taken together (a coarser digit of radix R m) may fit:
  // (R) rows of R = B * views to (B, views) are B blocks, one per example. The
  // rules accept a blocking only when it is the batch's.
  const std::size_t inner = from[a] / (x.outer * x.count);
  const std::size_t radix = inner * product(from, a + 1, from.size());
  for (std::size_t m = 1; m <= x.count; ++m) {
    if (x.count % m != 0) continue;
    const std::size_t count = x.count / m, r = radix * m;
    for (std::size_t b = 0; b < to.size(); ++b) {
      const std::size_t pb = product(to, b + 1, to.size());
      if (to[b] == 0 || r % pb != 0 || (pb * to[b]) % (r * count) != 0) continue;
      return Samples::interleaved(b, count, to[b] / ((r / pb) * count));
    }
  }
  return merged();
}

SamplesToFront samples_to_front(const Samples& s, const Shape& shape) {
  SamplesToFront r;
  const std::size_t a = s.axis;
  const std::size_t block = s.count == 0 ? 0 : shape[a] / (s.outer * s.count);
  r.split.assign(shape.begin(), shape.begin() + std::ptrdiff_t(a));
  r.split.insert(r.split.end(), {s.outer, s.count, block});
  r.split.insert(r.split.end(), shape.begin() + std::ptrdiff_t(a) + 1, shape.end());
  r.perm.push_back(a + 1);
  for (std::size_t i = 0; i < r.split.size(); ++i)
    if (i != a + 1) r.perm.push_back(i);
  for (auto p : r.perm) r.moved.push_back(r.split[p]);
  // nothing before the count axis but axes of length 1: already in front
  r.identity = true;
  for (std::size_t i = 0; i <= a; ++i) r.identity = r.identity && r.split[i] == 1;
  return r;
}

Samples samples_transposed(const Samples& x, const std::vector<std::size_t>& perm) {
  if (x.is_none() || x.kind == Samples::Kind::mixed) return x;
  for (std::size_t i = 0; i < perm.size(); ++i)
    if (perm[i] == x.axis) {
      Samples r = x;
      r.axis = i;
      return r;
    }
  return Samples::mixed();
}

Samples samples_sliced(const Samples& x, const Shape& from, std::size_t axis, std::size_t begin, std::size_t end) {
  if (x.kind != Samples::Kind::axis || x.axis != axis) return x;
  if ((begin == 0 && end == from[axis]) || x.count == 1) return x;
  return Samples::subset(axis);
}

Samples samples_concatenated(std::span<const Samples> in, std::span<const Shape> shapes, std::size_t axis) {
  // parts of one sample joined: still that sample's
  const bool single = std::all_of(in.begin(), in.end(), [](const Samples& s) {
    return s.is_none() || (s.kind == Samples::Kind::axis && s.count == 1);
  });
  if (single && std::any_of(in.begin(), in.end(), [](const Samples& s) { return !s.is_none(); }))
    return shapes.empty() || shapes[0].empty() ? Samples::mixed() : Samples::at(0, 1);
  Samples r;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Samples& s = in[i];
    if (s.is_none()) continue;
    if (s.kind == Samples::Kind::mixed) return s;
    if (s.kind != Samples::Kind::axis || s.axis == axis)
      return Samples::mixed(MixedBy::What::other,
                            s.kind == Samples::Kind::axis
                                ? "joins along the per-sample axis " + std::to_string(axis)
                                : "joins " + s.str() + " with other inputs along axis " + std::to_string(axis));
    r = agree(r, s, shapes[i][s.axis]);
    if (r.kind == Samples::Kind::mixed) return r;
  }
  return r;
}

}  // namespace dpgrad
