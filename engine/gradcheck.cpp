// Gradient checks: see gradcheck.hpp. Every comparison is relative to the
// larger magnitude (floored at 1e-3 so that values near zero compare absolutely).
#include "engine/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/random.hpp"
#include "engine/tape.hpp"

namespace dpgrad {
namespace {

double rel(double a, double b) { return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-3}); }

ArrayT<double> random_like(const Shape& s, Rng& rng) {
  ArrayT<double> a = ArrayT<double>::from_shape(s);
  rng.fill_normal(a.data(), a.size(), 1.0);
  return a;
}

double dot(const ArrayT<double>& a, const ArrayT<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a.data()[i] * b.data()[i];
  return s;
}

struct Checker {
  const GradFn& f;
  const std::vector<ArrayT<double>>& xs;
  const GradcheckOptions& o;

  bool constant(std::size_t i) const {
    return std::find(o.constant_inputs.begin(), o.constant_inputs.end(), i) != o.constant_inputs.end();
  }

  ArrayT<double> eval(const std::vector<ArrayT<double>>& at) const {
    NoRecordScope<double> no_tape;
    std::vector<TensorT<double>> ts;
    for (const auto& x : at) ts.emplace_back(x, false);
    return f(ts).value();
  }

  /// (f(x + h v) - f(x - h v)) / 2h
  ArrayT<double> central_difference(const std::vector<ArrayT<double>>& v) const {
    std::vector<ArrayT<double>> plus = xs, minus = xs;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (constant(i)) continue;
      plus[i] += o.step * v[i];
      minus[i] -= o.step * v[i];
    }
    return (eval(plus) - eval(minus)) / (2 * o.step);
  }

  /// The gradients J^T u by reverse mode (zeros for inputs f ignores).
  std::vector<ArrayT<double>> reverse(const ArrayT<double>& u) const {
    TapeT<double> tape;
    RecordScope<double> scope(tape);
    std::vector<TensorT<double>> ts;
    for (std::size_t i = 0; i < xs.size(); ++i) ts.emplace_back(xs[i], !constant(i));
    TensorT<double> y = f(ts);
    if (y.requires_grad()) tape.backward(y, u);
    std::vector<ArrayT<double>> g;
    for (auto& t : ts) g.push_back(t.grad());
    return g;
  }

  /// J applied to k stacked directions dirs[i] (k, ...x_i): returns (k, ...out).
  ArrayT<double> forward(const std::vector<ArrayT<double>>& dirs, const Shape& out_shape, std::size_t k) const {
    NoRecordScope<double> no_tape;
    std::vector<TensorT<double>> ts;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      ts.emplace_back(xs[i], false);
      if (!constant(i)) ts.back().set_tangent(dirs[i]);
    }
    TensorT<double> y = f(ts);
    if (!y.has_tangent()) {
      Shape s{k};
      s.insert(s.end(), out_shape.begin(), out_shape.end());
      return xt::zeros<double>(s);
    }
    return y.tangent();
  }
};

ArrayT<double> stack_k(const std::vector<ArrayT<double>>& parts) {
  Shape s{parts.size()};
  s.insert(s.end(), parts[0].shape().begin(), parts[0].shape().end());
  ArrayT<double> r = ArrayT<double>::from_shape(s);
  std::size_t n = parts[0].size();
  for (std::size_t j = 0; j < parts.size(); ++j) std::copy_n(parts[j].data(), n, r.data() + j * n);
  return r;
}

}  // namespace

