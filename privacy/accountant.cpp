// The accountant base class (validated, merged ledger), its JSON form, and the
// factory that builds any accountant by name or from saved JSON, so that a
// resumed run continues the same ledger with the same settings.
#include "privacy/accountant.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "privacy/gdp.hpp"
#include "privacy/pate.hpp"
#include "privacy/rdp.hpp"
#include "privacy/shuffle.hpp"
#include "privacy/wor.hpp"

#include "privacy/pld.hpp"

namespace dpgrad::privacy {
namespace {

std::unique_ptr<Accountant> make_pld(const AccountantOptions&) { return std::make_unique<PldAccountant>(); }

std::unique_ptr<Accountant> pld_from_json(const nlohmann::json& j) { return PldAccountant::from_json(j); }

}  // namespace

std::string format_number(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}

std::string format_epsilon(double epsilon, int decimals) {
  if (std::isnan(epsilon)) return "nan";
  if (!std::isfinite(epsilon)) return "inf";
  const double scale = std::pow(10.0, decimals);
  double up = std::ceil(epsilon * scale) / scale;
  if (up < epsilon) up = std::nextafter(up + 1.0 / scale, INFINITY);  // rounding in the division
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, up);
  return buf;
}

double accounted_sensitivity(double s, Neighbouring n) {
  if (!(s > 0) || !std::isfinite(s))
    throw std::invalid_argument("sensitivity must be finite and > 0, got " + format_number(s));
  return n == Neighbouring::add_remove ? s : std::min(s, 1.0);
}

std::string to_string(Neighbouring n) {
  return n == Neighbouring::add_remove ? "add/remove-one" : "replace-one";
}

// Refuses sigma = 0 (and non-finite sigma): a step without noise has no finite
// epsilon, and callers that want to print "inf" for it (dpgrad-account) do so
// without recording it.
void Accountant::validate(const Step& s) const {
  if (!(s.sampling_rate > 0.0 && s.sampling_rate <= 1.0))
    throw std::invalid_argument(name() + " accountant: sampling rate q must be in (0, 1], got " +
                                format_number(s.sampling_rate));
  if (!(s.noise_multiplier > 0.0) || !std::isfinite(s.noise_multiplier))
    throw std::invalid_argument(name() + " accountant: noise multiplier sigma must be finite and > 0, got " +
                                format_number(s.noise_multiplier) +
                                (s.noise_multiplier == 0.0 ? " (no noise: epsilon is infinite)" : ""));
  if (s.count < 1)
    throw std::invalid_argument(name() + " accountant: step count must be >= 1, got " +
                                std::to_string(s.count));
  if (s.jl_dim < 0)
    throw std::invalid_argument(name() + " accountant: jl_dim must be >= 0, got " + std::to_string(s.jl_dim));
  if (s.jl_dim > 0 && !supports_jl())
    throw std::invalid_argument(name() + " accountant cannot analyse DP-SGD-JL (jl_dim = " +
                                std::to_string(s.jl_dim) + "); use the pld accountant");
}

void Accountant::step(double sampling_rate, double noise_multiplier, long steps, int jl_dim) {
  const Step s{sampling_rate, noise_multiplier, steps, jl_dim};
  validate(s);
  if (!ledger_.empty()) {
    Step& last = ledger_.back();
    if (last.sampling_rate == s.sampling_rate && last.noise_multiplier == s.noise_multiplier &&
        last.jl_dim == s.jl_dim) {
      if (last.count > std::numeric_limits<long>::max() - s.count)
        throw std::invalid_argument(name() + " accountant: step count overflows");
      last.count += s.count;
      return;
    }
  }
  ledger_.push_back(s);
}

long Accountant::total_steps() const {
  long total = 0;
  for (const Step& s : ledger_) {
    if (total > std::numeric_limits<long>::max() - s.count) return std::numeric_limits<long>::max();
    total += s.count;
  }
  return total;
}

