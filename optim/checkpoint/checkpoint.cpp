// Checkpoints: see checkpoint.hpp.
#include "optim/checkpoint/checkpoint.hpp"

#include "engine/files.hpp"

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
#include <cmath>
#include <optional>

#include <xtensor/xnpy.hpp>  // dump_npy: writing

#include "engine/communicator.hpp"
#include "engine/json.hpp"
#include "engine/random.hpp"
#include "optim/checkpoint/npy.hpp"
#include "optim/optimizer.hpp"
#include "optim/sampling/sampler.hpp"
#include "privacy/accountant.hpp"

namespace dpgrad {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "dpgrad-checkpoint";

[[noreturn]] void fail(const std::string& what) { throw CheckpointError("checkpoint: " + what); }

/// `text` fit for a message: at most 80 characters, control bytes and NULs shown as \xNN.
std::string printable(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < 80; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(char(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > 80) out += "...";
  return out;
}

/// A file descriptor closed at scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
};

void fsync_path(const fs::path& p, bool directory) {
  Fd f(::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC));
  if (f.fd < 0) fail("cannot open " + p.string() + ": " + std::strerror(errno));
  if (::fsync(f.fd) != 0) fail("cannot flush " + p.string() + " to disk: " + std::strerror(errno));
}

/// Writes `bytes` to a new file `path` (mode 0600, never through a link) and flushes it to disk.
void write_file(const fs::path& path, const std::string& bytes) {
  Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (f.fd < 0) fail("cannot create " + path.string() + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write " + path.string() + ": " + (w < 0 ? std::strerror(errno) : "disk full?"));
    done += std::size_t(w);
  }
  if (::fsync(f.fd) != 0) fail("cannot flush " + path.string() + " to disk: " + std::strerror(errno));
}

/// Creates the folders of `rel` below `root` (mode 0700), as far as they are missing.
void make_private_dirs(const fs::path& root, const fs::path& rel) {
  fs::path p = root;
  for (const auto& part : rel) {
    p /= part;
    if (::mkdir(p.c_str(), 0700) != 0 && errno != EEXIST) fail("cannot create " + p.string() + ": " + std::strerror(errno));
  }
}

/// Creates `dir` and those of its parents that are missing, each with mode 0700:
/// what a checkpoint folder holds, and how many there are (a search's trials),
/// is for its user alone. Folders that exist are left as they are.
void create_private_folders(const fs::path& dir, const std::string& what) {
  fs::path p;
  std::error_code ec;
  for (const auto& part : dir) {
    p /= part;
    if (part.empty() || fs::exists(p, ec)) continue;
    if (::mkdir(p.c_str(), 0700) != 0 && errno != EEXIST)
      fail("cannot create " + what + " " + dir.string() + " (" + p.string() + ": " + std::strerror(errno) + ")");
  }
  if (!fs::is_directory(dir, ec)) fail("cannot create " + what + " " + dir.string() + ": it is not a folder");
}

/// Why opening `what` failed, in words (a link or a loop named as such).
std::string open_error(int e) {
  if (e == ELOOP || e == EMLINK) return "it is a symbolic link, which a checkpoint never holds";
  if (e == ENOTDIR) return "it is not a folder (or a symbolic link to one, which a checkpoint never holds)";
  return std::strerror(e);
}

