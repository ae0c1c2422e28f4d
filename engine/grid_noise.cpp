// The discrete Gaussian sampler of the noise grid (engine/grid_noise.hpp) and
// the grid noise itself (engine/random.hpp add_grid_noise). The argument that
// bounds the sampler's pmf is in docs/noise.md section 5.
#include "engine/grid_noise.hpp"

#include <string.h>  // explicit_bzero

#include <algorithm>
#include <atomic>
#include <bit>
#include <memory>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/parallel.hpp"
#include "engine/random.hpp"
#include "engine/simd.hpp"

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
    if (pos_ == block_) [[unlikely]] refill();
    return buf_[pos_++];
  }
  /// The words fetched and not yet used (fetching a block when none is left): `count` of them.
  const std::uint64_t* pending(std::size_t& count) {
    if (pos_ == block_) refill();
    count = block_ - pos_;
    return buf_ + pos_;
  }
  /// Marks the first `count` pending words used.
  void skip(std::size_t count) { pos_ += count; }

 private:
  void refill() {
    rng_.fill_u64(buf_, block_);
    pos_ = 0;
  }

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
  const auto set_column = [&](std::size_t c, std::uint64_t threshold, std::uint64_t alias) {
    column_[c] = threshold | alias << 32;
  };
  while (!small.empty() && !large.empty()) {
    const std::uint16_t l = small.back(), g = large.back();
    small.pop_back();
    set_column(l, rest[l], g);
    rest[g] -= kCapacity - rest[l];
    if (rest[g] < kCapacity) {
      large.pop_back();
      small.push_back(g);
    }
  }
  for (const auto* left : {&small, &large})
    for (const std::uint16_t i : *left) {
      if (rest[i] != kCapacity) throw std::logic_error("GridNoiseSampler: alias table does not balance");
      set_column(i, kCapacity, i);
    }
}

std::uint64_t GridNoiseSampler::realised_bin_weight(std::size_t j) const {
  const auto threshold = [&](std::size_t c) { return column_[c] & 0xffffffff; };
  std::uint64_t w = threshold(j);
  for (std::size_t i = 0; i < kColumns; ++i)
    if ((column_[i] >> 32) == j && i != j) w += kCapacity - threshold(i);
  return w;
}

double GridNoiseSampler::acceptance(std::uint64_t m) const {
  const std::uint64_t j = m >> kBinBits, o = m & (kBinWidth - 1);
  if (j >= covered_) return 0.0;
  const double c = m == 0 ? accept_[0] * 0.5 : accept_[j];
  return c * std::exp(-(static_cast<double>(o * (2 * j * kBinWidth + o)) * inv_two_s2_));
}

template <class Words>
bool GridNoiseSampler::propose(Words& words, std::int64_t& out) const {
  // one word proposes and decides: column (11 bits), threshold (16), sign (1), offset in
  // the bin (20), and the first 16 bits of the uniform U of the acceptance test U < A(m)
  const std::uint64_t p = words.next();
  const std::uint64_t entry = column_[p >> 53];
  const std::uint64_t j = ((p >> 37) & (kCapacity - 1)) < (entry & 0xffffffff) ? p >> 53 : entry >> 32;
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
  if (accept) out = negative ? -static_cast<std::int64_t>(m) : static_cast<std::int64_t>(m);
  return accept;
}

void GridNoiseSampler::fill(Rng& rng, std::int64_t* out, std::size_t n) const {
  if (n > 0 && out == nullptr) throw std::invalid_argument("GridNoiseSampler::fill: null output buffer");
  Words words(rng);
  fill_words(words, out, n);
}

