// A checkpoint is read without trusting it: its ledger cannot shrink or soften,
// its manifest names only files inside it, only regular files are read and never
// more bytes than the manifest says, npy arrays are parsed defensively, and one
// run at a time holds a checkpoint directory.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "layers/models.hpp"
#include "optim/checkpoint/checkpoint.hpp"
#include "optim/run/private_trainer.hpp"
#include "privacy/accountant.hpp"
#include "support/check.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}


/// The latest checkpoint's folder in `dir`.
fs::path latest(const fs::path& dir) {
  std::string name = slurp(dir / "latest");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return dir / name;
}

/// Writes the manifest of the latest checkpoint, with a MAC under the run's key
/// when `sign` (as only the holder of the key could: the checks behind the MAC).
void write_manifest(const fs::path& dir, const json& m, bool sign) {
  const fs::path root = latest(dir);
  const std::string text = m.dump(1);
  std::ofstream(root / "manifest.json", std::ios::trunc) << text;
  if (sign) std::ofstream(root / "manifest.mac", std::ios::trunc) << RunKey::peek(m["run"])->mac(text) << "\n";
}

/// Rewrites `rel` in the latest checkpoint and regenerates the manifest's size and
/// hash for it, as someone editing a checkpoint would; `sign`: with the run's key too.
void tamper(const fs::path& dir, const std::string& rel, const std::string& bytes, bool sign = true) {
  const fs::path root = latest(dir);
  std::ofstream(root / rel, std::ios::binary | std::ios::trunc) << bytes;
  json m = json::parse(slurp(root / "manifest.json"));
  m["files"][rel] = {{"bytes", bytes.size()}, {"blake2b", checkpoint_file_hash(bytes)}};
  write_manifest(dir, m, sign);
}

/// Edits state.json of the latest checkpoint.
template <class F>
void edit_state(const fs::path& dir, F&& f, bool sign = true) {
  json s = json::parse(slurp(latest(dir) / "state.json"));
  f(s);
  tamper(dir, "state.json", s.dump(1), sign);
}

struct Run {
  BatchT<double> data;
  PrivateTrainingConfigT<double> config;
  Run() {
    FastRng rng(5);
    data.inputs = ArrayT<double>::from_shape({200, 6});
    for (auto& v : data.inputs) v = rng.normal();
    for (std::size_t i = 0; i < 200; ++i) {
      data.labels.push_back(data.inputs(i, 0) > 0 ? 1 : 0);
      data.ids.push_back(std::int64_t(i));
    }
    config.noise_multiplier = 1.0;
    config.batch_size = 20;
    config.epochs = 2;
    config.reproducible_noise = true;
  }
  /// Trains `steps` steps and checkpoints into dir.
  void write(const fs::path& dir, int steps) {
    FastRng init(1);
    auto model = make_mlp<double>({6, 2}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainerT<double> t(*model, sgd, data, config);
    for (int i = 0; i < steps; ++i) t.step();
    t.save(dir);
  }
  /// Resumes from dir.
  void resume(const fs::path& dir) {
    FastRng init(1);
    auto model = make_mlp<double>({6, 2}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainerT<double> t(*model, sgd, data, config, dir);
  }
};

}  // namespace

TEST_CASE("checkpoint hardening: the ledger cannot shrink or soften on resume") {
  Run run;
  test::TempDir dir("dpgrad-ckpt");
  run.write(dir.path, 5);
  run.resume(dir.path);  // untouched: fine
  const json original = json::parse(slurp(latest(dir.path) / "state.json"));
  auto restore = [&] { tamper(dir.path, "state.json", original.dump(1)); };

  // even signed with the run's key, a shorter ledger is below the key store's high-water mark
  edit_state(dir.path, [](json& s) { s["accountant"]["ledger"][0]["count"] = 1; });
  test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"ledger holds 1 steps", "saved a ledger of 5"});
  restore();
  edit_state(dir.path, [](json& s) { s["accountant"]["ledger"] = json::array(); });
  test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"ledger holds 0 steps", "saved a ledger of 5"});
  restore();
  edit_state(dir.path, [](json& s) { s["accountant"].erase("ledger"); });
  test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"ledger holds 0 steps"});
  restore();
  edit_state(dir.path, [](json& s) { s["accountant"]["ledger"][0]["count"] = 7; });
  test::check_error<std::invalid_argument>([&] { run.resume(dir.path); }, {"ledger holds 7 steps for step 5"});
  restore();
  edit_state(dir.path, [](json& s) { s.erase("accountant"); });
  test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"has no accountant ledger"});
  restore();
  edit_state(dir.path, [](json& s) { s["accountant"]["ledger"][0]["noise_multiplier"] = 5.0; });
  test::check_error<std::invalid_argument>([&] { run.resume(dir.path); }, {"sigma 5", "this run takes them at"});
  restore();
  edit_state(dir.path, [](json& s) { s["accountant"]["ledger"][0]["sampling_rate"] = 0.01; });
  test::check_error<std::invalid_argument>([&] { run.resume(dir.path); }, {"q 0.01"});
  restore();
  edit_state(dir.path, [](json& s) { s["accountant"]["ledger"][0]["count"] = 1e98; });
  test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"\"count\" must be a whole number"});
  restore();
  edit_state(dir.path, [](json& s) { s["step"] = -100; });
  test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"step -100 is negative"});
  restore();
  run.resume(dir.path);
}

