// Generators and samplers behind engine/random.hpp: xoshiro256** (Blackman &
// Vigna, seeded through splitmix64) for repeatable experiments, libsodium's
// ChaCha20 keystream for privacy noise, and the distributions DP training draws
// from (normal, Laplace, gamma, chi-squared), written once on top of next_u64().
#include "engine/random.hpp"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

#ifdef XTENSOR_USE_XSIMD
#include <xsimd/xsimd.hpp>
#endif

namespace dpgrad {

namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/// splitmix64 (Steele, Lea & Flood): one step, advancing x.
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// Parses exactly 1..16 hex digits; anything else is an error.
bool parse_hex64(const std::string& s, std::uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  out = v;
  return true;
}

void ensure_sodium() {
  // sodium_init() returns 0 on first success, 1 if already initialised, -1 on failure.
  static const int status = sodium_init();
  if (status < 0) throw std::runtime_error("SecureRng: sodium_init() failed; libsodium is unusable");
}

void require_finite_positive(double v, const char* what, const char* name) {
  if (!(std::isfinite(v) && v > 0.0))
    throw std::invalid_argument(std::string("Rng::") + what + ": " + name +
                                " must be finite and > 0, got " + std::to_string(v));
}

}  // namespace

// ---------------------------------------------------------------- distributions

void Rng::fill_u64(std::uint64_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = next_u64();
}

double Rng::uniform() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

double Rng::uniform_open() {
  // (k + 1/2) / 2^52 for a 52-bit k: never 0, never 1.
  return (static_cast<double>(next_u64() >> 12) + 0.5) * 0x1.0p-52;
}

std::uint64_t Rng::below(std::uint64_t n) {
  if (n == 0) throw std::invalid_argument("Rng::below: n must be >= 1, got 0");
  // Reject the lowest 2^64 mod n words so that what is left is a multiple of n.
  const std::uint64_t threshold = (0 - n) % n;
  for (;;) {
    const std::uint64_t r = next_u64();
    if (r >= threshold) return r % n;
  }
}

bool Rng::bernoulli(double p) {
  if (!(p >= 0.0 && p <= 1.0))
    throw std::invalid_argument("Rng::bernoulli: p must be in [0, 1], got " + std::to_string(p));
  return uniform() < p;
}

