// The audit against the accountants: below them for every honest strategy, close
// to them where they are tight, far above them for broken mechanisms.
#include <string>

#include <doctest/doctest.h>

#include "optim/audit.hpp"

using namespace dpgrad;

TEST_CASE("audit: every exact strategy and jl:K stay below the accountant's epsilon") {
  for (std::string strategy : {"naive", "vanilla", "ghost", "microbatch:2", "jl:4"}) {
    CAPTURE(strategy);
    AuditConfig c;
    c.model = "mlp";
    c.strategy = strategy;
    c.noise_multiplier = 1.5;
    c.trials = 20000;
    const AuditResult r = run_audit(c);
    CAPTURE(r.bound.epsilon);
    CAPTURE(r.accountant_epsilon);
    CHECK(r.bound.epsilon > 0.2);  // the test sees the canary
    CHECK(r.bound.epsilon <= r.accountant_epsilon);
  }
}

TEST_CASE("audit: a single Gaussian step with the strongest canary comes within a factor 2 of the accountant") {
  AuditConfig c;
  c.model = "logreg";
  c.noise_multiplier = 1.0;
  c.trials = 100000;
  const AuditResult r = run_audit(c);
  CAPTURE(r.bound.epsilon);
  CAPTURE(r.accountant_epsilon);
  CHECK(r.bound.epsilon <= r.accountant_epsilon);
  CHECK(r.bound.epsilon >= r.accountant_epsilon / 2);
}

TEST_CASE("audit: broken mechanisms give bounds far above what the accountant claims") {
  for (AuditFault f : {AuditFault::no_noise, AuditFault::known_seed_noise, AuditFault::batch_clipping,
                       AuditFault::wrong_sampling_rate, AuditFault::under_reported_norm}) {
    CAPTURE(to_string(f));
    AuditConfig c;
    c.model = "logreg";
    c.noise_multiplier = 3.0;
    c.trials = 10000;
    c.others = 10;  // batch clipping: one example can move the sum by 11 C
    c.fault = f;
    if (f == AuditFault::wrong_sampling_rate) c.sampling_rate = 0.01;
    const AuditResult r = run_audit(c);
    CAPTURE(r.bound.epsilon);
    CAPTURE(r.accountant_epsilon);
    CHECK(r.bound.epsilon > 3 * r.accountant_epsilon);
  }
  CHECK(audit_fault_from_string("no-noise") == AuditFault::no_noise);
  CHECK_THROWS_AS(audit_fault_from_string("nope"), std::invalid_argument);
}
