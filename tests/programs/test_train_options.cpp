// dpgrad-train's option parsing as a function: hostile command lines end in a
// clean error or exit code, never a crash or a silently odd run.
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "programs/train/options.hpp"

using dpgrad::train::parse_train_options;

namespace {
dpgrad::train::ParsedOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dpgrad-train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_train_options(int(argv.size()), argv.data());
}
}  // namespace

TEST_CASE("dpgrad-train options: parsed as a function; flags given are recorded; bad input gives exit code 2") {
  auto ok = parse({"--optimizer", "dp-adam", "--noise-multiplier", "1.5", "--batch-size", "32"});
  CHECK_FALSE(ok.exit_code);
  CHECK(ok.options.optimizer == "dp-adam");
  CHECK(ok.options.noise_multiplier == 1.5);
  CHECK(ok.given.count("optimizer") == 1);
  CHECK(ok.given.count("batch-size") == 1);
  CHECK(ok.given.count("model") == 0);
  CHECK_FALSE(ok.options.lr);  // resolved later from the optimizer
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--batch-size", "-1"}, {"--batch-size", "99999999999999999999999"},
        {"--noise-multiplier", "abc"}, {"--no-such-flag"}, {"--threads", "100000"}, {"--epochs"}, {""}}) {
    CAPTURE(bad.front());
    auto r = parse(bad);
    REQUIRE(r.exit_code);
    CHECK(*r.exit_code == 2);
  }
  auto demo = parse({"--demo"});
  CHECK(demo.options.model == "cnn26k");
  CHECK(demo.options.target_epsilon == 3.0);
}
