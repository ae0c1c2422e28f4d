// Tests for the IDX loader: small files written here (plain and gzipped) round
// trip exactly, every malformed input gives a DataError naming the file and the
// problem, and the real Fashion-MNIST test set loads when the package is installed.
#include <doctest/doctest.h>

#include "support/real_data.hpp"

#include "support/check.hpp"
#include "support/temp_dir.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/datasets.hpp"
#include "data/idx.hpp"

namespace fs = std::filesystem;
using namespace dpgrad::data;

namespace {

struct TempDir : dpgrad::test::TempDir {
  TempDir() : dpgrad::test::TempDir("dpgrad-idx") {}
};

using Bytes = std::vector<unsigned char>;

void write_bytes(const std::string& path, const Bytes& b, bool gzip) {
  if (!gzip) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    REQUIRE(f.good());
    return;
  }
  gzFile g = gzopen(path.c_str(), "wb");
  REQUIRE(g != nullptr);
  if (!b.empty()) REQUIRE(gzwrite(g, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(g) == Z_OK);
}

Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put_be32(Bytes& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}

Bytes header(std::uint32_t magic, std::vector<std::uint32_t> dims) {
  Bytes b;
  put_be32(b, magic);
  for (auto d : dims) put_be32(b, d);
  return b;
}

// 3 images of 2 x 4 with known pixels, labels {0, 9, 3}.
dpgrad::ArrayT<std::uint8_t> sample_images() {
  dpgrad::ArrayT<std::uint8_t> im = xt::zeros<std::uint8_t>(dpgrad::Shape{3, 2, 4});
  for (std::size_t i = 0; i < im.size(); ++i) im.data()[i] = static_cast<std::uint8_t>((i * 37) % 256);
  im(0, 0, 0) = 0;
  im(1, 1, 3) = 255;
  return im;
}
const std::vector<std::uint8_t> kLabels = {0, 9, 3};

template <class F>
void check_error(F&& f, const std::vector<std::string>& fragments) {
  dpgrad::test::check_error<DataError>(std::forward<F>(f), fragments);
}

}  // namespace

TEST_CASE("idx: images and labels round trip, plain and gzipped") {
  TempDir dir;
  const auto im = sample_images();
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    const std::string ip = dir / (gz ? "im.gz" : "im"), lp = dir / (gz ? "lb.gz" : "lb");
    write_idx_images(ip, im, gz);
    write_idx_labels(lp, kLabels, gz);
    const Bytes raw = read_bytes(ip);
    if (gz) {
      REQUIRE(raw.size() >= 2);
      CHECK((raw[0] == 0x1f && raw[1] == 0x8b));  // gzip magic
    } else {
      CHECK(raw.size() == 16 + 24);
      CHECK(raw == [&] {
        Bytes b = header(0x803, {3, 2, 4});
        b.insert(b.end(), im.data(), im.data() + im.size());
        return b;
      }());
    }

    const IdxImages r = read_idx_images(ip);
    CHECK(r.count == 3);
    CHECK(r.rows == 2);
    CHECK(r.cols == 4);
    CHECK(r.pixels == std::vector<std::uint8_t>(im.data(), im.data() + im.size()));
    CHECK(read_idx_labels(lp) == kLabels);

    const ImageDataset ds = load_idx(ip, lp);
    CHECK(dpgrad::shape_of(ds.images) == dpgrad::Shape{3, 1, 2, 4});
    CHECK(ds.labels == std::vector<std::int32_t>{0, 9, 3});
    CHECK(ds.classes == 10);
    for (std::size_t n = 0; n < 3; ++n)
      for (std::size_t y = 0; y < 2; ++y)
        for (std::size_t x = 0; x < 4; ++x) CHECK(ds.images(n, 0, y, x) == im(n, y, x) / 255.0f);
    CHECK(ds.images(0, 0, 0, 0) == 0.0f);
    CHECK(ds.images(1, 0, 1, 3) == 1.0f);
  }
}

TEST_CASE("idx: standard file names in a folder, .gz preferred") {
  TempDir dir;
  IdxPaths p = idx_dir_paths(dir.path.string());
  CHECK(p.train_images == dir / "train-images-idx3-ubyte.gz");  // nothing there: the .gz name
  CHECK(p.test_labels == dir / "t10k-labels-idx1-ubyte.gz");
  write_idx_labels(dir / "t10k-labels-idx1-ubyte", kLabels, false);
  write_idx_images(dir / "t10k-images-idx3-ubyte", sample_images(), false);
  p = idx_dir_paths(dir.path.string());
  CHECK(p.test_labels == dir / "t10k-labels-idx1-ubyte");
  CHECK(load_idx(p.test_images, p.test_labels).labels.size() == 3);
  write_idx_labels(dir / "t10k-labels-idx1-ubyte.gz", kLabels, true);
  CHECK(idx_dir_paths(dir.path.string()).test_labels == dir / "t10k-labels-idx1-ubyte.gz");
}

