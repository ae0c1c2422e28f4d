// The BLAS core check (engine/blas.hpp, docs/training.md "The BLAS core"): a
// CPU that OpenBLAS takes for an older one is simulated with the test hook
// DPGRAD_BLAS_CORENAME_FOR_TESTS (what OpenBLAS is taken to have detected while
// OPENBLAS_CORETYPE is unset); the programs restart on the right kernels, once,
// and a user's own OPENBLAS_CORETYPE is respected as given.
#include <cstdlib>
#include <optional>
#include <string>

#include <doctest/doctest.h>

#include "engine/blas.hpp"
#include "support/programs.hpp"

using namespace dpgrad;

namespace {

/// Sets (or, with nullopt, unsets) an environment variable for a scope.
class EnvScope {
 public:
  EnvScope(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value) setenv(name, value->c_str(), 1);
    else unsetenv(name);
  }
  ~EnvScope() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("BLAS core: a misdetected CPU is seen, and the programs restart on the right kernels once") {
  std::string supported;
  {
    EnvScope none("OPENBLAS_CORETYPE", std::nullopt);
    EnvScope hook("DPGRAD_BLAS_CORENAME_FOR_TESTS", "Prescott");
    const blas::CoreCheck c = blas::check_core();
    CHECK(c.detected == "Prescott");
    CHECK(!c.user_set);
    supported = c.supported;
    CHECK(c.weaker == !supported.empty());  // any CPU with AVX runs more than Prescott's kernels
  }
  if (supported.empty()) {
    MESSAGE("skipped: this CPU has no AVX; OpenBLAS's generic kernels are its best");
    return;
  }
  const std::string hook = "env -u OPENBLAS_CORETYPE DPGRAD_BLAS_CORENAME_FOR_TESTS=Prescott ";
  const test::Run help = test::run_shell(hook + DPGRAD_ACCOUNT " --help");
  CHECK(help.status == 0);
  CHECK(help.out.find("dpgrad-account: OpenBLAS took this CPU for Prescott: restarted with OPENBLAS_CORETYPE=" +
                      supported) != std::string::npos);
  CHECK(help.out.find("Usage") != std::string::npos);  // and then ran as asked, once
  CHECK(help.out.find("restarted") == help.out.rfind("restarted"));
  // the bench says which kernels it ran with: the supported core's, set by dpgrad
  const std::string bench = " --model cnn26k --methods none --batch 4 --steps 1";
  const test::Run b = test::run_shell(hook + DPGRAD_BENCH + bench);
  CHECK(b.status == 0);
  CHECK(b.out.find("OPENBLAS_CORETYPE=" + supported + " set by dpgrad") != std::string::npos);
  CHECK(b.out.find("SLOWER KERNELS") == std::string::npos);
  // a user's own choice stands, even a slower one: no restart, and the bench names it
  const test::Run mine =
      test::run_shell("env OPENBLAS_CORETYPE=Prescott DPGRAD_BLAS_CORENAME_FOR_TESTS=Prescott " DPGRAD_BENCH + bench);
  CHECK(mine.status == 0);
  CHECK(mine.out.find("restarted") == std::string::npos);
  CHECK(mine.out.find("OpenBLAS core Prescott") != std::string::npos);
  CHECK(mine.out.find("OPENBLAS_CORETYPE=Prescott set by the user") != std::string::npos);
  // and where OpenBLAS chose well (or the user chose), nothing happens
  EnvScope no_hook("DPGRAD_BLAS_CORENAME_FOR_TESTS", std::nullopt);
  const blas::CoreCheck real = blas::check_core();
  const test::Run plain = test::run_shell(DPGRAD_ACCOUNT " --help");
  CHECK((plain.out.find("restarted") == std::string::npos) == (!real.weaker || real.user_set));
}
