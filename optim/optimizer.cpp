// SGD, momentum and Adam updates, with argument checks and state for checkpoints.
#include "optim/optimizer.hpp"

#include "engine/check.hpp"
#include "engine/numbers.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>


namespace dpgrad {

template <class T>
OptimizerT<T>::OptimizerT(std::vector<TensorT<T>> params, double lr)
    : params_(std::move(params)), lr_(lr), lr_scale_(params_.size(), 1.0) {
  set_lr(lr);
}

template <class T>
void OptimizerT<T>::set_lr_scale(std::size_t i, double factor) {
  require(i < params_.size(), "learning-rate scale for parameter " + std::to_string(i) + " of " +
                                  std::to_string(params_.size()));
  require(std::isfinite(factor) && factor >= 0, "learning-rate scale of '" + params_[i].name() +
                                                    "' must be a finite number >= 0, got " + std::to_string(factor));
  lr_scale_[i] = factor;
}

template <class T>
void OptimizerT<T>::set_lr(double lr) {
  require(std::isfinite(lr) && lr >= 0, "learning rate must be a finite number >= 0, got " + std::to_string(lr));
  lr_ = lr;
}

template <class T>
std::size_t OptimizerT<T>::set_lr_scale(const std::string& name, double factor) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string& p = params_[i].name();
    if (p == name || (p.size() > name.size() && p.compare(0, name.size(), name) == 0 && p[name.size()] == '.')) {
      set_lr_scale(i, factor);
      ++n;
    }
  }
  if (n == 0) {
    std::string known;
    for (const auto& p : params_) known += (known.empty() ? "" : ", ") + p.name();
    throw std::invalid_argument("learning-rate scale: no parameter or layer '" + name + "' (parameters: " + known + ")");
  }
  return n;
}

template <class T>
void OptimizerT<T>::step(const std::vector<ArrayT<T>>& grads) {
  require(grads.size() == params_.size(), "optimizer step: " + std::to_string(grads.size()) + " gradients for " +
                                              std::to_string(params_.size()) + " parameters");
  for (std::size_t i = 0; i < grads.size(); ++i)
    require(grads[i].shape() == params_[i].value().shape(),
            "optimizer step: gradient " + std::to_string(i) + " does not match parameter '" + params_[i].name() + "'");
  ++t_;
  for (std::size_t i = 0; i < params_.size(); ++i) update(i, params_[i], grads[i]);
}

template <class T>
void OptimizerT<T>::step() {
  std::vector<ArrayT<T>> g;
  for (auto& p : params_) g.push_back(p.grad());
  step(g);
}

template <class T>
void OptimizerT<T>::zero_grad() {
  for (auto& p : params_) p.zero_grad();
}

template <class T>
void OptimizerT<T>::load_state(const std::map<std::string, ArrayT<T>>&, long steps) {
  t_ = steps;
}

template <class T>
SgdT<T>::SgdT(std::vector<TensorT<T>> params, double lr, double momentum, double weight_decay)
    : OptimizerT<T>(std::move(params), lr), momentum_(momentum), weight_decay_(weight_decay) {
  require(momentum >= 0 && momentum < 1, "momentum must be in [0, 1), got " + std::to_string(momentum));
  require(weight_decay >= 0, "weight decay must be >= 0, got " + std::to_string(weight_decay));
  if (momentum_ > 0)
    for (auto& p : this->params_) velocity_.push_back(xt::zeros<T>(p.value().shape()));
}

template <class T>
void SgdT<T>::update(std::size_t i, TensorT<T>& p, const ArrayT<T>& g) {
  T* w = p.mutable_value().data();
  const T* gr = g.data();
  const std::size_t n = g.size();
  const T lr = T(this->lr_of(i)), wd = T(weight_decay_), mu = T(momentum_);
  if (momentum_ > 0) {
    T* v = velocity_[i].data();
    for (std::size_t k = 0; k < n; ++k) {
      v[k] = mu * v[k] + gr[k] + wd * w[k];
      w[k] -= lr * v[k];
    }
  } else {
    for (std::size_t k = 0; k < n; ++k) w[k] -= lr * (gr[k] + wd * w[k]);
  }
}