TEST_CASE("idx: every malformed file is a DataError naming the file") {
  TempDir dir;
  const std::string good_im = dir / "good-im", good_lb = dir / "good-lb";
  write_idx_images(good_im, sample_images(), false);
  write_idx_labels(good_lb, kLabels, false);
  const std::string bad = dir / "bad-file";
  auto images_error = [&](const Bytes& b, bool gz, std::vector<std::string> frags) {
    write_bytes(bad, b, gz);
    frags.insert(frags.begin(), bad);
    check_error([&] { read_idx_images(bad); }, frags);
  };
  Bytes pixels24(24, 7);

  SUBCASE("missing file and folder") {
    check_error([&] { read_idx_images(dir / "nope"); }, {dir / "nope", "no such file"});
    check_error([&] { read_idx_labels(dir.path.string()); }, {"is a folder, not an IDX file"});
  }
  SUBCASE("empty file and short header") {
    images_error({}, false, {"empty file"});
    images_error({0, 0}, false, {"too short for an IDX header"});
    images_error({}, true, {"empty file"});
  }
  SUBCASE("bad magic") {
    images_error(header(0x12345678, {3, 2, 4}), false, {"bad magic 0x12345678", "expected 0x00000803"});
    images_error(header(0x00000d03, {3, 2, 4}), false, {"element type 0x0d"});
  }
  SUBCASE("wrong number of dimensions") {
    images_error(read_bytes(good_lb), false, {"expected 3 dimension(s)", "header says 1", "labels file"});
    check_error([&] { read_idx_labels(good_im); }, {good_im, "expected 1 dimension(s)", "images file"});
  }
  SUBCASE("truncated header, truncated data") {
    images_error(header(0x803, {3, 2}), false, {"header ends inside the dimension sizes"});
    Bytes b = header(0x803, {3, 2, 4});
    b.insert(b.end(), 10, 1);
    images_error(b, false, {"truncated: expected 24 image bytes, got 10"});
    images_error(b, true, {"truncated: expected 24 image bytes, got 10"});
    Bytes l = header(0x801, {5});
    l.insert(l.end(), {1, 2});
    write_bytes(bad, l, false);
    check_error([&] { read_idx_labels(bad); }, {bad, "truncated: expected 5 label bytes, got 2"});
  }
  SUBCASE("gzip stream cut short or corrupted") {
    Bytes b = header(0x803, {3, 2, 4});
    b.insert(b.end(), pixels24.begin(), pixels24.end());
    write_bytes(bad, b, true);
    Bytes gz = read_bytes(bad);
    REQUIRE(gz.size() > 12);
    Bytes cut(gz.begin(), gz.end() - 12);  // loses part of the deflate data and the trailer
    write_bytes(bad, cut, false);
    check_error([&] { read_idx_images(bad); }, {bad, "truncated"});
    Bytes corrupt = gz;
    corrupt[corrupt.size() - 6] ^= 0xff;  // damages the CRC32 / length trailer
    write_bytes(bad, corrupt, false);
    check_error([&] { read_idx_images(bad); }, {bad, "gzip"});
  }
  SUBCASE("trailing data is an error") {
    Bytes b = header(0x803, {3, 2, 4});
    b.insert(b.end(), pixels24.begin(), pixels24.end());
    b.insert(b.end(), 5, 0xaa);
    images_error(b, false, {"trailing data: 5 bytes after the 24 image bytes"});
    images_error(b, true, {"trailing data: 5 bytes"});
  }
  SUBCASE("empty dataset and zero-size images") {
    images_error(header(0x803, {0, 28, 28}), false, {"empty dataset"});
    write_bytes(bad, header(0x801, {0}), false);
    check_error([&] { read_idx_labels(bad); }, {bad, "empty dataset"});
    images_error(header(0x803, {3, 0, 4}), false, {"bad image size 0 x 4"});
  }
  SUBCASE("corrupt header sizes: no giant allocation") {
    images_error(header(0x803, {0xffffffffu, 0xffffffffu, 0xffffffffu}), false, {"more than the 2 GiB"});
    // 50M images of 28 x 28 (39 GB) announced, 24 bytes present: refused from the header, before reading
    Bytes b = header(0x803, {50000000u, 28, 28});
    b.insert(b.end(), pixels24.begin(), pixels24.end());
    images_error(b, false, {"50000000 images of 28 x 28 pixels", "36.51 GiB", "more than the 2 GiB"});
    // 2 x 12 pixels announced and present: read
    Bytes ok = header(0x803, {2, 3, 4});
    ok.insert(ok.end(), pixels24.begin(), pixels24.end());
    write_bytes(bad, ok, false);
    CHECK(read_idx_images(bad).count == 2);
  }
  SUBCASE("a gzip bomb's header (3 GB announced) names the file and the size") {
    // what 3 GB of zeros would start with; the rest is never read
    Bytes b = header(0x803, {3000u, 1000u, 1000u});
    b.insert(b.end(), 4096, 0);
    images_error(b, true, {"3000 images of 1000 x 1000 pixels", "2.79 GiB", "11.18 GiB as floats",
                           "more than the 2 GiB dpgrad reads"});
    Bytes l = header(0x801, {3000000000u});
    write_bytes(bad, l, true);
    check_error([&] { read_idx_labels(bad); }, {bad, "3000000000 labels", "2.79 GiB"});
  }
  SUBCASE("bytes after the gzip stream are refused, as bytes after a plain file's data are") {
    Bytes b = header(0x803, {3, 2, 4});
    b.insert(b.end(), pixels24.begin(), pixels24.end());
    write_bytes(bad, b, true);
    Bytes gz = read_bytes(bad);
    Bytes garbage = gz;
    garbage.insert(garbage.end(), {'j', 'u', 'n', 'k', '!', 0, 0});
    write_bytes(bad, garbage, false);
    check_error([&] { read_idx_images(bad); }, {bad, "trailing data: 7 bytes after the end of the gzip stream"});
    Bytes zeros = gz;
    zeros.insert(zeros.end(), 512, 0);  // padding, as some tools leave it
    write_bytes(bad, zeros, false);
    check_error([&] { read_idx_images(bad); }, {bad, "trailing data: 512 bytes"});
    // two gzip members in one file read as one stream (gzip(1) reads them so)
    Bytes first(b.begin(), b.begin() + 20), second(b.begin() + 20, b.end());
    const std::string part = dir / "part.gz";
    write_bytes(part, first, true);
    Bytes joined = read_bytes(part);
    write_bytes(part, second, true);
    const Bytes tail = read_bytes(part);
    joined.insert(joined.end(), tail.begin(), tail.end());
    write_bytes(bad, joined, false);
    CHECK(read_idx_images(bad).pixels == std::vector<std::uint8_t>(pixels24.begin(), pixels24.end()));
  }
  SUBCASE("images and labels disagree") {
    write_idx_labels(bad, {1, 2}, false);
    check_error([&] { load_idx(good_im, bad); }, {good_im, bad, "3 images", "2 labels"});
    write_idx_labels(bad, {1, 10, 2}, false);
    check_error([&] { load_idx(good_im, bad); }, {bad, "label 10 at index 1 is out of range [0, 10)"});
    CHECK(load_idx(good_im, bad, 11).classes == 11);  // fine with 11 classes
    CHECK_THROWS_AS(load_idx(good_im, good_lb, 0), std::invalid_argument);
  }
  SUBCASE("writer arguments") {
    dpgrad::ArrayT<std::uint8_t> flat = xt::zeros<std::uint8_t>(dpgrad::Shape{4, 4});
    CHECK_THROWS_AS(write_idx_images(dir / "x", flat, false), std::invalid_argument);
    CHECK_THROWS_AS(write_idx_labels((dir / "no-such-dir") + "/x", kLabels, false), DataError);
  }
}

