// IDX reader on zlib's inflate (plain files are read as they are) and writer on
// its gz* interface. Headers are validated before any data is read, and data are
// read in bounded chunks, so a corrupt header can neither crash nor trigger a huge
// allocation.
#include "data/idx.hpp"

#include <sys/stat.h>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

namespace dpgrad::data {

namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kImagesMagic = 0x00000803;
constexpr std::uint32_t kLabelsMagic = 0x00000801;
constexpr std::size_t kChunk = std::size_t{1} << 20;
// The largest payload read from one file (2 GiB of pixels, 8 GiB as floats): a header announcing more
// is refused before anything is read, naming the size, rather than running out of memory.
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 31;

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / double(std::uint64_t{1} << 30));
  return buf;
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError(path + ": " + what);
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ELOOP) throw DataError(path + ": a loop of symbolic links, not " + what);
    if (errno == ENOENT || errno == ENOTDIR) {
      struct stat link {};
      if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
        throw DataError(path + ": a symbolic link to a file that does not exist, not " + what);
      throw DataError(path + ": no such file");
    }
    throw DataError(path + ": cannot read: " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) throw DataError(path + ": is a folder, not " + what);
  if (!S_ISREG(st.st_mode)) throw DataError(path + ": is not a regular file (a FIFO, socket or device), not " + what);
}

namespace {

/// Reads a plain or gzipped file (told apart by gzip's magic bytes) through
/// zlib's inflate, so that the end of the compressed data is seen: what follows
/// the last gzip member is trailing data, refused as a plain file's extra bytes
/// are. Concatenated gzip members read as one stream, as gzip(1) reads them.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path), in_(kInput) {
    require_regular_file(path, "an IDX file");
    f_ = std::fopen(path.c_str(), "rb");
    if (f_ == nullptr) fail(path, std::string("cannot open: ") + std::strerror(errno));
    while (available() < 2 && fill()) {
    }
    gzip_ = starts_with_magic();
    if (gzip_ && inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) fail(path, "cannot start gzip decompression");
  }
  ~GzReader() {
    if (gzip_) inflateEnd(&zs_);
    if (f_) std::fclose(f_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  /// Reads up to n bytes into out; returns the count, short only at the end of
  /// the data. Throws on a corrupt or truncated gzip stream, and on trailing
  /// bytes after the last gzip member.
  std::size_t read_some(unsigned char* out, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      if (!gzip_) {
        if (available() == 0 && !fill()) break;
        const std::size_t k = std::min(n - got, available());
        std::memcpy(out + got, in_.data() + pos_, k);
        pos_ += k;
        got += k;
        continue;
      }
      if (member_done_) {
        while (available() < 2 && fill()) {
        }
        if (available() == 0) break;  // the file ends after a whole member
        if (!starts_with_magic())
          fail(path_, "trailing data: " + std::to_string(count_input_left()) +
                          " bytes after the end of the gzip stream that are not gzip data (a corrupt or wrong file)");
        inflateReset(&zs_);
        member_done_ = false;
      }
      if (available() == 0 && !fill()) fail(path_, "truncated gzip stream (unexpected end of compressed data)");
      zs_.next_in = in_.data() + pos_;
      zs_.avail_in = static_cast<uInt>(available());
      zs_.next_out = out + got;
      zs_.avail_out = static_cast<uInt>(std::min(n - got, kChunk));
      const uInt before = zs_.avail_out;
      const int r = inflate(&zs_, Z_NO_FLUSH);
      pos_ = len_ - zs_.avail_in;
      got += before - zs_.avail_out;
      if (r == Z_STREAM_END) member_done_ = true;
      else if (r == Z_BUF_ERROR && !fill()) fail(path_, "truncated gzip stream (unexpected end of compressed data)");
      else if (r != Z_OK && r != Z_BUF_ERROR)
        fail(path_, std::string("corrupt gzip data: ") + (zs_.msg ? zs_.msg : "unknown zlib error " + std::to_string(r)));
    }
    return got;
  }

  /// Counts (and discards) the bytes left in the data, stopping once more than
  /// `cap` are counted: a gzip bomb's output is never inflated past the cap.
  std::uint64_t count_rest(std::uint64_t cap) {
    std::vector<unsigned char> buf(1 << 16);
    std::uint64_t n = 0;
    for (;;) {
      const std::size_t r = read_some(buf.data(), buf.size());
      n += r;
      if (r < buf.size() || n > cap) return n;
    }
  }

 private:
  static constexpr std::size_t kInput = 1 << 16;
  std::size_t available() const { return len_ - pos_; }
  bool starts_with_magic() const { return available() >= 2 && in_[pos_] == 0x1f && in_[pos_ + 1] == 0x8b; }
  /// Keeps the unread input at the front and reads more after it; false at the end of the file.
  bool fill() {
    std::memmove(in_.data(), in_.data() + pos_, available());
    len_ = available();
    pos_ = 0;
    if (len_ == in_.size()) return true;
    const std::size_t r = std::fread(in_.data() + len_, 1, in_.size() - len_, f_);
    if (r == 0 && std::ferror(f_)) fail(path_, std::string("read error: ") + std::strerror(errno));
    len_ += r;
    return r > 0;
  }
  std::uint64_t count_input_left() {
    std::uint64_t n = available();
    pos_ = len_;
    while (fill()) {
      n += available();
      pos_ = len_;
    }
    return n;
  }

  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<unsigned char> in_;
  std::size_t pos_ = 0, len_ = 0;
  bool gzip_ = false, member_done_ = false;
  z_stream zs_{};
};

