// Random numbers for dpgrad: a fast seeded generator for what may be public
// (initialisation, data order of non-private runs), a cryptographically secure
// one (libsodium's ChaCha20 stream, keyed from the operating system's entropy)
// for privacy noise and sampling, and a seeded one that noise and sampling accept
// only because it is asked for by name (ReproducibleRng: NOT private).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace dpgrad {

namespace parallel {
class Background;
}

/// A source of uniform 64-bit words plus the distributions DP needs.
class Rng {
 public:
  virtual ~Rng() = default;
  /// The next uniform 64-bit word: the distributions below are drawn from these.
  virtual std::uint64_t next_u64() = 0;
  /// out[0, n) = the next n words, in the order next_u64() would give them.
  virtual void fill_u64(std::uint64_t* out, std::size_t n);
  /// A new generator of the same kind, keyed from this one's output (which it
  /// advances): secure from secure, the reproducible opt-in from the opt-in. Lets
  /// threads draw at once, each from its own stream, with results that do not
  /// depend on how many threads there are.
  virtual std::unique_ptr<Rng> split() = 0;
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
  /// The stream of `seed`: the same seed gives the same words.
  explicit FastRng(std::uint64_t seed);
  std::uint64_t next_u64() override;
  void fill_u64(std::uint64_t* out, std::size_t n) override;
  std::unique_ptr<Rng> split() override;
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
  std::unique_ptr<Rng> split() override;
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
  /// Keyed from the operating system's entropy. Throws std::runtime_error when
  /// libsodium cannot be initialised.
  SecureRng();
  /// Keyed with `key` (32 bytes) instead of OS entropy: for split().
  explicit SecureRng(const unsigned char* key);
  /// Re-keys with `key` (32 bytes): the stream restarts under it. For a stream that
  /// several processes share (share_generator in engine/communicator.hpp).
  void set_key(const unsigned char* key);
  ~SecureRng() override;
  // A copy would replay the same keystream (correlated noise): not copyable.
  SecureRng(const SecureRng&) = delete;
  SecureRng& operator=(const SecureRng&) = delete;
  std::uint64_t next_u64() override;
  void fill_u64(std::uint64_t* out, std::size_t n) override;
  std::unique_ptr<Rng> split() override;
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

// ---------------------------------------------------------------- keyed hashing
// Rules fixed per record (its microbatch, its augmentation draws, its PATE
// teacher) hash its id with a per-run key, never its position in a batch, so
// that no other record changes them (docs/data-privacy.md).

/// The key of a keyed hash (SipHash-2-4, libsodium crypto_shorthash).
using HashKey = std::array<unsigned char, 16>;
/// A key from the operating system's entropy (libsodium randombytes_buf):
/// draws no one can predict or repeat.
HashKey random_hash_key();
/// A key derived from a seed: BLAKE2b (crypto_generichash) of `tag` and the
/// seed's 8 little-endian bytes. Repeatable, for runs that ask for it.
HashKey hash_key_from_seed(std::uint64_t seed, std::string_view tag);
/// SipHash-2-4(key, the words as 8 little-endian bytes each), as a little-endian number.
std::uint64_t keyed_hash(const HashKey& key, std::initializer_list<std::uint64_t> words);
/// keyed_hash(key, {id}) mod count: the bucket of record `id` among `count` (>= 1).
std::size_t keyed_bucket(const HashKey& key, std::int64_t id, std::size_t count);

// ---------------------------------------------------------------- noise on a grid
// Gaussian noise drawn in floating point and added in floating point leaks the
// data through the set of values the sum can reach (Mironov 2012; Jin et al.
// 2022). Here the value is rounded to a power-of-two grid and an integer number
// of grid steps is added, drawn exactly from the discrete Gaussian: the released
// value minus the rounded one is grid * k, whatever the data (docs/noise.md).

/// Largest integer scale the discrete Gaussian sampler takes (its integer
/// arithmetic stays within 128 bits up to here; docs/noise.md section 2).
inline constexpr std::uint64_t kMaxDiscreteGaussianScale = (std::uint64_t(1) << 25) + 2;

/// out[0, n) = independent draws from the discrete Gaussian N_Z(0, s^2), pmf
/// proportional to exp(-k^2 / (2 s^2)) on the integers, s = `scale` a whole
/// number in [1, kMaxDiscreteGaussianScale]. Exact, from the bits of `rng`
/// (Canonne, Kamath, Steinke 2020, Algorithms 1-3), conditioned only on
/// |k| < 2048 (s + 1), an event of probability above 1 - exp(-2,000,000).
void fill_discrete_gaussian(Rng& rng, std::uint64_t scale, std::int64_t* out, std::size_t n);

/// The grid of noise of standard deviation `noise_std`: grid = 2^e and a whole
/// scale s in (2^24, 2^25 + 1] with s * grid > noise_std.
struct NoiseGrid {
  double grid = 0;          // gamma, a power of two
  std::uint64_t scale = 0;  // s: the noise is grid * k, k ~ N_Z(0, s^2)
};
NoiseGrid noise_grid(double noise_std);

/// x[i] <- grid * (round(x[i] / grid) + k_i), k_i ~ N_Z(0, s^2) drawn by
/// GridNoiseSampler (within exp(+-2^-44) of the exact pmf, which the accounting
/// charges for: engine/grid_noise.hpp), round to nearest (ties to even), the sum
/// taken in integers; the result is then rounded to T, which is post-processing.
/// Throws std::runtime_error on a non-finite x[i] or |x[i]| >= 2^52 grid. x: (n)
void add_grid_noise(Rng& rng, const NoiseGrid& g, float* x, std::size_t n);
void add_grid_noise(Rng& rng, const NoiseGrid& g, double* x, std::size_t n);

/// Noise blocks: a step's gradient is noised in blocks of at most kNoiseBlock
/// coordinates, each within one array, each drawn from its own generator. The
/// block generators are split in block order off one generator split off `rng`
/// (Rng::split), which `rng` pays for with one split whatever the blocks drawn.
/// So a block's noise is the same whichever thread or process draws it: the
/// blocks go to the engine's threads, and the ranks of a data-parallel run each
/// draw their own blocks (docs/distributed.md).
inline constexpr std::size_t kNoiseBlock = std::size_t(1) << 16;

/// `parts` (a step's gradient, array by array) cut into its noise blocks, in order.
std::vector<std::span<float>> noise_blocks(const std::vector<std::span<float>>& parts);
std::vector<std::span<double>> noise_blocks(const std::vector<std::span<double>>& parts);
/// The sizes of the blocks noise_blocks cuts arrays of these sizes into, in order.
std::vector<std::size_t> noise_block_sizes(const std::vector<std::size_t>& part_sizes);

/// A step's grid noise drawn while the step computes its gradient (docs/noise.md,
/// "Drawn ahead"). Made when the step starts, from the sizes of its noise blocks, it
/// splits the blocks' generators off `rng` at once, as add_grid_noise_blocks does, and
/// with `ahead` the engine's idle workers draw the k of blocks [first, last) meanwhile
/// (parallel::Background), up to `keep` of them. add() then draws what is left
/// and noises the blocks: the released values are exactly add_grid_noise_blocks(rng, g,
/// blocks, first, last)'s had it been called in place of this constructor. The draws
/// depend on nothing but the generators, and are wiped when used or dropped.
class NoiseAhead {
 public:
  /// At most this many draws are kept ahead (4 bytes each); later blocks are drawn by add().
  static constexpr std::size_t kAheadValues = std::size_t(1) << 22;

