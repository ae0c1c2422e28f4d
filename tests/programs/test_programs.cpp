// dpgrad-account and dpgrad-train run as a user runs them: bad input gives a
// clear message and exit status 2; --json output parses and says what it must.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "privacy/pate.hpp"
#include "support/temp_dir.hpp"

namespace {

struct Run {
  int status;
  std::string out;  // stdout and stderr together
};

Run run(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

/// The last line that parses as a JSON object.
nlohmann::json last_json(const std::string& out) {
  std::istringstream in(out);
  std::string line;
  nlohmann::json j;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') j = nlohmann::json::parse(line);
  return j;
}

const std::string account = DPGRAD_ACCOUNT;
const std::string train = DPGRAD_TRAIN;
const std::string ok_args = " --dataset-size 60000 --batch-size 256 --noise-multiplier 1.1 --epochs 60 --delta 1e-5";

}  // namespace

TEST_CASE("dpgrad-account: the TF Privacy tutorial point by RDP, in JSON") {
  Run r = run(account + ok_args + " --accountant rdp --json");
  REQUIRE(r.status == 0);
  auto j = last_json(r.out);
  CHECK(j["accountant"] == "rdp");
  CHECK(j["neighbouring"] == "add/remove-one");
  CHECK(j["steps"] == 14063);  // ceil(60 * 60000 / 256)
  // tight conversion: 2.597 (docs/math.md section 3: about 2.6); classic would give 3.01
  CHECK(j["epsilon"].get<double>() == doctest::Approx(2.597).epsilon(0.002));
  CHECK(j.contains("order"));
}

TEST_CASE("dpgrad-account: every accountant names its relation; jl only with pld; calibration") {
  Run g = run(account + ok_args + " --accountant gdp --json");
  REQUIRE(g.status == 0);
  CHECK(last_json(g.out).contains("mu"));
  Run w = run(account + ok_args + " --accountant wor --json");
  REQUIRE(w.status == 0);
  CHECK(last_json(w.out)["neighbouring"] == "replace-one");
  Run jl = run(account + " --dataset-size 25000 --batch-size 256 --noise-multiplier 1.0 --epochs 20 --delta 1e-5 "
                         "--accountant pld --jl-dim 1 --json");
  REQUIRE(jl.status == 0);
  auto e = last_json(jl.out)["epsilon"];
  CHECK((e == "inf" || (e.is_number() && e.get<double>() > 1000)));
  Run bad = run(account + ok_args + " --jl-dim 5 --accountant rdp");  // JL needs pld
  CHECK(bad.status == 2);
  Run cal = run(account + " --dataset-size 60000 --batch-size 256 --epochs 15 --delta 1e-5 --target-epsilon 2 --json");
  REQUIRE(cal.status == 0);
  auto c = last_json(cal.out);
  CHECK(c["epsilon"].get<double>() <= 2.0);
  CHECK(c["epsilon"].get<double>() >= 1.98);
}

TEST_CASE("dpgrad-account: invalid input exits with status 2 and a message") {
  const char* cases[] = {
      " --dataset-size 0 --batch-size 1 --noise-multiplier 1 --epochs 1 --delta 1e-5",
      " --dataset-size 100 --batch-size 200 --noise-multiplier 1 --epochs 1 --delta 1e-5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier -1 --epochs 1 --delta 1e-5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --epochs 1 --delta 0",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --epochs 1 --delta 1.5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --epochs 1 --delta 1e-5 --accountant magic",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --epochs 1 --delta 1e-5 --accountant shuffle "
      "--epoch-fraction 1.5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier x --epochs 1 --delta 1e-5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --delta 1e-5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --steps 99999999999999999999 --delta 1e-5",
      " --dataset-size 99999999999999999999 --batch-size 10 --noise-multiplier 1 --steps 5 --delta 1e-5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1e999 --steps 5 --delta 1e-5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --epochs 1e400 --delta 1e-5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --epochs 1e300 --delta 1e-5",
      " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --steps 5 --delta 1e-5 --jl-dim 99999999999",
      " --dataset-size 100 --batch-size 10 --epochs 1 --delta 1e-5 --accountant gdp --target-epsilon 1",
  };
  for (const char* args : cases) {
    CAPTURE(args);
    Run r = run(account + args);
    CHECK(r.status == 2);
    CHECK(r.out.size() > 10);
  }
}

TEST_CASE("dpgrad-train: a short private run on synthetic data reports epsilon with its accountant") {
  Run r = run(train + " --dataset synthetic --model mlp --hidden 16 --optimizer dp-sgd --lr 0.5 --batch-size 64 "
                      "--epochs 1 --clip-strategy ghost --noise-multiplier 1.0 --json");
  REQUIRE(r.status == 0);
  auto j = last_json(r.out);
  CHECK(j["final"] == true);
  CHECK(j["private"] == true);
  CHECK(j["accountant"] == "pld");  // the default for Poisson sampling
  CHECK(j["neighbouring"] == "add/remove-one");
  CHECK(j["epsilon"].get<double>() > 0);
  // private by default: secure noise, and nothing computed from the private data without noise
  CHECK(j["noise_generator"].get<std::string>().find("secure") != std::string::npos);
  CHECK_FALSE(j.contains("train_loss"));
  CHECK_FALSE(j.contains("train_loss_not_covered_by_epsilon"));
  CHECK(r.out.find("loss") == std::string::npos);
  // the named opt-in to seeded noise: labelled not private in text and JSON
  Run s = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 --epochs 1 "
                      "--clip-strategy ghost --noise-multiplier 1.0 --reproducible-noise --json");
  REQUIRE(s.status == 0);
  auto k = last_json(s.out);
  CHECK(k["private"] == false);
  CHECK(k["privacy_note"] == "not private: the noise can be recomputed from the seed");
  CHECK(k["noise_generator"].get<std::string>().find("reproducible") != std::string::npos);
  Run t = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 --epochs 1 "
                      "--clip-strategy ghost --noise-multiplier 1.0 --reproducible-noise --report-train-loss");
  REQUIRE(t.status == 0);
  CHECK(t.out.find("not private: the noise can be recomputed from the seed") != std::string::npos);
  CHECK(t.out.find("train loss (not covered by epsilon)") != std::string::npos);
}

