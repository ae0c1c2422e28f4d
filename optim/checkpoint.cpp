// Checkpoints: see checkpoint.hpp.
#include "optim/checkpoint.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <xtensor/xnpy.hpp>  // dump_npy: writing

#include "engine/random.hpp"
#include "optim/npy.hpp"
#include "optim/optimizer.hpp"
#include "optim/sampler.hpp"
#include "privacy/accountant.hpp"

namespace dpgrad {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "dpgrad-checkpoint";
constexpr int kVersion = 1;

[[noreturn]] void fail(const std::string& what) { throw CheckpointError("checkpoint: " + what); }


void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) fail("cannot open " + p.string() + ": " + std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("cannot flush " + p.string() + " to disk: " + std::strerror(errno));
}

/// Writes `bytes` to `path` and flushes it to disk.
void write_file(const fs::path& path, const std::string& bytes) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create " + path.string() + ": " + std::strerror(errno));
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.flush();
    if (!out) fail("cannot write " + path.string() + " (disk full?)");
  }
  fsync_path(path, false);
}

/// Reads a regular file of at most `max_bytes` (a symbolic link, FIFO, device or
/// folder in its place is an error, not a read that blocks or never ends).
std::string read_file(const fs::path& path, std::size_t max_bytes = std::size_t(1) << 34) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    fail("cannot read " + path.string() + ": " +
         (errno == ELOOP ? std::string("it is a symbolic link, which a checkpoint never holds") : std::strerror(errno)));
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot read " + path.string() + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path.string() + " is not a regular file");
  if (std::size_t(st.st_size) > max_bytes)
    fail(path.string() + " has " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
         " expected");
  std::string out(std::size_t(st.st_size), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::read(fd, out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("cannot read " + path.string() + ": " + (r < 0 ? std::strerror(errno) : "it shrank"));
    done += std::size_t(r);
  }
  return out;
}

/// A manifest's relative path: letters, digits, '.', '_', '-' and '/', no empty,
/// '.' or '..' component, not absolute: it stays inside the checkpoint.
bool safe_relative_path(const std::string& rel) {
  if (rel.empty() || rel.size() > 512 || rel.front() == '/') return false;
  for (char c : rel)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '/')) return false;
  std::size_t start = 0;
  while (start <= rel.size()) {
    const std::size_t end = std::min(rel.find('/', start), rel.size());
    const std::string part = rel.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

/// Replaces `path` by a file holding `bytes`, atomically (temp file + rename).
void replace_file(const fs::path& path, const std::string& bytes) {
  fs::path tmp = path;
  tmp += ".tmp" + std::to_string(::getpid());
  write_file(tmp, bytes);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  fsync_path(path.parent_path(), true);
}

std::string step_name(long step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08ld", step);
  return buf;
}

/// File-name-safe version of a parameter or buffer name.
std::string safe(const std::string& name) {
  std::string s;
  for (char c : name) s.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_');
  return s;
}

/// Collects files of a checkpoint being written, with their hashes for the manifest.
class Writer {
 public:
  explicit Writer(fs::path root) : root_(std::move(root)) {}
  void add(const std::string& rel, const std::string& bytes) {
    fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    write_file(p, bytes);
    files_[rel] = {{"bytes", bytes.size()}, {"blake2b", checkpoint_file_hash(bytes)}};
  }
  template <class T>
  void add_array(const std::string& rel, const ArrayT<T>& a) {
    add(rel, xt::dump_npy(a));
  }
  const json& files() const { return files_; }

 private:
  fs::path root_;
  json files_ = json::object();
};

/// Reads files of a verified checkpoint.
class Reader {
 public:
  explicit Reader(fs::path root) : root_(std::move(root)) {
    std::string m = read_file(root_ / "manifest.json", std::size_t(64) << 20);
    try {
      manifest_ = json::parse(m);
    } catch (const json::exception& e) {
      fail(root_.string() + "/manifest.json is not valid JSON (" + e.what() + ")");
    }
    if (!manifest_.is_object() || manifest_.value("format", "") != kFormat)
      fail(root_.string() + "/manifest.json is not a dpgrad checkpoint manifest");
    if (manifest_.value("version", 0) != kVersion)
      fail(root_.string() + ": unsupported checkpoint version " + manifest_.value("version", json()).dump());
    if (!manifest_.contains("files") || !manifest_["files"].is_object())
      fail(root_.string() + "/manifest.json lists no files");
    for (auto& [rel, info] : manifest_["files"].items()) bytes(rel);  // verify all before touching anything
  }
  std::string bytes(const std::string& rel) const {
    const json& files = manifest_["files"];
    if (!safe_relative_path(rel))
      fail(root_.string() + "/manifest.json names '" + rel.substr(0, 200) + "', which is not a path inside the checkpoint");
    if (!files.contains(rel)) fail(root_.string() + ": " + rel + " is not in the manifest");
    fs::path p = root_ / rel;
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(p, ec))) fail(p.string() + " is missing");
    const json& info = files[rel];
    if (!info.is_object() || !info.contains("bytes") || !info["bytes"].is_number_unsigned())
      fail(root_.string() + "/manifest.json gives no size for " + rel);
    const std::size_t expected = info["bytes"].get<std::size_t>();
    std::string b = read_file(p, expected);  // never reads more than the manifest says
    if (b.size() != expected)
      fail(p.string() + " has " + std::to_string(b.size()) + " bytes; the manifest says " + std::to_string(expected) +
           " (truncated or modified)");
    if (checkpoint_file_hash(b) != info.value("blake2b", ""))
      fail(p.string() + " does not match its hash in the manifest (corrupted or modified)");
    return b;
  }
  /// The step the manifest names.
  long step() const {
    const json& v = manifest_.value("step", json());
    if (!v.is_number_integer()) fail(root_.string() + "/manifest.json names no step");
    return v.get<long>();
  }
  json json_file(const std::string& rel) const {
    try {
      return json::parse(bytes(rel));
    } catch (const json::exception& e) {
      fail(root_.string() + "/" + rel + " is not valid JSON (" + e.what() + ")");
    }
  }
  template <class T>
  ArrayT<T> array(const std::string& rel, const Shape& expected, const std::string& what) const {
    ArrayT<T> a;
    try {
      a = read_npy<T>(bytes(rel), root_.string() + "/" + rel + " (" + what + ")");
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
    if (shape_of(a) != expected)
      fail(root_.string() + "/" + rel + ": " + what + " has shape " + shape_str(shape_of(a)) + ", the model needs " +
           shape_str(expected));
    return a;
  }

 private:
  fs::path root_;
  json manifest_;
};

}  // namespace

