// dpgrad-train's output: progress on standard error, epsilon for people and for
// JSON, and the per-layer signal-to-noise summary.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/dp_optimizer.hpp"

namespace dpgrad::train {

/// A progress bar (terminal) or a line every tenth of an epoch (not a terminal).
class Progress {
 public:
  explicit Progress(bool quiet);
  /// `loss` only when it may be shown, with its label (" (not covered by epsilon)" in private runs).
  void update(long step, long total, std::optional<double> loss, const std::string& label, double examples_per_s,
              double eta_s, long epoch);

 private:
  bool tty_, quiet_;
};

/// epsilon rounded up for people ("inf" when none is proven).
std::string fmt_eps(double e);
/// epsilon for JSON: a number, or "inf".
nlohmann::json eps_json(double e);

/// Per layer (a parameter's name up to its last '.'), the noised gradient's
/// signal-to-noise ratio per coordinate over the epoch, in the layers' order.
std::vector<std::pair<std::string, double>> layer_snr(const std::vector<GradientEnergy>& energy);

}  // namespace dpgrad::train
