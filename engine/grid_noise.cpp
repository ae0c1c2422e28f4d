// The discrete Gaussian sampler of the noise grid (engine/grid_noise.hpp) and
// the grid noise itself (engine/random.hpp add_grid_noise). The argument that
// bounds the sampler's pmf is in docs/noise.md section 5.
#include "engine/grid_noise.hpp"

#include <string.h>  // explicit_bzero

#include <algorithm>
#include <bit>
#include <memory>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/parallel.hpp"
#include "engine/random.hpp"

namespace dpgrad {

namespace {

constexpr std::uint64_t kBinWidth = std::uint64_t(1) << GridNoiseSampler::kBinBits;
constexpr std::uint64_t kCapacity = std::uint64_t(1) << GridNoiseSampler::kThresholdBits;
constexpr std::uint64_t kMinScale = (std::uint64_t(1) << 24) + 1;

/// The generator's words, fetched a block at a time; the block is wiped when the
/// draw is done (keystream does not linger in memory). Words left over are dropped.
class Words {
 public:
  /// `block` <= kBlock words are fetched at a time.
  explicit Words(Rng& rng, std::size_t block = kBlock) : rng_(rng), block_(block), pos_(block) {}
  ~Words() { explicit_bzero(buf_, sizeof(buf_)); }
  Words(const Words&) = delete;
  Words& operator=(const Words&) = delete;

  std::uint64_t next() {
    if (pos_ == block_) [[unlikely]] {
      rng_.fill_u64(buf_, block_);
      pos_ = 0;
    }
    return buf_[pos_++];
  }