double Rng::normal() {
  // Box-Muller: r = sqrt(-2 ln u1), angle 2 pi u2 gives two independent normals.
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double r = std::sqrt(-2.0 * std::log(uniform_open()));
  const double theta = kTwoPi * uniform();
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

double Rng::laplace(double scale) {
  require_finite_positive(scale, "laplace", "scale");
  // Inverse CDF: u uniform on (-1/2, 1/2), x = -scale sign(u) ln(1 - 2|u|).
  const double u = uniform_open() - 0.5;
  const double mag = -scale * std::log1p(-2.0 * std::fabs(u));
  return u < 0.0 ? -mag : mag;
}

double Rng::gamma(double shape, double scale) {
  require_finite_positive(shape, "gamma", "shape");
  require_finite_positive(scale, "gamma", "scale");
  // Marsaglia & Tsang (2000), "A simple method for generating gamma variables";
  // for shape < 1: Gamma(a) = Gamma(a + 1) * U^(1/a).
  if (shape < 1.0) {
    const double boost = std::pow(uniform_open(), 1.0 / shape);
    return gamma(shape + 1.0, scale) * boost;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = normal();
    double v = 1.0 + c * x;
    if (v <= 0.0) continue;
    v = v * v * v;
    const double u = uniform_open();
    const double x2 = x * x;
    if (u < 1.0 - 0.0331 * x2 * x2) return d * v * scale;
    if (std::log(u) < 0.5 * x2 + d * (1.0 - v + std::log(v))) return d * v * scale;
  }
}

double Rng::chi_squared(double k) {
  require_finite_positive(k, "chi_squared", "degrees of freedom k");
  return gamma(0.5 * k, 2.0);
}

namespace {
void check_fill_normal(const void* out, std::size_t n, double stddev) {
  if (!(std::isfinite(stddev) && stddev >= 0.0))
    throw std::invalid_argument("Rng::fill_normal: stddev must be finite and >= 0, got " +
                                std::to_string(stddev));
  if (n > 0 && out == nullptr) throw std::invalid_argument("Rng::fill_normal: null output buffer");
}

/// Box-Muller on `pairs` uniform pairs: out[2p] = r cos(theta), out[2p + 1] =
/// r sin(theta) with r = sqrt(-2 ln u1[p]), theta = 2 pi u2[p], as normal() does.
void box_muller(const double* u1, const double* u2, std::size_t pairs, double* out) {
  std::size_t p = 0;
#ifdef XTENSOR_USE_XSIMD
  using V = xsimd::batch<double>;
  alignas(64) double c[V::size], s[V::size];
  for (; p + V::size <= pairs; p += V::size) {
    const V r = xsimd::sqrt(V(-2.0) * xsimd::log(V::load_unaligned(u1 + p)));
    const auto [sn, cs] = xsimd::sincos(V(kTwoPi) * V::load_unaligned(u2 + p));
    (r * cs).store_aligned(c);
    (r * sn).store_aligned(s);
    for (std::size_t l = 0; l < V::size; ++l) {
      out[2 * (p + l)] = c[l];
      out[2 * (p + l) + 1] = s[l];
    }
  }
#endif
  for (; p < pairs; ++p) {
    const double r = std::sqrt(-2.0 * std::log(u1[p])), theta = kTwoPi * u2[p];
    out[2 * p] = r * std::cos(theta);
    out[2 * p + 1] = r * std::sin(theta);
  }
}
}  // namespace

void Rng::standard_normals(double* out, std::size_t n) {
  std::size_t i = 0;
  if (n > 0 && has_spare_) {
    out[i++] = spare_;
    has_spare_ = false;
  }
  constexpr std::size_t kPairs = 256;
  double u1[kPairs], u2[kPairs];
  while (n - i >= 2) {
    const std::size_t pairs = std::min(kPairs, (n - i) / 2);
    for (std::size_t p = 0; p < pairs; ++p) {  // the words normal() would read: radius first, then angle
      u1[p] = uniform_open();
      u2[p] = uniform();
    }
    box_muller(u1, u2, pairs, out + i);
    i += 2 * pairs;
  }
  if (i < n) out[i] = normal();  // an odd one: its pair's sine stays as the spare
}

void Rng::fill_normal(float* out, std::size_t n, double stddev) {
  check_fill_normal(out, n, stddev);
  double buf[512];
  for (std::size_t i = 0; i < n; i += 512) {
    const std::size_t len = std::min<std::size_t>(512, n - i);
    standard_normals(buf, len);
    for (std::size_t l = 0; l < len; ++l) out[i + l] = static_cast<float>(stddev * buf[l]);
  }
}

void Rng::fill_normal(double* out, std::size_t n, double stddev) {
  check_fill_normal(out, n, stddev);
  standard_normals(out, n);
  for (std::size_t i = 0; i < n; ++i) out[i] *= stddev;
}

// ---------------------------------------------------------------- FastRng

FastRng::FastRng(std::uint64_t seed) : seed_(seed) {
  std::uint64_t x = seed;
  for (auto& w : s_) w = splitmix64(x);
  // splitmix64 is a bijection on its counter, so four consecutive outputs are never all zero.
}

std::uint64_t FastRng::next_u64() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

void FastRng::fill_u64(std::uint64_t* out, std::size_t n) {
  // next_u64's steps on a local copy of the state (kept in registers)
  std::uint64_t s0 = s_[0], s1 = s_[1], s2 = s_[2], s3 = s_[3];
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = rotl(s1 * 5, 7) * 9;
    const std::uint64_t t = s1 << 17;
    s2 ^= s0;
    s3 ^= s1;
    s1 ^= s2;
    s0 ^= s3;
    s2 ^= t;
    s3 = rotl(s3, 45);
  }
  s_[0] = s0, s_[1] = s1, s_[2] = s2, s_[3] = s3;
}

std::unique_ptr<Rng> FastRng::split() { return std::make_unique<FastRng>(next_u64()); }

std::string FastRng::describe() const {
  return "fast (xoshiro256**, seed " + std::to_string(seed_) + "): not for production noise";
}

