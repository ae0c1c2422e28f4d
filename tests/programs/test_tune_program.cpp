// dpgrad-tune as a user runs it (docs/tuning.md): a search on synthetic data
// releases its best trial with the search's epsilon and nothing that counts the
// trials; bad settings are refused before any trial runs or any state is written;
// a search resumes and a finished one releases the same best trial again.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "support/key_store.hpp"
#include "support/programs.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using dpgrad::test::last_json;
using dpgrad::test::Run;
using dpgrad::test::run_argv;

namespace {

const std::string tune = DPGRAD_TUNE;

std::vector<std::string> search(const std::string& dir, std::vector<std::string> more) {
  std::vector<std::string> a{tune, "--dataset", "synthetic", "--model", "logreg", "--target-epsilon", "6",
                             "--score-noise", "0.05", "--trials", "tnb:1,0.4", "--epochs", "1,2", "--batch-size",
                             "128,256", "--lr", "0.05:0.5", "--clip-norm", "0.3:3", "--search-dir", dir,
                             "--reproducible-noise", "--seed", "4"};
  for (std::size_t i = 0; i < more.size(); ++i) {  // a flag given again replaces the default's value
    const auto at = std::find(a.begin(), a.end(), more[i]);
    if (at != a.end() && i + 1 < more.size() && more[i] != "--resume" && more[i] != "--json") *(at + 1) = more[++i];
    else a.push_back(more[i]);
  }
  return a;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("dpgrad-tune: a search releases one best trial and the search's epsilon, and nothing that counts the trials") {
  dpgrad::test::KeyStoreForTests keys;
  dpgrad::test::TempDir dir("dpgrad-tune");
  const Run r = run_argv(search(dir / "s", {"--json", "--ema", "0.9", "--lr-scale", "dense1=2"}));
  REQUIRE_MESSAGE(r.status == 0, r.out);
  const nlohmann::json j = last_json(r.out);
  CHECK(j["released"] == true);
  CHECK(j["epsilon"].get<double>() <= 6);
  CHECK(j["epsilon"].get<double>() > 5.9);
  CHECK(j["best"]["batch_size"].get<int>() % 128 == 0);
  CHECK(j.contains("validation_score"));
  CHECK(j["test"]["accuracy"].get<double>() >= 0);
  CHECK(j["private"] == false);  // --reproducible-noise
  for (const char* secret : {"\"scores\"", "trial-0", "\"k\"", "trials run", "\"settings\""}) CHECK_FALSE(contains(r.out, secret));
  // the text report: the best trial and the privacy statement; resuming the finished search releases the same
  const Run text = run_argv(search(dir / "s", {"--resume", "--ema", "0.9", "--lr-scale", "dense1=2"}));
  REQUIRE_MESSAGE(text.status == 0, text.out);
  CHECK(contains(text.out, "best trial: lr "));
  CHECK(contains(text.out, "privacy of the whole search: epsilon "));
  CHECK(contains(text.out, "not private: the noise can be recomputed"));
  const Run again = run_argv(search(dir / "s", {"--resume", "--json", "--ema", "0.9", "--lr-scale", "dense1=2"}));
  CHECK(last_json(again.out)["best"] == j["best"]);
  CHECK(last_json(again.out)["validation_score"] == j["validation_score"]);
}

TEST_CASE("dpgrad-tune: bad settings are refused before any trial runs or any state is written") {
  dpgrad::test::KeyStoreForTests keys;
  dpgrad::test::TempDir dir("dpgrad-tune");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--trials", "tnb:1"}, "tnb:ETA,GAMMA"},
      {{"--trials", "poisson:-2"}, "mu"},
      {{"--lr", "1:0.1"}, "lr"},
      {{"--lr", "0x1"}, "--lr"},
      {{"--clip-strategy", "jl:4"}, "jl:K"},
      {{"--clip-strategy", "ghost+layers:adaptive"}, "give --clip-quantile"},
      {{"--target-epsilon", "0.01"}, "out of reach"},
      {{"--validation-fraction", "0.9"}, "validation_fraction"},
      {{"--resume"}, "no search"},
      {{"--epochs", "0"}, "epochs"},
      {{"--ema", "1.5"}, "--ema"},
      {{"--lr-scale", "dense1=x"}, "learning-rate scale"},
      {{"--lr-scale", "nosuch=2"}, "nosuch"},
      // a value given twice: a saved search reads its trials' settings back by value
      {{"--batch-size", "128,128"}, "--batch-size 128,128: 128 is given twice"},
      {{"--epochs", "1,2,1"}, "--epochs 1,2,1: 1 is given twice"},
      // an empty value is refused, never read as "not given"
      {{"--clip-quantile", ""}, "empty value"},
      {{"--lr-scale", ""}, "empty value"},
      {{"--export-onnx", ""}, "empty value"},
  };
  for (const auto& [more, words] : cases) {
    CAPTURE(more.front());
    const Run r = run_argv(search(dir / "s", more));
    CHECK(r.status == 2);
    CHECK_MESSAGE(contains(r.out, words), r.out);
    CHECK_FALSE(fs::exists(dir.path / "s"));
  }
}

TEST_CASE("dpgrad-tune: a large target epsilon is met; no message names a noise multiplier the user never gave") {
  dpgrad::test::KeyStoreForTests keys;
  dpgrad::test::TempDir dir("dpgrad-tune");
  // 29 steps per trial: at sigma 1/16 their RDP proves no finite epsilon, and the calibration passes below it
  const Run r = run_argv(search(dir / "s", {"--target-epsilon", "200", "--batch-size", "64", "--epochs", "1",
                                            "--trials", "poisson:1", "--json"}));
  REQUIRE_MESSAGE(r.status == 0, r.out);
  const nlohmann::json j = last_json(r.out);
  CHECK(j["epsilon"].get<double>() <= 200);
  CHECK(j["search"]["noise_multiplier"].get<double>() > 0);
  CHECK_FALSE(contains(r.out, "proves no finite epsilon"));
}

TEST_CASE("dpgrad-tune: a target out of reach for any number of records is refused before the data is read") {
  dpgrad::test::KeyStoreForTests keys;
  dpgrad::test::TempDir dir("dpgrad-tune");
  // a dataset that does not exist: the refusal must be about the target, which needs no data
  const Run r = run_argv(search(dir / "s", {"--dataset", "idx:" + (dir / "no-such-data"),
                                            "--target-epsilon", "0.001"}));
  CHECK(r.status == 2);
  CHECK_MESSAGE(contains(r.out, "out of reach whatever the number of records"), r.out);
  CHECK_FALSE(contains(r.out, "no-such-data"));
  CHECK_FALSE(fs::exists(dir.path / "s"));
}