TEST_CASE("checkpoint hardening: manifest paths stay inside; only regular files; sizes checked before reading") {
  Run run;
  test::TempDir dir("dpgrad-ckpt");
  run.write(dir.path, 2);
  const fs::path root = latest(dir.path);
  const json manifest = json::parse(slurp(root / "manifest.json"));
  {
    json m = manifest;
    m["files"]["../../../../dev/zero"] = {{"bytes", 1 << 30}, {"blake2b", "00"}};
    write_manifest(dir.path, m, true);
    test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"not a path inside the checkpoint"});
    write_manifest(dir.path, manifest, true);
  }
  // a FIFO in place of a parameter file: refused at once, never blocks
  std::string param;
  for (const auto& [rel, info] : manifest["files"].items())
    if (rel.rfind("params/", 0) == 0) param = rel;
  REQUIRE(!param.empty());
  const std::string saved = slurp(root / param);
  fs::remove(root / param);
  REQUIRE(::mkfifo((root / param).c_str(), 0600) == 0);
  test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {param, "not a regular file"});
  fs::remove(root / param);
  // a file longer than the manifest says is not read past that size
  std::ofstream(root / param, std::ios::binary) << saved << std::string(1000, 'x');
  test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {param, "more than the"});
  fs::remove(root / param);
  std::ofstream(root / param, std::ios::binary) << saved;
  run.resume(dir.path);
}

TEST_CASE("checkpoint hardening: npy arrays are parsed without trusting their headers") {
  Run run;
  test::TempDir dir("dpgrad-ckpt");
  run.write(dir.path, 2);
  const json manifest = json::parse(slurp(latest(dir.path) / "manifest.json"));
  std::string param;
  for (const auto& [rel, info] : manifest["files"].items())
    if (rel.rfind("params/", 0) == 0) param = rel;
  const std::string good = slurp(latest(dir.path) / param);
  auto npy = [](int major, const std::string& header) {
    std::string b = "\x93NUMPY";
    b.push_back(char(major));
    b.push_back(0);
    const std::size_t n = header.size();
    b.push_back(char(n & 255));
    b.push_back(char((n >> 8) & 255));
    if (major >= 2) {
      b.push_back(char((n >> 16) & 255));
      b.push_back(char((n >> 24) & 255));
    }
    return b + header;
  };
  struct Bad {
    std::string bytes, why;
  };
  const std::vector<Bad> cases = {
      {npy(1, "{'descr': '', 'fortran_order': False, 'shape': (), }"), "dtype"},            // an empty field
      {npy(2, "{'descr': '<f8', 'fortran_order': False, 'shape': (16000000000, 16000000000), }"), "is too large"},
      {npy(2, "{'descr': '<f8', 'fortran_order': False, 'shape': (264000000,), }"), "bytes of data"},
      {good.substr(0, good.size() - 8), "bytes of data"},                                  // truncated, hash matching
      {npy(1, "{'descr': '<f8', 'fortran_order': True, 'shape': (2,), }") + std::string(16, '\0'), "C order"},
      {npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, x), }") + std::string(16, '\0'), "shape"},
      {npy(7, "{}"), "version"},
      {"\x93NUMPY\x01", "magic"},
      {std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12), "header of"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.why);
    tamper(dir.path, param, c.bytes);
    test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {param, c.why});
  }
  tamper(dir.path, param, good);
  run.resume(dir.path);
}

