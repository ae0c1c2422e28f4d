// dpgrad-train's option parsing as a function: hostile command lines end in a
// clean error or exit code, never a crash or a silently odd run.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "programs/train/options.hpp"
#include "programs/cli.hpp"

using dpgrad::train::parse_train_options;

namespace {
dpgrad::train::ParsedOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dpgrad-train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_train_options(int(argv.size()), argv.data());
}
}  // namespace

TEST_CASE("dpgrad-train --demo: the recipe fills in what the command line leaves out, and flags given win") {
  auto demo = parse({"--demo"});
  REQUIRE_FALSE(demo.exit_code);
  CHECK(demo.options.model == "cnn26k");
  CHECK(demo.options.run.clip_norm == 1.0);
  CHECK(demo.options.run.batch_size == 4096);
  CHECK(demo.options.run.target_epsilon == 3.0);
  auto mine = parse({"--demo", "--clip-norm", "0.01", "--clip-quantile", "0.5", "--epochs", "3"});
  REQUIRE_FALSE(mine.exit_code);
  CHECK(mine.options.model == "cnn26k");
  CHECK(mine.options.run.clip_norm == 0.01);  // before: silently replaced by the recipe's 1
  CHECK(mine.options.run.epochs == 3.0);
  CHECK(mine.options.clip_quantile == 0.5);
  CHECK(mine.options.lr == 0.5);
}

TEST_CASE("dpgrad-train options: parsed as a function; flags given are recorded; bad input gives exit code 2") {
  auto ok = parse({"--optimizer", "dp-adam", "--noise-multiplier", "1.5", "--batch-size", "32"});
  CHECK_FALSE(ok.exit_code);
  CHECK(ok.options.optimizer == "dp-adam");
  CHECK(ok.options.run.noise_multiplier == 1.5);
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
  CHECK(demo.options.run.target_epsilon == 3.0);
}

TEST_CASE("dpgrad-train options: every option that holds numbers refuses an empty value and hexadecimal") {
  // the option parser knows which options hold numbers (the fuzz harnesses check them against argv)
  CHECK_FALSE(parse({"--momentum", "0.5"}).exit_code);
  const auto& numeric = dpgrad::numeric_options_seen();
  for (const char* flag : {"--momentum", "--ema", "--weight-decay", "--sat-rho", "--lr-final", "--centre-features",
                           "--epochs", "--batch-size", "--classes", "--normalize", "--threads", "--lr"}) {
    CAPTURE(flag);
    CHECK(std::find(numeric.begin(), numeric.end(), flag) != numeric.end());
    auto empty = parse({flag, ""});
    REQUIRE(empty.exit_code);
    CHECK(*empty.exit_code == 2);
    auto hex = parse({flag, "0x10"});
    REQUIRE(hex.exit_code);
    CHECK(*hex.exit_code == 2);
  }
  CHECK(*parse({"--batch-size", "010"}).exit_code == 2);  // CLI11 would read it as octal 8
  CHECK(parse({"--batch-size", "10"}).options.run.batch_size == 10);
  CHECK(parse({"--lr", "1e-3"}).options.lr == 1e-3);
  CHECK(parse({"--sat-rho", "inf"}).options.run.sat_rho == INFINITY);  // a number: refused later, by the checks
  CHECK(dpgrad::is_decimal_real("-1.5e+3"));
  CHECK(dpgrad::is_decimal_real(".5"));
  for (const char* bad : {"", " 1", "1 ", "0x1p3", "1e", "e5", "--1", "1.2.3", "nan(1)"}) {
    CAPTURE(bad);
    CHECK_FALSE(dpgrad::is_decimal_real(bad));
  }
}

TEST_CASE("dpgrad-train options: settings a non-private run would ignore are refused before any data is read") {
  for (const std::vector<std::string>& more :
       {std::vector<std::string>{"--clip-norm", "2"}, {"--delta", "1e-6"}, {"--accountant", "pld"},
        {"--sampler", "fixed"}, {"--clip-strategy", "ghost"}, {"--epoch-fraction", "0.5"}}) {
    CAPTURE(more[0]);
    auto p = parse(more);
    REQUIRE_FALSE(p.exit_code);
    CHECK_THROWS_WITH_AS(dpgrad::train::check_train_options(p.options, p.given), doctest::Contains("has no effect"),
                         std::invalid_argument);
  }
  auto none = parse({"--clip-strategy", "none", "--sampler", "shuffle", "--physical-batch-size", "16"});
  CHECK_NOTHROW(dpgrad::train::check_train_options(none.options, none.given));
}

TEST_CASE("dpgrad-train options: a target epsilon or a noise multiplier without --optimizer runs the default's "
          "private form (docs/onnx.md's command failed: 'need a dp-* optimizer'); a non-private one named is refused") {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--target-epsilon", "3"}, {"--noise-multiplier", "1.1"}}) {
    CAPTURE(args[0]);
    auto p = parse(args);
    REQUIRE_FALSE(p.exit_code);
    CHECK_NOTHROW(dpgrad::train::check_train_options(p.options, p.given));
    CHECK(p.options.optimizer == "dp-sgd");
  }
  auto named = parse({"--optimizer", "sgd", "--target-epsilon", "3"});
  REQUIRE_FALSE(named.exit_code);
  CHECK_THROWS_WITH_AS(dpgrad::train::check_train_options(named.options, named.given),
                       doctest::Contains("need a dp-* optimizer"), std::invalid_argument);
  auto plain = parse({"--epochs", "1"});
  dpgrad::train::check_train_options(plain.options, plain.given);
  CHECK(plain.options.optimizer == "sgd");  // no privacy asked for: no change
}

TEST_CASE("dpgrad-train: the library's messages name its flags") {
  using dpgrad::train::in_train_flags;
  CHECK(in_train_flags("clip_norm must be in [1e-12, 1e6], got 0") == "--clip-norm must be in [1e-12, 1e6], got 0");
  CHECK(in_train_flags("it needs adaptive clipping (adaptive_clipping: the quantile)") ==
        "it needs adaptive clipping (--clip-quantile: the quantile)");
  CHECK(in_train_flags("set checkpoints.every_steps. noise_multiplier 0 with allow_no_noise") ==
        "set --checkpoint-every. --noise-multiplier 0 with --allow-no-noise");
  // one-word flags are words of the sentence too: left alone, as are words that only contain a field's name
  CHECK(in_train_flags("delta must be in (0, 1); layer_clip_norms, sat_rho_x") ==
        "delta must be in (0, 1); layer_clip_norms, sat_rho_x");
  CHECK(in_train_flags("cannot read /runs/clip_norm/max_steps.json") == "cannot read /runs/clip_norm/max_steps.json");
}