GradcheckResult gradcheck(const GradFn& f, const std::vector<ArrayT<double>>& inputs, GradcheckOptions opts) {
  GradcheckResult res;
  std::ostringstream rep;
  Checker c{f, inputs, opts};
  FastRng rng(opts.seed);
  ArrayT<double> y0 = c.eval(inputs);
  Shape ys = shape_of(y0);
  std::size_t k = std::max<std::size_t>(opts.tangents, 1);

  for (int probe = 0; probe < opts.probes; ++probe) {
    ArrayT<double> u = random_like(ys, rng);
    std::vector<std::vector<ArrayT<double>>> dirs(k);  // dirs[j][i]: direction j for input i
    for (std::size_t j = 0; j < k; ++j)
      for (const auto& x : inputs) dirs[j].push_back(random_like(shape_of(x), rng));

    // 1. vjp: <J^T u, v> against <u, FD(v)>
    std::vector<ArrayT<double>> g = c.reverse(u);
    double rev = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (!c.constant(i)) rev += dot(g[i], dirs[0][i]);
    ArrayT<double> fd = c.central_difference(dirs[0]);
    double fd_dot = dot(u, fd);
    double e = rel(rev, fd_dot);
    res.vjp_error = std::max(res.vjp_error, e);
    if (e > opts.tolerance)
      rep << "vjp: <J^T u, v> = " << rev << " but finite differences give " << fd_dot << " (probe " << probe << ")\n";

    // 2. jvp with k tangents at once: each against its finite difference
    std::vector<ArrayT<double>> stacked;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      std::vector<ArrayT<double>> parts;
      for (std::size_t j = 0; j < k; ++j) parts.push_back(dirs[j][i]);
      stacked.push_back(stack_k(parts));
    }
    ArrayT<double> jv = c.forward(stacked, ys, k);
    for (std::size_t j = 0; j < k; ++j) {
      ArrayT<double> fdj = j == 0 ? fd : c.central_difference(dirs[j]);
      const double* t = jv.data() + j * y0.size();
      double worst = 0;
      std::size_t at = 0;
      for (std::size_t l = 0; l < y0.size(); ++l) {
        double el = rel(t[l], fdj.data()[l]);
        if (el > worst) worst = el, at = l;
      }
      res.jvp_error = std::max(res.jvp_error, worst);
      if (worst > opts.tolerance)
        rep << "jvp: tangent " << j << " element " << at << " = " << t[at] << " but finite differences give "
            << fdj.data()[at] << " (probe " << probe << ")\n";
    }

    // 3. forward vs reverse: <u, J v> = <J^T u, v>, no finite-difference noise
    ArrayT<double> jv0(xt::view(jv, 0));
    double fwd = dot(u, jv0);
    double em = rel(fwd, rev);
    res.mode_error = std::max(res.mode_error, em);
    if (em > opts.exact_tolerance)
      rep << "modes: <u, J v> = " << fwd << " (jvp) but <J^T u, v> = " << rev << " (vjp)\n";
  }

  // 4. Tiny inputs: the whole Jacobian, row by row from the vjp, against finite differences.
  std::size_t n_in = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (!c.constant(i)) n_in += inputs[i].size();
  if (n_in <= 64 && y0.size() <= 64) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (c.constant(i)) continue;
      for (std::size_t l = 0; l < inputs[i].size(); ++l) {
        std::vector<ArrayT<double>> e1;
        for (const auto& x : inputs) e1.push_back(xt::zeros<double>(x.shape()));
        e1[i].data()[l] = 1;
        ArrayT<double> col = c.central_difference(e1);  // column l of J
        for (std::size_t r = 0; r < y0.size(); ++r) {
          ArrayT<double> u = xt::zeros<double>(ys);
          u.data()[r] = 1;
          double jr = c.reverse(u)[i].data()[l];
          double er = rel(jr, col.data()[r]);
          res.jacobian_error = std::max(res.jacobian_error, er);
          if (er > opts.tolerance)
            rep << "jacobian: d out[" << r << "] / d in" << i << "[" << l << "] = " << jr
                << " (vjp) but finite differences give " << col.data()[r] << "\n";
        }
      }
    }
  }
  res.report = rep.str();
  res.ok = res.report.empty();
  if (!res.ok) res.report = res.report.substr(0, 2000);
  return res;
}

}  // namespace dpgrad