TEST_CASE("dpgrad-train: a run the budget cuts short says so in its text and its JSON") {
  const std::string cmd = train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 "
                                  "--epochs 5 --noise-multiplier 1 --target-epsilon 1.5 --reproducible-noise";
  Run text = run(cmd);
  REQUIRE(text.status == 0);
  CHECK(text.out.find("(stopped by the privacy budget: 68 of 160 steps)") != std::string::npos);
  Run js = run(cmd + " --json");
  REQUIRE(js.status == 0);
  auto j = last_json(js.out);
  CHECK(j["status"] == "stopped by the privacy budget");
  CHECK(j["steps"] == 68);
  CHECK(j["planned_steps"] == 160);
  // a run within its budget says it is complete
  Run whole = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 --epochs 1 "
                          "--noise-multiplier 1 --reproducible-noise --json");
  REQUIRE(whole.status == 0);
  CHECK(last_json(whole.out)["status"] == "complete");
}

TEST_CASE("dpgrad-train: --physical-batch-size clips in chunks and releases what one piece releases") {
  const std::string base = train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 "
                                   "--epochs 1 --noise-multiplier 1.0 --reproducible-noise --seed 4 --json";
  Run whole = run(base);
  Run chunks = run(base + " --physical-batch-size 16");
  REQUIRE(whole.status == 0);
  REQUIRE(chunks.status == 0);
  const auto a = last_json(whole.out), b = last_json(chunks.out);
  CHECK(a["processes"] == 1);
  CHECK(a["test_accuracy"].get<double>() == doctest::Approx(b["test_accuracy"].get<double>()).epsilon(0.02));
  CHECK(a["epsilon"] == b["epsilon"]);
  // strategies whose contributions are not per example cannot split
  Run jl = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 --epochs 1 "
                       "--noise-multiplier 4 --physical-batch-size 16 --clip-strategy jl:2");
  CHECK(jl.status != 0);
  CHECK(jl.out.find("physical batches of 16") != std::string::npos);
}

TEST_CASE("dpgrad-train: two default private runs release different parameters; two reproducible runs the same") {
  dpgrad::test::TempDir tmp("dpgrad-noise");
  auto params = [&](const std::string& name, const std::string& more) {
    const auto dir = tmp.path / name;
    Run r = run(train + " --dataset synthetic --model logreg --optimizer dp-momentum --max-steps 3 "
                        "--noise-multiplier 1 --checkpoint-dir " + dir.string() + more);
    REQUIRE(r.status == 0);
    std::ifstream latest(dir / "latest");
    std::string step;
    std::getline(latest, step);
    std::string bytes;
    for (const auto& e : std::filesystem::directory_iterator(dir / step / "params")) {
      std::ifstream in(e.path(), std::ios::binary);
      bytes += std::string(std::istreambuf_iterator<char>(in), {});
    }
    REQUIRE(bytes.size() > 100);
    return bytes;
  };
  CHECK(params("a", "") != params("b", ""));
  CHECK(params("c", " --reproducible-noise") == params("d", " --reproducible-noise"));
  // sgd keeps no optimizer buffers: it checkpoints too
  Run sgd = run(train + " --dataset synthetic --model logreg --optimizer dp-sgd --max-steps 3 --noise-multiplier 1 "
                        "--checkpoint-dir " + (tmp.path / "sgd").string());
  CHECK(sgd.status == 0);
}

TEST_CASE("dpgrad-train: step counts it cannot hold and noise too small to prove anything are refused") {
  Run e = run(train + " --dataset synthetic --model logreg --optimizer dp-sgd --epochs 1e30 --noise-multiplier 1");
  CHECK(e.status == 2);
  CHECK(e.out.find("too many steps") != std::string::npos);
  Run n = run(train + " --dataset synthetic --model logreg --optimizer dp-sgd --epochs 1 --noise-multiplier 1e-300");
  CHECK(n.status == 2);
  CHECK(n.out.find("proves no finite epsilon") != std::string::npos);
}

