// Batch samplers and the accountant each one matches: Poisson (every example
// joins independently with probability q: rdp, pld, gdp), shuffled cyclic
// passes stopping at a fraction f of each epoch (shuffle), and fixed-size
// batches drawn without replacement (wor).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dpgrad {

class Rng;

/// Draws the batches of a run: which records each step uses (the kinds at the
/// top of this file); make_sampler and the functions below make one.
class Sampler {
 public:
  virtual ~Sampler() = default;
  /// The sampling's name: "poisson", "shuffle" or "fixed" for the samplers here.
  virtual std::string name() const = 0;
  /// Dataset indices of the next batch (Poisson batches may be empty). `rng` must
  /// be the secure generator or a ReproducibleRng (the named, NOT private opt-in):
  /// a batch anyone can recompute loses the amplification the accountant counts on.
  /// Throws std::invalid_argument for any other generator.
  std::vector<std::size_t> next(Rng& rng);
  /// Steps that make one epoch (about N / L).
  virtual long steps_per_epoch() const = 0;
  /// q for the accountant: L / N (Poisson), b / n (fixed, shuffle).
  virtual double sampling_rate() const = 0;
  /// L, the expected batch size: q N (Poisson), b (fixed, shuffle).
  virtual double expected_batch_size() const = 0;
  /// The accountants whose analysis matches this sampling.
  virtual std::vector<std::string> accountants() const = 0;
  /// Position within the data order, for checkpoints (the generator is saved separately).
  virtual nlohmann::json state() const;
  /// Restores what state() returned; the shuffle sampler throws
  /// std::invalid_argument when it does not match its dataset.
  virtual void load_state(const nlohmann::json& s);

 protected:
  /// The sampling itself, from a generator next() has checked.
  virtual std::vector<std::size_t> draw(Rng& rng) = 0;
};

/// Throws std::invalid_argument naming both when the accountant does not analyse this sampler.
void check_accountant_matches(const Sampler& sampler, const std::string& accountant);

/// Typed constructors (make_sampler takes the same by name). Each checks its sizes.
/// Poisson: each of `dataset_size` records joins a batch with probability L / N.
std::unique_ptr<Sampler> poisson_sampler(std::size_t dataset_size, std::size_t expected_batch);
/// Shuffled passes in batches of `batch`, each pass stopped after `epoch_fraction` of the data.
std::unique_ptr<Sampler> shuffle_sampler(std::size_t dataset_size, std::size_t batch, double epoch_fraction);
/// Batches of exactly `batch` distinct records, drawn without replacement.
std::unique_ptr<Sampler> fixed_size_sampler(std::size_t dataset_size, std::size_t batch);

/// "poisson", "shuffle" or "fixed"; epoch_fraction is used by "shuffle".
/// Throws std::invalid_argument for an empty dataset, a batch_size outside
/// [1, dataset_size], an epoch_fraction outside (0, 1] (shuffle) or another name.
std::unique_ptr<Sampler> make_sampler(const std::string& name, std::size_t dataset_size, std::size_t batch_size,
                                      double epoch_fraction = 1.0);

}  // namespace dpgrad
