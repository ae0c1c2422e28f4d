// The text form of a clipping strategy ("ghost", "jl:K", "microbatch:M", ...),
// parsed once for make_clip_strategy and for the programs that check their
// options before building anything.
#pragma once

#include <string>

namespace dpgrad {

/// A clipping strategy as parse_clip_spec reads it from its text; the numbers
/// not used by its kind stay 0.
struct ClipSpec {
  /// The strategies of optim/clipping/clipping.hpp.
  enum class Kind { none, naive, vanilla, ghost, jl, microbatch };
  Kind kind = Kind::ghost;
  int directions = 0;    // jl:K
  int chunk = 0;         // jl:K/C (0: chosen from the tape's size)
  int group_size = 0;    // microbatch:M: M examples per microbatch
  /// Per-layer clipping (naive, vanilla, ghost; "+layers", "+layers:size",
  /// "+layers:adaptive"): each layer's part of a contribution (a layer: its
  /// parameters' names up to the last '.') is clipped to its own C_g, with the
  /// C_g^2 summing to C^2, so the contribution's norm and the sensitivity stay
  /// at most C. equal: C_g = C / sqrt(layers); size: C_g^2 proportional to the
  /// layer's parameter count; adaptive: each C_g follows its own quantile
  /// through a noised count (DPConfig::adaptive, which it needs; docs/math.md section 8).
  enum class Layers { flat, equal, size, adaptive };
  Layers layers = Layers::flat;
};

/// jl:K takes at most this many directions: each is a forward pass.
inline constexpr int kMaxJlDirections = 10000;

/// Parses "none", "naive", "vanilla", "ghost", "jl:K", "jl:K/C" or
/// "microbatch:M", the first three optionally followed by "+layers",
/// "+layers:size" or "+layers:adaptive"; throws std::invalid_argument naming the problem.
ClipSpec parse_clip_spec(const std::string& spec);

}  // namespace dpgrad
