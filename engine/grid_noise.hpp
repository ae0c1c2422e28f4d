// The sampler behind add_grid_noise: the discrete Gaussian N_Z(0, s^2) at the
// large scales the noise grid uses (s in (2^24, 2^25 + 2]), drawn by rejection
// from a proposal that is almost the target, so that one candidate in about 40
// is refused, one random word decides most draws, and the loop runs a few
// nanoseconds a coordinate. Its output's pmf
// is within a factor exp(+-kPmfBound) of the exact discrete Gaussian on
// |k| <= kCoverage s and 0 beyond; the accounting charges for both
// (docs/noise.md section 5, privacy::grid_noise_bound).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace dpgrad {

class Rng;

/// Bernoulli(p) for a double p in [0, 1], exactly: a double is a dyadic rational,
/// and it is compared with a uniform U on [0, 1) read from `rng`'s words (one
/// word for p >= 2^-11, more for smaller p). No rounding touches the decision.
bool bernoulli_dyadic(Rng& rng, double p);

/// Draws from the discrete Gaussian N_Z(0, s^2) for one scale s (see the top of
/// this file): an integer alias table over bins of |k| proposes, and an
/// acceptance test refuses about one candidate in 40.
class GridNoiseSampler {
 public:
  /// Proven bound on |log(p(k) / d(k))| for |k| <= kCoverage s, p the sampler's
  /// pmf, d the discrete Gaussian's (docs/noise.md section 5).
  static constexpr double kPmfBound = 0x1p-44;
  /// The sampler draws |k| < kCoverage s + 2^20 only (and every |k| <= kCoverage s).
  static constexpr double kCoverage = 36.0;
  static constexpr int kBinBits = 20;                    // bin width W = 2^20
  static constexpr std::size_t kColumns = 2048;          // alias table columns (= bins)
  static constexpr int kThresholdBits = 16;              // column capacity 2^16
  static constexpr std::uint64_t kTotalWeight = std::uint64_t(kColumns) << kThresholdBits;  // 2^27

  /// The table for scale s in [2^24 + 1, 2^25 + 2] (what noise_grid produces).
  explicit GridNoiseSampler(std::uint64_t scale);

  /// s, the scale the table was built for.
  std::uint64_t scale() const { return scale_; }
  /// out[0, n) = independent draws (Rng's words only; no state kept between calls).
  void fill(Rng& rng, std::int64_t* out, std::size_t n) const;
  /// The same from a word buffer of engine/grid_noise.cpp that outlives the call: draws
  /// taken in pieces from one buffer are those of one fill.
  template <class Words>
  void fill_words(Words& words, std::int64_t* out, std::size_t n) const;

  // ---- what the tests inspect
  /// Bins with a proposal weight: bin j holds |k| in [j W, (j + 1) W).
  std::size_t covered_bins() const { return covered_; }
  /// The proposal's integer weight of bin j (out of kTotalWeight).
  std::uint64_t bin_weight(std::size_t j) const { return weight_[j]; }
  /// The weight the alias table actually gives bin j: its own column's threshold
  /// plus what other columns hand it. Equal to bin_weight(j) when the table is right.
  std::uint64_t realised_bin_weight(std::size_t j) const;
  /// The acceptance probability the sampler uses for |k| = m (exactly this double).
  double acceptance(std::uint64_t m) const;

 private:
  std::uint64_t scale_;
  std::size_t covered_ = 0;
  double inv_two_s2_ = 0;  // 1 / (2 s^2), rounded
  std::array<std::uint64_t, kColumns> weight_{};
  std::array<std::uint64_t, kColumns> column_{};  // threshold in [0, 2^16] | alias << 32
  std::array<double, kColumns> accept_{};         // c_j in [0, 1]

  /// One proposal from `words` (a Words of grid_noise.cpp): true and `out` set when accepted.
  template <class Words>
  bool propose(Words& words, std::int64_t& out) const;
};

}  // namespace dpgrad