// Format: "xoshiro256** <seed> <s0> <s1> <s2> <s3> <spare>", words in hex, spare is
// the bit pattern of the cached Box-Muller normal or "-" when there is none.
std::string FastRng::state() const {
  std::string out = "xoshiro256** ";
  out.append(hex64(seed_));
  for (auto w : s_) out.append(" ").append(hex64(w));
  if (has_spare_) {
    std::uint64_t bits;
    std::memcpy(&bits, &spare_, sizeof(bits));
    out.append(" ").append(hex64(bits));
  } else {
    out.append(" -");
  }
  return out;
}

void FastRng::set_state(const std::string& s) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("FastRng::set_state: " + why + " (state \"" +
                                s.substr(0, 200) + "\")");
  };
  std::istringstream in(s);
  std::vector<std::string> tok;
  for (std::string t; in >> t;) tok.push_back(t);
  if (tok.size() != 7) fail("expected 7 fields, got " + std::to_string(tok.size()));
  if (tok[0] != "xoshiro256**") fail("not a xoshiro256** state");
  std::uint64_t seed, w[4];
  if (!parse_hex64(tok[1], seed)) fail("bad seed field '" + tok[1] + "'");
  for (int i = 0; i < 4; ++i)
    if (!parse_hex64(tok[2 + i], w[i])) fail("bad state word '" + tok[2 + i] + "'");
  if ((w[0] | w[1] | w[2] | w[3]) == 0) fail("all-zero state (xoshiro would only output 0)");
  bool has_spare = false;
  double spare = 0.0;
  if (tok[6] != "-") {
    std::uint64_t bits;
    if (!parse_hex64(tok[6], bits)) fail("bad spare field '" + tok[6] + "'");
    std::memcpy(&spare, &bits, sizeof(spare));
    if (!std::isfinite(spare)) fail("spare normal is not finite");
    has_spare = true;
  }
  seed_ = seed;
  for (int i = 0; i < 4; ++i) s_[i] = w[i];
  has_spare_ = has_spare;
  spare_ = spare;
}

// ---------------------------------------------------------------- SecureRng

SecureRng::SecureRng() {
  ensure_sodium();
  rekey();
}

SecureRng::SecureRng(const unsigned char* key) {
  ensure_sodium();
  rekey();
  std::memcpy(key_, key, sizeof(key_));
}

void SecureRng::set_key(const unsigned char* key) {
  rekey();
  std::memcpy(key_, key, sizeof(key_));
}

std::unique_ptr<Rng> SecureRng::split() {
  alignas(std::uint64_t) unsigned char key[32];
  fill_u64(reinterpret_cast<std::uint64_t*>(key), sizeof(key) / sizeof(std::uint64_t));
  auto child = std::make_unique<SecureRng>(key);
  sodium_memzero(key, sizeof(key));
  return child;
}

SecureRng::~SecureRng() {
  sodium_memzero(key_, sizeof(key_));
  sodium_memzero(buf_, sizeof(buf_));
  sodium_memzero(&spare_, sizeof(spare_));
}

void SecureRng::rekey() {
  randombytes_buf(key_, sizeof(key_));
  nonce_ = 0;
  sodium_memzero(buf_, sizeof(buf_));
  pos_ = sizeof(buf_);
  has_spare_ = false;
  spare_ = 0.0;
}

void SecureRng::refill() {
  // A fresh 8-byte nonce (a counter, little-endian) per buffer: never reused under one key.
  unsigned char nonce[crypto_stream_chacha20_NONCEBYTES];
  static_assert(sizeof(nonce) == 8, "crypto_stream_chacha20 takes an 8-byte nonce");
  std::uint64_t n = nonce_++;
  for (auto& b : nonce) {
    b = static_cast<unsigned char>(n & 0xff);
    n >>= 8;
  }
  if (nonce_ == 0) rekey();  // 2^64 refills: unreachable in practice, but never reuse a nonce
  crypto_stream_chacha20(buf_, sizeof(buf_), nonce, key_);
  pos_ = 0;
}