TEST_CASE("dpgrad-train: augmentation multiplicity trains on views and says so; jl:K/C runs") {
  Run r = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 --epochs 1 "
                      "--clip-strategy ghost --noise-multiplier 1 --augment-views 3");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("augmentation multiplicity: 3 views per example") != std::string::npos);
  Run j = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 --epochs 1 "
                      "--clip-strategy jl:3/2 --accountant pld --noise-multiplier 1 --json");
  REQUIRE(j.status == 0);
  CHECK(last_json(j.out)["epsilon"].get<double>() > 0);
}

TEST_CASE("dpgrad-train: --target-epsilon without --optimizer trains privately with dp-sgd (docs/onnx.md's command)") {
  Run r = run(train + " --dataset synthetic --model mlp --hidden 8 --batch-size 64 --epochs 1 --target-epsilon 3 --json");
  REQUIRE(r.status == 0);
  const auto j = last_json(r.out);
  CHECK(j["epsilon"].get<double>() <= 3.0);
  CHECK(j["epsilon"].get<double>() > 0);
}

TEST_CASE("dpgrad-train: --classes keeps two classes as a binary task; --model logreg is named so") {
  Run r = run(train + " --dataset synthetic --model logreg --classes 3,7 --optimizer sgd --batch-size 64 --epochs 1 --json");
  REQUIRE(r.status == 0);
  auto j = last_json(r.out);
  CHECK(j["model"] == "logreg");
  CHECK(r.out.find("classes 3,7") != std::string::npos);
}

TEST_CASE("dpgrad-train: zero noise only when insisted on, with a loud warning") {
  std::string base = train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 "
                             "--epochs 1 --clip-strategy ghost --noise-multiplier 0";
  Run refused = run(base);
  CHECK(refused.status == 2);
  CHECK(refused.out.find("NOT private") != std::string::npos);
  Run allowed = run(base + " --allow-no-noise");
  CHECK(allowed.status == 0);
  CHECK(allowed.out.find("NOT private") != std::string::npos);
}

TEST_CASE("dpgrad-train: bad input exits with status 2 and a message") {
  const char* cases[] = {
      " --dataset nowhere",
      " --dataset idx:/nonexistent/folder",
      " --dataset synthetic --model resnet",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier -1",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier 1 --clip-norm 0",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier 1 --delta 2",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier 1 --clip-strategy jl:0",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier 1 --clip-strategy jl:5 --accountant rdp",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier 1 --sampler fixed --accountant rdp",
      " --dataset synthetic --optimizer dp-sgd",
      " --dataset synthetic --batch-size 0",
      " --dataset synthetic --model bilstm598k",
      " --dataset synthetic --epochs -1",
      " --dataset synthetic --optimizer sgd --noise-multiplier 1",  // a non-private optimizer named with noise
      " --dataset synthetic --classes 3",
      " --dataset synthetic --classes 0,12",
      " --dataset synthetic --classes 2,2",
      " --dataset synthetic --ema 1.5",
      " --dataset synthetic --normalize 0.2",
      " --dataset synthetic --normalize 0.2,0",
      " --dataset synthetic --checkpoint-every -1",
      " --dataset synthetic-text --model bilstm598k --augment-views 2",
      " --dataset synthetic --augment-views 300",
      " --dataset synthetic --augment-views 2 --augment-shift -1",
      " --dataset synthetic --vocab-file /nonexistent/tokens.txt",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier 1 --clip-strategy jl:5/0 --accountant pld",
      " --dataset synthetic --optimizer adambc",
      " --dataset synthetic --optimizer dp-adambc --noise-multiplier 1 --adambc-floor 0",
      " --dataset synthetic --lr 0.1 --lr-final 0.01",
      " --dataset synthetic --lr 0.1 --lr-schedule cosine --lr-final 0.2",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier 1 --sat-rho -0.1",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier 1 --sat-rho inf",
      " --dataset synthetic --lr-scale conv9=2",
      " --dataset synthetic --layer-snr",
      " --dataset synthetic --optimizer dp-sgd --noise-multiplier 0 --allow-no-noise --layer-snr",
      " --dataset synthetic --lr-scale dense1",
      " --dataset synthetic --lr-scale dense1=-1",
      " --dataset synthetic --lr-scale dense1=2x",
      " --dataset synthetic --lr-scale dense1=2,dense1=3",
  };
  for (const char* args : cases) {
    CAPTURE(args);
    Run r = run(train + args);
    CHECK(r.status == 2);
    CHECK(r.out.find("error") != std::string::npos);
  }
}

