// The programs under hostile input (issue 31) and what they show of private
// data (issue 30, section 4): user text never becomes gnuplot code, outputs that
// are not regular files are never replaced, lost output is an error, checks run
// before the work, nonsense is refused, and messages name the problem.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "data/idx.hpp"
#include "privacy/accountant.hpp"
#include "support/key_store.hpp"
#include "support/programs.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using dpgrad::test::last_json;
using dpgrad::test::Run;
using dpgrad::test::run_argv;
using dpgrad::test::run_shell;

namespace {

const std::string train = DPGRAD_TRAIN, account = DPGRAD_ACCOUNT, audit = DPGRAD_AUDIT, logreg = DPGRAD_LOGREG,
                  bench = DPGRAD_BENCH, pate = DPGRAD_PATE, tune = DPGRAD_TUNE;

/// A short non-private run on synthetic images, with more arguments.
std::vector<std::string> quick_train(std::vector<std::string> more) {
  std::vector<std::string> a{train, "--dataset", "synthetic", "--model", "mlp", "--hidden", "8", "--batch-size",
                             "64", "--epochs", "1"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Four small IDX files (train 64 images, test 32) in dir.
void write_idx_folder(const fs::path& dir) {
  fs::create_directories(dir);
  for (const auto& [prefix, n] : {std::pair{std::string("train"), 64}, std::pair{std::string("t10k"), 32}}) {
    dpgrad::ArrayT<std::uint8_t> images = xt::zeros<std::uint8_t>({std::size_t(n), std::size_t(28), std::size_t(28)});
    std::vector<std::uint8_t> labels;
    for (int i = 0; i < n; ++i) {
      labels.push_back(std::uint8_t(i % 10));
      for (int k = 0; k < 28; ++k) images(std::size_t(i), std::size_t(k), std::size_t((i * 3) % 28)) = 200;
    }
    dpgrad::data::write_idx_images((dir / (prefix + "-images-idx3-ubyte.gz")).string(), images, true);
    dpgrad::data::write_idx_labels((dir / (prefix + "-labels-idx1-ubyte.gz")).string(), labels, true);
  }
}

bool is_png(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in && magic[1] == 'P' && magic[2] == 'N' && magic[3] == 'G';
}

}  // namespace

TEST_CASE("dpgrad-train --plot: hostile plot paths and dataset names never become gnuplot code") {
  dpgrad::test::TempDir tmp("dpgrad-plot-attack");
  // a data folder whose name closes gnuplot's quotes in the title
  const fs::path data = tmp.path / "a\"; system \"touch pwned2\"; b=\"";
  write_idx_folder(data);
  for (const std::string& name : {std::string("x.png'; system 'touch pwned'; set output 'y.png"), std::string("it's.png"),
                                  std::string("q\"uote`touch pwned3`$(touch pwned4).png")}) {
    CAPTURE(name);
    const Run r = run_argv({train, "--dataset", "idx:" + data.string(), "--model", "mlp", "--hidden", "8",
                            "--batch-size", "16", "--epochs", "2", "--plot", name},
                           tmp.path.string());
    CHECK(r.status == 0);
    INFO(r.out);
    CHECK(is_png(tmp.path / name));
  }
  for (const char* pwned : {"pwned", "pwned2", "pwned3", "pwned4"}) {
    CAPTURE(pwned);
    CHECK_FALSE(fs::exists(tmp.path / pwned));
  }
}

TEST_CASE("dpgrad-train --plot and dpgrad-bench --markdown: a path that is not a regular file is refused before any work") {
  dpgrad::test::TempDir tmp("dpgrad-outputs");
  const std::string fifo = tmp / "fifo", folder = tmp / "folder", link = tmp / "link";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_directory(folder);
  fs::create_symlink(tmp / "elsewhere.png", link);
  for (const std::string& path : {fifo, folder, link, std::string("/dev/null")}) {
    CAPTURE(path);
    const Run t = run_argv(quick_train({"--plot", path}));
    CHECK(t.status == 2);
    CHECK(contains(t.out, "--plot " + path));
    CHECK_FALSE(contains(t.out, "epoch 1"));  // nothing trained
    const Run b = run_argv({bench, "--model", "mlp", "--batch", "8", "--steps", "1", "--methods", "none",
                            "--markdown", path});
    CHECK(b.status == 2);
    CHECK(contains(b.out, "--markdown " + path));
    CHECK_FALSE(contains(b.out, "ms/step"));
  }
  struct stat st {};
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK(fs::is_symlink(link));
  // an unwritable folder: refused before measuring
  const Run b = run_argv({bench, "--model", "mlp", "--batch", "8", "--steps", "1", "--methods", "none", "--markdown",
                          "/nonexistent-folder/x.md"});
  CHECK(b.status == 2);
  CHECK(contains(b.out, "/nonexistent-folder/x.md"));
  CHECK_FALSE(contains(b.out, "ms/step"));
  // a regular file is replaced
  const std::string md = tmp / "results.md";
  std::ofstream(md) << "old";
  const Run ok = run_argv({bench, "--model", "mlp", "--batch", "8", "--steps", "1", "--warmup", "1", "--methods",
                           "none", "--threads", "1", "--markdown", md});
  CHECK(ok.status == 0);
  std::ifstream in(md);
  std::string first;
  std::getline(in, first);
  CHECK(first == "# dpgrad-bench results");
}

TEST_CASE("every program: output that cannot be written is an error, and a closed stdout is refused at once") {
  dpgrad::test::KeyStoreForTests keys;  // dpgrad-tune's search keys
  const std::vector<std::string> commands = {
      account + " --dataset-size 60000 --batch-size 256 --noise-multiplier 1.1 --epochs 1 --delta 1e-5 --json",
      train + " --dataset synthetic --model logreg --optimizer dp-sgd --noise-multiplier 1 --max-steps 2 --json",
      audit + " --model logreg --trials 8 --noise-multiplier 2 --json",
      logreg + " --dataset synthetic --dim 5 --size 200 --test-size 100 --epsilons 1 --repeats 1 --json",
      pate + " --dataset synthetic --teachers 4 --pool 100 --queries 20 --teacher-model logreg --student-model logreg "
             "--teacher-epochs 1 --student-epochs 1 --threshold 2 --sigma1 1 --sigma 2 --json",
      bench + " --model mlp --batch 8 --steps 1 --warmup 1 --methods none --threads 1 --json",
      tune + " --dataset synthetic --model logreg --target-epsilon 8 --score-noise 0.1 --trials poisson:1 --epochs 1 "
             "--batch-size 128 --reproducible-noise --seed 2 --search-dir \"$(mktemp -d)/s\" --json",
  };
  for (const auto& cmd : commands) {
    CAPTURE(cmd);
    // in a subshell, so that its standard error still reaches the test
    const Run full = run_shell("(" + cmd + " >/dev/full)");
    CHECK(full.status != 0);
    CHECK(contains(full.out, "standard output"));
    const Run closed = run_shell("(" + cmd + " >&-)");
    CHECK(closed.status == 2);
    CHECK(contains(closed.out, "standard output is closed"));
  }
}

TEST_CASE("checks that need no work run before it") {
  // the aggregator's noise is checked before any teacher trains
  const Run p = run_argv({pate, "--dataset", "synthetic", "--teachers", "4", "--pool", "100", "--queries", "20",
                          "--teacher-model", "logreg", "--student-model", "logreg", "--threshold", "2", "--sigma1",
                          "1e308"});
  CHECK(p.status == 2);
  CHECK(contains(p.out, "--sigma1"));
  CHECK_FALSE(contains(p.out, "teachers:"));
  CHECK_FALSE(contains(p.out, "noise_grid"));
}

TEST_CASE("every program refuses an empty number, never reading it as 0") {
  const std::vector<std::vector<std::string>> cases = {
      quick_train({"--optimizer", "dp-momentum", "--noise-multiplier", "1", "--momentum", ""}),
      quick_train({"--ema", ""}),
      quick_train({"--weight-decay", ""}),
      quick_train({"--optimizer", "dp-sgd", "--noise-multiplier", "1", "--sat-rho", ""}),
      quick_train({"--lr-schedule", "cosine", "--lr-final", ""}),
      quick_train({"--centre-features", ""}),
      quick_train({"--epochs="}),
      quick_train({"--classes", "3,"}),
      quick_train({"--classes", "3,,7"}),
      {account, "--dataset-size", "100", "--batch-size", "10", "--noise-multiplier", "", "--steps", "1", "--delta",
       "1e-5"},
      {audit, "--clip-norm", ""},
      {logreg, "--dataset", "synthetic", "--epsilons", "1,,2"},
      {logreg, "--dataset", "synthetic", "--bias", ""},
      {bench, "--memory-limit-gb", "", "--max-batch"},
      {pate, "--student-lr", ""},
      {pate, "--pseudo-confidence="},
      {tune, "--score-noise", "", "--target-epsilon", "1", "--search-dir", "x"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.back());
    CAPTURE(c[c.size() - 2]);
    const Run r = run_argv(c);
    CHECK(r.status == 2);
    // "--flag=" is an option without its value to CLI11
    CHECK((contains(r.out, "empty value") || contains(r.out, "required FLOAT:REAL missing")));
  }
}

TEST_CASE("one rule for numbers in every program: decimal only, hexadecimal refused") {
  const std::vector<std::vector<std::string>> cases = {
      quick_train({"--epochs", "0x10"}),
      quick_train({"--batch-size", "0x40"}),
      quick_train({"--batch-size", "010"}),  // octal to CLI11
      quick_train({"--lr-scale", "dense1=0x2"}),
      {account, "--dataset-size", "0x100", "--batch-size", "10", "--noise-multiplier", "1", "--steps", "1",
       "--delta", "1e-5"},
      {account, "--dataset-size", "100", "--batch-size", "10", "--noise-multiplier", "0x1p0", "--steps", "1",
       "--delta", "1e-5"},
      {audit, "--trials", "0x100"},
      {logreg, "--lambda", "0x1p-3"},
      {bench, "--steps", "0x3"},
      {pate, "--teachers", "0x10"},
  };
  for (const auto& c : cases) {
    CAPTURE(c[c.size() - 2]);
    CAPTURE(c.back());
    const Run r = run_argv(c);
    CHECK(r.status == 2);
    CHECK(contains(r.out, "decimal"));
  }
}

TEST_CASE("dpgrad-train: exploding parameters stop the run, release nothing, and report the epsilon spent") {
  const Run p = run_argv(quick_train({"--optimizer", "dp-sgd", "--noise-multiplier", "1", "--lr", "1e20"}));
  CHECK(p.status == 2);
  CHECK(contains(p.out, "diverged"));
  CHECK(contains(p.out, "epsilon spent"));
  CHECK_FALSE(contains(p.out, "test accuracy"));
  const Run j = run_argv(quick_train({"--optimizer", "dp-sgd", "--noise-multiplier", "1", "--lr", "1e20", "--json"}));
  CHECK(j.status == 2);
  auto row = last_json(j.out);
  CHECK(row["diverged"] == true);
  CHECK(row["epsilon"].get<double>() > 0);
  CHECK_FALSE(row.contains("test_accuracy"));
  const Run n = run_argv(quick_train({"--lr", "1e20"}));  // non-private: no epsilon
  CHECK(n.status == 2);
  CHECK(contains(n.out, "diverged"));
  CHECK_FALSE(contains(n.out, "test accuracy"));
}

TEST_CASE("dpgrad-pate: a student that diverges stops the run and reports what its answers cost") {
  const Run r = run_argv({pate, "--dataset", "synthetic", "--teachers", "8", "--pool", "200", "--queries", "120",
                          "--teacher-model", "logreg", "--student-model", "logreg", "--teacher-epochs", "2",
                          "--student-epochs", "2", "--threshold", "2", "--sigma1", "1", "--sigma", "2",
                          "--student-lr", "1e308"});
  CHECK(r.status != 0);
  CHECK(contains(r.out, "diverged"));
  CHECK(contains(r.out, "epsilon spent"));
  CHECK_FALSE(contains(r.out, "final: student test accuracy"));
}

TEST_CASE("dpgrad-train: settings a run would ignore are refused") {
  for (const std::vector<std::string>& more :
       {std::vector<std::string>{"--clip-norm", "2"}, {"--delta", "1e-6"}, {"--accountant", "rdp"},
        {"--sampler", "fixed"}, {"--clip-strategy", "vanilla"}, {"--augment-shift", "3"}}) {
    CAPTURE(more[0]);
    const Run r = run_argv(quick_train(more));
    CHECK(r.status == 2);
    CHECK((contains(r.out, "has no effect") || contains(r.out, "--augment-views, which is off")));
  }
  const Run shift = run_argv(quick_train({"--augment-views", "2", "--augment-shift", "28"}));
  CHECK(shift.status == 2);
  CHECK(contains(shift.out, "augmentation: shift 28 is not smaller than the images (28 x 28"));
  const Run fits = run_argv(quick_train({"--optimizer", "dp-sgd", "--noise-multiplier", "1", "--accountant", "shuffle"}));
  CHECK(fits.status == 2);
  CHECK(contains(fits.out, "the shuffle accountant does not analyse poisson sampling (it analyses shuffle sampling; "
                           "poisson sampling goes with the pld or rdp accountant)"));
  CHECK_FALSE(contains(fits.out, "epoch fraction"));
}

TEST_CASE("messages name the flag, not the noise grid") {
  const Run a = run_argv({audit, "--noise-multiplier", "1e-9", "--model", "logreg", "--trials", "8"});
  CHECK(a.status == 2);
  CHECK(contains(a.out, "--noise-multiplier"));
  CHECK_FALSE(contains(a.out, "grid 0.0"));
  const Run t = run_argv(quick_train({"--optimizer", "dp-sgd", "--noise-multiplier", "1", "--clip-norm", "1e-300"}));
  CHECK(t.status == 2);
  CHECK(contains(t.out, "--clip-norm"));
  CHECK_FALSE(contains(t.out, "noise_grid"));
  const Run b = run_argv({bench, "--model", "mlp", "--batch", "1000000000", "--methods", "ghost", "--steps", "1"});
  CHECK(b.status == 2);
  CHECK(contains(b.out, "--batch 1000000000"));
  CHECK_FALSE(contains(b.out, "std::bad_alloc"));
}

TEST_CASE("dpgrad-account: a huge noise multiplier gives a tiny epsilon, never inf") {
  double prev = 1;
  for (const char* sigma : {"1e7", "1e9", "1e12"}) {
    CAPTURE(sigma);
    const Run r = run_argv({account, "--dataset-size", "60000", "--batch-size", "256", "--noise-multiplier", sigma,
                            "--epochs", "1", "--delta", "1e-5", "--json"});
    REQUIRE(r.status == 0);
    auto e = last_json(r.out)["epsilon"];
    REQUIRE(e.is_number());
    CHECK(e.get<double>() <= prev);
    CHECK(e.get<double>() < 1e-6);
    prev = e.get<double>();
  }
}

TEST_CASE("dpgrad-account: gdp's \"epsilon\" is the sound bound; the CLT figure has its own labelled key") {
  const std::string args = " --dataset-size 60000 --batch-size 256 --noise-multiplier 1.1 --epochs 3 --delta 1e-5 --json";
  auto pld = last_json(run_shell(account + args + " --accountant pld").out);
  auto gdp = last_json(run_shell(account + args + " --accountant gdp").out);
  REQUIRE(pld["epsilon"].is_number());
  CHECK(gdp["epsilon"] == pld["epsilon"]);
  CHECK(gdp["accountant"] == "pld");
  REQUIRE(gdp["approximate_epsilon"].is_number());
  CHECK(gdp["approximate_epsilon"].get<double>() < gdp["epsilon"].get<double>());
  CHECK(contains(gdp["approximate_epsilon_label"].get<std::string>(), "NOT an upper bound"));
  auto curve = last_json(run_shell(account + args + " --accountant gdp --curve").out);
  auto pld_curve = last_json(run_shell(account + args + " --accountant pld --curve").out);
  CHECK(curve["epsilon"] == pld_curve["epsilon"]);
  CHECK(curve["approximate_epsilon"].size() == 3);
  const Run text = run_shell(account + " --dataset-size 60000 --batch-size 256 --noise-multiplier 1.1 --epochs 3 "
                                       "--delta 1e-5 --accountant gdp");
  CHECK(contains(text.out, "epsilon          " + dpgrad::privacy::format_epsilon(pld["epsilon"].get<double>())));
}

TEST_CASE("dpgrad-logreg: refuses noise it cannot compute and options it would ignore") {
  const Run l = run_argv({logreg, "--dataset", "synthetic", "--lambda", "1e-300"});
  CHECK(l.status == 2);
  CHECK(contains(l.out, "--lambda 1e-300"));
  const Run c = run_argv({logreg, "--dataset", "synthetic", "--classes", "0,99"});
  CHECK(c.status == 2);
  CHECK(contains(c.out, "--classes"));
  const Run d = run_argv({logreg, "--dim", "50"});
  CHECK(d.status == 2);
  CHECK(contains(d.out, "--dim applies to --dataset synthetic only"));
}

TEST_CASE("dpgrad-logreg: only noised releases are shown, composed into one epsilon; the rest by name, labelled") {
  const std::vector<std::string> base{logreg, "--dataset", "synthetic", "--dim", "5", "--size", "500",
                                      "--test-size", "200", "--epsilons", "0.5,1,2", "--repeats", "4"};
  Run j = run_argv([&] { auto a = base; a.push_back("--json"); return a; }());
  REQUIRE(j.status == 0);
  auto r = last_json(j.out);
  CHECK(r["epsilon_total"].get<double>() == doctest::Approx(4 * (0.5 + 1 + 2)));
  CHECK(r["releases"] == 12);
  CHECK_FALSE(r.contains("non_private"));
  CHECK_FALSE(r.contains("not_private"));
  CHECK_FALSE(r["solver"].contains("objective"));
  CHECK_FALSE(r["results"][0].contains("mean_noise_norm"));
  const Run t = run_argv(base);
  REQUIRE(t.status == 0);
  CHECK_FALSE(contains(t.out, "J(w*)"));
  CHECK_FALSE(contains(t.out, "train accuracy"));
  CHECK(contains(t.out, "together they are 14-DP"));
  Run shown = run_argv([&] { auto a = base; a.push_back("--show-non-private"); return a; }());
  REQUIRE(shown.status == 0);
  CHECK(contains(shown.out, "J(w*)"));
  CHECK(contains(shown.out, "NOT private"));
}

TEST_CASE("dpgrad-pate: the data-dependent epsilon only when asked for by name, and its help says it leaks") {
  const std::vector<std::string> base{pate, "--dataset", "synthetic", "--teachers", "8", "--pool", "200",
                                      "--queries", "120", "--teacher-model", "logreg", "--student-model", "logreg",
                                      "--teacher-epochs", "2", "--student-epochs", "2", "--threshold", "2",
                                      "--sigma1", "1", "--sigma", "2", "--json"};
  const Run plain = run_argv(base);
  REQUIRE(plain.status == 0);
  CHECK_FALSE(contains(plain.out, "data-dependent epsilon"));
  CHECK_FALSE(last_json(plain.out).contains("epsilon_data_dependent"));
  auto asked = base;
  asked.push_back("--show-data-dependent-epsilon");
  const Run shown = run_argv(asked);
  REQUIRE(shown.status == 0);
  CHECK(last_json(shown.out)["epsilon_data_dependent"].is_number());
  const Run help = run_argv({pate, "--help"});
  CHECK(contains(help.out, "LEAKS"));
}

TEST_CASE("dpgrad-train --classes: the kept classes' record counts only when asked for by name") {
  const Run plain = run_argv(quick_train({"--classes", "0,9"}));
  REQUIRE(plain.status == 0);
  CHECK(contains(plain.out, "classes 0,9"));
  CHECK_FALSE(contains(plain.out, " train, "));
  const Run counted = run_argv(quick_train({"--classes", "0,9", "--show-record-counts"}));
  REQUIRE(counted.status == 0);
  CHECK(contains(counted.out, "NOT covered by epsilon"));
}

TEST_CASE("dpgrad-train --clip-quantile: C is reported, checkpointed and resumed; its flags are refused where they do nothing") {
  dpgrad::test::TempDir tmp("dpgrad-adaptive");
  const std::string dir = (tmp.path / "run").string();
  const std::vector<std::string> adaptive = {"--optimizer", "dp-sgd", "--noise-multiplier", "1", "--clip-norm", "0.001",
                                             "--clip-quantile", "0.5", "--clip-count-noise", "5", "--json"};
  auto with = [&](const std::string& epochs, std::vector<std::string> more) {  // quick_train's 1 epoch replaced
    std::vector<std::string> a = quick_train(adaptive);
    *std::next(std::find(a.begin(), a.end(), std::string("--epochs"))) = epochs;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const Run whole = run_argv(with("2", {"--reproducible-noise"}));
  REQUIRE(whole.status == 0);
  const auto end = last_json(whole.out);
  CHECK(end["clip_norm"].get<double>() > 0.001);  // the norms are far above 0.001: C grew
  const Run first = run_argv(with("2", {"--reproducible-noise", "--checkpoint-dir", dir, "--max-steps", "32"}));
  REQUIRE(first.status == 0);
  CHECK(contains(first.out, "\"clip_norm\""));
  const Run rest = run_argv({train, "--checkpoint-dir", dir, "--resume", "--max-steps", "0", "--json"});
  REQUIRE(rest.status == 0);
  CHECK(last_json(rest.out)["clip_norm"] == end["clip_norm"]);  // C came back from the checkpoint
  CHECK(last_json(rest.out)["epsilon"] == end["epsilon"]);
  // per layer: each layer's C_g is reported, and their squares add up to C^2
  const Run layers = run_argv(with("1", {"--clip-strategy", "ghost+layers:adaptive"}));
  REQUIRE(layers.status == 0);
  const auto by_layer = last_json(layers.out);
  REQUIRE(by_layer.contains("layer_clip_norms"));
  CHECK(by_layer["layer_clip_norms"].size() >= 2);
  double squares = 0;
  for (const auto& [layer, c] : by_layer["layer_clip_norms"].items()) squares += c.get<double>() * c.get<double>();
  CHECK(std::abs(std::sqrt(squares) / by_layer["clip_norm"].get<double>() - 1) < 1e-6);
  CHECK(by_layer["clip_strategy"] == "ghost+layers:adaptive");
  for (const auto& [flags, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--optimizer", "dp-sgd", "--noise-multiplier", "1", "--clip-strategy", "ghost+layers:adaptive"},
            "it needs adaptive clipping (--clip-quantile"},
           {{"--clip-lr", "0.5"}, "adaptive clipping, which is off"},
           {{"--clip-count-noise", "3"}, "adaptive clipping, which is off"},
           {{"--clip-quantile", "0.5"}, "needs a dp-* optimizer"},
           {{"--optimizer", "dp-sgd", "--noise-multiplier", "3", "--clip-strategy", "jl:4", "--clip-quantile", "0.5"},
            "adaptive clipping cannot run with jl:4"},
           {{"--optimizer", "dp-sgd", "--noise-multiplier", "4", "--clip-quantile", "0.5", "--clip-count-noise", "1"},
            "must exceed half the noise multiplier"},
           {{"--optimizer", "dp-adambc", "--noise-multiplier", "1", "--clip-quantile", "0.5"}, "dp-adambc"}}) {
    CAPTURE(flags.back());
    const Run r = run_argv(quick_train(flags));
    CHECK(r.status == 2);
    CHECK(contains(r.out, says));
  }
}

namespace {

/// `args` run with DPGRAD_KEY_STORE set to `store` (the test's own store restored after).
Run with_key_store(const std::string& store, const std::vector<std::string>& args) {
  const char* before = std::getenv("DPGRAD_KEY_STORE");
  const std::string saved = before ? before : "";
  ::setenv("DPGRAD_KEY_STORE", store.c_str(), 1);
  const Run r = run_argv(args);
  if (before) ::setenv("DPGRAD_KEY_STORE", saved.c_str(), 1);
  else ::unsetenv("DPGRAD_KEY_STORE");
  return r;
}

}  // namespace

TEST_CASE("dpgrad-train and dpgrad-tune: a key store that cannot keep the run's key is refused before any data") {
  dpgrad::test::TempDir tmp("dpgrad-key-stores");
  const fs::path open = tmp.path / "open", real = tmp.path / "real", link = tmp.path / "link", file = tmp.path / "file";
  fs::create_directory(open);
  fs::permissions(open, fs::perms::all);  // mode 777
  fs::create_directory(real);
  fs::permissions(real, fs::perms::owner_all);
  fs::create_symlink(real, link);
  std::ofstream(file) << "not a folder";
  struct Case {
    std::string store, named, says;  // DPGRAD_KEY_STORE, the store the message names, and what it says
  };
  const std::vector<Case> stores = {
      {open.string(), open.string(), "open to other users"},
      {link.string(), link.string(), "symbolic link"},
      {link.string() + "/", link.string(), "symbolic link"},  // a trailing '/' would follow the link
      {link.string() + "/.", link.string(), "symbolic link"},
      {file.string(), file.string(), "not a folder"},
  };
  for (const auto& [store, named, says] : stores) {
    CAPTURE(store);
    const Run t = with_key_store(store, quick_train({"--optimizer", "dp-sgd", "--noise-multiplier", "1",
                                                      "--checkpoint-dir", (tmp.path / "run").string()}));
    CHECK(t.status == 2);
    CHECK_MESSAGE(contains(t.out, "key store " + named + " "), t.out);
    CHECK(contains(t.out, says));
    CHECK_FALSE(contains(t.out, "parameters) on"));  // no data read, no model built
    CHECK_FALSE(contains(t.out, "epsilon"));
    const Run s = with_key_store(store, {tune, "--dataset", "synthetic", "--model", "logreg", "--target-epsilon", "8",
                                         "--trials", "poisson:1", "--epochs", "1", "--batch-size", "128",
                                         "--search-dir", (tmp.path / "search").string()});
    CHECK(s.status == 2);
    CHECK_MESSAGE(contains(s.out, "key store " + named + " "), s.out);
    CHECK(contains(s.out, says));
    CHECK_FALSE(contains(s.out, "searching"));
  }
  CHECK(fs::is_empty(real));  // nothing written through the link
  // a store that works: the probe leaves nothing behind, the run's key and lock stay
  const Run ok = with_key_store(real.string(), quick_train({"--checkpoint-dir", (tmp.path / "run").string()}));
  REQUIRE_MESSAGE(ok.status == 0, ok.out);
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(real)) kept.push_back(e.path().extension().string());
  std::sort(kept.begin(), kept.end());
  CHECK(kept == std::vector<std::string>{".key", ".lock"});
}

TEST_CASE("dpgrad-train refuses an empty file name or list, never reading it as not given") {
  for (const std::string flag : {"--lr-scale", "--vocab-file", "--export-onnx", "--plot"}) {
    CAPTURE(flag);
    const Run r = run_argv(quick_train({flag, ""}));
    CHECK(r.status == 2);
    CHECK_MESSAGE(contains(r.out, flag + ": an empty value is not"), r.out);
    CHECK_FALSE(contains(r.out, "parameters) on"));
  }
}