std::uint64_t SecureRng::next_u64() {
  if (pos_ + sizeof(std::uint64_t) > sizeof(buf_)) refill();
  std::uint64_t v;
  std::memcpy(&v, buf_ + pos_, sizeof(v));
  sodium_memzero(buf_ + pos_, sizeof(v));  // used keystream does not linger in memory
  pos_ += sizeof(v);
  return v;
}

void SecureRng::fill_u64(std::uint64_t* out, std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    if (pos_ + sizeof(std::uint64_t) > sizeof(buf_)) refill();
    const std::size_t take = std::min(n - done, (sizeof(buf_) - pos_) / sizeof(std::uint64_t));
    std::memcpy(out + done, buf_ + pos_, take * sizeof(std::uint64_t));
    sodium_memzero(buf_ + pos_, take * sizeof(std::uint64_t));
    pos_ += take * sizeof(std::uint64_t);
    done += take;
  }
}

std::string SecureRng::describe() const { return "secure (ChaCha20 via libsodium, OS entropy)"; }

void SecureRng::set_state(const std::string& s) {
  if (!s.empty())
    throw std::invalid_argument(
        "SecureRng::set_state: the secure generator has no restorable state (expected \"\", got \"" +
        s.substr(0, 200) + "\"); it re-keys from OS entropy instead");
  rekey();
}

// ---------------------------------------------------------------- discrete Gaussian

namespace {

__extension__ typedef unsigned __int128 u128;

/// floor(2^16 / k!) for k = 0..8 (F_1 = 2^16 does not fit and is never used),
/// and kAmbiguous[K] = F_K for K in 3..8 with, for K = 2 and 9, a chunk that
/// cannot have K as its first failure (u >= 2^15 for K = 2, u = 0 is handled
/// before K = 9 is looked at).
constexpr std::uint32_t kInverseFactorial[9] = {0, 0, 32768, 10922, 2730, 546, 91, 13, 1};
constexpr std::uint32_t kAmbiguous[10] = {0, 0, 0, 10922, 2730, 546, 91, 13, 1, 0xffffffffU};
constexpr std::uint64_t kFactorial[10] = {1, 1, 2, 6, 24, 120, 720, 5040, 40320, 362880};
static_assert(kInverseFactorial[7] == (1 << 16) / 5040 && kInverseFactorial[8] == (1 << 16) / 40320 &&
              (1 << 16) / 362880 == 0);

/// The generator's words, served in 16- or 32-bit chunks or single bits, with
/// the exact samplers the discrete Gaussian is built from (Canonne, Kamath,
/// Steinke 2020). All probabilities are ratios of integers; no floating point
/// touches a draw.
///
/// Bernoulli(num / den) with a b-bit chunk U (docs/noise.md section 2): a
/// uniform X on [0, 1) is (U + Y) / 2^b with Y uniform on [0, 1) and
/// independent of U, and X < num / den iff (U + Y) den < num 2^b. If
/// U den >= num 2^b the answer is no, if (U + 1) den <= num 2^b it is yes, and
/// otherwise (one value of U in 2^b) it is Y < r / den with r = num 2^b - U den
/// in (0, den): the same question again, asked of fresh bits.
class BitStream {
 public:
  explicit BitStream(Rng& rng) : rng_(rng) {}

  bool bit() { return chunk(1) != 0; }

  /// b <= 32 fresh bits (the rest of a word too short for them is dropped).
  std::uint64_t chunk(int b) {
    if (left_ < b) {
      word_ = rng_.next_u64();
      left_ = 64;
    }
    const std::uint64_t c = word_ & ((std::uint64_t(1) << b) - 1);
    word_ >>= b;
    left_ -= b;
    return c;
  }

  /// Uniform on {0, ..., n - 1}, 1 <= n <= 2^32 - 1: Lemire's multiply-and-reject,
  /// `reject` = 2^32 mod n precomputed (the lowest products it rejects).
  std::uint32_t below(std::uint32_t n, std::uint32_t reject) {
    for (;;) {
      const std::uint64_t m = chunk(32) * n;
      if (static_cast<std::uint32_t>(m) >= reject) return static_cast<std::uint32_t>(m >> 32);
    }
  }