/// The folder `name` inside the folder open at `parent`, never through a symbolic link.
Fd open_dir_at(int parent, const std::string& name, const std::string& shown) {
  Fd f(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (f.fd < 0) fail("cannot open " + shown + ": " + open_error(errno));
  return f;
}

/// Reads the regular file `rel` (components separated by '/') below the folder open at
/// `root`, following no symbolic link at any level; at most `max_bytes`. `shown` names it.
std::string read_at(int root, const std::string& rel, std::size_t max_bytes, const std::string& shown) {
  std::vector<std::string> parts;
  for (std::size_t start = 0; start <= rel.size();) {
    const std::size_t end = std::min(rel.find('/', start), rel.size());
    parts.push_back(rel.substr(start, end - start));
    start = end + 1;
  }
  std::optional<Fd> dir;
  int at = root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    dir.emplace(open_dir_at(at, parts[i], shown));
    at = dir->fd;
  }
  Fd f(::openat(at, parts.back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (f.fd < 0) {
    const int e = errno;
    if (e == ENOENT) fail(shown + " is missing");
    fail("cannot read " + shown + ": " + open_error(e));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail("cannot read " + shown + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(shown + " is not a regular file");
  if (std::size_t(st.st_size) > max_bytes)
    fail(shown + " has " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
         " expected");
  std::string out(std::size_t(st.st_size), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::read(f.fd, out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("cannot read " + shown + ": " + (r < 0 ? std::strerror(errno) : "it shrank"));
    done += std::size_t(r);
  }
  return out;
}

/// The checkpoint directory itself (the user's path: a link to it is followed here, and nowhere below).
Fd open_root(const fs::path& dir) {
  Fd f(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (f.fd < 0) {
    const int e = errno;
    if (e == ENOENT) fail("no checkpoint in " + dir.string() + " (the folder does not exist)");
    fail("cannot open the checkpoint directory " + dir.string() + ": " + std::strerror(e));
  }
  return f;
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
  try {  // the one checked writer of output files: a scratch file created exclusively, fsynced, renamed
    write_output_file(path.string(), bytes, "checkpoint file", 0600);
  } catch (const std::runtime_error& e) {
    fail(std::string("cannot write ") + e.what());
  }
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
    make_private_dirs(root_, fs::path(rel).parent_path());
    write_file(root_ / rel, bytes);
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

/// A whole number from a JSON value that must be one (128.5 and "128" are refused).
long integer(const json& v, const std::string& what) {
  if (!v.is_number_integer()) fail(what + " must be a whole number, got " + printable(v.dump()));
  return v.get<long>();
}

/// The name `latest` holds: "step-" and a step, with an optional ".k" suffix.
std::string read_latest(int root, const fs::path& dir) {
  std::string name = read_at(root, "latest", 256, dir.string() + "/latest");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  bool ok = name.rfind("step-", 0) == 0 && name.size() > 5;
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.');
  if (!ok) fail(dir.string() + "/latest does not name a checkpoint ('" + printable(name) + "')");
  return name;
}

/// A verified checkpoint: its manifest's MAC under the run's key first, then
/// every file against the manifest, all read below one open folder.
class Reader {
 public:
  /// Opens the checkpoint `latest` names in `dir`. With `key`, the MAC is verified;
  /// without, only the run id is read (run_id()).
  Reader(const fs::path& dir, const RunKey* key) : root_fd_(open_root(dir)) {
    name_ = read_latest(root_fd_.fd, dir);
    root_ = dir / name_;
    step_fd_.emplace(open_dir_at(root_fd_.fd, name_, root_.string()));
    const std::string m = read_at(step_fd_->fd, "manifest.json", std::size_t(64) << 20, root_.string() + "/manifest.json");
    try {
      manifest_ = parse_json(m, root_.string() + "/manifest.json");
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
    if (!manifest_.is_object() || manifest_.value("format", "") != kFormat)
      fail(root_.string() + "/manifest.json is not a dpgrad checkpoint manifest");
    const json version = manifest_.value("version", json());
    if (version != kCheckpointVersion)
      fail(root_.string() + ": checkpoint format version " + printable(version.dump()) + "; this dpgrad reads version " +
           std::to_string(kCheckpointVersion) + (version == 1 ? " (version 1 checkpoints carry no key and cannot be "
                                                                "verified: start the run again)" : ""));
    const json id = manifest_.value("run", json());
    if (!id.is_string() || !valid_run_id(id.get<std::string>()))
      fail(root_.string() + "/manifest.json names no run id");
    run_id_ = id.get<std::string>();
    if (!key) return;
    if (key->run_id() != run_id_)
      fail(root_.string() + " belongs to run " + run_id_ + ", not to run " + key->run_id());
    const std::string mac = read_at(step_fd_->fd, "manifest.mac", 256, root_.string() + "/manifest.mac");
    std::string trimmed = mac;
    while (!trimmed.empty() && trimmed.back() == '\n') trimmed.pop_back();
    if (!key->verify(m, trimmed))
      fail(root_.string() + "/manifest.json does not match its MAC under run " + run_id_ +
           "'s key: the checkpoint was modified or forged (docs/checkpoints.md)");
    if (!manifest_.contains("files") || !manifest_["files"].is_object())
      fail(root_.string() + "/manifest.json lists no files");
    for (auto& [rel, info] : manifest_["files"].items()) bytes(rel);  // verify all before touching anything
    verified_ = true;
  }
  const std::string& run_id() const { return run_id_; }
  const fs::path& path() const { return root_; }
  std::string bytes(const std::string& rel) const {
    const json& files = manifest_["files"];
    if (!safe_relative_path(rel))
      fail(root_.string() + "/manifest.json names '" + printable(rel) + "', which is not a path inside the checkpoint");
    if (!files.contains(rel)) fail(root_.string() + ": " + rel + " is not in the manifest");
    const json& info = files[rel];
    if (!info.is_object() || !info.contains("bytes") || !info["bytes"].is_number_unsigned())
      fail(root_.string() + "/manifest.json gives no size for " + rel);
    const std::size_t expected = info["bytes"].get<std::size_t>();
    const std::string shown = root_.string() + "/" + rel;
    std::string b = read_at(step_fd_->fd, rel, expected, shown);  // never reads more than the manifest says
    if (b.size() != expected)
      fail(shown + " has " + std::to_string(b.size()) + " bytes; the manifest says " + std::to_string(expected) +
           " (truncated or modified)");
    if (checkpoint_file_hash(b) != info.value("blake2b", ""))
      fail(shown + " does not match its hash in the manifest (corrupted or modified)");
    return b;
  }
  /// The step the manifest names.
  long step() const { return integer(manifest_.value("step", json()), root_.string() + "/manifest.json's step"); }
  /// The step of the folder `latest` names (step-00000120, or step-00000120.1 for a second save of it).
  long folder_step() const {
    const std::string digits = name_.substr(5, name_.find('.') == std::string::npos ? std::string::npos : name_.find('.') - 5);
    if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
      fail(root_.string() + ": '" + printable(name_) + "' has no step number");
    return std::stol(digits);
  }
  json json_file(const std::string& rel) const {
    try {
      return parse_json(bytes(rel), root_.string() + "/" + rel);
    } catch (const std::invalid_argument& e) {
      fail(e.what());
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
    for (const T v : a)
      if (!std::isfinite(v)) fail(root_.string() + "/" + rel + ": " + what + " holds a non-finite value (" +
                                  std::to_string(double(v)) + ")");
    return a;
  }

 private:
  Fd root_fd_;
  std::optional<Fd> step_fd_;
  std::string name_, run_id_;
  fs::path root_;
  json manifest_;
  bool verified_ = false;
};

/// A hash key as 32 lower-case hex digits (libsodium's sodium_bin2hex), and back:
/// false unless `hex` is exactly that.
std::string hex_of(const HashKey& k) {
  char out[2 * sizeof(HashKey) + 1];
  sodium_bin2hex(out, sizeof out, k.data(), k.size());
  return out;
}

bool key_of_hex(const std::string& hex, HashKey& k) {
  std::size_t n = 0;
  if (hex.size() != 2 * k.size() || !std::all_of(hex.begin(), hex.end(), [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
      }))
    return false;
  return sodium_hex2bin(k.data(), k.size(), hex.data(), hex.size(), nullptr, &n, nullptr) == 0 && n == k.size();
}

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

bool CheckpointDir::has_checkpoint() const {
  std::error_code ec;
  return fs::exists(fs::symlink_status(dir_ / "latest", ec));
}

long CheckpointDir::latest_step() const {
  if (!has_checkpoint()) fail("no checkpoint in " + dir_.string() + " (no 'latest' file)");
  return Reader(dir_, nullptr).folder_step();
}

std::string CheckpointDir::run_id() const {
  if (!has_checkpoint()) fail("no checkpoint in " + dir_.string() + " (no 'latest' file)");
  return Reader(dir_, nullptr).run_id();
}

json CheckpointDir::read_extra(const RunKey& key) const {
  if (!has_checkpoint()) fail("no checkpoint in " + dir_.string() + " (no 'latest' file)");
  Reader r(dir_, &key);
  const json s = r.json_file("state.json");
  const std::string where = r.path().string() + "/state.json";
  if (!s.is_object()) fail(where + " is not a JSON object");
  if (!s.contains("extra")) return json::object();
  if (!s["extra"].is_object()) fail(where + ": its 'extra' is not a JSON object");
  return s["extra"];
}

json CheckpointDir::read_extra() const { return read_extra(*RunKey::peek(run_id())); }

json CheckpointDir::read_extra(Communicator* comm) const {
  std::string extra, error;
  if (!comm || comm->rank() == 0) {
    try {
      extra = read_extra().dump();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (comm) {
    error = broadcast_string(*comm, error);
    extra = broadcast_string(*comm, extra);
  }
  if (!error.empty()) throw CheckpointError(error);
  return parse_json(extra, dir_.string() + "/state.json's extra");
}

template <class T>
fs::path CheckpointDir::save(long step, const TrainingStateT<T>& st, const json& extra, RunKey& run_key) const {
  std::error_code ec;
  create_private_folders(dir_, "the checkpoint directory");
  if (step < 0) fail("cannot save step " + std::to_string(step));
  const std::string name = step_name(step);
  fs::path tmp = dir_ / (".partial-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  if (::mkdir(tmp.c_str(), 0700) != 0) fail("cannot create " + tmp.string() + ": " + std::strerror(errno));

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
  json keys = json::object();
  for (const auto& [role, k] : st.keys) keys[role] = hex_of(*k);
  state["keys"] = keys;
  if (st.accountant) state["accountant"] = st.accountant->to_json();
  w.add("state.json", state.dump(1));
  const std::string manifest = json{{"format", kFormat}, {"version", kCheckpointVersion}, {"run", run_key.run_id()},
                                    {"step", step}, {"files", w.files()}}
                                   .dump(1);
  write_file(tmp / "manifest.json", manifest);
  write_file(tmp / "manifest.mac", run_key.mac(manifest) + "\n");
  make_private_dirs(tmp, "params");  // a model without parameters still has the folder
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
  // only now, with `latest` naming it: a high-water mark never runs ahead of the checkpoints
  run_key.record_saved(step, st.accountant ? st.accountant->total_steps() : 0);
  return final_dir;
}

template <class T>
long CheckpointDir::load(TrainingStateT<T>& st, const RunKey& run_key) const {
  if (!has_checkpoint()) fail("no checkpoint in " + dir_.string() + " (no 'latest' file)");
  Reader r(dir_, &run_key);
  json s = r.json_file("state.json");
  const std::string where = r.path().string() + "/state.json";
  try {
    // ---- read and check everything first
    if (!s.is_object()) fail(where + " is not a JSON object");
    const long step = integer(s.value("step", json()), where + "'s step");
    if (step < 0) fail(where + ": step " + std::to_string(step) + " is negative");
    if (step != r.step() || step != r.folder_step())
      fail(where + ": step " + std::to_string(step) + " does not match the manifest's " + std::to_string(r.step()) +
           " and the folder's " + std::to_string(r.folder_step()));
    if (step < run_key.saved_step())
      fail(r.path().string() + " is step " + std::to_string(step) + ", but run " + run_key.run_id() + " has saved step " +
           std::to_string(run_key.saved_step()) + ": this is an older copy or a rewound checkpoint, whose later steps "
           "were already released; resume from the run's latest checkpoint (docs/checkpoints.md)");
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
      opt_steps = integer(o.at("steps"), where + "'s optimizer steps");
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
    std::map<std::string, HashKey> keys;  // a checkpoint written before keys were saved has none: kept as they are
    const json stored_keys = s.value("keys", json::object());
    if (!stored_keys.is_object()) fail(where + ": its keys are not a JSON object");
    for (const auto& [role, k] : stored_keys.items())
      if (st.keys.count(role) && !key_of_hex(k.template get<std::string>(), keys[role]))
        fail(where + ": the " + role + " key is not 32 lower-case hex digits");
    std::unique_ptr<privacy::Accountant> acc;
    if (st.accountant) {
      if (!s.contains("accountant")) fail(where + " has no accountant ledger");
      if (!st.accountant->ledger().empty()) fail("the accountant to restore into has already recorded steps");
      acc = privacy::accountant_from_json(s["accountant"]);
      if (acc->name() != st.accountant->name())
        fail(where + ": the ledger is for the " + acc->name() + " accountant, this run uses " + st.accountant->name());
      if (acc->total_steps() < run_key.saved_ledger())
        fail(where + ": the ledger holds " + std::to_string(acc->total_steps()) + " steps, but run " +
             run_key.run_id() + " has saved a ledger of " + std::to_string(run_key.saved_ledger()) +
             " (an older or edited checkpoint)");
    }

    // ---- then restore (generators and sampler validate their own state)
    for (const auto& [role, rng] : st.generators) rng->set_state(std::string(gens[role].at("state")));
    for (const auto& [role, k] : keys) *st.keys.at(role) = k;
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
  create_private_folders(dir, "the checkpoint directory");
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

template fs::path CheckpointDir::save(long, const TrainingStateT<float>&, const json&, RunKey&) const;
template fs::path CheckpointDir::save(long, const TrainingStateT<double>&, const json&, RunKey&) const;
template long CheckpointDir::load(TrainingStateT<float>&, const RunKey&) const;
template long CheckpointDir::load(TrainingStateT<double>&, const RunKey&) const;

}  // namespace dpgrad