 private:
  static constexpr std::size_t kBlock = 256;
  Rng& rng_;
  std::size_t block_, pos_;
  std::uint64_t buf_[kBlock];
};

/// Bernoulli(p) for a double p in [0, 1], exactly: p is a dyadic rational, and a
/// uniform U on [0, 1) whose first 64 bits are `first` (more words drawn if p is
/// tiny) is compared with it. p = M 2^(e - 53) with M < 2^53: U < p iff the first
/// -e bits of U are 0 and the next 53, read as an integer, are below M.
bool below_dyadic(double p, std::uint64_t first, Words& words) {
  if (!(p > 0)) return false;
  if (p >= 1) return true;
  if (p >= 0x1p-11) return first < static_cast<std::uint64_t>(p * 0x1p64);  // p 2^64 is a whole number
  int e = 0;
  const auto mantissa = static_cast<std::uint64_t>(std::ldexp(std::frexp(p, &e), 53));
  int zeros = -e;  // > 11
  std::uint64_t w = first;
  while (zeros >= 64) {
    if (w != 0) return false;
    zeros -= 64;
    w = words.next();
  }
  if (zeros > 0 && (w >> (64 - zeros)) != 0) return false;
  std::uint64_t v = (w << zeros) >> 11;  // the next min(64 - zeros, 53) bits, left-aligned in 53
  if (zeros > 11) v |= words.next() >> (64 - (zeros - 11));
  return v < mantissa;
}

}  // namespace

bool bernoulli_dyadic(Rng& rng, double p) {
  if (!(p >= 0 && p <= 1)) throw std::invalid_argument("bernoulli_dyadic: p must be in [0, 1], got " + std::to_string(p));
  Words words(rng, 1);
  return below_dyadic(p, words.next(), words);
}

GridNoiseSampler::GridNoiseSampler(std::uint64_t scale) : scale_(scale) {
  if (scale < kMinScale || scale > kMaxDiscreteGaussianScale)
    throw std::invalid_argument("GridNoiseSampler: scale must be a whole number in [2^24 + 1, 2^25 + 2], got " +
                                std::to_string(scale));
  // bins 0 .. covered_ - 1 hold |k| in [0, covered_ W), which contains [0, kCoverage s]
  covered_ = static_cast<std::size_t>(std::ceil(kCoverage * double(scale) / double(kBinWidth))) + 1;
  static_assert(kColumns >= 36 * ((std::uint64_t(1) << 25) + 2) / kBinWidth + 3);
  // envelope heights f_j = exp(-(j W)^2 / (2 s^2)), in long double
  const long double s2 = static_cast<long double>(scale) * static_cast<long double>(scale);
  std::vector<long double> f(covered_);
  long double sum = 0;
  for (std::size_t j = 0; j < covered_; ++j) {
    const long double x = static_cast<long double>(j * kBinWidth);
    f[j] = std::exp(-(x * x) / (2 * s2));
    sum += f[j];
  }
  // integer weights ceil(f_j S), S chosen so that they add up to at most 2^27 - 1;
  // the rest goes to the bin after the covered ones, which always refuses
  const long double S = static_cast<long double>(kTotalWeight - covered_ - 1) / sum;
  std::uint64_t total = 0;
  for (std::size_t j = 0; j < covered_; ++j) {
    weight_[j] = static_cast<std::uint64_t>(std::ceil(f[j] * S));
    total += weight_[j];
  }
  if (total >= kTotalWeight) throw std::logic_error("GridNoiseSampler: weights exceed the table");
  weight_[covered_] = kTotalWeight - total;
  // c_j = (f_j / w_j) / max_i (f_i / w_i): every acceptance is at most 1, and
  // proposal times acceptance is f(m) / K for one constant K
  long double k_max = 0;
  for (std::size_t j = 0; j < covered_; ++j) k_max = std::max(k_max, f[j] / static_cast<long double>(weight_[j]));
  for (std::size_t j = 0; j < covered_; ++j)
    accept_[j] = static_cast<double>(f[j] / static_cast<long double>(weight_[j]) / k_max);
  inv_two_s2_ = 1.0 / (2.0 * double(scale) * double(scale));  // 2 s^2 < 2^52: exact, then one rounding

  // Vose's alias table in integers: every column holds exactly 2^16 of weight
  std::array<std::uint64_t, kColumns> rest = weight_;
  std::vector<std::uint16_t> small, large;
  for (std::size_t i = 0; i < kColumns; ++i) (rest[i] < kCapacity ? small : large).push_back(std::uint16_t(i));
  while (!small.empty() && !large.empty()) {
    const std::uint16_t l = small.back(), g = large.back();
    small.pop_back();
    threshold_[l] = static_cast<std::uint32_t>(rest[l]);
    alias_[l] = g;
    rest[g] -= kCapacity - rest[l];
    if (rest[g] < kCapacity) {
      large.pop_back();
      small.push_back(g);
    }
  }
  for (const auto* left : {&small, &large})
    for (const std::uint16_t i : *left) {
      if (rest[i] != kCapacity) throw std::logic_error("GridNoiseSampler: alias table does not balance");
      threshold_[i] = kCapacity;
      alias_[i] = i;
    }
}

std::uint64_t GridNoiseSampler::realised_bin_weight(std::size_t j) const {
  std::uint64_t w = threshold_[j];
  for (std::size_t i = 0; i < kColumns; ++i)
    if (alias_[i] == j && i != j) w += kCapacity - threshold_[i];
  return w;
}

double GridNoiseSampler::acceptance(std::uint64_t m) const {
  const std::uint64_t j = m >> kBinBits, o = m & (kBinWidth - 1);
  if (j >= covered_) return 0.0;
  const double c = m == 0 ? accept_[0] * 0.5 : accept_[j];
  return c * std::exp(-(static_cast<double>(o * (2 * j * kBinWidth + o)) * inv_two_s2_));
}

void GridNoiseSampler::fill(Rng& rng, std::int64_t* out, std::size_t n) const {
  if (n > 0 && out == nullptr) throw std::invalid_argument("GridNoiseSampler::fill: null output buffer");
  Words words(rng);
  for (std::size_t i = 0; i < n; ++i) {
    for (;;) {
      // one word proposes and decides: column (11 bits), threshold (16), sign (1),
      // offset in the bin (20), and the first 16 bits of the uniform U of the
      // acceptance test U < A(m)
      const std::uint64_t p = words.next();
      const std::size_t column = p >> 53;
      const std::uint64_t j = ((p >> 37) & (kCapacity - 1)) < threshold_[column] ? column : alias_[column];
      const bool negative = (p >> 36) & 1;
      const std::uint64_t o = (p >> 16) & (kBinWidth - 1), m = j * kBinWidth + o;
      const auto u = static_cast<std::uint32_t>(p & 0xffff);
      // A(m) = c_j exp(-(m^2 - (j W)^2) / (2 s^2)), halved at m = 0 (both signs
      // give 0); m^2 - (j W)^2 = o (2 j W + o) < 2^52 is exact in double
      const double c = m == 0 ? accept_[0] * 0.5 : accept_[j];
      const double x = static_cast<double>(o * (2 * j * kBinWidth + o)) * inv_two_s2_;
      // exp(-x) >= 1 - x: below that, less a margin for rounding, U is accepted
      // without computing exp (the decision U < A(m) would be the same)
      const double floor_a = c * ((1.0 - x) - 0x1p-40);
      bool accept = floor_a > 0 && u < static_cast<std::uint32_t>(floor_a * 0x1p16);
      if (!accept) {
        // U = (u + Y) / 2^16: u below floor(A 2^16) accepts, above refuses, and
        // equal leaves Y < A 2^16 - u, asked of fresh words (both exact in double)
        const double t = c * std::exp(-x) * 0x1p16, whole = std::floor(t);
        const auto w = static_cast<std::uint32_t>(whole);
        accept = u < w || (u == w && below_dyadic(t - whole, words.next(), words));
      }
      if (accept) {
        out[i] = negative ? -static_cast<std::int64_t>(m) : static_cast<std::int64_t>(m);
        break;
      }
    }
  }
}

namespace {

/// The sampler of the last scale used on this thread (a step calls add_grid_noise
/// once per parameter tensor, always at the same scale).
const GridNoiseSampler& sampler_for(std::uint64_t scale) {
  thread_local std::unique_ptr<GridNoiseSampler> last;
  if (!last || last->scale() != scale) last = std::make_unique<GridNoiseSampler>(scale);
  return *last;
}

template <class T>
void add_grid_noise_impl(Rng& rng, const NoiseGrid& g, T* x, std::size_t n) {
  int e = 0;
  if (!(std::isfinite(g.grid) && g.grid > 0 && std::frexp(g.grid, &e) == 0.5 && e > -1000 && e < 1000))
    throw std::invalid_argument("add_grid_noise: grid must be a power of two in [2^-1000, 2^1000], got " +
                                std::to_string(g.grid));
  if (g.scale < kMinScale || g.scale > kMaxDiscreteGaussianScale)
    throw std::invalid_argument("add_grid_noise: scale must be a whole number in [2^24 + 1, 2^25 + 2], got " +
                                std::to_string(g.scale));
  if (n > 0 && x == nullptr) throw std::invalid_argument("add_grid_noise: null buffer");
  const double inverse = 1.0 / g.grid;  // exact: a power of two
  constexpr double kLimit = 0x1.0p52;
  // every value is checked before any noise is drawn: a count the compiler vectorises, then
  // the first offender named
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += !(std::fabs(static_cast<double>(x[i]) * inverse) < kLimit);
  for (std::size_t i = 0; i < n && bad > 0; ++i)
    if (!(std::fabs(static_cast<double>(x[i]) * inverse) < kLimit))
      throw std::runtime_error("add_grid_noise: value " + std::to_string(double(x[i])) +
                               " is not finite or too large for the grid " + std::to_string(g.grid));
  const GridNoiseSampler& sampler = sampler_for(g.scale);
  thread_local std::vector<std::int64_t> k;
  k.resize(n);
  sampler.fill(rng, k.data(), n);
  // k as a double without a scalar conversion (x86 has none for 64-bit integers before
  // AVX-512): |k| < 2^51, so k + 1.5 2^52's bits are that double's, and subtracting
  // 1.5 2^52 leaves k exactly. The loop vectorises.
  static_assert(GridNoiseSampler::kCoverage * double(kMaxDiscreteGaussianScale) + 0x1p20 < 0x1p51);
  constexpr std::int64_t kMagicBits = std::bit_cast<std::int64_t>(0x1.8p52);
  for (std::size_t i = 0; i < n; ++i) {
    const double m = std::nearbyint(static_cast<double>(x[i]) * inverse);  // ties to even
    const double kd = std::bit_cast<double>(k[i] + kMagicBits) - 0x1.8p52;
    // m + k is an integer below 2^53: exact in double
    x[i] = static_cast<T>((m + kd) * g.grid);
  }
  explicit_bzero(k.data(), n * sizeof(std::int64_t));
}

template <class T>
std::vector<std::span<T>> blocks_of(const std::vector<std::span<T>>& parts) {
  std::vector<std::span<T>> blocks;
  for (const auto& part : parts)
    for (std::size_t at = 0; at < part.size(); at += kNoiseBlock)
      blocks.push_back(part.subspan(at, std::min(kNoiseBlock, part.size() - at)));
  return blocks;
}

template <class T>
void add_noise_to_blocks(Rng& rng, const NoiseGrid& g, const std::vector<std::span<T>>& blocks, std::size_t first,
                         std::size_t last) {
  if (first > last || last > blocks.size())
    throw std::invalid_argument("add_grid_noise_blocks: blocks [" + std::to_string(first) + ", " +
                                std::to_string(last) + ") of " + std::to_string(blocks.size()));
  const std::unique_ptr<Rng> step = rng.split();
  std::vector<std::unique_ptr<Rng>> own(last - first);
  for (std::size_t b = 0; b < last; ++b) {
    std::unique_ptr<Rng> child = step->split();
    if (b >= first) own[b - first] = std::move(child);
  }
  // one block a piece: the blocks differ in size (a parameter's last block is short)
  parallel::for_each_piece(own.size(), 1, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) add_grid_noise_impl(*own[i], g, blocks[first + i].data(), blocks[first + i].size());
  });
}

}  // namespace

