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

class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::string name() const = 0;
  /// Dataset indices of the next batch (Poisson batches may be empty). `rng` must
  /// be the secure generator or a ReproducibleRng (the named, NOT private opt-in):
  /// a batch anyone can recompute loses the amplification the accountant counts on.
  std::vector<std::size_t> next(Rng& rng);
  /// Steps that make one epoch (about N / L).
  virtual long steps_per_epoch() const = 0;
  /// q for the accountant: L / N (Poisson), b / n (fixed, shuffle).
  virtual double sampling_rate() const = 0;
  virtual double expected_batch_size() const = 0;
  /// The accountants whose analysis matches this sampling.
  virtual std::vector<std::string> accountants() const = 0;
  /// Position within the data order, for checkpoints (the generator is saved separately).
  virtual nlohmann::json state() const;
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
std::unique_ptr<Sampler> make_sampler(const std::string& name, std::size_t dataset_size, std::size_t batch_size,
                                      double epoch_fraction = 1.0);

}  // namespace dpgrad