nlohmann::json Accountant::to_json() const {
  nlohmann::json ledger = nlohmann::json::array();
  for (const Step& s : ledger_)
    ledger.push_back({{"sampling_rate", s.sampling_rate},
                      {"noise_multiplier", s.noise_multiplier},
                      {"count", s.count},
                      {"jl_dim", s.jl_dim}});
  return {{"format", "dpgrad-accountant"},
          {"version", 1},
          {"accountant", name()},
          {"neighbouring", to_string(neighbouring())},
          {"ledger", ledger}};
}

long json_whole_number(const nlohmann::json& j, const char* key, long lo, long hi, std::optional<long> fallback) {
  if (!j.contains(key)) {
    if (fallback) return *fallback;
    throw std::invalid_argument(std::string("accountant JSON: missing \"") + key + "\"");
  }
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer())
    throw std::invalid_argument(std::string("accountant JSON: \"") + key + "\" must be a whole number, got " +
                                v.dump().substr(0, 80));
  const bool fits = v.is_number_unsigned() ? v.get<std::uint64_t>() <= std::uint64_t(hi) : v.get<std::int64_t>() >= lo &&
                                                                                               v.get<std::int64_t>() <= hi;
  if (!fits)
    throw std::invalid_argument(std::string("accountant JSON: \"") + key + "\" must be in [" + std::to_string(lo) +
                                ", " + std::to_string(hi) + "], got " + v.dump().substr(0, 80));
  return static_cast<long>(v.get<std::int64_t>());
}

void replay_ledger(Accountant& a, const nlohmann::json& j) {
  if (!j.contains("ledger")) return;
  const auto& ledger = j.at("ledger");
  if (!ledger.is_array()) throw std::invalid_argument("accountant JSON: \"ledger\" must be an array");
  for (const auto& e : ledger) {
    if (!e.is_object()) throw std::invalid_argument("accountant JSON: ledger entries must be objects");
    a.step(e.at("sampling_rate").get<double>(), e.at("noise_multiplier").get<double>(),
           json_whole_number(e, "count", 1, std::numeric_limits<long>::max(), 1),
           static_cast<int>(json_whole_number(e, "jl_dim", 0, 1 << 20, 0)));
  }
}

std::unique_ptr<Accountant> accountant_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("accountant JSON: expected an object, got " + j.dump());
  if (!j.contains("accountant") || !j.at("accountant").is_string())
    throw std::invalid_argument("accountant JSON: missing string field \"accountant\"");
  const std::string name = j.at("accountant").get<std::string>();
  std::unique_ptr<Accountant> a;
  try {
    if (name == "rdp") a = RdpAccountant::from_json(j);
    else if (name == "gdp") a = GdpAccountant::from_json(j);
    else if (name == "wor") a = WorAccountant::from_json(j);
    else if (name == "shuffle") a = ShuffleAccountant::from_json(j);
    else if (name == "pld") a = pld_from_json(j);
    else if (name == "pate") a = PateAccountant::from_json(j);
    else throw std::invalid_argument("accountant JSON: unknown accountant '" + name + "'");
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("accountant JSON for '" + name + "' is malformed: " + e.what());
  }
  if (j.contains("neighbouring") && j.at("neighbouring") != to_string(a->neighbouring()))
    throw std::invalid_argument("accountant JSON: neighbouring relation " + j.at("neighbouring").dump() +
                                " does not match accountant '" + name + "' (" +
                                to_string(a->neighbouring()) + ")");
  return a;
}

std::unique_ptr<Accountant> make_accountant(const std::string& name, const AccountantOptions& opts) {
  if (name == "rdp") return std::make_unique<RdpAccountant>(opts.orders);
  if (name == "gdp") return std::make_unique<GdpAccountant>();
  if (name == "wor") return std::make_unique<WorAccountant>(opts.orders);
  if (name == "shuffle")
    return std::make_unique<ShuffleAccountant>(opts.dataset_size, opts.batch_size, opts.epoch_fraction,
                                               opts.orders);
  if (name == "pld") return make_pld(opts);
  throw std::invalid_argument("unknown accountant '" + name + "' (expected rdp, pld, gdp, wor or shuffle)");
}

}  // namespace dpgrad::privacy
