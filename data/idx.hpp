// IDX image/label files (the MNIST and Fashion-MNIST format: big-endian header,
// unsigned bytes), read through zlib so gzipped and plain files both work. Every
// malformed input ends in a DataError naming the file and the problem, before any
// allocation larger than the data actually present.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/array.hpp"

namespace dpgrad::data {

/// Bad or missing input data (all data loaders throw this; the message names the file).
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws DataError unless `path` names a regular file (after symbolic links):
/// "no such file", "a loop of symbolic links", "a folder", or "not a regular file
/// (a FIFO, socket or device)" - a FIFO would block a reader forever.
/// `what` names what was expected ("an IDX file").
void require_regular_file(const std::string& path, const std::string& what);

/// Images with their class labels, as load_idx() and load_fashion_mnist() return them.
struct ImageDataset {
  ArrayT<float> images;               // (N, 1, R, C), pixel / 255 in [0, 1]
  std::vector<std::int32_t> labels;   // (N), in [0, classes)
  std::size_t classes = 10;
};

/// Raw contents of an images file (magic 0x00000803).
struct IdxImages {
  std::size_t count = 0, rows = 0, cols = 0;  // N images of R x C pixels
  std::vector<std::uint8_t> pixels;   // (count * rows * cols), row-major
};

/// Reads one images file (magic 0x803, N x R x C unsigned bytes).
/// Throws DataError: missing/unreadable file, bad magic, element type not ubyte,
/// wrong number of dimensions, a zero or implausible dimension, truncated data,
/// trailing bytes after the last image (an error, not a warning: a longer file is
/// the wrong file or a corrupt one), or N = 0.
IdxImages read_idx_images(const std::string& path);

/// Reads one labels file (magic 0x801, N unsigned bytes); the same errors as above.
std::vector<std::uint8_t> read_idx_labels(const std::string& path);   // (N)

/// Images and labels together; also checks that the counts agree and that every
/// label is below `classes`.
ImageDataset load_idx(const std::string& images_path, const std::string& labels_path,
                      std::size_t classes = 10);

/// The four IDX files of a dataset.
struct IdxPaths {
  std::string train_images, train_labels, test_images, test_labels;  // their paths
};

/// The four standard names (train-images-idx3-ubyte, train-labels-idx1-ubyte,
/// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte) in dir, each with ".gz" if that
/// file exists, else without if that exists, else with ".gz" (for the error message).
IdxPaths idx_dir_paths(const std::string& dir);

/// Debian's dataset-fashion-mnist folder, /usr/share/datasets/fashion-mnist, or the
/// folder in the environment variable DPGRAD_FASHION_MNIST when set and non-empty.
std::string fashion_mnist_dir();
IdxPaths fashion_mnist_paths();

/// Fashion-MNIST's training (60000) or test (10000) split. A missing file gives a
/// DataError that says "install it with: apt-get install dataset-fashion-mnist".
ImageDataset load_fashion_mnist(bool train);

/// Writers (for tests and tools). gzip = false writes a plain file.
/// images: (N, R, C); throws std::invalid_argument on another rank or a dimension
/// above 2^32 - 1, DataError if the file cannot be written.
void write_idx_images(const std::string& path, const ArrayT<std::uint8_t>& images, bool gzip);
void write_idx_labels(const std::string& path, const std::vector<std::uint8_t>& labels,  // (N)
                      bool gzip);

}  // namespace dpgrad::data
