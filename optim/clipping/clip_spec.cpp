// Clipping strategy names: see clip_spec.hpp.
#include "optim/clipping/clip_spec.hpp"

#include <stdexcept>

namespace dpgrad {

namespace {

/// The whole number >= 1 in `text`, which is `what` of strategy `spec`.
int parse_positive(const std::string& spec, const std::string& text, const std::string& what) {
  const bool digits = !text.empty() && text.size() <= 7 && text.find_first_not_of("0123456789") == std::string::npos;
  const long v = digits ? std::stol(text) : 0;
  if (v < 1 || v > 1000000)
    throw std::invalid_argument("clip strategy '" + spec + "': " + what + " needs a whole number >= 1 and <= 10^6");
  return int(v);
}

}  // namespace

ClipSpec parse_clip_spec(const std::string& text) {
  ClipSpec s;
  using K = ClipSpec::Kind;
  const std::size_t plus = text.find('+');
  const std::string spec = text.substr(0, plus);
  if (plus != std::string::npos) {
    const std::string layers = text.substr(plus + 1);
    if (layers == "layers") s.layers = ClipSpec::Layers::equal;
    else if (layers == "layers:size") s.layers = ClipSpec::Layers::size;
    else if (layers == "layers:adaptive") s.layers = ClipSpec::Layers::adaptive;
    else throw std::invalid_argument("clip strategy '" + text + "': after '+' comes layers, layers:size or layers:adaptive");
    if (spec != "naive" && spec != "vanilla" && spec != "ghost")
      throw std::invalid_argument("clip strategy '" + text + "': per-layer clipping (+" + layers + ") applies to naive, "
                                  "vanilla and ghost, whose contributions are one example's exact gradient");
  }
  if (spec == "none") s.kind = K::none;
  else if (spec == "naive") s.kind = K::naive;
  else if (spec == "vanilla") s.kind = K::vanilla;
  else if (spec == "ghost") s.kind = K::ghost;
  else if (spec.rfind("jl:", 0) == 0) {  // jl:K or jl:K/C (C directions per pass)
    s.kind = K::jl;
    const std::size_t slash = spec.find('/');
    s.directions = parse_positive(spec, spec.substr(3, slash == std::string::npos ? std::string::npos : slash - 3), "jl:");
    s.chunk = slash == std::string::npos ? 0 : parse_positive(spec, spec.substr(slash + 1), "jl:K/");
    // each direction is a forward pass: K of them cost about K non-private steps
    // (jl:1000 took 26 s a step on cnn26k); beyond a few hundred the exact
    // strategies are faster and tighter (dpgrad-train allows at most jl:1000)
    if (s.directions > kMaxJlDirections)
      throw std::invalid_argument("jl:" + std::to_string(s.directions) + " would take about " +
                                  std::to_string(s.directions) + " forward passes per step; at most jl:" +
                                  std::to_string(kMaxJlDirections) + " (ghost and vanilla give exact norms faster)");
  } else if (spec.rfind("microbatch:", 0) == 0) {
    s.kind = K::microbatch;
    s.group_size = parse_positive(spec, spec.substr(11), "microbatch:");
  } else {
    throw std::invalid_argument("unknown clip strategy '" + text +
                                "' (none, naive, vanilla, ghost, jl:K, microbatch:M; naive, vanilla and ghost also "
                                "per layer: ghost+layers, ghost+layers:size, ghost+layers:adaptive)");
  }
  return s;
}

}  // namespace dpgrad
