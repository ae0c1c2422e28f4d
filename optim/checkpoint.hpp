// Checkpoints of a training run: parameters as .npy files (numpy reads them),
// optimizer buffers as .npy, and the rest (sampler position, generator states,
// the accountant's ledger, whatever the program adds) in JSON.
//
// Layout of a checkpoint directory:
//   DIR/latest              name of the newest complete checkpoint ("step-00000120")
//   DIR/step-00000120/      params/*.npy, optimizer/*.npy, state.json, manifest.json
// A checkpoint is written into a hidden temporary directory, every file is
// flushed to disk, manifest.json (sizes and BLAKE2b hashes of all files) is
// written last, the directory is renamed into place and only then `latest` is
// replaced (temp file + rename). A process killed at any moment leaves `latest`
// naming a complete checkpoint, or no `latest` at all.
#pragma once

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tensor.hpp"

namespace dpgrad {

class Rng;
class Sampler;
template <class T>
class OptimizerT;
namespace privacy {
class Accountant;
}

/// A missing, incomplete, corrupted or mismatched checkpoint.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
};

/// The hash a checkpoint's manifest gives each file: BLAKE2b-256 of its bytes
/// (libsodium), in lower-case hex.
std::string checkpoint_file_hash(const std::string& bytes);

class CheckpointDir {
 public:
  explicit CheckpointDir(std::filesystem::path dir, int keep = 1);
  const std::filesystem::path& path() const { return dir_; }

  /// True when `latest` names a checkpoint (complete by construction).
  bool has_checkpoint() const;
  /// The step of the latest checkpoint; throws CheckpointError when there is none.
  long latest_step() const;

  /// Writes the checkpoint of `step` atomically and removes older ones beyond
  /// `keep`. `extra` is stored verbatim (options, history, counters).
  template <class T>
  std::filesystem::path save(long step, const TrainingStateT<T>& state, const nlohmann::json& extra) const;

  /// The `extra` JSON of the latest checkpoint, after verifying every file.
  nlohmann::json read_extra() const;

  /// Verifies the latest checkpoint and restores it into `state` (parameters,
  /// optimizer, sampler, generators, accountant ledger); returns its step.
  /// Throws CheckpointError naming the file and the problem; `state` is left
  /// untouched unless every piece verified and matched.
  template <class T>
  long load(TrainingStateT<T>& state) const;

 private:
  std::filesystem::path latest_dir() const;
  std::filesystem::path dir_;
  int keep_;
};

using TrainingState = TrainingStateT<float>;

/// Holds a checkpoint directory for one run: creates it (an unwritable place fails
/// here, before any training), takes an exclusive lock on DIR/.lock (a second run
/// on the same directory is refused with CheckpointError), and removes what a
/// save that was killed half-way left behind. The lock lasts as long as the object.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::filesystem::path& dir);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace dpgrad