TEST_CASE("checkpoint hardening: one run holds a checkpoint directory; partial saves are cleaned up") {
  test::TempDir dir("dpgrad-ckpt");
  fs::create_directories(dir.path / ".partial-step-00000003-12345" / "params");
  {
    CheckpointLock first(dir.path);
    CHECK_FALSE(fs::exists(dir.path / ".partial-step-00000003-12345"));
    test::check_error<CheckpointError>([&] { CheckpointLock second(dir.path); }, {"another run is using"});
  }
  CheckpointLock again(dir.path);  // released with the first
  test::check_error<CheckpointError>([&] { CheckpointLock nowhere("/proc/no-such-dir/x"); }, {"cannot create"});
}

TEST_CASE("accountant JSON: out-of-range numbers and orders are refused, not converted") {
  json shuffle = {{"accountant", "shuffle"}, {"dataset_size", 1e98}, {"batch_size", 10}, {"epoch_fraction", 0.5}};
  test::check_error<std::invalid_argument>([&] { privacy::accountant_from_json(shuffle); },
                                           {"\"dataset_size\" must be a whole number"});
  shuffle["dataset_size"] = -5;
  test::check_error<std::invalid_argument>([&] { privacy::accountant_from_json(shuffle); }, {"must be in [1,"});
  json rdp = {{"accountant", "rdp"}, {"orders", {2.0, 2.9e83}}};
  test::check_error<std::invalid_argument>([&] { privacy::accountant_from_json(rdp); }, {"rdp orders must be in (1, 1e6]"});
}

TEST_CASE("checkpoint hardening: a state.json of the wrong JSON type is refused by name (found by fuzzing)") {
  Run run;
  test::TempDir dir("dpgrad-ckpt-type");
  run.write(dir.path, 1);
  const std::string saved = slurp(latest(dir.path) / "state.json");
  for (const char* bad : {"3", "[]", "\"text\"", "null"}) {
    CAPTURE(bad);
    tamper(dir.path, "state.json", bad);
    test::check_error<CheckpointError>([&] { CheckpointDir(dir.path).read_extra(); }, {"state.json is not a JSON object"});
    test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"state.json"});
  }
  json s = json::parse(saved);
  s["extra"] = 7;
  tamper(dir.path, "state.json", s.dump());
  test::check_error<CheckpointError>([&] { CheckpointDir(dir.path).read_extra(); }, {"'extra' is not a JSON object"});
  tamper(dir.path, "state.json", saved);
  CHECK(CheckpointDir(dir.path).read_extra().is_object());
  run.resume(dir.path);
}

