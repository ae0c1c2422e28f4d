// The keys that authenticate a run's checkpoints (docs/checkpoints.md). Each
// run gets a random id and a 32-byte key, kept outside the checkpoint in a
// per-user key store (mode 0700, files 0600) with the run's high-water mark:
// the largest step and ledger it ever saved. A checkpoint carries a MAC of its
// manifest under that key, so one edited by hand (its ledger, sigma, q, step)
// no longer verifies, and one older than the high-water mark (a copy kept from
// before, or a rewound `latest`) is refused: its steps were already released.
#pragma once

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

namespace dpgrad {

/// A missing, incomplete, corrupted, forged or mismatched checkpoint, or a key
/// store that cannot vouch for one.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The key store: $DPGRAD_KEY_STORE when set, else $XDG_STATE_HOME/dpgrad/checkpoint-keys,
/// else $HOME/.local/state/dpgrad/checkpoint-keys. Throws CheckpointError when none can be named.
std::filesystem::path default_key_store();

/// Checks, before any work, that `store` can keep run keys: created (mode 0700)
/// if missing; refused when it is a symbolic link (named with a trailing '/' or
/// not), not a folder, not the user's own or open to others, or when a file
/// cannot be written, synced and removed in it (read-only, a full file system).
/// Throws CheckpointError naming the store and the problem.
void check_key_store(const std::filesystem::path& store = default_key_store());

/// One run's checkpoint key and high-water mark from the key store (see the top
/// of this file). A lock taken on the run's key lasts as long as the object.
class RunKey {
 public:
  /// A new run: a fresh random id and key, written to `store` (created with mode 0700
  /// if missing; refused when it is a symbolic link, not a folder, not the user's
  /// own, or open to others), and locked by this object.
  static std::unique_ptr<RunKey> create(const std::filesystem::path& store = default_key_store());
  /// Run `run_id`'s key and high-water mark from `store`, locked by this object
  /// (another process holding it is refused: two processes continuing one run
  /// would release the same steps twice). Throws CheckpointError saying why when
  /// the store has no such key.
  static std::unique_ptr<RunKey> open(const std::string& run_id, const std::filesystem::path& store = default_key_store());
  /// The same, read without taking the lock (to read a checkpoint, not to continue its run).
  static std::unique_ptr<RunKey> peek(const std::string& run_id, const std::filesystem::path& store = default_key_store());
  /// A key received from the process that opened it (the other ranks of a
  /// data-parallel run): verifies, but cannot record saves.
  static std::unique_ptr<RunKey> borrowed(const std::string& run_id, const std::string& key, long step, long ledger);
  ~RunKey();
  RunKey(const RunKey&) = delete;
  RunKey& operator=(const RunKey&) = delete;

  /// The run's id: 32 lower-case hex digits (valid_run_id).
  const std::string& run_id() const { return id_; }
  /// The 32 key bytes (to send to the other ranks of a run; never written anywhere else).
  const std::string& key_bytes() const { return key_; }
  /// HMAC-SHA-512-256 (libsodium's crypto_auth) of `bytes`, in lower-case hex.
  std::string mac(const std::string& bytes) const;
  /// Whether `mac_hex` is mac(bytes), compared in constant time.
  bool verify(const std::string& bytes, const std::string& mac_hex) const;
  /// The high-water mark: the largest step and ledger length ever saved (-1: none yet).
  long saved_step() const { return step_; }
  long saved_ledger() const { return ledger_; }
  /// Raises the high-water mark to a save of `step` with `ledger` accounted steps
  /// (the key file is replaced atomically; never lowered).
  /// Throws CheckpointError for a borrowed key or a save below the mark.
  void record_saved(long step, long ledger);

 private:
  RunKey() = default;
  static std::unique_ptr<RunKey> read(const std::string& run_id, const std::filesystem::path& store, bool lock);
  void write() const;
  std::string id_, key_;
  long step_ = -1, ledger_ = -1;
  std::filesystem::path store_;  // empty: borrowed
  int lock_fd_ = -1;
};

/// Whether `id` has the form of a run id (32 lower-case hex digits).
bool valid_run_id(const std::string& id);

}  // namespace dpgrad