template <class T>
std::map<std::string, ArrayT<T>> SgdT<T>::state() const {
  std::map<std::string, ArrayT<T>> s;
  for (std::size_t i = 0; i < velocity_.size(); ++i) s["velocity." + this->params_[i].name()] = velocity_[i];
  return s;
}

template <class T>
void SgdT<T>::load_state(const std::map<std::string, ArrayT<T>>& s, long steps) {
  this->t_ = steps;
  for (std::size_t i = 0; i < velocity_.size(); ++i) {
    auto it = s.find("velocity." + this->params_[i].name());
    require(it != s.end() && it->second.shape() == velocity_[i].shape(),
            "optimizer state: missing or misshapen velocity for '" + this->params_[i].name() + "'");
    velocity_[i] = it->second;
  }
}

template <class T>
AdamT<T>::AdamT(std::vector<TensorT<T>> params, double lr, double beta1, double beta2, double eps, double weight_decay)
    : OptimizerT<T>(std::move(params), lr), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {
  require(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "Adam betas must be in [0, 1)");
  require(eps > 0, "Adam eps must be > 0");
  require(weight_decay >= 0, "weight decay must be >= 0");
  for (auto& p : this->params_) {
    m_.push_back(xt::zeros<T>(p.value().shape()));
    v_.push_back(xt::zeros<T>(p.value().shape()));
  }
}

template <class T>
void AdamT<T>::update(std::size_t i, TensorT<T>& p, const ArrayT<T>& g) {
  T* w = p.mutable_value().data();
  T* m = m_[i].data();
  T* v = v_[i].data();
  const T* gr = g.data();
  const std::size_t n = g.size();
  const T b1 = T(beta1_), b2 = T(beta2_), wd = T(weight_decay_), eps = T(eps_);
  // bias corrections folded into the step: lr m_hat / (sqrt(v_hat) + eps)
  const T step = T(this->lr_of(i) / (1 - std::pow(beta1_, double(this->t_))));
  const T unbias = T(1.0 / std::sqrt(1 - std::pow(beta2_, double(this->t_))));
  if (noise_variance_ > 0) {  // DP-AdamBC: v_hat less the noise's variance, floored
    const T phi = T(noise_variance_), floor = T(floor_), unbias2 = unbias * unbias;
    for (std::size_t k = 0; k < n; ++k) {
      const T gk = gr[k] + wd * w[k];
      m[k] = b1 * m[k] + (T(1) - b1) * gk;
      v[k] = b2 * v[k] + (T(1) - b2) * gk * gk;
      w[k] -= step * m[k] / (std::sqrt(std::max(v[k] * unbias2 - phi, floor)) + eps);
    }
    return;
  }
  for (std::size_t k = 0; k < n; ++k) {
    const T gk = gr[k] + wd * w[k];
    m[k] = b1 * m[k] + (T(1) - b1) * gk;
    v[k] = b2 * v[k] + (T(1) - b2) * gk * gk;
    w[k] -= step * m[k] / (std::sqrt(v[k]) * unbias + eps);
  }
}

template <class T>
void AdamT<T>::correct_noise(double variance, double floor) {
  require(std::isfinite(variance) && variance >= 0, "Adam noise variance must be a finite number >= 0");
  require(std::isfinite(floor) && floor > 0, "Adam noise correction floor must be a finite number > 0");
  noise_variance_ = variance;
  floor_ = floor;
}

template <class T>
std::map<std::string, ArrayT<T>> AdamT<T>::state() const {
  std::map<std::string, ArrayT<T>> s;
  for (std::size_t i = 0; i < m_.size(); ++i) {
    s["m." + this->params_[i].name()] = m_[i];
    s["v." + this->params_[i].name()] = v_[i];
  }
  return s;
}