std::uint32_t big_endian32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

/// Reads and checks the header; returns the dimensions.
std::vector<std::uint32_t> read_header(GzReader& in, const std::string& path, std::uint32_t magic,
                                       const char* kind) {
  unsigned char head[4];
  const std::size_t got = in.read_some(head, 4);
  if (got == 0) fail(path, "empty file (no IDX header)");
  if (got < 4) fail(path, "truncated: " + std::to_string(got) + " bytes, too short for an IDX header");
  const std::uint32_t found = big_endian32(head);
  const unsigned want_dims = magic & 0xff;
  if (head[0] != 0 || head[1] != 0)
    fail(path, "not an IDX file: bad magic " + hex32(found) + " (expected " + hex32(magic) + " for " +
                   kind + ")");
  if (head[2] != 0x08)
    fail(path, "IDX element type 0x" + hex32(head[2]).substr(8) + " is not unsigned byte (0x08)");
  if (head[3] != want_dims) {
    std::string hint;
    if (head[3] == 1) hint = "; this looks like a labels file";
    if (head[3] == 3) hint = "; this looks like an images file";
    fail(path, "expected " + std::to_string(want_dims) + " dimension(s) for " + kind +
                   " (magic " + hex32(magic) + "), header says " + std::to_string(head[3]) +
                   " (magic " + hex32(found) + ")" + hint);
  }
  std::vector<std::uint32_t> dims(want_dims);
  for (unsigned d = 0; d < want_dims; ++d) {
    unsigned char b[4];
    if (in.read_some(b, 4) < 4) fail(path, "truncated: header ends inside the dimension sizes");
    dims[d] = big_endian32(b);
  }
  return dims;
}

/// Reads exactly `bytes` payload bytes (in chunks, growing as data arrive), then
/// requires end of file.
std::vector<std::uint8_t> read_payload(GzReader& in, const std::string& path, std::uint64_t bytes,
                                       const std::string& what) {
  std::vector<std::uint8_t> data;
  data.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(bytes, 64u << 20)));
  while (data.size() < bytes) {
    const std::size_t old = data.size();
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(bytes - old, kChunk));
    data.resize(old + want);
    const std::size_t got = in.read_some(data.data() + old, want);
    if (got < want) {
      fail(path, "truncated: expected " + std::to_string(bytes) + " " + what + " bytes, got " +
                     std::to_string(old + got));
    }
  }
  constexpr std::uint64_t kCountedTrailing = 1 << 20;  // beyond this, "more than"
  const std::uint64_t extra = in.count_rest(kCountedTrailing);
  if (extra > 0)
    fail(path, "trailing data: " +
                   (extra > kCountedTrailing ? "more than " + std::to_string(kCountedTrailing) : std::to_string(extra)) +
                   " bytes after the " + std::to_string(bytes) + " " + what + " bytes the header announces");
  return data;
}