  /// Bernoulli(num / den), 0 <= num, 1 <= den < 2^127, a whole word U at a time:
  /// U den < 2^191 is kept as top 2^64 + low and compared with num 2^64. Used
  /// where a chunk left the question open, and for k >= 3 in Algorithm 1.
  bool bernoulli(u128 num, u128 den) {
    if (num >= den) return true;
    const auto den_lo = static_cast<std::uint64_t>(den), den_hi = static_cast<std::uint64_t>(den >> 64);
    for (;;) {
      const std::uint64_t u = rng_.next_u64();
      const u128 lo = u128(u) * den_lo;
      const u128 top = u128(u) * den_hi + (lo >> 64);  // < den < 2^127
      const auto low = static_cast<std::uint64_t>(lo);
      if (top >= num) return false;  // U den >= num 2^64
      const u128 gap = num - top;    // r = num 2^64 - U den = gap 2^64 - low
      if (gap >> 64) return true;    // r > 2^128 - 2^64 > den
      const u128 r = (gap << 64) - low;
      if (r >= den) return true;
      num = r;
    }
  }

  /// One 16-bit chunk decides Bernoulli(num / den), num < den <= 2^32, without a
  /// branch on the answer; the remainder case (one U in 2^16) goes on as above.
  bool bernoulli_chunk(std::uint64_t num, std::uint64_t den) {
    const std::uint64_t a = chunk(16) * den, n = num << 16;
    // 0 < n - a < den in one unsigned comparison: a > n wraps n - a to at least
    // 2^64 - a > den, as a < 2^48
    if (n - a - 1 < den - 1) [[unlikely]]
      return bernoulli(u128(n - a), u128(den));
    return a < n;
  }

  /// The same for num < den < 2^110 in 128-bit arithmetic.
  bool bernoulli_chunk(u128 num, u128 den) {
    const u128 a = chunk(16) * den, n = num << 16;  // both < 2^126: n - a wraps above 2^127 when a > n
    if (n - a - 1 < den - 1) [[unlikely]]
      return bernoulli(n - a, den);
    return a < n;
  }

  /// Bernoulli(exp(-num / den)) for num < den (CKS 2020, Algorithm 1): the parity
  /// of the first k with Bernoulli(gamma / k) false. The Bernoullis are
  /// independent, so k = 1 and 2 are both drawn and only their conjunction
  /// (probability gamma^2 / 2) is branched on. den <= 2^31 (Num = uint64) or
  /// den < 2^102 (Num = u128): 2 den fits bernoulli_chunk, and den k < 2^127
  /// while k < 2^24 (reaching k = 2^24 has probability below 1 / (2^24)!).
  template <class Num>
  bool bernoulli_exp_fraction(Num num, Num den) {
    const bool pass1 = bernoulli_chunk(num, den), pass2 = bernoulli_chunk(num, 2 * den);
    if (pass1 & pass2) [[unlikely]] {
      for (std::uint64_t k = 3;; ++k)
        if (!bernoulli(u128(num), u128(den) * k)) return k & 1;
    }
    return !pass1;
  }

  /// Bernoulli(exp(-1)) from one 16-bit chunk in all but 7 cases in 2^16.
  /// Algorithm 1 at gamma = 1 passes k with probability 1 / k given the earlier
  /// passes, so P(pass 1..k) = 1 / k!: the same law as the nested events
  /// X < 1 / k! of one uniform X = (U + Y) / 2^16 (docs/noise.md section 2).
  /// With F_k = floor(2^16 / k!), U < F_k decides "pass k" and U > F_k "fail k";
  /// the first failing k is K = 2 + #{k in 2..8 : U < F_k}, and the answer is K
  /// odd. U = F_K (K in 3..8, where 2^16 / K! is not whole) leaves pass K open:
  /// it is Y < (2^16 - U K!) / K!, and every later k fails. U = 0 passes 2..8
  /// and leaves 9 open: Y < 2^16 / 9!, then Algorithm 1 from k = 10 (given
  /// X < 1 / 9!, X 9! is uniform again).
  bool bernoulli_exp_minus_one() {
    const auto u = static_cast<std::uint32_t>(chunk(16));
    // K > 5 has probability 1 / 120: k = 2..5 first, without branching
    unsigned passes = unsigned(u < kInverseFactorial[2]) + unsigned(u < kInverseFactorial[3]) +
                      unsigned(u < kInverseFactorial[4]) + unsigned(u < kInverseFactorial[5]);
    if (passes == 4) [[unlikely]] {
      if (u == 0) {
        if (!bernoulli(u128(1) << 16, u128(kFactorial[9]))) return true;  // K = 9
        for (std::uint64_t k = 10;; ++k)
          if (!bernoulli(u128(1), u128(k))) return k & 1;
      }
      for (int k = 6; k <= 8 && u < kInverseFactorial[k]; ++k) ++passes;
    }
    const unsigned first_fail = 2 + passes;
    if (u == kAmbiguous[first_fail]) [[unlikely]] {
      const std::uint64_t f = kFactorial[first_fail];
      const std::uint64_t rest = (std::uint64_t(1) << 16) - std::uint64_t(u) * f;  // in (0, f)
      return (first_fail + unsigned(bernoulli(u128(rest), u128(f)))) & 1;
    }
    return first_fail & 1;
  }