template <class T>
void AdamT<T>::load_state(const std::map<std::string, ArrayT<T>>& s, long steps) {
  this->t_ = steps;
  for (std::size_t i = 0; i < m_.size(); ++i) {
    const std::string& n = this->params_[i].name();
    auto a = s.find("m." + n), b = s.find("v." + n);
    require(a != s.end() && b != s.end() && a->second.shape() == m_[i].shape() && b->second.shape() == v_[i].shape(),
            "optimizer state: missing or misshapen Adam moments for '" + n + "'");
    m_[i] = a->second;
    v_[i] = b->second;
  }
}

double cosine_lr(double start, double end, long step, long total) {
  require(total > 0 && step >= 0 && step <= total,
          "cosine_lr: step " + std::to_string(step) + " is outside [0, " + std::to_string(total) + "]");
  return end + (start - end) * 0.5 * (1 + std::cos(M_PI * double(step) / double(total)));
}

std::vector<std::pair<std::string, double>> parse_lr_scales(const std::string& spec) {
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t pos = 0; pos < spec.size();) {
    const std::size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    require(eq != std::string::npos && eq > 0 && eq + 1 < item.size(), "learning-rate scale '" + item +
                                                                           "' is not LAYER=FACTOR");
    const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
    for (const auto& [seen, f] : out) require(seen != name, "learning-rate scale: '" + name + "' is given twice");
    const std::optional<double> factor = decimal_number(value);
    require(factor && *factor >= 0,
            "learning-rate scale: the factor of '" + name + "' must be a decimal number >= 0, got '" + value + "'");
    out.emplace_back(name, *factor);
    pos = end + 1;
  }
  return out;
}

std::vector<std::string> optimizer_names() { return {"sgd", "momentum", "adam", "adambc"}; }

double default_lr(const std::string& name) {
  if (name == "sgd" || name == "momentum") return 0.1;
  if (name == "adam" || name == "adambc") return 1e-3;
  throw std::invalid_argument("unknown optimizer '" + name + "' (sgd, momentum, adam, adambc)");
}

void check_optimizer_spec(const OptimizerSpec& s) {
  const double lr = s.lr.value_or(default_lr(s.name));
  require(lr > 0 && std::isfinite(lr), "the learning rate must be > 0 and finite, got " + std::to_string(lr));
  require(std::isfinite(s.momentum) && s.momentum >= 0 && s.momentum < 1,
          "momentum must be in [0, 1), got " + std::to_string(s.momentum));
  require(std::isfinite(s.weight_decay) && s.weight_decay >= 0,
          "weight_decay must be finite and >= 0, got " + std::to_string(s.weight_decay));
}

template <class T>
std::unique_ptr<OptimizerT<T>> make_optimizer(const OptimizerSpec& s, std::vector<TensorT<T>> params) {
  check_optimizer_spec(s);
  const double lr = s.lr.value_or(default_lr(s.name));
  if (s.name == "adam" || s.name == "adambc")
    return std::make_unique<AdamT<T>>(std::move(params), lr, 0.9, 0.999, 1e-8, s.weight_decay);
  return std::make_unique<SgdT<T>>(std::move(params), lr, s.name == "momentum" ? s.momentum : 0.0, s.weight_decay);
}

template class OptimizerT<float>;
template class OptimizerT<double>;
template class SgdT<float>;
template class SgdT<double>;
template class AdamT<float>;
template class AdamT<double>;
template std::unique_ptr<OptimizerT<float>> make_optimizer(const OptimizerSpec&, std::vector<TensorT<float>>);
template std::unique_ptr<OptimizerT<double>> make_optimizer(const OptimizerSpec&, std::vector<TensorT<double>>);

}  // namespace dpgrad