TEST_CASE("dpgrad-train: dp-adambc says what it subtracts from Adam's second moment") {
  Run r = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-adambc --lr 0.01 --batch-size 64 "
                      "--epochs 1 --noise-multiplier 2 --clip-norm 0.5");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("DP-AdamBC") != std::string::npos);
  CHECK(r.out.find("final: test accuracy") != std::string::npos);
}

TEST_CASE("dpgrad-train: --lr-scale sets per-layer learning rates; --layer-snr reports each layer's signal") {
  const std::string cmd = train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-momentum --lr 0.1 "
                                  "--batch-size 64 --epochs 1 --noise-multiplier 1 --lr-scale dense1=4,dense2.bias=0 "
                                  "--layer-snr";
  Run r = run(cmd);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("lr x0 for dense2.bias; lr x4 for dense1.weight, dense1.bias") != std::string::npos);
  CHECK(r.out.find("signal/noise per coordinate of the noised gradient: dense1 ") != std::string::npos);
  Run j = run(cmd + " --json");
  REQUIRE(j.status == 0);
  CHECK(j.out.find("\"layer_snr\":{\"dense1\":") != std::string::npos);
}

TEST_CASE("dpgrad-train: --plot writes a PNG of accuracy and epsilon; an unwritable path is an error") {
  const std::string png = "/tmp/dpgrad-test-plot-" + std::to_string(getpid()) + ".png";
  std::string base = train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 "
                             "--epochs 2 --noise-multiplier 1";
  Run r = run(base + " --plot " + png);
  REQUIRE(r.status == 0);
  std::FILE* f = std::fopen(png.c_str(), "rb");
  REQUIRE(f != nullptr);
  unsigned char magic[8] = {};
  CHECK(std::fread(magic, 1, 8, f) == 8);
  std::fclose(f);
  std::remove(png.c_str());
  CHECK(magic[1] == 'P');
  CHECK(magic[2] == 'N');
  CHECK(magic[3] == 'G');
  Run bad = run(base + " --plot /nonexistent-folder/out.png");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("/nonexistent-folder/out.png") != std::string::npos);
}

TEST_CASE("dpgrad-train: a missing dataset names the command that installs it") {
  Run r = run("DPGRAD_FASHION_MNIST=/nonexistent/fmnist " + train + " --dataset fashion-mnist");
  CHECK(r.status == 2);
  CHECK(r.out.find("apt-get install dataset-fashion-mnist") != std::string::npos);
}

TEST_CASE("dpgrad-account: overflowing counts are refused, not saturated") {
  Run r = run(account + " --dataset-size 100 --batch-size 10 --noise-multiplier 1 --steps 99999999999999999999 "
                        "--delta 1e-5");
  CHECK(r.status == 2);
  CHECK(r.out.find("--steps") != std::string::npos);
  CHECK(r.out.find("too large") != std::string::npos);
}

TEST_CASE("dpgrad-account: a vanishing noise multiplier claims no finite epsilon") {
  for (const char* acc : {"rdp", "pld"}) {
    CAPTURE(acc);
    Run r = run(account + " --dataset-size 60000 --batch-size 256 --noise-multiplier 1e-300 --steps 10 --delta 1e-5 "
                          "--json --accountant " + acc);
    if (r.status == 0) CHECK(last_json(r.out)["epsilon"] == "inf");
    else CHECK(r.status == 2);
  }
}

TEST_CASE("dpgrad-account: gdp is labelled an approximation, beside the pld upper bound") {
  Run r = run(account + ok_args + " --accountant gdp --json");
  REQUIRE(r.status == 0);
  auto j = last_json(r.out);
  CHECK(j.contains("approximate_epsilon_label"));
  REQUIRE(j.contains("approximate_epsilon"));
  CHECK(j["epsilon"].get<double>() > 0);
  Run t = run(account + ok_args + " --accountant gdp");
  CHECK(t.out.find("NOT an upper bound") != std::string::npos);
  CHECK(t.out.find("pld: privacy loss distribution, an upper bound") != std::string::npos);
}

TEST_CASE("dpgrad-train: gdp is refused as a run's accountant; the default is pld for Poisson") {
  // --target-epsilon 1 --accountant gdp used to calibrate sigma by the CLT (under-stating epsilon).
  Run g = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 --epochs 1 "
                      "--clip-strategy ghost --target-epsilon 1 --accountant gdp");
  CHECK(g.status == 2);
  CHECK(g.out.find("not an upper bound") != std::string::npos);
  Run f = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 --epochs 1 "
                      "--clip-strategy ghost --noise-multiplier 1 --sampler fixed --json");
  REQUIRE(f.status == 0);
  CHECK(last_json(f.out)["accountant"] == "wor");
}

