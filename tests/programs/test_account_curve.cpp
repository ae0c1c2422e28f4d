// dpgrad-account --curve run as a user runs it: epsilon after each epoch never
// decreases, ends where a plain run of the same epochs ends, orders DP-SGD-JL by
// its JL dimension above exact DP-SGD (the paper's pair, labelled, below the sound
// curve), and bad input exits 2 naming --curve.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

namespace {

struct Output {
  int status;
  std::string text;  // stdout and stderr together
};

Output run_account(const std::string& args) {
  FILE* p = popen((std::string(DPGRAD_ACCOUNT) + args + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string text;
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) text.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, text};
}

/// The JSON object a --json run prints (its last line starting with '{').
nlohmann::json json_of(const Output& o) {
  REQUIRE_MESSAGE(o.status == 0, o.text);
  std::istringstream in(o.text);
  std::string line;
  nlohmann::json j;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') j = nlohmann::json::parse(line);
  REQUIRE_MESSAGE(j.is_object(), o.text);
  return j;
}

/// The "epsilon" array of a --curve --json run, "inf" read as infinity.
std::vector<double> curve_of(const nlohmann::json& j) {
  std::vector<double> eps;
  for (const auto& e : j.at("epsilon"))
    eps.push_back(e == "inf" ? std::numeric_limits<double>::infinity() : e.get<double>());
  return eps;
}

void check_non_decreasing(const std::vector<double>& eps) {
  for (std::size_t e = 1; e < eps.size(); ++e) {
    CAPTURE(e);
    CHECK(eps[e] >= eps[e - 1]);
  }
}

// A small run: q = 0.05, 20 steps per epoch.
const std::string small = " --dataset-size 2000 --batch-size 100 --noise-multiplier 1 --delta 1e-5";

}  // namespace

TEST_CASE("dpgrad-account --curve: non-decreasing, ends at the plain run's epsilon (rdp, pld, gdp)") {
  struct Case {
    const char* accountant;
    int epochs;  // pld: fewer (each epoch is a full PLD composition)
  };
  for (const Case c : {Case{"rdp", 5}, Case{"pld", 3}, Case{"gdp", 5}}) {
    CAPTURE(c.accountant);
    const std::string args = small + " --accountant " + c.accountant;
    const std::string epochs = " --epochs " + std::to_string(c.epochs);
    const nlohmann::json j = json_of(run_account(args + epochs + " --curve --json"));
    const std::vector<double> eps = curve_of(j);
    REQUIRE(eps.size() == static_cast<std::size_t>(c.epochs));
    nlohmann::json numbers = nlohmann::json::array(), steps = nlohmann::json::array();
    for (int e = 1; e <= c.epochs; ++e) {
      numbers.push_back(e);
      steps.push_back(20 * e);  // ceil(e * 2000 / 100)
    }
    CHECK(j["epochs"] == numbers);
    CHECK(j["steps"] == steps);
    // gdp is an approximation: its curve's "epsilon" is the sound pld figure (the CLT's: "approximate_epsilon")
    CHECK(j["accountant"] == (std::string(c.accountant) == "gdp" ? "pld" : c.accountant));
    CHECK(j["neighbouring"] == "add/remove-one");
    CHECK(eps.front() > 0);
    CHECK(eps.back() > eps.front());
    check_non_decreasing(eps);
    // The same accounting as the plain run: equal to the last bit.
    const nlohmann::json plain = json_of(run_account(args + epochs + " --json"));
    CHECK(eps.back() == plain["epsilon"].get<double>());
    // Epoch 2 is at most a plain run of 2 epochs (a later epoch may lower it, never raise it).
    if (std::string(c.accountant) != "pld") {
      const nlohmann::json second = json_of(run_account(args + " --epochs 2 --json"));
      CHECK(eps[1] <= second["epsilon"].get<double>());
    }
  }
}

TEST_CASE("dpgrad-account --curve: the human table ends with the plain run's rounded-up epsilon") {
  const Output table = run_account(small + " --epochs 4 --curve");
  REQUIRE_MESSAGE(table.status == 0, table.text);
  const Output plain = run_account(small + " --epochs 4");
  REQUIRE(plain.status == 0);
  // Plain: "epsilon          <value>  (delta = ...)"; curve: a header " epoch  steps  epsilon",
  // then one row per epoch, the last "     4          80  <value>".
  std::istringstream pin(plain.text);
  std::string word, plain_eps;
  pin >> word >> plain_eps;
  REQUIRE(word == "epsilon");
  std::istringstream tin(table.text);
  std::string line, last;
  int rows = -1;  // -1: before the header
  while (std::getline(tin, line)) {
    std::istringstream words(line);
    std::string first, second;
    words >> first >> second;
    if (rows >= 0 && !line.empty()) {
      last = line;
      ++rows;
    }
    if (first == "epoch" && second == "steps") rows = 0;
  }
  CHECK(rows == 4);
  std::istringstream lin(last);
  std::string epoch, steps, eps;
  lin >> epoch >> steps >> eps;
  CHECK(epoch == "4");
  CHECK(steps == "80");
  CHECK(eps == plain_eps);
}