std::string checkpoint_file_hash(const std::string& bytes) {
  if (sodium_init() < 0) fail("libsodium failed to initialise");
  unsigned char h[32];
  crypto_generichash(h, sizeof(h), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), nullptr, 0);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : h) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

CheckpointDir::CheckpointDir(fs::path dir, int keep) : dir_(std::move(dir)), keep_(keep < 1 ? 1 : keep) {}

bool CheckpointDir::has_checkpoint() const { return fs::exists(dir_ / "latest"); }

fs::path CheckpointDir::latest_dir() const {
  if (!has_checkpoint()) fail("no checkpoint in " + dir_.string() + " (no 'latest' file)");
  std::string name = read_file(dir_ / "latest", 256);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos)
    fail(dir_.string() + "/latest does not name a checkpoint ('" + name.substr(0, 80) + "')");
  fs::path p = dir_ / name;
  if (!fs::is_directory(p)) fail(dir_.string() + "/latest names " + name + ", which does not exist");
  return p;
}

long CheckpointDir::latest_step() const {
  std::string name = latest_dir().filename().string();
  try {
    return std::stol(name.substr(5));
  } catch (const std::exception&) {
    fail(dir_.string() + "/latest names '" + name + "', which has no step number");
  }
}

json CheckpointDir::read_extra() const {
  const fs::path root = latest_dir();
  Reader r(root);
  const json s = r.json_file("state.json");
  if (!s.is_object()) fail(root.string() + "/state.json is not a JSON object");
  if (!s.contains("extra")) return json::object();
  if (!s["extra"].is_object()) fail(root.string() + "/state.json: its 'extra' is not a JSON object");
  return s["extra"];
}