std::vector<std::span<float>> noise_blocks(const std::vector<std::span<float>>& parts) { return blocks_of(parts); }
std::vector<std::span<double>> noise_blocks(const std::vector<std::span<double>>& parts) { return blocks_of(parts); }

void add_grid_noise_blocks(Rng& rng, const NoiseGrid& g, const std::vector<std::span<float>>& blocks,
                           std::size_t first, std::size_t last) {
  add_noise_to_blocks(rng, g, blocks, first, last);
}
void add_grid_noise_blocks(Rng& rng, const NoiseGrid& g, const std::vector<std::span<double>>& blocks,
                           std::size_t first, std::size_t last) {
  add_noise_to_blocks(rng, g, blocks, first, last);
}

void add_grid_noise(Rng& rng, const NoiseGrid& g, const std::vector<std::span<float>>& parts) {
  const auto blocks = blocks_of(parts);
  add_noise_to_blocks(rng, g, blocks, 0, blocks.size());
}
void add_grid_noise(Rng& rng, const NoiseGrid& g, const std::vector<std::span<double>>& parts) {
  const auto blocks = blocks_of(parts);
  add_noise_to_blocks(rng, g, blocks, 0, blocks.size());
}

void add_grid_noise(Rng& rng, const NoiseGrid& g, float* x, std::size_t n) { add_grid_noise_impl(rng, g, x, n); }
void add_grid_noise(Rng& rng, const NoiseGrid& g, double* x, std::size_t n) { add_grid_noise_impl(rng, g, x, n); }

}  // namespace dpgrad
