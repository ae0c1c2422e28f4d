// Datasets by name for the programs: Fashion-MNIST (Debian package), MNIST or
// any IDX folder, a folder tree of text classes, the SpamAssassin corpus, and
// synthetic data for benchmarks. Each gives train and test batches in memory,
// with record ids that no other record can change and, for text, a vocabulary
// that reads no document (docs/data-privacy.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/batch.hpp"

namespace dpgrad::data {

/// A loaded dataset: training and test batches, the number of classes, and what was loaded.
struct DataSplit {
  BatchT<float> train, test;    // ids: images, the row in the dataset's file; text, record_id of the file name
  std::size_t classes = 0;
  std::string description;      // what was loaded, for the run's output
  bool tokens = false;          // token sequences (text) rather than images
};

/// What load_dataset() loads and keeps (checked by check_dataset_options()).
struct DatasetOptions {
  std::size_t vocabulary = 8185;  // text: ids including padding and unknown (hashed: all used; file: at most)
  std::string vocab_file;         // text: a public token list (Vocabulary::from_token_file); empty: feature hashing
  std::size_t max_length = 150;   // text: tokens kept per document
  std::size_t synthetic_size = 2048;  // synthetic data: training examples (the test set has 256)
  std::uint64_t seed = 0;         // synthetic data
  // ---- what is kept of what was loaded (fixed in advance: nothing here is computed from the data)
  std::vector<int> classes;       // only these classes, relabelled 0, 1, ... in this order (empty: all)
  std::optional<std::pair<double, double>> normalize;  // images: (x - mean) / std, constants given in advance
  std::size_t train_limit = 0, test_limit = 0;          // only the first this many examples (0: all)
};

/// Checks the options that need no data (classes: at least two, none repeated or
/// negative; normalize: a finite mean and a std > 0); throws std::invalid_argument.
/// load_dataset calls it; programs call it before loading anything.
void check_dataset_options(const DatasetOptions& opts);

/// The positions rank, rank + size, ... below n: one rank's shard of a data-parallel run.
std::vector<std::size_t> shard_positions(std::size_t n, int rank, int size);

/// Keeps rank `rank`'s shard of the training and the test set (shard_positions;
/// records keep their ids) and returns the kept training records' positions in
/// the whole training set (PrivateTrainingConfig::positions).
std::vector<std::size_t> keep_shard(DataSplit& split, int rank, int size);

/// "fashion-mnist", "mnist" (IDX files in $DPGRAD_MNIST or /usr/share/datasets/mnist),
/// "idx:PATH", "text:PATH" (PATH/train and PATH/test class folders),
/// "spamassassin", "synthetic" or "synthetic-text". Text is encoded with
/// Vocabulary::hashed(vocabulary), or with the tokens of vocab_file when given
/// (std::invalid_argument for any other dataset). Then only `classes`, the
/// normalisation and the limits are applied; how many records the kept classes
/// hold is private, so the description names the classes, not their counts.
/// Throws DataError or std::invalid_argument with a message that says how to get
/// missing data or what is wrong with the options; an empty training or test set
/// or a training set of one class is refused.
DataSplit load_dataset(const std::string& spec, const DatasetOptions& opts = {});

/// Synthetic images (N, 1, 28, 28) with 10 classes, or token sequences (N, L) over
/// `vocabulary` ids with 2 classes: speed does not depend on content.
BatchT<float> synthetic_images(std::size_t n, std::uint64_t seed);
BatchT<float> synthetic_tokens(std::size_t n, std::size_t length, std::size_t vocabulary, std::uint64_t seed);

}  // namespace dpgrad::data
