// The accountant alone: what a planned run will spend, and the noise it needs.
#include <dpgrad/dpgrad.hpp>

#include <cstdio>

int main() {
  // 60,000 examples, expected batch 256 (Poisson, q = 256 / 60000), 30 epochs
  const double q = 256.0 / 60000;
  const long steps = dpgrad::privacy::steps_for_epochs("poisson", 60000, 256, 30);
  auto pld = dpgrad::privacy::make_accountant("pld");
  pld->step(q, 1.1, steps);
  std::printf("sigma 1.1, %ld steps: epsilon %s at delta 1e-5 (%s neighbours)\n", steps,
              dpgrad::privacy::format_epsilon(pld->epsilon(1e-5)).c_str(),
              dpgrad::privacy::to_string(pld->neighbouring()).c_str());
  // the noise multiplier that spends exactly epsilon 3 over the same run
  const auto cal = dpgrad::privacy::calibrate_noise_multiplier("pld", {}, q, steps, 3.0, 1e-5);
  std::printf("epsilon 3 needs sigma %.4f (epsilon reached %s)\n", cal.noise_multiplier,
              dpgrad::privacy::format_epsilon(cal.epsilon).c_str());
  return cal.epsilon <= 3.0 && pld->epsilon(1e-5) > 0 ? 0 : 1;
}