template <class T>
fs::path CheckpointDir::save(long step, const TrainingStateT<T>& st, const json& extra) const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) fail("cannot create " + dir_.string() + ": " + ec.message());
  const std::string name = step_name(step);
  fs::path tmp = dir_ / (".partial-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) fail("cannot create " + tmp.string() + ": " + ec.message());

  Writer w(tmp);
  json state = {{"step", step}, {"extra", extra}};
  json params = json::array();
  for (std::size_t i = 0; i < st.params.size(); ++i) {
    char idx[32];
    std::snprintf(idx, sizeof(idx), "%03zu-", i);
    std::string rel = "params/" + std::string(idx) + safe(st.params[i].name()) + ".npy";
    w.add_array(rel, st.params[i].value());
    params.push_back({{"name", st.params[i].name()}, {"file", rel}, {"shape", shape_of(st.params[i].value())}});
  }
  state["params"] = params;
  bool optimizer_files = false;
  if (st.optimizer) {
    json buffers = json::object();
    std::size_t i = 0;
    for (const auto& [key, value] : st.optimizer->state()) {
      char idx[32];
      std::snprintf(idx, sizeof(idx), "%03zu-", i++);
      std::string rel = "optimizer/" + std::string(idx) + safe(key) + ".npy";
      w.add_array(rel, value);
      buffers[key] = {{"file", rel}, {"shape", shape_of(value)}};
      optimizer_files = true;
    }
    state["optimizer"] = {{"name", st.optimizer->name()}, {"steps", st.optimizer->steps()},
                          {"lr", st.optimizer->lr()}, {"buffers", buffers}};
  }
  json arrays = json::object();
  std::size_t n_arrays = 0;
  for (const auto& [key, value] : st.arrays) {
    char idx[32];
    std::snprintf(idx, sizeof(idx), "%03zu-", n_arrays++);
    std::string rel = "arrays/" + std::string(idx) + safe(key) + ".npy";
    w.add_array(rel, *value);
    arrays[key] = {{"file", rel}, {"shape", shape_of(*value)}};
  }
  state["arrays"] = arrays;
  if (st.sampler) state["sampler"] = {{"name", st.sampler->name()}, {"state", st.sampler->state()}};
  json gens = json::object();
  for (const auto& [role, rng] : st.generators)
    gens[role] = {{"secure", rng->secure()}, {"state", rng->state()}};
  state["generators"] = gens;
  if (st.accountant) state["accountant"] = st.accountant->to_json();
  w.add("state.json", state.dump(1));
  write_file(tmp / "manifest.json",
             json{{"format", kFormat}, {"version", kVersion}, {"step", step}, {"files", w.files()}}.dump(1));
  fsync_path(tmp / "params", true);
  if (optimizer_files) fsync_path(tmp / "optimizer", true);  // plain SGD has no buffers, so no folder
  if (!st.arrays.empty()) fsync_path(tmp / "arrays", true);
  fsync_path(tmp, true);

  // A second checkpoint of the same step (say, at the end of a run) gets a new
  // name: the one `latest` names is never removed before `latest` moves on.
  std::string final_name = name;
  for (int k = 1; fs::exists(dir_ / final_name); ++k) final_name = name + "." + std::to_string(k);
  fs::path final_dir = dir_ / final_name;
  fs::rename(tmp, final_dir, ec);
  if (ec) fail("cannot rename " + tmp.string() + " to " + final_dir.string() + ": " + ec.message());
  fsync_path(dir_, true);
  replace_file(dir_ / "latest", final_name + "\n");

  // Older checkpoints beyond `keep`, and partial ones of earlier (killed) runs.
  std::vector<fs::path> steps;
  for (const auto& e : fs::directory_iterator(dir_)) {
    std::string f = e.path().filename().string();
    if (f.rfind("step-", 0) == 0 && e.is_directory()) steps.push_back(e.path());
    else if (f.rfind(".partial-", 0) == 0) fs::remove_all(e.path(), ec);
  }
  std::sort(steps.begin(), steps.end());
  for (std::size_t i = 0; i + std::size_t(keep_) < steps.size(); ++i)
    if (steps[i] != final_dir) fs::remove_all(steps[i], ec);
  return final_dir;
}

