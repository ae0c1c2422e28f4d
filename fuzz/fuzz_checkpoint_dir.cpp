// libFuzzer harness: a whole checkpoint directory, as --resume reads it
// (CheckpointDir::read_extra and load: the `latest` pointer, the manifest,
// state.json, the npy arrays, the generators', sampler's, optimizer's and
// accountant's states).
//
// Input: byte 0 picks the run (its accountant: rdp, pld, wor, shuffle, gdp);
// byte 1 bit 0 asks for the manifest's sizes and hashes to be recomputed after
// the files are replaced, and its MAC under the run's key (as only the key's
// holder could), so that the reading behind the MAC and the manifest is reached
// (deep JSON in state.json, say). The rest is split on "@@@@": piece k replaces
// the k-th file of a valid checkpoint of that run (state.json, the arrays,
// manifest.json, manifest.mac, latest), the others stay as saved. Every problem
// must be a CheckpointError; anything else (a crash, another exception, a hang) is a bug.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/random.hpp"
#include "engine/tensor.hpp"
#include "optim/checkpoint/checkpoint.hpp"
#include "optim/optimizer.hpp"
#include "optim/sampling/sampler.hpp"
#include "privacy/accountant.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace dpgrad;

namespace {

const char* const kAccountants[] = {"rdp", "pld", "wor", "shuffle", "gdp"};

/// The pieces of a small run, fresh (nothing restored yet).
struct Run {
  std::vector<TensorT<float>> params;
  std::unique_ptr<AdamT<float>> adam;
  std::unique_ptr<Sampler> sampler;
  ReproducibleRng noise{3}, sampling{4};
  std::unique_ptr<privacy::Accountant> accountant;
  ArrayT<float> average = ArrayT<float>{1.0f, 2.0f, 3.0f};

  explicit Run(const std::string& accountant_name) {
    params.push_back(make_parameter<float>("w", ArrayT<float>{{0.5f, -1.0f}, {2.0f, 0.25f}}));
    params.push_back(make_parameter<float>("b", ArrayT<float>{0.1f, 0.2f}));
    adam = std::make_unique<AdamT<float>>(params, 0.01);
    const std::string sampler_name =
        accountant_name == "wor" ? "fixed" : accountant_name == "shuffle" ? "shuffle" : "poisson";
    sampler = make_sampler(sampler_name, 40, 8, accountant_name == "shuffle" ? 0.5 : 1.0);
    privacy::AccountantOptions ao;
    ao.dataset_size = 40;
    ao.batch_size = 8;
    if (accountant_name == "shuffle") ao.epoch_fraction = 0.5;
    accountant = privacy::make_accountant(accountant_name, ao);
  }
  TrainingStateT<float> state() {
    TrainingStateT<float> s;
    s.params = params;
    s.optimizer = adam.get();
    s.sampler = sampler.get();
    s.generators = {{"noise", &noise}, {"sampling", &sampling}};
    s.accountant = accountant.get();
    s.arrays["average"] = &average;
    return s;
  }
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// A saved checkpoint of each run, as files (relative path -> bytes), in the
/// order pieces of the input replace them.
struct Template {
  std::vector<std::pair<std::string, std::string>> files;
};

struct Fixture {
  fs::path root;
  std::vector<Template> templates;
  std::vector<std::unique_ptr<RunKey>> keys;