  /// Bernoulli(exp(-num / den)), num >= 0, den < 2^102: one Bernoulli(exp(-1)) per
  /// whole unit of num / den, stopping at the first failure (no division), then
  /// the fraction.
  bool bernoulli_exp(u128 num, u128 den) {
    while (num >= den) {
      num -= den;
      if (!bernoulli_exp_minus_one()) return false;
    }
    return bernoulli_exp_fraction<u128>(num, den);
  }

 private:
  Rng& rng_;
  std::uint64_t word_ = 0;
  int left_ = 0;
};

/// What a scale fixes, computed once per call of fill_discrete_gaussian or
/// add_grid_noise: t = s + 1, s^2, 2 s^2 t^2 and the rejection threshold of
/// uniform draws below t.
struct DiscreteGaussianScale {
  explicit DiscreteGaussianScale(std::uint64_t s)
      : t(s + 1),
        s2(s * s),
        den(2 * u128(s * s) * (t * t)),
        reject(static_cast<std::uint32_t>((std::uint64_t(1) << 32) % t)) {}
  std::uint64_t t, s2;  // s2 < 2^51
  u128 den;             // < 2^102
  std::uint32_t reject;
};

/// One draw of N_Z(0, s^2) (CKS 2020, Algorithm 3 over Algorithm 2): a discrete
/// Laplace candidate y of scale t = s + 1, kept with probability
/// exp(-(|y| - s^2 / t)^2 / (2 s^2)) = exp(-(|y| t - s^2)^2 / (2 s^2 t^2)).
/// Candidates with V >= 2048 (|y| >= 2048 t) are dropped: the output is the
/// discrete Gaussian conditioned on |k| < 2048 t, and the integers stay below
/// 2^126 (|y| t < 2^61 for s <= kMaxDiscreteGaussianScale).
std::int64_t discrete_gaussian(BitStream& bits, const DiscreteGaussianScale& c) {
  constexpr std::uint64_t kMaxV = 2048;
  const std::uint64_t t = c.t;
  for (;;) {
    // discrete Laplace, pmf proportional to exp(-|y| / t) (Algorithm 2)
    const std::uint64_t u = bits.below(static_cast<std::uint32_t>(t), c.reject);
    if (!bits.bernoulli_exp_fraction<std::uint64_t>(u, t)) continue;
    std::uint64_t v = 0;
    while (v < kMaxV && bits.bernoulli_exp_minus_one()) ++v;
    if (v == kMaxV) continue;
    const std::uint64_t x = u + t * v;
    const bool negative = bits.bit();
    if (x == 0 && negative) continue;
    // Gaussian acceptance (Algorithm 3): |x t - s^2| < 2^61 fits in 64 bits
    const std::uint64_t xt = x * t;
    const std::uint64_t d = xt >= c.s2 ? xt - c.s2 : c.s2 - xt;
    if (bits.bernoulli_exp(u128(d) * d, c.den))
      return negative ? -static_cast<std::int64_t>(x) : static_cast<std::int64_t>(x);
  }
}

void check_scale(std::uint64_t scale, const char* who) {
  if (scale < 1 || scale > kMaxDiscreteGaussianScale)
    throw std::invalid_argument(std::string(who) + ": scale must be a whole number in [1, " +
                                std::to_string(kMaxDiscreteGaussianScale) + "], got " + std::to_string(scale));
}

}  // namespace