template <class Words>
void GridNoiseSampler::fill_words(Words& words, std::int64_t* out, std::size_t n) const {
  for (std::size_t i = 0; i < n;) {
    // most words are accepted by the quick test, a vector of them at a time; the first
    // word that is not (and the few left at a block's end) go through propose, which reads
    // the words in the same order: the values are those of propose alone
    std::size_t count = 0;
    const std::uint64_t* w = words.pending(count);
    const std::size_t quick =
        simd::grid_quick_accept(w, std::min(count, n - i), column_.data(), accept_.data(), inv_two_s2_, out + i);
    words.skip(quick);
    i += quick;
    if (i < n && propose(words, out[i])) ++i;
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

void check_grid(const NoiseGrid& g) {
  int e = 0;
  if (!(std::isfinite(g.grid) && g.grid > 0 && std::frexp(g.grid, &e) == 0.5 && e > -1000 && e < 1000))
    throw std::invalid_argument("add_grid_noise: grid must be a power of two in [2^-1000, 2^1000], got " +
                                std::to_string(g.grid));
  if (g.scale < kMinScale || g.scale > kMaxDiscreteGaussianScale)
    throw std::invalid_argument("add_grid_noise: scale must be a whole number in [2^24 + 1, 2^25 + 2], got " +
                                std::to_string(g.scale));
}

/// Throws unless every x[i] / grid is finite and below 2^52 (a count the compiler
/// vectorises, then the first offender named).
template <class T>
void check_values(const NoiseGrid& g, const T* x, std::size_t n) {
  if (n > 0 && x == nullptr) throw std::invalid_argument("add_grid_noise: null buffer");
  const double inverse = 1.0 / g.grid;  // exact: a power of two
  constexpr double kLimit = 0x1.0p52;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += !(std::fabs(static_cast<double>(x[i]) * inverse) < kLimit);
  for (std::size_t i = 0; i < n && bad > 0; ++i)
    if (!(std::fabs(static_cast<double>(x[i]) * inverse) < kLimit))
      throw std::runtime_error("add_grid_noise: value " + std::to_string(double(x[i])) +
                               " is not finite or too large for the grid " + std::to_string(g.grid));
}

// |k| < 36 s + 2^20 < 2^31: a draw fits in 32 bits, whose conversion to double vectorises
static_assert(GridNoiseSampler::kCoverage * double(kMaxDiscreteGaussianScale) + 0x1p20 < 0x1p31);

/// x[i] <- grid (round(x[i] / grid) + k[i]) over [0, n): m + k is a whole number below
/// 2^53, exact in double; round to nearest, ties to even.
template <class T>
void add_draws(const NoiseGrid& g, const std::int32_t* k, T* x, std::size_t n) {
  const double inverse = 1.0 / g.grid;
  for (std::size_t i = 0; i < n; ++i)
    x[i] = static_cast<T>((std::nearbyint(static_cast<double>(x[i]) * inverse) + static_cast<double>(k[i])) * g.grid);
}

/// Zeroes what `k` holds (draws must not linger in memory).
void wipe(std::vector<std::int32_t>& k) {
  if (!k.empty()) explicit_bzero(k.data(), k.size() * sizeof(std::int32_t));
}

/// Draws of a block are made and kept this many at a time (first-level cache).
constexpr std::size_t kPiece = 2048;

/// n draws from `words` into k (32 bits each).
void draw_into(const GridNoiseSampler& sampler, Words& words, std::int32_t* k, std::size_t n) {
  std::int64_t wide[kPiece];
  for (std::size_t at = 0; at < n; at += kPiece) {
    const std::size_t len = std::min(kPiece, n - at);
    sampler.fill_words(words, wide, len);
    for (std::size_t i = 0; i < len; ++i) k[at + i] = static_cast<std::int32_t>(wide[i]);
  }
  explicit_bzero(wide, sizeof(wide));
}

/// Noises x[0, n) (checked already) with the block's draws: k[0, drawn) made before,
/// the rest drawn now from `words`, a piece at a time.
template <class T>
void noise_block(const NoiseGrid& g, Words& words, const std::int32_t* k, std::size_t drawn, T* x, std::size_t n) {
  add_draws(g, k, x, drawn);
  const GridNoiseSampler& sampler = sampler_for(g.scale);
  std::int32_t piece[kPiece];
  for (std::size_t at = drawn; at < n; at += kPiece) {
    const std::size_t len = std::min(kPiece, n - at);
    draw_into(sampler, words, piece, len);
    add_draws(g, piece, x + at, len);
  }
  explicit_bzero(piece, sizeof(piece));
}

template <class T>
void add_grid_noise_impl(Rng& rng, const NoiseGrid& g, T* x, std::size_t n) {
  check_grid(g);
  check_values(g, x, n);  // every value before any noise is drawn
  Words words(rng);
  noise_block(g, words, nullptr, 0, x, n);
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
std::vector<std::size_t> sizes_of(const std::vector<std::span<T>>& blocks) {
  std::vector<std::size_t> sizes;
  for (const auto& b : blocks) sizes.push_back(b.size());
  return sizes;
}

}  // namespace

/// One block's generator, its words and what was drawn of it ahead.
struct NoiseAhead::Block {
  std::unique_ptr<Rng> rng;
  std::unique_ptr<Words> words;  // made with the first draw
  std::size_t size = 0, drawn = 0;
  std::vector<std::int32_t> k;  // the first `drawn` draws
  std::atomic<bool> busy{false};  // a worker is drawing it
  std::atomic<bool> closed{false};  // drawn to its end, or left to add()
};

NoiseAhead::NoiseAhead(Rng& rng, const NoiseGrid& g, const std::vector<std::size_t>& block_sizes, std::size_t first,
                       std::size_t last, bool ahead, std::size_t keep)
    : grid_(g), sizes_(block_sizes), first_(first), keep_(keep) {
  check_grid(g);
  if (first > last || last > block_sizes.size())
    throw std::invalid_argument("add_grid_noise_blocks: blocks [" + std::to_string(first) + ", " +
                                std::to_string(last) + ") of " + std::to_string(block_sizes.size()));
  for (const std::size_t size : block_sizes)
    if (size == 0 || size > kNoiseBlock)
      throw std::invalid_argument("noise blocks hold 1 to " + std::to_string(kNoiseBlock) + " values, got " +
                                  std::to_string(size));
  // the generators, split as add_grid_noise_blocks splits them: one off rng, one per block off that
  const std::unique_ptr<Rng> step = rng.split();
  blocks_ = std::vector<Block>(last - first);
  for (std::size_t b = 0; b < last; ++b) {
    std::unique_ptr<Rng> child = step->split();
    if (b >= first) {
      blocks_[b - first].rng = std::move(child);
      blocks_[b - first].size = block_sizes[b];
    }
  }
  if (ahead && !blocks_.empty()) {
    background_ = std::make_unique<parallel::Background>([this] { return draw_ahead(); });
    if (!background_->active()) background_.reset();
  }
}

NoiseAhead::~NoiseAhead() {
  background_.reset();  // no worker draws once this returns
  for (Block& b : blocks_) wipe(b.k);
}

bool NoiseAhead::draw_ahead() {
  for (Block& b : blocks_) {
    if (b.closed.load(std::memory_order_acquire)) continue;
    bool expected = false;
    if (!b.busy.compare_exchange_strong(expected, true, std::memory_order_acquire)) continue;
    bool drew = false;
    if (!b.closed.load(std::memory_order_relaxed)) {
      // a block is drawn ahead whole, if the allowance has room for it; otherwise add() draws it
      const bool room = b.drawn > 0 || kept_.fetch_add(b.size, std::memory_order_relaxed) + b.size <= keep_;
      if (!room) {
        kept_.fetch_sub(b.size, std::memory_order_relaxed);
        b.closed.store(true, std::memory_order_relaxed);
      } else {
        if (b.drawn == 0) {
          b.k.resize(b.size);
          b.words = std::make_unique<Words>(*b.rng);
        }
        const std::size_t len = std::min(kPiece, b.size - b.drawn);
        draw_into(sampler_for(grid_.scale), *b.words, b.k.data() + b.drawn, len);
        b.drawn += len;
        drawn_ahead_.fetch_add(len, std::memory_order_release);
        if (b.drawn == b.size) b.closed.store(true, std::memory_order_relaxed);
        drew = true;
      }
    }
    b.busy.store(false, std::memory_order_release);
    if (drew) return true;
  }
  return false;
}

template <class T>
void NoiseAhead::add_impl(const std::vector<std::span<T>>& blocks) {
  if (added_) throw std::logic_error("NoiseAhead::add: the noise was added already");
  added_ = true;
  if (blocks.size() != sizes_.size())
    throw std::invalid_argument("NoiseAhead::add: " + std::to_string(blocks.size()) + " blocks, drawn for " +
                                std::to_string(sizes_.size()));
  for (std::size_t b = 0; b < blocks.size(); ++b)
    if (blocks[b].size() != sizes_[b])
      throw std::invalid_argument("NoiseAhead::add: block " + std::to_string(b) + " holds " +
                                  std::to_string(blocks[b].size()) + " values, drawn for " + std::to_string(sizes_[b]));
  if (background_) {
    background_->stop();  // rethrows what a worker's draw threw
    background_.reset();
  }
  // one block a piece: the blocks differ in size (a parameter's last block is short)
  parallel::for_each_piece(blocks_.size(), 1, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      Block& b = blocks_[i];
      const std::span<T> x = blocks[first_ + i];
      check_values(grid_, x.data(), x.size());  // every value of the block before it is noised
      if (!b.words) b.words = std::make_unique<Words>(*b.rng);
      noise_block(grid_, *b.words, b.k.data(), b.drawn, x.data(), x.size());
      wipe(b.k);
      b.words.reset();
    }
  });
}

