// dpgrad-train's output helpers (programs/train/report.hpp).
#include "programs/train/report.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/core.h>

#include "privacy/accountant.hpp"

namespace dpgrad::train {

Progress::Progress(bool quiet) : tty_(isatty(fileno(stderr)) && !quiet), quiet_(quiet) {}

void Progress::update(long step, long total, std::optional<double> loss, const std::string& label,
                    double examples_per_s, double eta_s, long epoch) {
  if (quiet_) return;
  const std::string shown = loss ? fmt::format(" loss{} {:.4f}", label, *loss) : "";
  if (tty_) {
    int width = 30, filled = total ? int(double(width) * double(step) / double(total)) : width;
    fmt::print(stderr, "\r  epoch {:>3} [{}{}] {:>6}/{}{} {:>7.0f} ex/s ETA {:>5.0f}s ", epoch,
               std::string(std::size_t(filled), '#'), std::string(std::size_t(width - filled), '.'), step, total,
               shown, examples_per_s, eta_s);
    if (step == total) fmt::print(stderr, "\n");
  } else if (total && (step == total || step * 10 / total != (step - 1) * 10 / total)) {
    fmt::print(stderr, "  epoch {} step {}/{}{} {:.0f} ex/s ETA {:.0f}s\n", epoch, step, total, shown,
               examples_per_s, eta_s);
  }
}

std::string fmt_eps(double e) { return privacy::format_epsilon(e); }
nlohmann::json eps_json(double e) { return std::isfinite(e) ? nlohmann::json(e) : nlohmann::json("inf"); }

std::vector<std::pair<std::string, double>> layer_snr(const std::vector<GradientEnergy>& energy) {
  std::vector<GradientEnergy> layers;  // the parameters' energies summed per layer
  for (const auto& e : energy) {
    const std::string layer = e.name.substr(0, e.name.rfind('.'));
    auto it = std::find_if(layers.begin(), layers.end(), [&](const GradientEnergy& l) { return l.name == layer; });
    if (it == layers.end()) it = layers.insert(layers.end(), GradientEnergy{layer});
    it->size += e.size;
    it->noised += e.noised;
    it->noise += e.noise;
  }
  std::vector<std::pair<std::string, double>> r;
  for (const auto& l : layers) r.emplace_back(l.name, l.snr());
  return r;
}

}  // namespace dpgrad::train