void fill_discrete_gaussian(Rng& rng, std::uint64_t scale, std::int64_t* out, std::size_t n) {
  check_scale(scale, "fill_discrete_gaussian");
  if (n > 0 && out == nullptr) throw std::invalid_argument("fill_discrete_gaussian: null output buffer");
  BitStream bits(rng);
  const DiscreteGaussianScale c(scale);
  for (std::size_t i = 0; i < n; ++i) out[i] = discrete_gaussian(bits, c);
}

NoiseGrid noise_grid(double noise_std) {
  if (!(std::isfinite(noise_std) && noise_std >= 0x1.0p-900 && noise_std <= 0x1.0p900))
    throw std::invalid_argument("noise_grid: the noise's standard deviation must be in [2^-900, 2^900], got " +
                                std::to_string(noise_std));
  int e = 0;
  const double m = std::frexp(noise_std, &e);  // noise_std = m 2^e, m in [1/2, 1)
  NoiseGrid g;
  g.grid = std::ldexp(1.0, e - 25);
  // m 2^25 in [2^24, 2^25) is exact; +1 keeps s grid above noise_std even if the
  // caller's product sigma * C was rounded down
  g.scale = static_cast<std::uint64_t>(std::ceil(std::ldexp(m, 25))) + 1;
  return g;
}


// ---------------------------------------------------------------- factory

std::unique_ptr<Rng> ReproducibleRng::split() { return std::make_unique<ReproducibleRng>(next_u64()); }

std::string ReproducibleRng::describe() const {
  return "reproducible (xoshiro256**, seed " + std::to_string(seed_) + "): " + kNotPrivateReproducible;
}

void require_private_generator(const Rng& rng, const std::string& role) {
  if (rng.secure() || rng.reproducible_opt_in()) return;
  throw std::invalid_argument("the " + role + " generator is " + rng.describe() +
                              ": anyone who knows its seed can recompute it. Use SecureRng (the default), or "
                              "ReproducibleRng to ask for recomputable randomness by name (NOT private)");
}

std::unique_ptr<Rng> make_private_rng(bool reproducible, std::uint64_t seed) {
  if (reproducible) return std::make_unique<ReproducibleRng>(seed);
  return std::make_unique<SecureRng>();
}

HashKey random_hash_key() {
  ensure_sodium();
  HashKey k;
  randombytes_buf(k.data(), k.size());
  return k;
}

HashKey hash_key_from_seed(std::uint64_t seed, std::string_view tag) {
  ensure_sodium();
  std::vector<unsigned char> msg(tag.begin(), tag.end());
  for (int i = 0; i < 8; ++i) msg.push_back(static_cast<unsigned char>(seed >> (8 * i)));
  HashKey k;
  crypto_generichash(k.data(), k.size(), msg.data(), msg.size(), nullptr, 0);
  return k;
}

std::uint64_t keyed_hash(const HashKey& key, std::initializer_list<std::uint64_t> words) {
  ensure_sodium();
  // short messages (dropout hashes eight words per element) stay on the stack
  unsigned char small[128];
  std::vector<unsigned char> large;
  unsigned char* msg = small;
  if (8 * words.size() > sizeof small) {
    large.resize(8 * words.size());
    msg = large.data();
  }
  std::size_t n = 0;
  for (std::uint64_t w : words)
    for (int i = 0; i < 8; ++i) msg[n++] = static_cast<unsigned char>(w >> (8 * i));
  unsigned char h[crypto_shorthash_BYTES];
  crypto_shorthash(h, msg, n, key.data());
  std::uint64_t z = 0;
  for (int i = 7; i >= 0; --i) z = (z << 8) | h[i];
  return z;
}

std::size_t keyed_bucket(const HashKey& key, std::int64_t id, std::size_t count) {
  if (count == 0) throw std::invalid_argument("keyed_bucket: count must be >= 1");
  return std::size_t(keyed_hash(key, {std::uint64_t(id)}) % count);
}

}  // namespace dpgrad