TEST_CASE("dpgrad-train and dpgrad-account count the same steps for the same epochs") {
  // synthetic: 2048 training examples; batch 100, 1.5 epochs: ceil(1.5 * 2048 / 100) = 31 steps.
  Run t = run(train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 100 "
                      "--epochs 1.5 --clip-strategy ghost --noise-multiplier 1 --delta 1e-5 --json");
  REQUIRE(t.status == 0);
  Run a = run(account + " --dataset-size 2048 --batch-size 100 --noise-multiplier 1 --epochs 1.5 --delta 1e-5 --json");
  REQUIRE(a.status == 0);
  CHECK(last_json(t.out)["steps"] == 31);
  CHECK(last_json(a.out)["steps"] == 31);
  // the same ledger; dpgrad-train adds the slack of its grid noise (docs/noise.md) to the Gaussian figure
  const double trained = last_json(t.out)["epsilon"].get<double>(), gaussian = last_json(a.out)["epsilon"].get<double>();
  CHECK(trained >= gaussian);
  CHECK(trained == doctest::Approx(gaussian).epsilon(1e-3));
}

TEST_CASE("dpgrad-train: each optimizer starts from its own learning rate unless --lr says otherwise") {
  for (const auto& [optimizer, lr] : std::vector<std::pair<std::string, std::string>>{
           {"adam", "at lr 0.001"}, {"dp-adam", "at lr 0.001"}, {"sgd", "at lr 0.1"}, {"dp-momentum", "at lr 0.1"}}) {
    CAPTURE(optimizer);
    const bool dp = optimizer.rfind("dp-", 0) == 0;
    Run r = run(train + " --dataset synthetic --model mlp --hidden 8 --batch-size 64 --max-steps 2 --optimizer " +
                optimizer + (dp ? " --noise-multiplier 1" : ""));
    REQUIRE(r.status == 0);
    CHECK(r.out.find("optimizer " + optimizer.substr(dp ? 3 : 0) + " " + lr) != std::string::npos);
  }
  Run given = run(train + " --dataset synthetic --model mlp --hidden 8 --batch-size 64 --max-steps 2 --optimizer adam "
                          "--lr 0.02");
  REQUIRE(given.status == 0);
  CHECK(given.out.find("optimizer adam at lr 0.02\n") != std::string::npos);
}