namespace {

/// A finished run of `steps` steps checkpointed in `dir` (sigma 1, q 0.1), whose
/// epsilon is what a resume must report at the end.
double finished_run(Run& run, const fs::path& dir, int steps) {
  FastRng init(1);
  auto model = make_mlp<double>({6, 2}, Activation::relu, init);
  SgdT<double> sgd(model->parameters(), 0.1);
  PrivateTrainerT<double> t(*model, sgd, run.data, run.config);
  for (int i = 0; i < steps; ++i) t.step();
  t.save(dir);
  return t.epsilon();
}

/// The epsilon a resume from `dir` reports, or the error that refused it.
std::string resumed_epsilon(Run& run, const fs::path& dir) {
  try {
    FastRng init(1);
    auto model = make_mlp<double>({6, 2}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainerT<double> t(*model, sgd, run.data, run.config, dir);
    return "epsilon " + std::to_string(t.epsilon());
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("forged checkpoints: every edit without the run's key is refused (before: epsilon 0, 0.0862, 1.9568)") {
  Run run;
  run.config.epochs = 100;
  run.config.max_steps = 20;
  test::TempDir dir("dpgrad-forged");
  const double truth = finished_run(run, dir.path, 20);
  REQUIRE(truth > 0);
  CHECK(resumed_epsilon(run, dir.path) == "epsilon " + std::to_string(truth));
  const std::string state = slurp(latest(dir.path) / "state.json");
  const json manifest = json::parse(slurp(latest(dir.path) / "manifest.json"));
  auto forged = [&](auto edit) {
    edit_state(dir.path, edit, false);  // the manifest's hashes recomputed, as anyone can: no MAC
    const std::string r = resumed_epsilon(run, dir.path);
    INFO(r);
    CHECK(r.find("does not match its MAC") != std::string::npos);
    tamper(dir.path, "state.json", state);
  };
  forged([](json& s) { s["accountant"]["ledger"] = json::array(); });                      // "epsilon so far 0"
  forged([](json& s) { s["extra"]["trainer"]["noise_multiplier"] = 10.0; });                // sigma 10 recorded
  forged([](json& s) { s["accountant"]["ledger"][0]["noise_multiplier"] = 10.0; });
  forged([](json& s) { s["accountant"]["ledger"][0]["sampling_rate"] = 0.01; });            // q
  forged([](json& s) { s["extra"]["trainer"]["total_steps"] = 1000; });                     // total_steps
  forged([](json& s) { s["accountant"]["ledger"][0]["count"] = 5; });
  // a renamed step folder, its state and ledger edited to match
  {
    const fs::path old_root = latest(dir.path);
    fs::rename(old_root, dir.path / "step-00000005");
    std::ofstream(dir.path / "latest", std::ios::trunc) << "step-00000005\n";
    edit_state(dir.path, [](json& s) { s["step"] = 5; s["accountant"]["ledger"][0]["count"] = 5; }, false);
    json m = json::parse(slurp(latest(dir.path) / "manifest.json"));
    m["step"] = 5;
    write_manifest(dir.path, m, false);
    const std::string r = resumed_epsilon(run, dir.path);
    INFO(r);
    CHECK(r.find("does not match its MAC") != std::string::npos);
    // even with the key, step 5 is below the run's high-water mark of 20
    write_manifest(dir.path, m, true);
    const std::string r2 = resumed_epsilon(run, dir.path);
    CHECK(r2.find("has saved step 20") != std::string::npos);
  }
}

TEST_CASE("checkpoint keys: an older copy is refused; a missing key says why; one process per run; files 0600") {
  Run run;
  run.config.epochs = 100;
  run.config.max_steps = 30;
  test::TempDir dir("dpgrad-keys");
  const fs::path ck = dir.path / "ck", copy = dir.path / "copy";
  {
    FastRng init(1);
    auto model = make_mlp<double>({6, 2}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainerT<double> t(*model, sgd, run.data, run.config);
    for (int i = 0; i < 10; ++i) t.step();
    t.save(ck);
    fs::copy(ck, copy, fs::copy_options::recursive);  // a copy kept at step 10
    // while this run holds its key, a second process cannot continue it
    CHECK(resumed_epsilon(run, copy).find("another process is continuing run") != std::string::npos);
    for (int i = 0; i < 10; ++i) t.step();
    t.save(ck);  // step 20: the high-water mark moves
  }
  // the copy's steps 11..20 were released by the original: re-drawing them would be free, so it is refused
  CHECK(resumed_epsilon(run, copy).find("has saved step 20") != std::string::npos);
  CHECK(resumed_epsilon(run, ck).rfind("epsilon ", 0) == 0);
  // files and folders are the user's only
  for (const auto& e : fs::recursive_directory_iterator(ck)) {
    if (e.path().filename() == ".lock") continue;
    const auto perms = fs::status(e.path()).permissions();
    CAPTURE(e.path().string());
    CHECK((perms & (fs::perms::group_all | fs::perms::others_all)) == fs::perms::none);
  }
  // a key store without the run's key: refused, saying why
  test::TempDir other("dpgrad-other-store");
  fs::permissions(other.path, fs::perms::owner_all);
  run.config.checkpoints.key_store = other.path;
  const std::string missing = resumed_epsilon(run, ck);
  CHECK(missing.find("is not in the key store") != std::string::npos);
  // a key store open to other users is refused
  fs::permissions(other.path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  CHECK(resumed_epsilon(run, ck).find("open to other users") != std::string::npos);
}

TEST_CASE("checkpoint hardening: no symbolic link is followed below the checkpoint directory") {
  Run run;
  test::TempDir dir("dpgrad-links");
  const fs::path ck = dir.path / "ck", outside = dir.path / "outside";
  run.write(ck, 2);
  const fs::path root = latest(ck);
  const std::string name = root.filename().string();
  SUBCASE("a step folder that is a link") {
    fs::rename(root, outside);
    fs::create_directory_symlink(outside, root);
    test::check_error<CheckpointError>([&] { run.resume(ck); }, {name, "symbolic link"});
  }
  SUBCASE("params/ that is a link") {
    fs::rename(root / "params", outside);
    fs::create_directory_symlink(outside, root / "params");
    test::check_error<CheckpointError>([&] { run.resume(ck); }, {"params", "symbolic link"});
  }
  SUBCASE("latest that is a link") {
    fs::rename(ck / "latest", outside);
    fs::create_symlink(outside, ck / "latest");
    test::check_error<CheckpointError>([&] { run.resume(ck); }, {"latest", "symbolic link"});
  }
  SUBCASE("the checkpoint directory itself may be a link (the user's own path)") {
    const fs::path link = dir.path / "link";
    fs::create_directory_symlink(ck, link);
    run.resume(link);
  }
}

TEST_CASE("checkpoint hardening: deep JSON, fractional steps, non-finite values and odd bytes are named") {
  Run run;
  test::TempDir dir("dpgrad-odd");
  run.write(dir.path, 2);
  const std::string state = slurp(latest(dir.path) / "state.json");
  SUBCASE("nested a million levels deep in extra") {
    json s = json::parse(state);
    std::string text = s.dump();
    const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
    text.insert(text.size() - 1, ",\"deep\":" + deep);
    tamper(dir.path, "state.json", text);
    test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"state.json", "deeper than 64 levels"});
    test::check_error<CheckpointError>([&] { CheckpointDir(dir.path).read_extra(); }, {"deeper than 64 levels"});
  }
  SUBCASE("a step of 2.5") {
    edit_state(dir.path, [](json& s) { s["step"] = 2.5; });
    test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"step must be a whole number, got 2.5"});
  }
  SUBCASE("a non-finite parameter") {
    const json m = json::parse(slurp(latest(dir.path) / "manifest.json"));
    std::string param;
    for (const auto& [rel, info] : m["files"].items())
      if (rel.rfind("params/", 0) == 0) param = rel;
    std::string bytes = slurp(latest(dir.path) / param);
    const double inf = INFINITY;
    std::memcpy(bytes.data() + bytes.size() - sizeof inf, &inf, sizeof inf);
    tamper(dir.path, param, bytes);
    test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {param, "non-finite value"});
  }
  SUBCASE("a NUL byte in latest") {
    std::ofstream(dir.path / "latest", std::ios::binary | std::ios::trunc) << std::string("step-0\0/../x", 12);
    test::check_error<CheckpointError>([&] { run.resume(dir.path); }, {"latest does not name a checkpoint", "\\x00/../x"});
  }
}

TEST_CASE("checkpoint hardening: a resumed run may go on longer under a larger budget, at its own noise, its ledger continued") {
  test::TempDir dir("dpgrad-longer");
  Run run;
  run.config.noise_multiplier.reset();
  run.config.target_epsilon = 4.0;  // calibrated for 2 epochs: 20 steps
  run.config.checkpoints.dir = dir.path;
  double sigma = 0;
  {
    FastRng init(1);
    auto model = make_mlp<double>({6, 2}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainerT<double> t(*model, sgd, run.data, run.config);
    CHECK(t.extension().empty());
    const TrainResult r = t.train();
    CHECK(r.status == RunStatus::complete);
    REQUIRE(t.steps_done() == 20);
    sigma = t.noise_multiplier();
    CHECK(t.epsilon() <= 4.0);
  }
  auto resume = [&](double epochs, std::optional<double> target) {
    FastRng init(1);
    auto model = make_mlp<double>({6, 2}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainingConfigT<double> c = run.config;
    c.epochs = epochs;
    c.target_epsilon = target;
    c.checkpoints.resume = true;
    auto t = std::make_unique<PrivateTrainerT<double>>(*model, sgd, run.data, c);
    const long done = t->steps_done();
    const std::string extension = t->extension();
    const double noise = t->noise_multiplier();
    const long total = t->total_steps();
    const TrainResult r = t->train();
    return std::make_tuple(done, extension, noise, total, t->steps_done(), t->epsilon(),
                           t->accountant()->total_steps(), r.status);
  };
  // the same budget, more epochs: the run's sigma takes it no further than the target allows
  {
    const auto [done, ext, noise, total, after, eps, ledger, status] = resume(4, 4.0);
    CHECK(done == 20);
    CHECK(ext == "epochs 2.0 -> 4.0");
    CHECK(noise == sigma);  // never recalibrated
    CHECK(eps <= 4.0);
    CHECK(after == total);
    CHECK(ledger == after);
    CHECK(status == (total < 40 ? RunStatus::stopped_by_budget : RunStatus::complete));
  }
  // a larger budget: more steps at the same sigma, the ledger continued, epsilon within the new target
  long before = 0;
  {
    FastRng init(1);
    auto model = make_mlp<double>({6, 2}, Activation::relu, init);
    SgdT<double> sgd(model->parameters(), 0.1);
    PrivateTrainingConfigT<double> c = run.config;
    c.epochs = 4;
    c.checkpoints.resume = true;
    PrivateTrainerT<double> t(*model, sgd, run.data, c);
    before = t.steps_done();
  }
  {
    const auto [done, ext, noise, total, after, eps, ledger, status] = resume(6, 8.0);
    CHECK(done == before);
    // the checkpoint records the settings of the last session that took a step
    CHECK(ext == (before > 20 ? "epochs 4.0 -> 6.0, target_epsilon 4.0 -> 8.0" : "epochs 2.0 -> 6.0, target_epsilon 4.0 -> 8.0"));
    CHECK(noise == sigma);
    CHECK(after > before);
    CHECK(ledger == after);
    CHECK(eps <= 8.0);
    CHECK(eps > 4.0);
    (void)status;
  }
  // shorter, or a smaller budget: refused, naming the change
  test::check_error<std::invalid_argument>([&] { resume(5, 8.0); }, {"epochs (checkpoint 6.0, now 5.0)", "may only go on longer"});
  test::check_error<std::invalid_argument>([&] { resume(6, 7.0); }, {"target_epsilon (checkpoint 8.0, now 7.0)"});
  test::check_error<std::invalid_argument>([&] { resume(6, std::nullopt); }, {"needs a noise_multiplier or a target_epsilon"});
}

TEST_CASE("checkpoint hardening: a resume that changes the run's settings is refused, listing each change") {
  test::TempDir dir("dpgrad-settings");
  Run run;
  run.config.target_epsilon = 50.0;  // with the noise multiplier: a budget the run stays within
  run.write(dir.path, 3);
  run.resume(dir.path);  // the same settings: fine
  struct Change {
    const char* what;
    std::function<void(PrivateTrainingConfigT<double>&)> apply;
    const char* says;
  };
  const std::vector<Change> changes = {
      {"fewer epochs", [](auto& c) { c.epochs = 1; }, "epochs (checkpoint 2.0, now 1.0)"},
      {"a smaller target epsilon", [](auto& c) { c.target_epsilon = 40.0; }, "target_epsilon (checkpoint 50.0, now 40.0)"},
      {"noise multiplier", [](auto& c) { c.noise_multiplier = 2.0; }, "noise_multiplier (checkpoint 1.0, now 2.0)"},
      {"clip norm", [](auto& c) { c.clip_norm = 0.5; }, "clip_norm (checkpoint 1.0, now 0.5)"},
  };
  for (const auto& change : changes) {
    CAPTURE(change.what);
    Run changed = run;
    change.apply(changed.config);
    test::check_error<std::invalid_argument>([&] { changed.resume(dir.path); },
                                             {"is of a run with other settings: ", change.says,
                                              "a resumed run keeps its settings"});
  }
  // all four at once: each is listed
  Run all = run;
  for (const auto& change : changes) change.apply(all.config);
  std::vector<std::string> says = {"is of a run with other settings"};
  for (const auto& change : changes) says.push_back(change.says);
  test::check_error<std::invalid_argument>([&] { all.resume(dir.path); }, says);
}

TEST_CASE("checkpoint keys: a key file open to other users or of another user is refused, naming it and the fix") {
  test::TempDir store("dpgrad-key-files");
  fs::permissions(store.path, fs::perms::owner_all);
  std::string id;
  {
    const auto key = RunKey::create(store.path);
    id = key->run_id();
  }
  const fs::path file = store.path / (id + ".key");
  CHECK_NOTHROW(RunKey::open(id, store.path));
  // 0644: any local user could read the key and forge the run's checkpoints
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  for (const bool lock : {true, false}) {
    CAPTURE(lock);
    test::check_error<CheckpointError>([&] { lock ? RunKey::open(id, store.path) : RunKey::peek(id, store.path); },
                                       {file.string(), "open to other users (mode 644)", "chmod 600"});
  }
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_write);
  test::check_error<CheckpointError>([&] { RunKey::open(id, store.path); }, {file.string(), "mode 620"});
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
  CHECK_NOTHROW(RunKey::open(id, store.path));
  // another user's file (only root can make one here)
  if (::geteuid() == 0) {
    REQUIRE(::chown(file.c_str(), 65534, 65534) == 0);
    test::check_error<CheckpointError>([&] { RunKey::open(id, store.path); }, {file.string(), "belongs to another user"});
  } else {
    MESSAGE("not root: the other-owner case is not exercised");
  }
}

TEST_CASE("checkpoint hardening: the folders a checkpoint creates, its own and missing parents, are 0700") {
  test::TempDir dir("dpgrad-folders");
  fs::permissions(dir.path, fs::perms::owner_all);
  Run run;
  run.write(dir.path / "runs" / "ck", 2);
  for (const fs::path& p : {dir.path / "runs", dir.path / "runs" / "ck"}) {
    CAPTURE(p.string());
    CHECK((fs::status(p).permissions() & (fs::perms::group_all | fs::perms::others_all)) == fs::perms::none);
  }
  // a folder the user made is left as it is
  fs::create_directory(dir.path / "mine");
  fs::permissions(dir.path / "mine", fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  run.write(dir.path / "mine" / "ck", 1);
  CHECK((fs::status(dir.path / "mine").permissions() & fs::perms::group_read) == fs::perms::group_read);
  CHECK((fs::status(dir.path / "mine" / "ck").permissions() & (fs::perms::group_all | fs::perms::others_all)) ==
        fs::perms::none);
}

TEST_CASE("checkpoint keys: the library's trainer checks the key store when it starts, not at its first save") {
  Run run;
  test::TempDir dir("dpgrad-store-check");
  const fs::path open_store = dir.path / "open";
  fs::create_directory(open_store);
  fs::permissions(open_store, fs::perms::all);  // 0777: other users could read the keys
  run.config.checkpoints.dir = dir.path / "ck";
  run.config.checkpoints.key_store = open_store;
  FastRng init(3);
  auto model = make_mlp<double>({6, 2}, Activation::relu, init);
  SgdT<double> sgd(model->parameters(), 0.1);
  test::check_error<std::invalid_argument>([&] { PrivateTrainerT<double> t(*model, sgd, run.data, run.config); },
                                           {open_store.string()});
  fs::permissions(open_store, fs::perms::owner_all);  // 0700: fine
  PrivateTrainerT<double> ok(*model, sgd, run.data, run.config);
  ok.step();
}