  Fixture() {
    char pattern[] = "/tmp/dpgrad-fuzz-checkpoint-XXXXXX";
    if (!mkdtemp(pattern)) std::abort();
    root = pattern;
    const fs::path store = root / "keys";
    fs::create_directory(store);
    fs::permissions(store, fs::perms::owner_all);
    setenv("DPGRAD_KEY_STORE", store.c_str(), 1);
    for (const char* name : kAccountants) {
      Run run(name);
      run.accountant->step(0.2, 1.1, 3);
      run.noise.normal();
      const fs::path dir = root / ("template-" + std::string(name));
      keys.push_back(RunKey::create(store));
      CheckpointDir(dir).save<float>(3, run.state(), json{{"note", "fuzz"}, {"epochs", 1.5}}, *keys.back());
      const std::string latest = read_all(dir / "latest");
      const fs::path step_dir = dir / std::string(latest.substr(0, latest.find('\n')));
      Template t;
      t.files.push_back({"state.json", read_all(step_dir / "state.json")});
      for (const char* sub : {"params", "optimizer", "arrays"}) {
        if (!fs::exists(step_dir / sub)) continue;
        std::vector<fs::path> names;  // in a fixed order, so that a saved input replays alike
        for (const auto& e : fs::directory_iterator(step_dir / sub)) names.push_back(e.path());
        std::sort(names.begin(), names.end());
        for (const auto& p : names) t.files.push_back({std::string(sub) + "/" + p.filename().string(), read_all(p)});
      }
      t.files.push_back({"manifest.json", read_all(step_dir / "manifest.json")});
      t.files.push_back({"manifest.mac", read_all(step_dir / "manifest.mac")});
      t.files.push_back({"../latest", latest});  // in the checkpoint directory, beside the step's folder
      templates.push_back(std::move(t));
    }
    // DPGRAD_FUZZ_SEEDS=DIR: writes, for each run, an input that spells out
    // all its files (the corpus's seeds that mutations start from)
    if (const char* seeds = std::getenv("DPGRAD_FUZZ_SEEDS")) {
      for (std::size_t k = 0; k < templates.size(); ++k) {
        std::string input{char(k), char(1)};
        for (std::size_t i = 0; i < templates[k].files.size(); ++i)
          input += (i ? "@@@@" : "") + templates[k].files[i].second;
        std::ofstream(fs::path(seeds) / ("files-" + std::string(kAccountants[k])), std::ios::binary) << input;
      }
    }
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};


}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture fixture;
  if (size < 2) return 0;
  const std::size_t which = data[0] % (sizeof(kAccountants) / sizeof(kAccountants[0]));
  const bool rehash = data[1] & 1;
  std::vector<std::pair<std::string, std::string>> files = fixture.templates[which].files;

  // the pieces
  const std::string rest(reinterpret_cast<const char*>(data + 2), size - 2);
  std::size_t start = 0, k = 0;
  while (!rest.empty() && start <= rest.size() && k < files.size()) {
    const std::size_t end = std::min(rest.find("@@@@", start), rest.size());
    files[k++].second = rest.substr(start, end - start);
    start = end + 4;
  }
  if (rehash) {  // the manifest as an editor would regenerate it, if it still parses
    for (auto& [rel, bytes] : files) {
      if (rel != "manifest.json") continue;
      json m = json::parse(bytes, nullptr, false);
      if (m.is_discarded() || !m.is_object()) break;
      json listed = json::object();
      for (const auto& [other, content] : files)
        if (other != "manifest.json" && other != "manifest.mac" && other != "../latest")
          listed[other] = {{"bytes", content.size()}, {"blake2b", checkpoint_file_hash(content)}};
      m["files"] = listed;
      bytes = m.dump();
      for (auto& [mac_rel, mac] : files)
        if (mac_rel == "manifest.mac") mac = fixture.keys[which]->mac(bytes);
    }
  }

  // written out as a checkpoint directory: dir/latest, dir/step-00000003/...
  const fs::path dir = fixture.root / "work";
  std::error_code ec;
  fs::remove_all(dir, ec);
  const fs::path step_dir = dir / "step-00000003";
  fs::create_directories(step_dir / "params");
  fs::create_directories(step_dir / "optimizer");
  fs::create_directories(step_dir / "arrays");
  for (const auto& [rel, bytes] : files) {
    std::ofstream out(rel == "../latest" ? dir / "latest" : step_dir / rel, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }

  Run run(kAccountants[which]);
  TrainingStateT<float> state = run.state();
  const CheckpointDir checkpoint(dir);
  try {
    (void)checkpoint.read_extra();
    (void)checkpoint.load(state, *fixture.keys[which]);
  } catch (const CheckpointError& e) {
    // the harness itself must reach the reading: a checkpoint left as saved loads
    if (rest.empty()) {
      std::fprintf(stderr, "a checkpoint left as saved was refused: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
