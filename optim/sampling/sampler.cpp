// Samplers: see sampler.hpp.
#include "optim/sampling/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/random.hpp"

namespace dpgrad {

std::vector<std::size_t> Sampler::next(Rng& rng) {
  require_private_generator(rng, "sampling");
  return draw(rng);
}

nlohmann::json Sampler::state() const { return nlohmann::json::object(); }
void Sampler::load_state(const nlohmann::json&) {}

namespace {

class PoissonSampler final : public Sampler {
 public:
  PoissonSampler(std::size_t n, std::size_t batch) : n_(n), q_(double(batch) / double(n)) {}
  std::string name() const override { return "poisson"; }
  std::vector<std::size_t> draw(Rng& rng) override {
    // Skip ahead by geometric gaps: O(batch) draws instead of O(N).
    std::vector<std::size_t> idx;
    if (q_ >= 1.0) {
      for (std::size_t i = 0; i < n_; ++i) idx.push_back(i);
      return idx;
    }
    const double log1mq = std::log1p(-q_);
    double pos = -1;
    while (true) {
      pos += 1 + std::floor(std::log(rng.uniform_open()) / log1mq);
      if (pos >= double(n_)) break;
      idx.push_back(std::size_t(pos));
    }
    return idx;
  }
  long steps_per_epoch() const override { return std::max(1L, long(std::llround(1.0 / q_))); }
  double sampling_rate() const override { return q_; }
  double expected_batch_size() const override { return q_ * double(n_); }
  std::vector<std::string> accountants() const override { return {"rdp", "pld", "gdp"}; }

 private:
  std::size_t n_;
  double q_;
};

/// Each epoch: a fresh permutation, processed in order, b at a time, stopping
/// after floor(f n / b) batches (Berthier et al. 2019, cyclic SGD).
class ShuffleSampler final : public Sampler {
 public:
  ShuffleSampler(std::size_t n, std::size_t b, double f)
      : n_(n), b_(b), f_(f), per_epoch_(std::max<long>(1, long(std::floor(f * double(n) / double(b))))) {}
  std::string name() const override { return "shuffle"; }
  std::vector<std::size_t> draw(Rng& rng) override {
    if (step_ == 0 || step_ >= per_epoch_) {
      perm_.resize(n_);
      for (std::size_t i = 0; i < n_; ++i) perm_[i] = i;
      for (std::size_t i = n_; i > 1; --i) std::swap(perm_[i - 1], perm_[rng.below(i)]);  // Fisher-Yates
      step_ = 0;
    }
    std::vector<std::size_t> idx(perm_.begin() + std::ptrdiff_t(std::size_t(step_) * b_),
                                 perm_.begin() + std::ptrdiff_t(std::size_t(step_ + 1) * b_));
    ++step_;
    return idx;
  }
  long steps_per_epoch() const override { return per_epoch_; }
  double sampling_rate() const override { return double(b_) / double(n_); }
  double expected_batch_size() const override { return double(b_); }
  std::vector<std::string> accountants() const override { return {"shuffle"}; }
  nlohmann::json state() const override { return {{"step", step_}, {"permutation", perm_}}; }
  void load_state(const nlohmann::json& s) override {
    step_ = s.at("step").get<long>();
    perm_ = s.at("permutation").get<std::vector<std::size_t>>();
    if ((step_ != 0 && perm_.size() != n_) || step_ < 0 || step_ > per_epoch_)
      throw std::invalid_argument("shuffle sampler state does not match this dataset");
  }

 private:
  std::size_t n_, b_;
  double f_;
  long per_epoch_;
  long step_ = 0;
  std::vector<std::size_t> perm_;
};

/// b distinct examples, uniformly, independently at every step.
class FixedSampler final : public Sampler {
 public:
  FixedSampler(std::size_t n, std::size_t b) : n_(n), b_(b) {}
  std::string name() const override { return "fixed"; }
  std::vector<std::size_t> draw(Rng& rng) override {
    // Floyd's algorithm: b distinct values from [0, n).
    std::vector<std::size_t> idx;
    idx.reserve(b_);
    for (std::size_t j = n_ - b_; j < n_; ++j) {
      std::size_t t = std::size_t(rng.below(j + 1));
      if (std::find(idx.begin(), idx.end(), t) == idx.end()) idx.push_back(t);
      else idx.push_back(j);
    }
    return idx;
  }
  long steps_per_epoch() const override { return std::max(1L, long(std::llround(double(n_) / double(b_)))); }
  double sampling_rate() const override { return double(b_) / double(n_); }
  double expected_batch_size() const override { return double(b_); }
  std::vector<std::string> accountants() const override { return {"wor"}; }

 private:
  std::size_t n_, b_;
};

}  // namespace

void check_accountant_matches(const Sampler& sampler, const std::string& accountant) {
  auto ok = sampler.accountants();
  if (std::find(ok.begin(), ok.end(), accountant) != ok.end()) return;
  std::string list;
  for (const auto& a : ok) list += (list.empty() ? "" : ", ") + a;
  throw std::invalid_argument("the " + accountant + " accountant does not analyse " + sampler.name() +
                              " sampling; use one of: " + list);
}

std::unique_ptr<Sampler> make_sampler(const std::string& name, std::size_t n, std::size_t b, double f) {
  if (n == 0) throw std::invalid_argument("sampler: the dataset is empty");
  if (b == 0 || b > n)
    throw std::invalid_argument("sampler: batch size " + std::to_string(b) + " must be in [1, " + std::to_string(n) + "]");
  if (name == "poisson") return std::make_unique<PoissonSampler>(n, b);
  if (name == "fixed") return std::make_unique<FixedSampler>(n, b);
  if (name == "shuffle") {
    if (!(f > 0 && f <= 1)) throw std::invalid_argument("sampler: epoch fraction must be in (0, 1], got " + std::to_string(f));
    return std::make_unique<ShuffleSampler>(n, b, f);
  }
  throw std::invalid_argument("unknown sampler '" + name + "' (poisson, shuffle, fixed)");
}

std::unique_ptr<Sampler> poisson_sampler(std::size_t n, std::size_t expected_batch) {
  return make_sampler("poisson", n, expected_batch);
}
std::unique_ptr<Sampler> shuffle_sampler(std::size_t n, std::size_t batch, double epoch_fraction) {
  return make_sampler("shuffle", n, batch, epoch_fraction);
}
std::unique_ptr<Sampler> fixed_size_sampler(std::size_t n, std::size_t batch) {
  return make_sampler("fixed", n, batch);
}

}  // namespace dpgrad
