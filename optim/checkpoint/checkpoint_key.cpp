// The checkpoint key store (optim/checkpoint/checkpoint_key.hpp, docs/checkpoints.md).
// Layout: STORE/RUN.key (JSON: the key and the high-water mark, mode 0600,
// replaced atomically) and STORE/RUN.lock (held with flock by the one process
// continuing the run).
#include "optim/checkpoint/checkpoint_key.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "engine/files.hpp"
#include "engine/json.hpp"
#include "optim/checkpoint/checkpoint.hpp"

namespace dpgrad {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& what) { throw CheckpointError("checkpoint key: " + what); }

std::string hex(const unsigned char* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}

bool unhex(const std::string& s, std::string& out) {
  if (s.size() % 2) return false;
  out.assign(s.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto nibble = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = char(hi * 16 + lo);
  }
  return true;
}

void init_sodium() {
  if (sodium_init() < 0) fail("libsodium failed to initialise");
}

/// The store, created if missing; refused when it is not a private folder of this user's.
/// `given` is looked at without its trailing '/' (lstat of "link/" would follow the link).
void require_private_folder(const fs::path& given) {
  const fs::path store = without_trailing_separators(given.string());
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(store, ec))) {
    fs::create_directories(store.parent_path(), ec);
    if (::mkdir(store.c_str(), 0700) != 0 && errno != EEXIST)
      fail("cannot create the key store " + store.string() + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(store.c_str(), &st) != 0) fail("cannot read the key store " + store.string() + ": " + std::strerror(errno));
  if (S_ISLNK(st.st_mode)) fail("the key store " + store.string() + " is a symbolic link; name the folder itself");
  if (!S_ISDIR(st.st_mode)) fail("the key store " + store.string() + " is not a folder");
  if (st.st_uid != ::geteuid()) fail("the key store " + store.string() + " belongs to another user");
  if (st.st_mode & 077)
    fail("the key store " + store.string() + " is open to other users (mode " + std::to_string((st.st_mode >> 6) & 7) +
         std::to_string((st.st_mode >> 3) & 7) + std::to_string(st.st_mode & 7) + "); run chmod 700 on it");
}

/// Writes a file of a key file's size in `store`, syncs it and removes it: a store
/// that is read-only or on a full file system is found before any work.
void probe_store(const fs::path& store) {
  const std::string probe = (store / (".probe-" + random_suffix())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) fail("the key store " + store.string() + " does not take a new file (" + std::strerror(errno) + ")");
  const std::string bytes(512, ' ');  // more than a key file holds
  std::size_t done = 0;
  int error = 0;
  while (error == 0 && done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) error = w < 0 ? errno : EIO;
    else done += std::size_t(w);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  ::unlink(probe.c_str());
  if (error != 0) fail("cannot write in the key store " + store.string() + " (" + std::strerror(error) + ")");
}

fs::path key_path(const fs::path& store, const std::string& id) { return store / (id + ".key"); }

/// The three octal digits of a file's permission bits ("644").
std::string mode_digits(mode_t mode) {
  return std::to_string((mode >> 6) & 7) + std::to_string((mode >> 3) & 7) + std::to_string(mode & 7);
}

/// A regular file of at most 64 KiB, never through a symbolic link, the user's own
/// and closed to others, as the store's folder is: anyone who can read a run's key
/// can forge its checkpoints, and anyone who can replace it can rewind the run.
std::string read_small(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) throw std::out_of_range(p.string());
    fail("cannot read " + p.string() + ": " + (e == ELOOP ? "it is a symbolic link" : std::strerror(e)));
  }
  struct stat st {};
  std::string out;
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= 65536;
  if (ok) {
    out.resize(std::size_t(st.st_size));
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t r = ::read(fd, out.data() + done, out.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      done += std::size_t(r);
    }
    out.resize(done);
  }
  ::close(fd);
  if (!ok) fail(p.string() + " is not a key file (not a regular file of at most 64 KiB)");
  if (st.st_uid != ::geteuid())
    fail("the key file " + p.string() + " belongs to another user: a run's key must be your own; copy it into "
         "your key store (docs/checkpoints.md) and run chmod 600 on the copy");
  if (st.st_mode & 077)
    fail("the key file " + p.string() + " is open to other users (mode " + mode_digits(st.st_mode) +
         "), who could read the key and forge the run's checkpoints; run chmod 600 on it");
  return out;
}

}  // namespace

