// Datasets by name: see datasets.hpp.
#include "data/datasets.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/check.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "engine/random.hpp"
#include "data/idx.hpp"
#include "data/spamassassin.hpp"
#include "data/text_folder.hpp"

namespace dpgrad::data {

namespace {

BatchT<float> from_images(ImageDataset d) {
  BatchT<float> b;
  b.inputs = std::move(d.images);
  b.labels = std::move(d.labels);
  for (std::size_t i = 0; i < b.labels.size(); ++i) b.ids.push_back(std::int64_t(i));
  return b;
}

BatchT<float> from_text(TextDataset d) {
  BatchT<float> b;
  b.tokens = std::move(d.tokens);
  b.lengths = std::move(d.lengths);
  b.labels = std::move(d.labels);
  b.ids = std::move(d.ids);
  return b;
}

std::string join(const std::vector<std::string>& names) {
  std::string r;
  for (const auto& n : names) r += (r.empty() ? "" : ", ") + n;
  return r;
}

/// `hint` tells how to get the files when one is missing.
DataSplit images(const IdxPaths& p, const std::string& what, const std::string& hint) {
  for (const std::string* path : {&p.train_images, &p.train_labels, &p.test_images, &p.test_labels}) {
    struct stat st {};
    // no entry at all: how to get the files; a broken link or a loop of links: named as such
    if (::lstat(path->c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR))
      throw DataError(*path + ": no such file; " + hint);
    require_regular_file(*path, "an IDX file");
  }
  DataSplit s;
  s.train = from_images(load_idx(p.train_images, p.train_labels));
  s.test = from_images(load_idx(p.test_images, p.test_labels));
  s.classes = 10;
  s.description = what + " (" + std::to_string(s.train.size()) + " train, " + std::to_string(s.test.size()) + " test)";
  return s;
}

DataSplit text(const RawText& train, const RawText& test, const DatasetOptions& o, const std::string& what) {
  if (train.docs.empty()) throw DataError(what + ": no training documents");
  if (train.class_names != test.class_names)
    throw DataError(what + ": train and test have different classes");
  // Never Vocabulary::build: a vocabulary ranked by the training documents'
  // word counts would carry every document into every other's token ids.
  const Vocabulary v = o.vocab_file.empty() ? Vocabulary::hashed(o.vocabulary)
                                            : Vocabulary::from_token_file(o.vocab_file, o.vocabulary);
  DataSplit s;
  s.train = from_text(encode(train, v, o.max_length));
  s.test = from_text(encode(test, v, o.max_length));
  s.classes = train.class_names.size();
  s.tokens = true;
  s.description = what + " (" + std::to_string(s.train.size()) + " train, " + std::to_string(s.test.size()) +
                  " test, " +
                  (v.is_hashed() ? "vocabulary: " + std::to_string(v.size()) + " ids by feature hashing"
                                 : "vocabulary: " + std::to_string(v.size() - 2) + " tokens of " + o.vocab_file) +
                  ", " + std::to_string(o.max_length) + " tokens)";
  return s;
}

}  // namespace

BatchT<float> synthetic_images(std::size_t n, std::uint64_t seed) {
  FastRng rng(seed);
  BatchT<float> b;
  b.inputs = ArrayT<float>::from_shape({n, 1, 28, 28});
  for (auto& v : b.inputs) v = float(rng.uniform());
  for (std::size_t i = 0; i < n; ++i) {
    b.labels.push_back(std::int32_t(rng.below(10)));
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

BatchT<float> synthetic_tokens(std::size_t n, std::size_t length, std::size_t vocabulary, std::uint64_t seed) {
  FastRng rng(seed);
  BatchT<float> b;
  b.tokens = ArrayT<std::int32_t>::from_shape({n, length});
  for (auto& v : b.tokens) v = std::int32_t(2 + rng.below(vocabulary - 2));
  for (std::size_t i = 0; i < n; ++i) {
    b.lengths.push_back(std::int32_t(length));
    b.labels.push_back(std::int32_t(rng.below(2)));
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

namespace {

/// load_dataset without its handling of memory exhaustion.
DataSplit load(const std::string& spec, const DatasetOptions& o) {
  const bool text_files = spec.rfind("text:", 0) == 0 || spec == "spamassassin";
  if (!o.vocab_file.empty() && !text_files)
    throw std::invalid_argument("a vocabulary file applies to text datasets (text:PATH, spamassassin), not '" + spec +
                                "'");
  if (spec == "fashion-mnist") {
    const char* env = std::getenv("DPGRAD_FASHION_MNIST");
    return images(fashion_mnist_paths(), "Fashion-MNIST from " + fashion_mnist_dir(),
                  "Fashion-MNIST not found in " + fashion_mnist_dir() +
                      (env && *env ? " (from DPGRAD_FASHION_MNIST)" : "") +
                      "; install it with: sudo apt-get install dataset-fashion-mnist (or ./dev deps)");
  }
  if (spec == "mnist") {
    const char* env = std::getenv("DPGRAD_MNIST");
    std::string dir = env && *env ? env : "/usr/share/datasets/mnist";
    if (!std::filesystem::exists(dir))
      throw DataError("MNIST not found in " + dir + ": put the four IDX files there, set DPGRAD_MNIST, or use idx:PATH");
    return images(idx_dir_paths(dir), "MNIST from " + dir, "put the four MNIST IDX files in " + dir);
  }
  if (spec.rfind("idx:", 0) == 0)
    return images(idx_dir_paths(spec.substr(4)), "IDX files from " + spec.substr(4),
                  "idx:PATH needs train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
                  "t10k-labels-idx1-ubyte (optionally .gz) in PATH");
  if (spec.rfind("text:", 0) == 0) {
    std::string root = spec.substr(5);
    RawText train = read_text_folder(root + "/train");
    // the test set's classes are the training set's: a test class folder that train lacks is refused, not skipped
    for (const std::string& name : class_folders(root + "/test"))
      if (std::find(train.class_names.begin(), train.class_names.end(), name) == train.class_names.end())
        throw DataError(root + "/test/" + name + ": a test class folder with no counterpart in " + root +
                        "/train (its classes: " + join(train.class_names) + ")");
    RawText test = read_text_folder(root + "/test", train.class_names);
    return text(train, test, o, "text folders under " + root);
  }
  if (spec == "spamassassin") {
    std::string dir = find_spamassassin();
    return text(load_spamassassin(dir, Split::train), load_spamassassin(dir, Split::test), o,
                "SpamAssassin public corpus (message bodies, fixed 80/20 split)");
  }
  if (spec == "synthetic" || spec == "synthetic-text") {
    DataSplit s;
    bool tok = spec == "synthetic-text";
    s.tokens = tok;
    s.classes = tok ? 2 : 10;
    s.train = tok ? synthetic_tokens(o.synthetic_size, o.max_length, o.vocabulary, o.seed)
                  : synthetic_images(o.synthetic_size, o.seed);
    s.test = tok ? synthetic_tokens(256, o.max_length, o.vocabulary, o.seed + 1) : synthetic_images(256, o.seed + 1);
    s.description = "synthetic " + std::string(tok ? "token sequences" : "images") + " (" +
                    std::to_string(o.synthetic_size) + " train)";
    return s;
  }
  throw std::invalid_argument("unknown dataset '" + spec +
                              "' (fashion-mnist, mnist, idx:PATH, text:PATH, spamassassin, synthetic, synthetic-text)");
}

}  // namespace

std::vector<std::size_t> shard_positions(std::size_t n, int rank, int size) {
  std::vector<std::size_t> rows;
  for (std::size_t i = std::size_t(rank); i < n; i += std::size_t(size)) rows.push_back(i);
  return rows;
}

std::vector<std::size_t> keep_shard(DataSplit& split, int rank, int size) {
  std::vector<std::size_t> positions = shard_positions(split.train.examples(), rank, size);
  split.train = split.train.select(positions);
  split.test = split.test.select(shard_positions(split.test.examples(), rank, size));
  return positions;
}

namespace {

/// The first n examples (all when n is 0).
BatchT<float> first(const BatchT<float>& b, std::size_t n) {
  if (n == 0 || n >= b.examples()) return b;
  std::vector<std::size_t> rows(n);
  for (std::size_t i = 0; i < n; ++i) rows[i] = i;
  return b.select(rows);
}

/// What DatasetOptions keeps of a loaded split.
void keep(DataSplit& s, const DatasetOptions& o) {
  const auto& cls = o.classes;
  if (!cls.empty()) {
    for (const int c : cls)
      require(std::size_t(c) < s.classes, "classes: class " + std::to_string(c) + " does not exist (the dataset has " +
                                              std::to_string(s.classes) + ")");
    for (auto* b : {&s.train, &s.test}) {
      std::vector<std::size_t> rows;
      for (std::size_t i = 0; i < b->size(); ++i)
        if (std::find(cls.begin(), cls.end(), b->labels[i]) != cls.end()) rows.push_back(i);
      *b = b->select(rows);
      for (auto& y : b->labels) y = std::int32_t(std::find(cls.begin(), cls.end(), y) - cls.begin());
    }
    s.classes = cls.size();
    s.description += "; classes";
    for (std::size_t i = 0; i < cls.size(); ++i) s.description += (i ? "," : " ") + std::to_string(cls[i]);
  }
  if (o.normalize) {
    const auto [mean, sd] = *o.normalize;
    require(!s.tokens, "normalize applies to image datasets only");
    for (auto* b : {&s.train, &s.test})
      for (auto& v : b->inputs) v = float((double(v) - mean) / sd);
  }
  s.train = first(s.train, o.train_limit);
  s.test = first(s.test, o.test_limit);
  // the limits, not the sizes kept: with classes selected, those are counts of private labels
  if (o.train_limit) s.description += "; at most the first " + std::to_string(o.train_limit) + " train";
  if (o.test_limit) s.description += (o.train_limit ? ", " : "; at most the first ") + std::to_string(o.test_limit) + " test";
  require(s.train.size() > 0 && s.test.size() > 0, "the training or the test set is empty");
  require(std::set<std::int32_t>(s.train.labels.begin(), s.train.labels.end()).size() >= 2,
          "the training set has one class: a classifier needs at least two");
  if (!s.tokens) {
    const Shape a = shape_of(s.train.inputs), b = shape_of(s.test.inputs);
    require(std::equal(a.begin() + 1, a.end(), b.begin() + 1, b.end()),
            "training images are " + shape_str(a) + " and test images " + shape_str(b) + ": they must be the same size");
  }
}

}  // namespace

void check_dataset_options(const DatasetOptions& o) {
  const auto& cls = o.classes;
  require(cls.empty() || cls.size() >= 2, "classes: at least two are needed");
  for (std::size_t i = 0; i < cls.size(); ++i) {
    require(cls[i] >= 0, "classes: class " + std::to_string(cls[i]) + " does not exist");
    for (std::size_t j = 0; j < i; ++j) require(cls[i] != cls[j], "classes: class " + std::to_string(cls[i]) + " is repeated");
  }
  require(!o.normalize || (std::isfinite(o.normalize->first) && std::isfinite(o.normalize->second) &&
                           o.normalize->second > 0),
          "normalize needs a finite mean and a std > 0 (Fashion-MNIST's published values: 0.2860, 0.3530)");
}

DataSplit load_dataset(const std::string& spec, const DatasetOptions& o) {
  check_dataset_options(o);
  DataSplit s;
  try {
    s = load(spec, o);
  } catch (const std::bad_alloc&) {
    throw DataError(spec + ": out of memory while reading the data set (its files hold more than this machine's "
                           "memory takes)");
  }
  keep(s, o);
  return s;
}

}  // namespace dpgrad::data