TEST_CASE("idx: a loop of symbolic links or a broken link is named as such, not as a missing file") {
  TempDir dir;
  const fs::path folder = dir.path / "data";
  fs::create_directory(folder);
  write_idx_labels((folder / "train-labels-idx1-ubyte").string(), kLabels, false);
  write_idx_images((folder / "t10k-images-idx3-ubyte").string(), sample_images(), false);
  write_idx_labels((folder / "t10k-labels-idx1-ubyte").string(), kLabels, false);
  // train images: a link to a file that does not exist
  fs::create_symlink(dir.path / "gone.gz", folder / "train-images-idx3-ubyte.gz");
  check_error([&] { dpgrad::data::load_dataset("idx:" + folder.string()); },
              {"train-images-idx3-ubyte.gz", "a symbolic link to a file that does not exist"});
  // a loop of two links
  fs::remove(folder / "train-images-idx3-ubyte.gz");
  fs::create_symlink(folder / "other", folder / "train-images-idx3-ubyte.gz");
  fs::create_symlink(folder / "train-images-idx3-ubyte.gz", folder / "other");
  check_error([&] { dpgrad::data::load_dataset("idx:" + folder.string()); },
              {"train-images-idx3-ubyte.gz", "a loop of symbolic links"});
  // truly missing: the hint
  fs::remove(folder / "train-images-idx3-ubyte.gz");
  check_error([&] { dpgrad::data::load_dataset("idx:" + folder.string()); }, {"no such file", "idx:PATH needs"});
}