bool valid_run_id(const std::string& id) {
  if (id.size() != 32) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

fs::path default_key_store() {
  if (const char* s = std::getenv("DPGRAD_KEY_STORE"); s && *s) return fs::path(s);
  if (const char* s = std::getenv("XDG_STATE_HOME"); s && *s) return fs::path(s) / "dpgrad" / "checkpoint-keys";
  if (const char* s = std::getenv("HOME"); s && *s) return fs::path(s) / ".local" / "state" / "dpgrad" / "checkpoint-keys";
  fail("no key store: set DPGRAD_KEY_STORE (or HOME) to keep checkpoint keys");
}

void check_key_store(const fs::path& store) {
  require_private_folder(store);
  probe_store(without_trailing_separators(store.string()));
}

std::unique_ptr<RunKey> RunKey::create(const fs::path& store) {
  init_sodium();
  require_private_folder(store);
  std::unique_ptr<RunKey> k(new RunKey());
  unsigned char id[16], key[crypto_auth_KEYBYTES];
  randombytes_buf(id, sizeof id);
  crypto_auth_keygen(key);
  k->id_ = hex(id, sizeof id);
  k->key_.assign(reinterpret_cast<const char*>(key), sizeof key);
  sodium_memzero(key, sizeof key);
  k->store_ = store;
  const fs::path lock = store / (k->id_ + ".lock");
  k->lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (k->lock_fd_ < 0 || ::flock(k->lock_fd_, LOCK_EX | LOCK_NB) != 0)
    fail("cannot create " + lock.string() + ": " + std::strerror(errno));
  k->write();
  return k;
}

std::unique_ptr<RunKey> RunKey::read(const std::string& run_id, const fs::path& store, bool lock) {
  init_sodium();
  if (!valid_run_id(run_id)) fail("'" + run_id.substr(0, 64) + "' is not a run id");
  require_private_folder(store);
  std::unique_ptr<RunKey> k(new RunKey());
  k->id_ = run_id;
  k->store_ = store;
  const fs::path file = key_path(store, run_id);
  std::string text;
  try {
    text = read_small(file);
  } catch (const std::out_of_range&) {
    fail("the key of run " + run_id + " is not in the key store " + store.string() +
         ": checkpoints are verified with the key of the run that wrote them, kept outside the checkpoint (a "
         "checkpoint from another user or machine needs its key file copied into the store; docs/checkpoints.md)");
  }
  nlohmann::json j;
  try {
    j = parse_json(text, file.string(), JsonLimits{65536, 4});
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  auto integer = [&](const char* name) {
    if (!j.is_object() || !j.contains(name) || !j[name].is_number_integer()) fail(file.string() + " has no " + name);
    return j[name].get<long>();
  };
  if (!j.is_object() || j.value("format", "") != "dpgrad-checkpoint-key" || j.value("run", "") != run_id ||
      !j.contains("key") || !j["key"].is_string() || !unhex(j["key"].get<std::string>(), k->key_) ||
      k->key_.size() != crypto_auth_KEYBYTES)
    fail(file.string() + " is not the key file of run " + run_id);
  k->step_ = integer("step");
  k->ledger_ = integer("ledger");
  if (lock) {
    const fs::path lockfile = store / (run_id + ".lock");
    k->lock_fd_ = ::open(lockfile.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (k->lock_fd_ < 0) fail("cannot open " + lockfile.string() + ": " + std::strerror(errno));
    if (::flock(k->lock_fd_, LOCK_EX | LOCK_NB) != 0)
      fail("another process is continuing run " + run_id + " (it holds " + lockfile.string() +
           "): two processes continuing one run would release the same steps twice");
  }
  return k;
}

std::unique_ptr<RunKey> RunKey::open(const std::string& run_id, const fs::path& store) {
  return read(run_id, store, true);
}

std::unique_ptr<RunKey> RunKey::peek(const std::string& run_id, const fs::path& store) {
  return read(run_id, store, false);
}

std::unique_ptr<RunKey> RunKey::borrowed(const std::string& run_id, const std::string& key, long step, long ledger) {
  if (!valid_run_id(run_id) || key.size() != crypto_auth_KEYBYTES) fail("a borrowed key must be a run id and 32 bytes");
  std::unique_ptr<RunKey> k(new RunKey());
  k->id_ = run_id;
  k->key_ = key;
  k->step_ = step;
  k->ledger_ = ledger;
  return k;
}

RunKey::~RunKey() {
  if (!key_.empty()) sodium_memzero(key_.data(), key_.size());
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

std::string RunKey::mac(const std::string& bytes) const {
  unsigned char out[crypto_auth_BYTES];
  crypto_auth(out, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
              reinterpret_cast<const unsigned char*>(key_.data()));
  return hex(out, sizeof out);
}

bool RunKey::verify(const std::string& bytes, const std::string& mac_hex) const {
  std::string m;
  if (!unhex(mac_hex, m) || m.size() != crypto_auth_BYTES) return false;
  return crypto_auth_verify(reinterpret_cast<const unsigned char*>(m.data()),
                            reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                            reinterpret_cast<const unsigned char*>(key_.data())) == 0;
}

void RunKey::record_saved(long step, long ledger) {
  if (store_.empty()) fail("a borrowed key cannot record saves (rank 0 writes the checkpoints)");
  if (step < step_ || ledger < ledger_)
    fail("run " + id_ + " already saved step " + std::to_string(step_) + "; a save of step " + std::to_string(step) +
         " would lower its high-water mark");
  step_ = step;
  ledger_ = ledger;
  write();
}

void RunKey::write() const {
  const std::string text =
      nlohmann::json{{"format", "dpgrad-checkpoint-key"}, {"version", 1}, {"run", id_},
                     {"key", hex(reinterpret_cast<const unsigned char*>(key_.data()), key_.size())},
                     {"step", step_}, {"ledger", ledger_}}
          .dump(1) + "\n";
  const fs::path file = key_path(store_, id_);
  try {  // the one checked writer of output files: a scratch file created exclusively, fsynced, renamed
    write_output_file(file.string(), text, "the run key", 0600);
  } catch (const std::runtime_error& e) {
    fail(std::string("cannot write ") + e.what());
  }
}

}  // namespace dpgrad