  /// `keep`: the most draws kept ahead (a block is drawn ahead whole or not at all).
  NoiseAhead(Rng& rng, const NoiseGrid& g, const std::vector<std::size_t>& block_sizes, std::size_t first,
             std::size_t last, bool ahead = true, std::size_t keep = kAheadValues);
  ~NoiseAhead();
  NoiseAhead(const NoiseAhead&) = delete;
  NoiseAhead& operator=(const NoiseAhead&) = delete;

  /// The grid it draws for.
  const NoiseGrid& grid() const { return grid_; }
  /// How many values have been drawn ahead so far.
  std::size_t drawn_ahead() const { return drawn_ahead_.load(std::memory_order_acquire); }
  /// Draws one piece (2,048 values) of one block on the calling thread, as an idle worker
  /// does; false when there is nothing left to draw ahead.
  bool draw_ahead();
  /// Noises blocks [first, last) of `blocks` (whose sizes must be the constructor's), each
  /// block's values checked before it is noised (std::runtime_error as add_grid_noise).
  /// Once only.
  void add(const std::vector<std::span<float>>& blocks);
  void add(const std::vector<std::span<double>>& blocks);

 private:
  struct Block;
  template <class T>
  void add_impl(const std::vector<std::span<T>>& blocks);

  NoiseGrid grid_;
  std::vector<std::size_t> sizes_;
  std::size_t first_ = 0, keep_ = 0;
  std::vector<Block> blocks_;
  std::atomic<std::size_t> kept_{0}, drawn_ahead_{0};
  std::unique_ptr<parallel::Background> background_;  // last: stopped before the blocks go
  bool added_ = false;
};

/// The grid noise on blocks [first, last) of `blocks` (noise_blocks of a step's gradient).
void add_grid_noise_blocks(Rng& rng, const NoiseGrid& g, const std::vector<std::span<float>>& blocks,
                           std::size_t first, std::size_t last);
void add_grid_noise_blocks(Rng& rng, const NoiseGrid& g, const std::vector<std::span<double>>& blocks,
                           std::size_t first, std::size_t last);

/// The same on every coordinate of `parts` (a step's gradient, array by array):
/// every block of noise_blocks(parts).
void add_grid_noise(Rng& rng, const NoiseGrid& g, const std::vector<std::span<float>>& parts);
void add_grid_noise(Rng& rng, const NoiseGrid& g, const std::vector<std::span<double>>& parts);

}  // namespace dpgrad
