// Checkpoints of a training run: parameters as .npy files (numpy reads them),
// optimizer buffers as .npy, and the rest (sampler position, generator states, hash keys,
// the accountant's ledger, whatever the program adds) in JSON.
//
// Layout of a checkpoint directory:
//   DIR/latest              name of the newest complete checkpoint ("step-00000120")
//   DIR/step-00000120/      params/*.npy, optimizer/*.npy, state.json, manifest.json
//   DIR/step-00000120/manifest.mac   the MAC of manifest.json under the run's key
// A checkpoint is written into a hidden temporary directory, every file is
// flushed to disk, manifest.json (the run's id, the step, sizes and BLAKE2b
// hashes of all files) and its MAC are written last, the directory is renamed
// into place and only then `latest` is replaced (temp file + rename); then the
// run's high-water mark in the key store moves up (optim/checkpoint/checkpoint_key.hpp).
// A process killed at any moment leaves `latest` naming a complete checkpoint,
// or no `latest` at all. Files are written with mode 0600, folders 0700, and
// read without following a symbolic link anywhere below DIR.
#pragma once

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/random.hpp"
#include "engine/tensor.hpp"
#include "optim/checkpoint/checkpoint_key.hpp"

namespace dpgrad {

class Communicator;

class Rng;
class Sampler;
template <class T>
class OptimizerT;
namespace privacy {
class Accountant;
}


/// The pieces of a run a checkpoint saves and restores. Pointers may be null
/// (nothing saved for them); on load the same pieces must be present.
template <class T>
struct TrainingStateT {
  std::vector<TensorT<T>> params;          // written and restored in place
  OptimizerT<T>* optimizer = nullptr;
  Sampler* sampler = nullptr;
  std::map<std::string, Rng*> generators;  // by role: "noise", "sampling", ...
  privacy::Accountant* accountant = nullptr;
  std::map<std::string, ArrayT<T>*> arrays;  // further named arrays (parameter averages, ...)
  /// Keys of keyed hashes by role ("dropout"), saved as hex in state.json (which the
  /// manifest's MAC covers). A checkpoint without one leaves it as it was.
  std::map<std::string, HashKey*> keys;
};

/// The hash a checkpoint's manifest gives each file: BLAKE2b-256 of its bytes
/// (libsodium), in lower-case hex.
std::string checkpoint_file_hash(const std::string& bytes);

/// The version of the checkpoint format this build writes and reads (2: keyed).
inline constexpr int kCheckpointVersion = 2;

/// A checkpoint directory (the layout above): saves, verifies and restores a
/// run's checkpoints. CheckpointLock keeps other runs out of it.
class CheckpointDir {
 public:
  /// Touches nothing on disk. `keep`: how many checkpoints a save leaves (at
  /// least 1; a smaller value counts as 1). path() is `dir`.
  explicit CheckpointDir(std::filesystem::path dir, int keep = 1);
  const std::filesystem::path& path() const { return dir_; }

  /// True when `latest` names a checkpoint (complete by construction).
  bool has_checkpoint() const;
  /// The step of the latest checkpoint; throws CheckpointError when there is none.
  long latest_step() const;

  /// The id of the run that wrote the latest checkpoint, as its manifest says
  /// (not yet verified: it names the key that verifies the rest).
  std::string run_id() const;

  /// Writes the checkpoint of `step` atomically, authenticated with `key`, and
  /// removes older ones beyond `keep`; then raises the key's high-water mark to
  /// `step` (and the accountant's ledger). `extra` is stored verbatim (options,
  /// history, counters).
  /// Returns the new checkpoint's folder.
  template <class T>
  std::filesystem::path save(long step, const TrainingStateT<T>& state, const nlohmann::json& extra, RunKey& key) const;

  /// The `extra` JSON of the latest checkpoint, after verifying its MAC with
  /// `key` and every file against the manifest.
  nlohmann::json read_extra(const RunKey& key) const;
  /// The same with the run's key from the default key store (read, not locked).
  nlohmann::json read_extra() const;
  /// read_extra() on rank 0 of `comm`, sent to every rank (null: this process
  /// reads it). A failure is thrown on every rank as CheckpointError, so that no
  /// rank waits for another.
  nlohmann::json read_extra(Communicator* comm) const;

  /// Verifies the latest checkpoint with `key` (its MAC, every file, and that its
  /// step and ledger are not below the key's high-water mark: an older copy's
  /// steps were already released) and restores it into `state` (parameters,
  /// optimizer, sampler, generators, accountant ledger); returns its step.
  /// Throws CheckpointError naming the file and the problem; `state` is left
  /// untouched unless every piece verified and matched. Non-finite values are refused.
  template <class T>
  long load(TrainingStateT<T>& state, const RunKey& key) const;

 private:
  std::filesystem::path dir_;
  int keep_;
};

/// TrainingStateT over float parameters.
using TrainingState = TrainingStateT<float>;

/// Holds a checkpoint directory for one run: creates it (an unwritable place fails
/// here, before any training), takes an exclusive lock on DIR/.lock (a second run
/// on the same directory is refused with CheckpointError), and removes what a
/// save that was killed half-way left behind. The lock lasts as long as the object.
class CheckpointLock {
 public:
  /// Throws CheckpointError when `dir` cannot be created, written or locked
  /// (another run holding the lock, say).
  explicit CheckpointLock(const std::filesystem::path& dir);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace dpgrad
