// Propagation of the per-sample axis through ops (engine/samples.hpp). Every
// rule errs towards `mixed`: a tensor is per-sample only when its layout is
// known exactly.
#include "engine/samples.hpp"

#include <algorithm>
#include <numeric>

namespace dpgrad {

std::string Samples::str() const {
  switch (kind) {
    case Kind::none: return "no samples";
    case Kind::axis: return "per-sample axis " + std::to_string(axis) + " (" + std::to_string(count) + " samples)";
    case Kind::mixed: return "mixed samples";
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
/// one of them holds no samples.
Samples agree(const Samples& a, const Samples& b, std::size_t extent) {
  if (a.is_none()) return b;
  if (b.is_none()) return a;
  if (a.kind != Samples::Kind::axis || b.kind != Samples::Kind::axis || a.axis != b.axis) return Samples::mixed();
  if (a.count == b.count) return a;
  if (a.count == 0 || b.count == 0 || extent == 0) return Samples::mixed();
  const std::size_t block = std::lcm(extent / a.count, extent / b.count);
  if (extent % block != 0) return Samples::mixed();
  return Samples::at(a.axis, extent / block);
}

}  // namespace

Samples samples_broadcast(std::span<const Samples> in, std::span<const Shape> shapes, const Shape& out) {
  Samples r;
  for (std::size_t i = 0; i < in.size(); ++i) {
    Samples s = in[i];
    if (s.is_none()) continue;
    if (s.kind == Samples::Kind::mixed) return s;
    s.axis += out.size() - shapes[i].size();
    if (s.kind == Samples::Kind::subset) {
      if (!r.is_none()) return Samples::mixed();
      r = s;
      continue;
    }
    // a per-sample axis of length 1 broadcast: its one sample fills the output's axis
    if (shapes[i][in[i].axis] != out[s.axis] && s.count > 1) return Samples::mixed();
    if (r.kind == Samples::Kind::subset) return Samples::mixed();
    r = agree(r, s, out[s.axis]);
    if (r.kind == Samples::Kind::mixed) return r;
  }
  return r;
}

Samples samples_rowwise(std::span<const Samples> in, std::span<const Shape> shapes) {
  Samples r;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i].is_none()) continue;
    if (!in[i].on_axis(0) || shapes[i].empty()) return Samples::mixed();
    if (!r.is_none() && shapes[i][0] != shapes[0][0]) return Samples::mixed();
    r = agree(r, in[i], shapes[i][0]);
    if (r.kind == Samples::Kind::mixed) return r;
  }
  return r;
}

Samples samples_unknown(std::span<const Samples> in) {
  for (const auto& s : in)
    if (!s.is_none()) return Samples::mixed();
  return Samples::none();
}

Samples samples_reduced(const Samples& x, const std::vector<std::size_t>& axes, bool keepdims) {
  if (x.is_none() || x.kind == Samples::Kind::mixed) return x;
  if (std::find(axes.begin(), axes.end(), x.axis) != axes.end()) return Samples::mixed();
  Samples r = x;
  if (!keepdims) r.axis -= std::size_t(std::count_if(axes.begin(), axes.end(), [&](std::size_t a) { return a < x.axis; }));
  return r;
}

Samples samples_reshaped(const Samples& x, const Shape& from, const Shape& to) {
  if (x.is_none() || x.kind == Samples::Kind::mixed) return x;
  if (x.kind == Samples::Kind::subset) return Samples::mixed();
  const std::size_t a = x.axis;
  if (from[a] == 0) {  // an empty batch: the output's first empty axis
    for (std::size_t i = 0; i < to.size(); ++i)
      if (to[i] == 0) return Samples::at(i, 0);
    return Samples::mixed();
  }
  if (numel(from) == 0 || x.count == 0) return Samples::mixed();
  // Row-major: the elements of axes a.. of `from` form contiguous runs,
  // repeated `outer` times; sample k owns the k-th of `count` equal pieces of
  // each run. An output axis b with the same elements before it (same outer)
  // cuts each run into to[b] slabs; the samples stay blocks along b when a
  // sample's piece is whole slabs (count divides to[b]). Otherwise the finest
  // blocks along b that are whole slabs and whole samples, gcd(count, to[b])
  // of them, still each hold whole samples: (R) rows of R = B * views to
  // (B, views) are B blocks, one per example. The rules accept a blocking only
  // when it is the batch's.
  const std::size_t outer = product(from, 0, a);
  Samples best = Samples::mixed();
  for (std::size_t b = 0; b < to.size(); ++b) {
    if (product(to, 0, b) != outer || to[b] == 0) continue;
    const std::size_t count = std::gcd(x.count, to[b]);
    if (count == x.count) return Samples::at(b, count);
    if (best.kind == Samples::Kind::mixed || count > best.count) best = Samples::at(b, count);
  }
  return best;
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
  if (begin == 0 && end == from[axis]) return x;
  return Samples::subset(axis);
}

Samples samples_concatenated(std::span<const Samples> in, std::span<const Shape> shapes, std::size_t axis) {
  Samples r;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Samples& s = in[i];
    if (s.is_none()) continue;
    if (s.kind != Samples::Kind::axis || s.axis == axis) return Samples::mixed();
    r = agree(r, s, shapes[i][s.axis]);
    if (r.kind == Samples::Kind::mixed) return r;
  }
  return r;
}

}  // namespace dpgrad