TEST_CASE("idx: Fashion-MNIST location and missing-package message") {
  const char* old = std::getenv("DPGRAD_FASHION_MNIST");
  const std::string saved = old ? old : "";
  TempDir empty;
  setenv("DPGRAD_FASHION_MNIST", empty.path.string().c_str(), 1);
  CHECK(fashion_mnist_dir() == empty.path.string());
  CHECK(fashion_mnist_paths().test_images == empty / "t10k-images-idx3-ubyte.gz");
  check_error([] { load_fashion_mnist(false); },
              {"t10k-images-idx3-ubyte.gz: no such file", "install it with: apt-get install dataset-fashion-mnist"});
  setenv("DPGRAD_FASHION_MNIST", "", 1);
  CHECK(fashion_mnist_dir() == "/usr/share/datasets/fashion-mnist");
  if (old) setenv("DPGRAD_FASHION_MNIST", saved.c_str(), 1);
  else unsetenv("DPGRAD_FASHION_MNIST");
}

TEST_CASE("idx: the real Fashion-MNIST test set") {
  const IdxPaths p = fashion_mnist_paths();
  if (!fs::exists(p.test_images) || !fs::exists(p.test_labels))
    dpgrad::test::real_data_missing("Fashion-MNIST not found in " + fashion_mnist_dir() +
                                    " (apt-get install dataset-fashion-mnist)");
  const ImageDataset ds = load_fashion_mnist(false);
  CHECK(dpgrad::shape_of(ds.images) == dpgrad::Shape{10000, 1, 28, 28});
  REQUIRE(ds.labels.size() == 10000);
  std::array<int, 10> count{};
  for (auto l : ds.labels) {
    REQUIRE((l >= 0 && l < 10));
    ++count[static_cast<std::size_t>(l)];
  }
  for (int c = 0; c < 10; ++c) {
    CAPTURE(c);
    CHECK(count[static_cast<std::size_t>(c)] == 1000);
  }
  CHECK(ds.labels[0] == 9);  // the first test image is an ankle boot
  double lo = 1, hi = 0, sum = 0;
  for (float v : ds.images) {
    lo = std::min<double>(lo, v);
    hi = std::max<double>(hi, v);
    sum += v;
  }
  CHECK(lo == 0.0);
  CHECK(hi == 1.0);
  // The test set's mean pixel is about 0.287 (the usual normalisation constant
  // for the training set is 0.2860).
  const double mean = sum / static_cast<double>(ds.images.size());
  CHECK(mean == doctest::Approx(0.287).epsilon(0.01));
}

TEST_CASE("idx: a gzip bomb after the data (16 GB of zeros in 16 MB of gzip) is refused without inflating it") {
  TempDir dir;
  const std::string bomb = dir / "bomb-labels.gz";
  // one label, then 1000 gzip members of 16 MB of zeros each: one stream to zlib, 16 GB inflated
  write_bytes(bomb, [] {
    Bytes b = header(0x801, {1});
    b.push_back(7);
    return b;
  }(), true);
  Bytes file = read_bytes(bomb);
  write_bytes(bomb, Bytes(std::size_t(16) << 20, 0), true);
  const Bytes zeros = read_bytes(bomb);
  for (int k = 0; k < 1000; ++k) file.insert(file.end(), zeros.begin(), zeros.end());
  write_bytes(bomb, file, false);
  CHECK(file.size() < (std::size_t(40) << 20));
  // refused once the inflated bytes after the label pass 1 MiB, not after 16 GB of them
  check_error([&] { read_idx_labels(bomb); },
              {bomb, "trailing data: more than 1048576 bytes after the 1 label bytes the header announces"});
}
