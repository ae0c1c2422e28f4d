// Random numbers for dpgrad: a fast seeded generator for what may be public
// (initialisation, data order of non-private runs), a cryptographically secure
// one (libsodium's ChaCha20 stream, keyed from the operating system's entropy)
// for privacy noise and sampling, and a seeded one that noise and sampling accept
// only because it is asked for by name (ReproducibleRng: NOT private).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dpgrad {

/// A source of uniform 64-bit words plus the distributions DP needs.
class Rng {
 public:
  virtual ~Rng() = default;
  virtual std::uint64_t next_u64() = 0;
  /// True for the cryptographically secure generator.
  virtual bool secure() const = 0;
  /// True for ReproducibleRng: seeded, and accepted for noise and sampling only
  /// because the caller asked for recomputable (NOT private) randomness by name.
  virtual bool reproducible_opt_in() const { return false; }
  /// "fast (xoshiro256**, seed S)" or "secure (ChaCha20, OS entropy)": for run output.
  virtual std::string describe() const = 0;
  /// Serialised state for checkpoints. The secure generator returns "" (its key
  /// never leaves memory) and re-keys from the OS on set_state.
  virtual std::string state() const = 0;
  virtual void set_state(const std::string& s) = 0;

  double uniform();        // [0, 1), 53 random bits
  double uniform_open();   // (0, 1)
  std::uint64_t below(std::uint64_t n);  // uniform on {0, ..., n-1}, unbiased; n >= 1
  bool bernoulli(double p);
  double normal();         // N(0, 1)
  double laplace(double scale);               // density exp(-|x|/scale) / (2 scale)
  double gamma(double shape, double scale);   // shape > 0, scale > 0
  double chi_squared(double k);
  void fill_normal(float* out, std::size_t n, double stddev);
  void fill_normal(double* out, std::size_t n, double stddev);

 protected:
  bool has_spare_ = false;   // Box-Muller produces normals in pairs
  double spare_ = 0.0;

 private:
  /// out[0, n) = the next n values of normal(), drawn from the same words in the
  /// same order, the pairs' logarithms and sines computed in SIMD batches (equal
  /// to normal()'s up to rounding in the last bits).
  void standard_normals(double* out, std::size_t n);
};

/// xoshiro256** seeded through splitmix64: fast, repeatable, NOT for privacy noise.
/// The DP optimizer and the samplers refuse it (see ReproducibleRng).
class FastRng : public Rng {
 public:
  explicit FastRng(std::uint64_t seed);
  std::uint64_t next_u64() override;
  bool secure() const override { return false; }
  std::string describe() const override;
  std::string state() const override;
  void set_state(const std::string& s) override;

 protected:
  std::uint64_t seed_;

 private:
  std::uint64_t s_[4];
};

/// The same seeded xoshiro256** stream, as the explicit opt-in to noise, sampling
/// and JL directions that anyone who knows the seed can recompute. A run that
/// uses it is NOT private, whatever its epsilon says; tests and reproducibility
/// studies use it by name.
class ReproducibleRng final : public FastRng {
 public:
  using FastRng::FastRng;
  bool reproducible_opt_in() const override { return true; }
  std::string describe() const override;
};

/// Throws std::invalid_argument unless `rng` may draw privacy randomness: the
/// secure generator, or ReproducibleRng (the named opt-in). `role` names the use
/// ("noise", "sampling", ...) in the message.
void require_private_generator(const Rng& rng, const std::string& role);

/// Message of runs whose noise comes from a ReproducibleRng.
inline constexpr const char* kNotPrivateReproducible = "not private: the noise can be recomputed from the seed";

/// ChaCha20 keystream (libsodium crypto_stream_chacha20) with a 256-bit key from
/// randombytes_buf. Not reproducible by design.
class SecureRng final : public Rng {
 public:
  SecureRng();
  ~SecureRng() override;
  // A copy would replay the same keystream (correlated noise): not copyable.
  SecureRng(const SecureRng&) = delete;
  SecureRng& operator=(const SecureRng&) = delete;
  std::uint64_t next_u64() override;
  bool secure() const override { return true; }
  std::string describe() const override;
  std::string state() const override { return ""; }
  void set_state(const std::string& s) override;

 private:
  void rekey();
  void refill();
  unsigned char key_[32];
  std::uint64_t nonce_ = 0;
  unsigned char buf_[4096];
  std::size_t pos_ = sizeof(buf_);
};

/// The generator of privacy randomness (noise, sampling, JL directions): the
/// secure one, or with `reproducible` a ReproducibleRng from `seed` (NOT private).
std::unique_ptr<Rng> make_private_rng(bool reproducible, std::uint64_t seed);

}  // namespace dpgrad