/// Whether the folder holds an entry of this name (a symbolic link counts, even a broken one).
bool has_entry(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

std::string with_gz_if_present(const std::string& dir, const std::string& name) {
  const fs::path gz = fs::path(dir) / (name + ".gz");
  const fs::path plain = fs::path(dir) / name;
  if (has_entry(gz)) return gz.string();
  if (has_entry(plain)) return plain.string();
  return gz.string();
}

/// Writes through gzopen: "wb" compresses, "wbT" writes a plain file.
class GzWriter {
 public:
  GzWriter(const std::string& path, bool gzip) : path_(path) {
    f_ = gzopen(path.c_str(), gzip ? "wb" : "wbT");
    if (f_ == nullptr) fail(path, std::string("cannot create: ") + std::strerror(errno));
  }
  ~GzWriter() {
    if (f_) gzclose(f_);
  }
  GzWriter(const GzWriter&) = delete;
  GzWriter& operator=(const GzWriter&) = delete;

  void write(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    while (n > 0) {
      const unsigned k = static_cast<unsigned>(std::min(n, kChunk));
      if (gzwrite(f_, c, k) != static_cast<int>(k)) fail(path_, "write failed");
      c += k;
      n -= k;
    }
  }
  void write_be32(std::uint32_t v) {
    const unsigned char b[4] = {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                                static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
    write(b, 4);
  }
  void close() {
    const int r = gzclose(f_);
    f_ = nullptr;
    if (r != Z_OK) fail(path_, "closing failed (disk full?)");
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

std::uint32_t checked_dim(std::size_t n, const char* what) {
  if (n > std::numeric_limits<std::uint32_t>::max())
    throw std::invalid_argument(std::string("write_idx: ") + what + " does not fit in 32 bits");
  return static_cast<std::uint32_t>(n);
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  GzReader in(path);
  const auto dims = read_header(in, path, kImagesMagic, "images");
  const std::uint64_t n = dims[0], rows = dims[1], cols = dims[2];
  if (n == 0) fail(path, "empty dataset: the header says 0 images");
  if (rows == 0 || cols == 0)
    fail(path, "bad image size " + std::to_string(rows) + " x " + std::to_string(cols));
  if (rows * cols > kMaxBytes / n)
    fail(path, "the header announces " + std::to_string(n) + " images of " + std::to_string(rows) + " x " +
                   std::to_string(cols) + " pixels, " + gib(double(n) * double(rows) * double(cols)) + " (" +
                   gib(4.0 * double(n) * double(rows) * double(cols)) +
                   " as floats): more than the 2 GiB dpgrad reads from one IDX file");
  IdxImages out;
  out.count = static_cast<std::size_t>(n);
  out.rows = static_cast<std::size_t>(rows);
  out.cols = static_cast<std::size_t>(cols);
  out.pixels = read_payload(in, path, n * rows * cols, "image");
  return out;
}

std::vector<std::uint8_t> read_idx_labels(const std::string& path) {
  GzReader in(path);
  const auto dims = read_header(in, path, kLabelsMagic, "labels");
  if (dims[0] == 0) fail(path, "empty dataset: the header says 0 labels");
  if (dims[0] > kMaxBytes)
    fail(path, "the header announces " + std::to_string(dims[0]) + " labels, " + gib(double(dims[0])) +
                   ": more than the 2 GiB dpgrad reads from one IDX file");
  return read_payload(in, path, dims[0], "label");
}

ImageDataset load_idx(const std::string& images_path, const std::string& labels_path,
                      std::size_t classes) {
  if (classes == 0 || classes > 256)
    throw std::invalid_argument("load_idx: classes must be in [1, 256], got " + std::to_string(classes));
  // Labels first: small, and their errors are cheap to find.
  const auto labels = read_idx_labels(labels_path);
  const IdxImages raw = read_idx_images(images_path);
  if (raw.count != labels.size())
    throw DataError(images_path + " has " + std::to_string(raw.count) + " images but " + labels_path +
                    " has " + std::to_string(labels.size()) + " labels");
  ImageDataset ds;
  ds.classes = classes;
  ds.labels.resize(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= classes)
      fail(labels_path, "label " + std::to_string(labels[i]) + " at index " + std::to_string(i) +
                            " is out of range [0, " + std::to_string(classes) + ")");
    ds.labels[i] = labels[i];
  }
  ds.images = xt::empty<float>(Shape{raw.count, 1, raw.rows, raw.cols});
  float* dst = ds.images.data();
  const std::uint8_t* src = raw.pixels.data();
  for (std::size_t i = 0, n = raw.pixels.size(); i < n; ++i) dst[i] = static_cast<float>(src[i]) / 255.0f;
  return ds;
}

IdxPaths idx_dir_paths(const std::string& dir) {
  return {with_gz_if_present(dir, "train-images-idx3-ubyte"),
          with_gz_if_present(dir, "train-labels-idx1-ubyte"),
          with_gz_if_present(dir, "t10k-images-idx3-ubyte"),
          with_gz_if_present(dir, "t10k-labels-idx1-ubyte")};
}

std::string fashion_mnist_dir() {
  const char* env = std::getenv("DPGRAD_FASHION_MNIST");
  if (env != nullptr && env[0] != '\0') return env;
  return "/usr/share/datasets/fashion-mnist";
}

IdxPaths fashion_mnist_paths() { return idx_dir_paths(fashion_mnist_dir()); }

ImageDataset load_fashion_mnist(bool train) {
  const std::string dir = fashion_mnist_dir();
  const IdxPaths p = idx_dir_paths(dir);
  const std::string& images = train ? p.train_images : p.test_images;
  const std::string& labels = train ? p.train_labels : p.test_labels;
  for (const auto* path : {&images, &labels}) {
    if (!has_entry(*path)) {
      const char* env = std::getenv("DPGRAD_FASHION_MNIST");
      const bool custom = env != nullptr && env[0] != '\0';
      throw DataError(*path + ": no such file; Fashion-MNIST not found in " + dir +
                      (custom ? " (from DPGRAD_FASHION_MNIST)" : "") +
                      "; install it with: apt-get install dataset-fashion-mnist");
    }
  }
  return load_idx(images, labels, 10);
}

void write_idx_images(const std::string& path, const ArrayT<std::uint8_t>& images, bool gzip) {
  if (images.dimension() != 3)
    throw std::invalid_argument("write_idx_images: images must be (N, R, C), got rank " +
                                std::to_string(images.dimension()));
  const std::uint32_t n = checked_dim(images.shape()[0], "N");
  const std::uint32_t r = checked_dim(images.shape()[1], "R");
  const std::uint32_t c = checked_dim(images.shape()[2], "C");
  GzWriter out(path, gzip);
  out.write_be32(kImagesMagic);
  out.write_be32(n);
  out.write_be32(r);
  out.write_be32(c);
  // xarray is row-major: its buffer is the IDX pixel order.
  out.write(images.data(), images.size());
  out.close();
}

void write_idx_labels(const std::string& path, const std::vector<std::uint8_t>& labels, bool gzip) {
  const std::uint32_t n = checked_dim(labels.size(), "N");
  GzWriter out(path, gzip);
  out.write_be32(kLabelsMagic);
  out.write_be32(n);
  out.write(labels.data(), labels.size());
  out.close();
}

}  // namespace dpgrad::data
