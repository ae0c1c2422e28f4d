// Conversions between privacy notions and the classic composition results:
// RDP to (epsilon, delta), basic and advanced composition, amplification of
// pure DP by subsampling, the analytic Gaussian mechanism (delta(eps) and its
// calibration), plus the log-space numerics the accountants share.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dpgrad::privacy {

// ---- log-space numerics ---------------------------------------------------

/// log(e^a + e^b), exact for infinite arguments.
double log_add_exp(double a, double b);
/// log(erfc(x)) for every real x, without underflow for large x.
double log_erfc(double x);
/// log(Phi(x)), Phi the standard normal CDF.
double log_normal_cdf(double x);
/// log binom(n, k) for real n >= k >= 0 (via lgamma).
double log_binomial(double n, double k);

// ---- RDP to (epsilon, delta) ----------------------------------------------

/// Which RDP to (epsilon, delta) conversion gave an epsilon: Mironov's classic
/// one or the tighter one of Balle et al. (below), and its name for output.
enum class RdpConversion { classic, tight };
std::string to_string(RdpConversion c);  // "classic (Mironov 2017)", "tight (Balle et al. 2020)"

/// Classic conversion, Mironov 2017 Prop. 3: eps = rdp + log(1/delta)/(alpha-1).
double rdp_to_epsilon_classic(double order, double rdp, double delta);
/// Tighter conversion, Balle, Barthe, Gaboardi, Hsu, Sato 2020 Thm. 21 (also
/// Canonne, Kamath, Steinke 2020 Prop. 12):
/// eps = rdp + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha-1).
double rdp_to_epsilon_tight(double order, double rdp, double delta);

/// The best epsilon over all orders and both conversions, with the winner.
struct RdpEpsilon {
  double epsilon;     // rounded upwards; +inf if no order gives a finite value
  double order;       // the order that achieved it (NaN if epsilon is +inf)
  RdpConversion conversion;
};
/// orders[i] > 1 with RDP rdp[i] >= 0; 0 < delta < 1.
RdpEpsilon rdp_to_epsilon(const std::vector<double>& orders, const std::vector<double>& rdp,
                          double delta);
/// Smallest delta over orders and both conversions (their inverses) at epsilon >= 0.
double rdp_to_delta(const std::vector<double>& orders, const std::vector<double>& rdp,
                    double epsilon);

// ---- composition and amplification ----------------------------------------

/// An (epsilon, delta)-DP guarantee, as the composition results take and return it.
struct DpGuarantee {
  double epsilon;  // >= 0
  double delta;    // in [0, 1]
};

/// Basic composition (Dwork-Roth Thm. 3.16): (sum eps_i, sum delta_i).
DpGuarantee compose_basic(const std::vector<DpGuarantee>& parts);
/// Advanced composition (Dwork, Rothblum, Vadhan 2010; Dwork-Roth Thm. 3.20):
/// k-fold (eps, delta)-DP is (sqrt(2k ln(1/delta')) eps + k eps (e^eps - 1), k delta + delta')-DP.
DpGuarantee compose_advanced(double epsilon, double delta, long k, double delta_prime);
/// Amplification of pure DP by Poisson subsampling at rate q (e.g. Balle,
/// Barthe, Gaboardi 2018, Thm. 8 with delta = 0): log(1 + q (e^eps - 1)).
double amplify_by_subsampling(double epsilon, double sampling_rate);

// ---- Gaussian mechanism ---------------------------------------------------

/// delta(eps) of mu-GDP, Dong, Roth, Su 2019 Cor. 2.13:
/// Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2); computed in log space, rounded up.
/// mu = +inf gives 1; mu = 0 gives 0.
double gaussian_dp_delta(double mu, double epsilon);
/// Analytic Gaussian mechanism, Balle and Wang 2018 Thm. 8: noise std s on a
/// query of L2 sensitivity Delta is (eps, delta)-DP with
/// delta = Phi(Delta/(2s) - eps s/Delta) - e^eps Phi(-Delta/(2s) - eps s/Delta)
/// (= gaussian_dp_delta(Delta/s, eps)).
double analytic_gaussian_delta(double sensitivity, double noise_std, double epsilon);
/// Smallest noise std (to relative precision 1e-12, rounded up) with
/// analytic_gaussian_delta(sensitivity, s, epsilon) <= delta (Balle and Wang 2018, Alg. 1
/// solved by bisection instead of their closed-form inversion).
double analytic_gaussian_noise_std(double epsilon, double delta, double sensitivity = 1.0);
/// Smallest epsilon (rounded up) with gaussian_dp_delta(mu, epsilon) <= delta.
double gaussian_dp_epsilon(double mu, double delta);

}  // namespace dpgrad::privacy