template <class T>
long CheckpointDir::load(TrainingStateT<T>& st) const {
  fs::path root = latest_dir();
  Reader r(root);
  json s = r.json_file("state.json");
  const std::string where = root.string() + "/state.json";
  try {
    // ---- read and check everything first
    const long step = s.at("step").get<long>();
    if (step < 0) fail(where + ": step " + std::to_string(step) + " is negative");
    if (step != r.step() || step != latest_step())
      fail(where + ": step " + std::to_string(step) + " does not match the manifest's " + std::to_string(r.step()) +
           " and the folder's " + std::to_string(latest_step()));
    if (!s.contains("params") || !s["params"].is_array()) fail(where + " has no parameter list");
    const json& plist = s["params"];
    if (plist.size() != st.params.size())
      fail(where + " holds " + std::to_string(plist.size()) + " parameters; the model has " +
           std::to_string(st.params.size()) + " (a different model?)");
    std::vector<ArrayT<T>> values;
    for (std::size_t i = 0; i < plist.size(); ++i) {
      const std::string name = plist[i].at("name").get<std::string>();
      if (name != st.params[i].name())
        fail(where + ": parameter " + std::to_string(i) + " is '" + name + "', the model's is '" +
             st.params[i].name() + "' (a different model?)");
      values.push_back(r.template array<T>(plist[i].at("file").get<std::string>(), shape_of(st.params[i].value()),
                                  "parameter '" + name + "'"));
    }
    std::map<std::string, ArrayT<T>> buffers;
    long opt_steps = 0;
    if (st.optimizer) {
      if (!s.contains("optimizer")) fail(where + " has no optimizer state");
      const json& o = s["optimizer"];
      if (o.at("name").get<std::string>() != st.optimizer->name())
        fail(where + ": optimizer was '" + o.at("name").get<std::string>() + "', this run uses '" +
             st.optimizer->name() + "'");
      opt_steps = o.at("steps").get<long>();
      auto expected = st.optimizer->state();
      if (o.at("buffers").size() != expected.size())
        fail(where + ": optimizer state has " + std::to_string(o.at("buffers").size()) + " buffers, expected " +
             std::to_string(expected.size()));
      for (auto& [key, info] : o.at("buffers").items()) {
        auto it = expected.find(key);
        if (it == expected.end()) fail(where + ": unexpected optimizer buffer '" + key + "'");
        buffers[key] = r.template array<T>(std::string(info.at("file")), shape_of(it->second), "optimizer buffer '" + key + "'");
      }
    }
    std::map<std::string, ArrayT<T>> arrays;
    const json stored_arrays = s.value("arrays", json::object());
    if (stored_arrays.size() != st.arrays.size())
      fail(where + " holds " + std::to_string(stored_arrays.size()) + " further arrays, this run needs " +
           std::to_string(st.arrays.size()));
    for (const auto& [key, target] : st.arrays) {
      if (!stored_arrays.contains(key)) fail(where + " has no array '" + key + "'");
      arrays[key] = r.template array<T>(std::string(stored_arrays[key].at("file")), shape_of(*target), "array '" + key + "'");
    }
    if (st.sampler) {
      if (!s.contains("sampler")) fail(where + " has no sampler state");
      if (s["sampler"].at("name").get<std::string>() != st.sampler->name())
        fail(where + ": sampler was '" + s["sampler"].at("name").get<std::string>() + "', this run uses '" +
             st.sampler->name() + "'");
    }
    const json gens = s.value("generators", json::object());
    for (const auto& [role, rng] : st.generators) {
      if (!gens.contains(role)) fail(where + " has no state for the " + role + " generator");
      if (bool(gens[role].at("secure")) != rng->secure())
        fail(where + ": the " + role + " generator was " + (rng->secure() ? "fast" : "secure") + ", this run's is " +
             (rng->secure() ? "secure" : "fast"));
    }
    std::unique_ptr<privacy::Accountant> acc;
    if (st.accountant) {
      if (!s.contains("accountant")) fail(where + " has no accountant ledger");
      if (!st.accountant->ledger().empty()) fail("the accountant to restore into has already recorded steps");
      acc = privacy::accountant_from_json(s["accountant"]);
      if (acc->name() != st.accountant->name())
        fail(where + ": the ledger is for the " + acc->name() + " accountant, this run uses " + st.accountant->name());
    }

    // ---- then restore (generators and sampler validate their own state)
    for (const auto& [role, rng] : st.generators) rng->set_state(std::string(gens[role].at("state")));
    if (st.sampler) st.sampler->load_state(s["sampler"].at("state"));
    if (st.accountant) privacy::replay_ledger(*st.accountant, s["accountant"]);
    for (std::size_t i = 0; i < values.size(); ++i) st.params[i].mutable_value() = values[i];
    for (auto& [key, target] : st.arrays) *target = arrays[key];
    if (st.optimizer) {
      st.optimizer->load_state(buffers, opt_steps);
      st.optimizer->set_lr(s["optimizer"].at("lr").get<double>());
    }
    return step;
  } catch (const json::exception& e) {
    fail(where + " is malformed (" + e.what() + ")");
  } catch (const std::invalid_argument& e) {
    fail(where + ": " + e.what());
  }
}

CheckpointLock::CheckpointLock(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create the checkpoint directory " + dir.string() + ": " + ec.message());
  const fs::path lock = dir / ".lock";
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) fail("cannot write in the checkpoint directory " + dir.string() + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK) fail("another run is using the checkpoint directory " + dir.string() + " (it holds its lock)");
    fail("cannot lock the checkpoint directory " + dir.string() + ": " + std::strerror(e));
  }
  // what a save killed half-way left behind: no run can be writing it now
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(".partial-", 0) == 0) fs::remove_all(e.path(), ec);
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

template fs::path CheckpointDir::save(long, const TrainingStateT<float>&, const json&) const;
template fs::path CheckpointDir::save(long, const TrainingStateT<double>&, const json&) const;
template long CheckpointDir::load(TrainingStateT<float>&) const;
template long CheckpointDir::load(TrainingStateT<double>&) const;

}  // namespace dpgrad