void NoiseAhead::add(const std::vector<std::span<float>>& blocks) { add_impl(blocks); }
void NoiseAhead::add(const std::vector<std::span<double>>& blocks) { add_impl(blocks); }

std::vector<std::span<float>> noise_blocks(const std::vector<std::span<float>>& parts) { return blocks_of(parts); }
std::vector<std::span<double>> noise_blocks(const std::vector<std::span<double>>& parts) { return blocks_of(parts); }

std::vector<std::size_t> noise_block_sizes(const std::vector<std::size_t>& part_sizes) {
  std::vector<std::size_t> sizes;
  for (const std::size_t n : part_sizes)
    for (std::size_t at = 0; at < n; at += kNoiseBlock) sizes.push_back(std::min(kNoiseBlock, n - at));
  return sizes;
}

void add_grid_noise_blocks(Rng& rng, const NoiseGrid& g, const std::vector<std::span<float>>& blocks,
                           std::size_t first, std::size_t last) {
  NoiseAhead(rng, g, sizes_of(blocks), first, last, false).add(blocks);
}
void add_grid_noise_blocks(Rng& rng, const NoiseGrid& g, const std::vector<std::span<double>>& blocks,
                           std::size_t first, std::size_t last) {
  NoiseAhead(rng, g, sizes_of(blocks), first, last, false).add(blocks);
}

void add_grid_noise(Rng& rng, const NoiseGrid& g, const std::vector<std::span<float>>& parts) {
  const auto blocks = blocks_of(parts);
  add_grid_noise_blocks(rng, g, blocks, 0, blocks.size());
}
void add_grid_noise(Rng& rng, const NoiseGrid& g, const std::vector<std::span<double>>& parts) {
  const auto blocks = blocks_of(parts);
  add_grid_noise_blocks(rng, g, blocks, 0, blocks.size());
}

void add_grid_noise(Rng& rng, const NoiseGrid& g, float* x, std::size_t n) { add_grid_noise_impl(rng, g, x, n); }
void add_grid_noise(Rng& rng, const NoiseGrid& g, double* x, std::size_t n) { add_grid_noise_impl(rng, g, x, n); }

}  // namespace dpgrad