TEST_CASE("dpgrad-train: what a run needs is checked before any step; silent values and misleading messages are gone") {
  const std::string base = train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd "
                                   "--max-steps 2 --noise-multiplier 1";
  struct Case {
    std::string args;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {" --checkpoint-dir /proc/no-such/dir", {"cannot create the checkpoint directory"}},
      {" --checkpoint-dir ''", {"--checkpoint-dir", "must name a directory"}},
      {" --plot /no-such-dir/x.png", {"--plot /no-such-dir/x.png", "its folder /no-such-dir does not exist"}},
      {" --train-limit 1 --batch-size 1", {"a classifier needs at least two"}},
      {" --train-limit 1000", {}},  // fine: the control
      {" --epoch-fraction 0.5", {"--epoch-fraction applies to --sampler shuffle only"}},
      {" --allow-no-noise --target-epsilon 1", {"--allow-no-noise goes with --noise-multiplier 0"}},
      {" --clip-norm 1e308", {"--clip-norm must be in [1e-12, 1e6]"}},
      {" --weight-decay inf", {"--weight-decay must be finite"}},
      {" --batch-size -1", {"--batch-size", "must be a whole number >= 0, got '-1'"}},
      {" --max-steps -5", {"--max-steps", "must be a whole number"}},
      {" --seed -1", {"--seed", "must be a whole number"}},
      {" --accountant foo", {"unknown accountant 'foo'"}},
      {" --clip-strategy jl:1000000", {"at most jl:1000"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    Run r = run(base + c.args);
    if (c.says.empty()) {
      CHECK(r.status == 0);
      continue;
    }
    CHECK(r.status == 2);
    for (const auto& s : c.says) CHECK(r.out.find(s) != std::string::npos);
    CHECK(r.out.find("epoch 1") == std::string::npos);  // nothing trained
  }
  // text models size their output layer from the data
  Run text = run(train + " --dataset synthetic-text --model bigru --optimizer dp-adam --batch-size 32 --max-steps 2 "
                         "--noise-multiplier 1 --json");
  REQUIRE(text.status == 0);
}

TEST_CASE("dpgrad-train: a resumed run may go on longer under a larger budget, and says so; shorter is refused") {
  dpgrad::test::TempDir dir("dpgrad-longer");
  const std::string base = train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 "
                                   "--reproducible-noise --checkpoint-dir " + (dir.path / "run").string();
  Run first = run(base + " --epochs 1 --target-epsilon 2 --json");
  REQUIRE(first.status == 0);
  const auto j1 = last_json(first.out);
  Run longer = run(base + " --resume --epochs 2 --target-epsilon 4 --json");
  REQUIRE(longer.status == 0);
  CHECK(longer.out.find("going on longer under a larger budget: epochs 1.0 -> 2.0, target_epsilon 2.0 -> 4.0") !=
        std::string::npos);
  const auto j2 = last_json(longer.out);
  CHECK(j2["noise_multiplier"] == j1["noise_multiplier"]);  // the run's own noise
  CHECK(j2["steps"].get<long>() > j1["steps"].get<long>());
  CHECK(j2["epsilon"].get<double>() <= 4.0);
  CHECK(j2["epsilon"].get<double>() > j1["epsilon"].get<double>());
  CHECK(j2["extended"] == "epochs 1.0 -> 2.0, target_epsilon 2.0 -> 4.0");
  Run shorter = run(base + " --resume --epochs 1");
  CHECK(shorter.status == 2);
  CHECK(shorter.out.find("epochs (checkpoint 2.0, now 1.0)") != std::string::npos);
}

TEST_CASE("dpgrad-train: two runs cannot share a checkpoint directory; a resume lists every changed flag, --threads may change") {
  dpgrad::test::TempDir dir("dpgrad-lock");
  const std::string base = train + " --dataset synthetic --model mlp --hidden 8 --optimizer dp-sgd --batch-size 64 "
                                   "--epochs 1 --noise-multiplier 1 --reproducible-noise --checkpoint-dir " +
                           (dir.path / "run").string();
  Run first = run(base + " --threads 1 --checkpoint-every 3");
  REQUIRE(first.status == 0);
  // resuming with other settings contradicts the stored run: each change is named
  Run other = run(base + " --resume --lr 0.3 --clip-norm 2 --checkpoint-every 4");
  CHECK(other.status == 2);
  CHECK(other.out.find("--lr 0.3 (the run's: 0.1)") != std::string::npos);
  CHECK(other.out.find("--clip-norm 2.0 (the run's: 1.0)") != std::string::npos);
  CHECK(other.out.find("--checkpoint-every 4 (the run's: 3) contradict the checkpointed run") != std::string::npos);
  // the engine's threads are not the run's: a resume may use others
  Run threads = run(base + " --resume --threads 2");
  CHECK(threads.status == 0);
  // a run holding the directory's lock keeps a second one out
  const std::filesystem::path lock = dir.path / "run" / ".lock";
  const int fd = ::open(lock.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  Run second = run(base + " --resume");
  CHECK(second.status == 2);
  CHECK(second.out.find("another run is using the checkpoint directory") != std::string::npos);
  ::close(fd);
}

TEST_CASE("dpgrad-account: a curve that would take hours is refused with an estimate") {
  Run r = run(account + " --curve --epochs 100000 --accountant pld --dataset-size 60000 --batch-size 256 "
                        "--noise-multiplier 1.1 --delta 1e-5");
  CHECK(r.status == 2);
  CHECK(r.out.find("--curve would take about") != std::string::npos);
  CHECK(r.out.find("minutes") != std::string::npos);
}

TEST_CASE("dpgrad-audit: a bound, its confidence, the claim and the ratio, in text and JSON") {
  const std::string audit = DPGRAD_AUDIT;
  Run j = run(audit + " --model mlp --trials 2000 --noise-multiplier 2 --json");
  REQUIRE(j.status == 0);
  const auto r = last_json(j.out);
  for (const char* key : {"epsilon_lower_bound", "confidence", "accountant_epsilon", "ratio", "fault"})
    CHECK(r.contains(key));
  CHECK(r["epsilon_lower_bound"].get<double>() <= r["accountant_epsilon"].get<double>());
  Run t = run(audit + " --model lstm --trials 500 --noise-multiplier 2 --clip-norm 0.01 --fault no-noise");
  REQUIRE(t.status == 0);
  CHECK(t.out.find("DELIBERATELY BROKEN: no-noise") != std::string::npos);
  CHECK(t.out.find("VIOLATION") != std::string::npos);
  Run one = run(audit + " --model cnn26k --method one-run --canaries 2000 --noise-multiplier 1 --json");
  REQUIRE(one.status == 0);
  CHECK(last_json(one.out)["method"] == "one-run");
  CHECK(last_json(one.out)["epsilon_lower_bound"].get<double>() <= last_json(one.out)["accountant_epsilon"].get<double>());
  Run bad = run(audit + " --fault whatever");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("unknown fault 'whatever'") != std::string::npos);
}

TEST_CASE("every program names a bad option and exits 2 before any work") {
  struct Case {
    std::string command;
    std::vector<std::string> says;
  };
  const std::string audit = DPGRAD_AUDIT, logreg = DPGRAD_LOGREG, bench = DPGRAD_BENCH, pate = DPGRAD_PATE;
  const std::vector<Case> cases = {
      {pate + " --teachers -2", {"dpgrad-pate: error", "--teachers", "whole number"}},
      {pate + " --threshold 300 --teachers 250", {"--threshold 300 is above the number of teachers (250)"}},
      {pate + " --sigma 0", {"--sigma must be > 0"}},
      {pate + " --sigma -1", {"--sigma must be > 0"}},
      {pate + " --sigma 40 --target-epsilon 3", {"not both"}},
      {pate + " --sigma1 -5", {"--sigma1 must be 0 (no threshold test) or in [1e-6, 1e6)"}},
      {pate + " --queries 9001", {"--queries must be in [1, --pool = 9000]"}},
      {pate + " --delta 1", {"--delta must be in (0, 1)"}},
      {pate + " --teacher-model bilstm598k", {"reads text"}},
      {pate + " --dataset synthetic --teachers 5000", {"--teachers 5000 is more than the 2048 training records"}},
      {audit + " --steps -1", {"dpgrad-audit: error", "--steps", "whole number"}},
      {audit + " --trials 3", {"trials must be in [8, 10^7]"}},
      {audit + " --clip-strategy jl:0", {"jl:0", ">= 1"}},
      {audit + " --clip-strategy none", {"not private"}},
      {audit + " --model resnet", {"unknown audit model 'resnet'"}},
      {audit + " --delta 2", {"delta must be in (0, 1)"}},
      {audit + " --noise-multiplier 1e999", {"--noise-multiplier", "overflows"}},
      {audit + " --method one-run --canaries 5", {"at least 20 canaries"}},
      {logreg + " --dim -3 --dataset synthetic", {"dpgrad-logreg: error", "--dim", "whole number"}},
      {logreg + " --dataset synthetic --dim 5000", {"--dim must be in [1, 4096]"}},
      {logreg + " --lambda nan", {"--lambda must be > 0"}},
      {logreg + " --classes 1", {"--classes takes two labels"}},
      {logreg + " --no-such-flag", {"dpgrad-logreg: error"}},
      {bench + " --batch -1", {"dpgrad-bench: error", "--batch", "whole number"}},
      {bench + " --methods ghost,jl:abc", {"jl:abc"}},
      {bench + " --model mlp --memory-limit-gb inf --max-batch", {"--memory-limit-gb must be in (0, 4096]"}},
      {bench + " --steps 0 --model mlp", {"--steps must be >= 1"}},
      {account + " --dataset-size -5 --batch-size 1 --steps 1 --noise-multiplier 1 --delta 1e-5",
       {"dpgrad-account: error", "--dataset-size", "whole number"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.command);
    const Run r = run(c.command);
    CHECK(r.status == 2);
    for (const auto& s : c.says) CHECK(r.out.find(s) != std::string::npos);
  }
}

TEST_CASE("dpgrad-pate: teachers, Confident-GNMax and a student end to end, in text and JSON") {
  const std::string pate = DPGRAD_PATE;
  const std::string base = pate + " --dataset synthetic --teachers 8 --pool 200 --queries 120 --teacher-model logreg "
                                  "--student-model logreg --teacher-epochs 2 --student-epochs 2 --threshold 2";
  Run j = run(base + " --sigma1 1 --sigma 2 --max-answers 50 --json");
  REQUIRE(j.status == 0);
  const auto r = last_json(j.out);
  CHECK(r["teachers"] == 8);
  CHECK(r["answered"].get<long>() <= 50);
  CHECK(r["asked"].get<long>() <= 120);
  CHECK(r["private"] == true);
  CHECK(r["evaluation_images"] == 56);
  // the released epsilon is the plan's: 120 threshold tests at 1 and 50 answers at 2
  dpgrad::privacy::PateAccountant plan;
  plan.record({1, 2, 120, 50});
  CHECK(r["epsilon"].get<double>() == doctest::Approx(dpgrad::privacy::pate_epsilon(plan, 10, 1e-5)));
  // the tighter of the RDP and PLD bounds, labelled (for composed Gaussians the PLD's)
  CHECK(r["epsilon_bound"] == "data-independent PLD (released)");
  CHECK(r["epsilon"].get<double>() == std::min(r["epsilon_rdp"].get<double>(), r["epsilon_pld"].get<double>()));
  CHECK(r["epsilon"].get<double>() < 0.97 * r["epsilon_rdp"].get<double>());
  CHECK_FALSE(r.contains("epsilon_data_dependent"));  // computed from the votes: only when asked for by name
  Run t = run(base + " --sigma1 40 --target-epsilon 8 --show-data-dependent-epsilon");
  REQUIRE(t.status == 0);
  CHECK(t.out.find("(calibrated)") != std::string::npos);
  CHECK(t.out.find("final: student test accuracy") != std::string::npos);
  CHECK(t.out.find("NOT releasable") != std::string::npos);
  Run tight = run(base + " --sigma1 1 --target-epsilon 8");
  CHECK(tight.status == 2);
  CHECK(tight.out.find("threshold tests alone") != std::string::npos);
}

TEST_CASE("dpgrad-train: the transformer and the scattering heads train privately end to end") {
  Run t = run(train + " --dataset synthetic-text --model transformer --optimizer dp-adam --batch-size 32 --max-steps 2 "
                      "--noise-multiplier 1 --json");
  REQUIRE(t.status == 0);
  nlohmann::json jt = last_json(t.out);
  CHECK(jt["model"] == "transformer");
  CHECK(jt["private"] == true);
  Run small = run(train + " --dataset synthetic-text --model transformer --vocabulary 512 --optimizer dp-adam "
                          "--batch-size 32 --max-steps 1 --noise-multiplier 1");
  REQUIRE(small.status == 0);
  CHECK(small.out.find("transformer (142594 parameters)") != std::string::npos);  // 633,666 - (8185 - 512) x 64
  Run lstm = run(train + " --dataset synthetic-text --model bilstm598k --vocabulary 512 --optimizer sgd --max-steps 1");
  CHECK(lstm.status == 2);
  CHECK(lstm.out.find("only the transformer takes another size") != std::string::npos);
  Run frozen = run(train + " --dataset synthetic-text --model transformer --frozen-embedding --optimizer dp-adam "
                           "--batch-size 32 --max-steps 1 --noise-multiplier 1");
  REQUIRE(frozen.status == 0);
  CHECK(frozen.out.find("transformer (109826 parameters)") != std::string::npos);  // 633,666 - 8185 x 64
  Run frozen_lstm = run(train + " --dataset synthetic-text --model bilstm598k --frozen-embedding --max-steps 1");
  CHECK(frozen_lstm.status == 2);
  CHECK(frozen_lstm.out.find("only the transformer's embedding can be frozen") != std::string::npos);
  Run tiny = run(train + " --dataset synthetic-text --model transformer --vocabulary 2 --max-steps 1");
  CHECK(tiny.status == 2);
  CHECK(tiny.out.find("--vocabulary must be in [3, 10^7]") != std::string::npos);
  Run s = run(train + " --dataset synthetic --model scatter-linear --optimizer dp-momentum --batch-size 64 "
                      "--train-limit 256 --test-limit 64 --max-steps 2 --noise-multiplier 1 --json");
  REQUIRE(s.status == 0);
  CHECK(s.out.find("scattering features (J = 2, L = 8)") != std::string::npos);
  CHECK(last_json(s.out)["model"] == "scatter-linear");
  Run bad = run(train + " --dataset synthetic-text --model scatter-cnn --optimizer sgd --max-steps 1");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("scatter-cnn reads images, and synthetic-text is text") != std::string::npos);
  Run views = run(train + " --dataset synthetic --model scatter-linear --optimizer sgd --augment-views 2 --max-steps 1");
  CHECK(views.status == 2);
  CHECK(views.out.find("--augment-views does not apply") != std::string::npos);
}

TEST_CASE("dpgrad-train: --centre-features releases a private centre, accounted with the run and kept for a resume") {
  dpgrad::test::TempDir tmp("dpgrad-centre");
  const std::string base = train + " --dataset synthetic --model scatter-linear --optimizer dp-momentum --batch-size 64 "
                                   "--train-limit 256 --test-limit 64 --epochs 1 --target-epsilon 2 --delta 1e-5";
  Run plain = run(base + " --max-steps 2 --json");
  Run c = run(base + " --centre-features 5 --max-steps 2 --json --checkpoint-dir " + (tmp.path / "c").string());
  REQUIRE(plain.status == 0);
  REQUIRE(c.status == 0);
  CHECK(c.out.find("released before training, feature_mean: a private mean of per-record features, noise multiplier 5") != std::string::npos);
  // the same target with the release in the ledger: a larger noise multiplier for the steps
  CHECK(last_json(c.out)["noise_multiplier"].get<double>() > last_json(plain.out)["noise_multiplier"].get<double>());
  Run resumed = run(train + " --checkpoint-dir " + (tmp.path / "c").string() + " --resume --json");
  REQUIRE(resumed.status == 0);
  CHECK(resumed.out.find("feature centre: the mean") == std::string::npos);  // taken from the checkpoint, not drawn again
  CHECK(last_json(resumed.out)["epsilon"].get<double>() <= 2.0);
  CHECK(last_json(resumed.out)["noise_multiplier"] == last_json(c.out)["noise_multiplier"]);
  Run cnn = run(train + " --dataset synthetic --model cnn26k --optimizer dp-sgd --centre-features 5 --max-steps 1 "
                        "--noise-multiplier 1");
  CHECK(cnn.status == 2);
  CHECK(cnn.out.find("--centre-features applies to scatter-linear and scatter-cnn") != std::string::npos);
  Run open = run(train + " --dataset synthetic --model scatter-linear --optimizer sgd --centre-features 5 --max-steps 1");
  CHECK(open.status == 2);
  CHECK(open.out.find("--centre-features belongs to private runs") != std::string::npos);
  Run negative = run(base + " --centre-features -1");
  CHECK(negative.status == 2);
  CHECK(negative.out.find("--centre-features must be a noise multiplier >= 0") != std::string::npos);
}

TEST_CASE("single-process programs refuse to run under an MPI launcher: each copy would spend the budget again") {
  // what mpirun puts in each process's environment
  for (const std::string& program : {std::string(DPGRAD_PATE), std::string(DPGRAD_LOGREG)}) {
    CAPTURE(program);
    Run r = run("OMPI_COMM_WORLD_SIZE=2 " + program + " --help");
    CHECK(r.status != 0);
    CHECK(r.out.find("runs on one process") != std::string::npos);
    Run plain = run(program + " --help");
    CHECK(plain.status == 0);
  }
}