TEST_CASE("dpgrad-account --curve: DP-SGD-JL's epsilon falls with K towards exact DP-SGD's") {
  // Each epoch of a JL curve costs a second or so (the step's PLD needs quadrature): few epochs.
  const std::string args = small + " --accountant pld --curve --json";
  const std::vector<double> k10 = curve_of(json_of(run_account(args + " --epochs 1 --jl-dim 10")));
  const std::vector<double> k30 = curve_of(json_of(run_account(args + " --epochs 2 --jl-dim 30")));
  const std::vector<double> exact = curve_of(json_of(run_account(args + " --epochs 2")));
  REQUIRE(k10.size() == 1);
  REQUIRE(k30.size() == 2);
  REQUIRE(exact.size() == 2);
  CHECK(k10[0] > k30[0]);
  for (std::size_t e = 0; e < 2; ++e) {
    CAPTURE(e);
    CHECK(k30[e] >= exact[e]);
    CHECK(k30[e] < 1.5 * exact[e]);  // K = 30 is close to exact norms (Bu et al. 2021, Fig. 3)
  }
  check_non_decreasing(k30);
}

TEST_CASE("dpgrad-account --curve: no noise gives inf at every epoch") {
  const nlohmann::json j = json_of(run_account(
      " --dataset-size 2000 --batch-size 100 --noise-multiplier 0 --delta 1e-5 --epochs 3 --curve --json"));
  CHECK(j["epsilon"] == nlohmann::json({"inf", "inf", "inf"}));
}

TEST_CASE("dpgrad-account --curve: bad input exits with status 2 and names --curve") {
  const char* cases[] = {
      " --steps 100 --curve",                        // needs epochs
      " --epochs 2.5 --curve",                       // a whole number of epochs
      " --epochs 0.5 --curve",
      " --epochs 1e9 --curve",                       // one line per epoch: capped
      " --epochs 3 --curve --target-epsilon 2",      // not with calibration
  };
  for (const char* extra : cases) {
    CAPTURE(extra);
    // --target-epsilon replaces --noise-multiplier.
    const std::string base = std::string(extra).find("target") != std::string::npos
        ? " --dataset-size 2000 --batch-size 100 --delta 1e-5"
        : small;
    const Output o = run_account(base + extra);
    CHECK(o.status == 2);
    CHECK(o.text.find("--curve") != std::string::npos);
  }
  // The run's own checks still apply.
  const Output bad_delta = run_account(" --dataset-size 2000 --batch-size 100 --noise-multiplier 1 --delta 2 "
                                       "--epochs 3 --curve");
  CHECK(bad_delta.status == 2);
  CHECK(bad_delta.text.find("--delta") != std::string::npos);
  const Output jl_rdp = run_account(small + " --epochs 3 --curve --jl-dim 5 --accountant rdp");
  CHECK(jl_rdp.status == 2);
  CHECK(jl_rdp.text.find("--jl-dim") != std::string::npos);
}

TEST_CASE("dpgrad-account --curve --jl-paper-pair: the paper's pair beside the sound curve, labelled") {
  const nlohmann::json j =
      json_of(run_account(small + " --accountant pld --curve --json --epochs 2 --jl-dim 10 --jl-paper-pair"));
  const std::vector<double> sound = curve_of(j);
  REQUIRE(j.contains("paper_pair_epsilon"));
  CHECK(j["paper_pair_epsilon_label"].get<std::string>().find("NOT an upper bound") != std::string::npos);
  REQUIRE(sound.size() == 2);
  REQUIRE(j["paper_pair_epsilon"].size() == 2);
  for (std::size_t e = 0; e < 2; ++e) {
    CAPTURE(e);
    CHECK(j["paper_pair_epsilon"][e].get<double>() < sound[e]);  // the pair under-states the leak
  }
  const Output table = run_account(small + " --accountant pld --epochs 1 --jl-dim 10 --jl-paper-pair");
  REQUIRE(table.status == 0);
  CHECK(table.text.find("paper pair") != std::string::npos);
  CHECK(table.text.find("NOT an upper bound") != std::string::npos);
  // Without --jl-dim the flag has nothing to compare: refused.
  CHECK(run_account(small + " --accountant pld --epochs 1 --jl-paper-pair").status == 2);
}
