// The accountant interface: a ledger of DP-SGD steps (sampling rate, noise
// multiplier, count, JL dimension) and the (epsilon, delta) it has spent. Each
// accountant is a thin class over pure analysis functions in its own file.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dpgrad::privacy {

/// Which datasets count as neighbours; every printed epsilon names it.
enum class Neighbouring { add_remove, replace_one };
std::string to_string(Neighbouring n);  // "add/remove-one", "replace-one"

/// One ledger entry: `count` identical steps of the subsampled Gaussian mechanism.
struct Step {
  double sampling_rate;     // q in (0, 1]
  double noise_multiplier;  // sigma > 0 (noise std / sensitivity)
  long count = 1;           // >= 1
  int jl_dim = 0;           // 0: exact per-sample norms; K >= 1: DP-SGD-JL with K projections
  bool operator==(const Step&) const = default;  // every field exactly
};

/// The base of every accountant: a validated ledger of steps and the (epsilon,
/// delta) its analysis proves for them, under the relation neighbouring().
class Accountant {
 public:
  virtual ~Accountant() = default;
  virtual std::string name() const = 0;  // "rdp", "pld", "gdp", "wor", "shuffle"
  virtual Neighbouring neighbouring() const = 0;
  /// Only what the accountant can analyse soundly; others are refused in step().
  virtual bool supports_jl() const { return false; }
  /// Whether epsilon()/delta() are proven upper bounds. Only those calibrate noise or
  /// serve as a run's epsilon; approximations (gdp) and comparisons say false.
  virtual bool upper_bound() const { return true; }

  /// Records `steps` steps at (q, sigma). Validates (throws std::invalid_argument
  /// naming the bad value); consecutive identical entries are merged.
  void step(double sampling_rate, double noise_multiplier, long steps = 1, int jl_dim = 0);

  /// Smallest epsilon this analysis proves at `delta` (0 < delta < 1); +infinity
  /// when it proves none. Never below the truth: numerical error rounds upwards.
  virtual double epsilon(double delta) const = 0;
  /// delta at `epsilon` (>= 0); an upper bound.
  virtual double delta(double epsilon) const = 0;

  /// The recorded steps (consecutive identical entries merged), and the sum of
  /// their counts (LONG_MAX when that sum overflows).
  const std::vector<Step>& ledger() const { return ledger_; }
  long total_steps() const;

  /// The ledger and settings, so that a resumed run continues the same account.
  virtual nlohmann::json to_json() const;
  virtual std::unique_ptr<Accountant> clone() const = 0;

 protected:
  virtual void validate(const Step& s) const;
  std::vector<Step> ledger_;
};

/// What a clipping strategy's noise multiplier is divided by before it reaches an
/// accountant with relation `n`. `add_remove_sensitivity` is how far one example moves
/// the clipped sum under add/remove-one, in units of C (1 vanilla, 2 microbatches: the
/// clipped mean of its microbatch moves anywhere in the C-ball). add/remove accountants
/// (rdp, pld) take sigma / that. Replace-one accountants (wor, shuffle) have the 2C of one
/// clipped unit moving across the C-ball built in, which bounds replace-one for every
/// strategy whose example moves one clipped unit (an example, or its microbatch): 2C for
/// microbatches too, so they take sigma / min(s, 1). Throws for s <= 0 or not finite.
double accounted_sensitivity(double add_remove_sensitivity, Neighbouring n);

/// A number for error messages: `digits` significant digits (17: round trip).
std::string format_number(double x, int digits = 17);

/// epsilon for people to read: rounded UP to `decimals` decimals (never below
/// the value computed), "inf" when infinite.
std::string format_epsilon(double epsilon, int decimals = 4);

/// Builds an accountant from to_json() output (settings and ledger).
std::unique_ptr<Accountant> accountant_from_json(const nlohmann::json& j);

/// j[key] as a whole number in [lo, hi]; throws std::invalid_argument naming the
/// key otherwise (a double such as 1e98 is not silently converted). `fallback`
/// when the key is absent (none: the key is required).
long json_whole_number(const nlohmann::json& j, const char* key, long lo, long hi,
                       std::optional<long> fallback = std::nullopt);

/// Replays the "ledger" of to_json() output into `a` through step(), so every
/// entry is validated again (used by each accountant's from_json).
void replay_ledger(Accountant& a, const nlohmann::json& j);

/// Settings an accountant may need; each accountant reads only its own.
struct AccountantOptions {
  /// RDP orders (rdp: any order > 1; wor, shuffle: integers >= 2). Empty: the
  /// accountant's default grid.
  std::vector<double> orders;
  long dataset_size = 0;        // n (shuffle; required there)
  long batch_size = 0;          // b (shuffle; required there)
  double epoch_fraction = 0.0;  // f in (0, 1): shuffle stops each pass after f n examples
};

/// "rdp", "pld", "gdp", "wor" or "shuffle"; throws std::invalid_argument for
/// an unknown name or settings the accountant rejects.
std::unique_ptr<Accountant> make_accountant(const std::string& name,
                                            const AccountantOptions& opts = {});

}  // namespace dpgrad::privacy
