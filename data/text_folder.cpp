// Tokenizer, vocabularies and folder reader behind text_folder.hpp. Everything is
// byte-oriented and deterministic (sorted folders and files, ties broken by the
// word's bytes, a fixed hash key), so two machines give the same ids.
#include "data/text_folder.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <sodium.h>

namespace dpgrad::data {

namespace {

namespace fs = std::filesystem;

bool is_word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

char lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : static_cast<char>(c); }

/// Calls emit(word) for each token of text, reusing one buffer; stops early when
/// emit returns false.
template <class Emit>
void for_each_token(std::string_view text, Emit&& emit) {
  std::string word;
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (is_word_byte(c)) {
      word.push_back(lower(c));
    } else if (c == '\'' && !word.empty() && i + 1 < n &&
               is_word_byte(static_cast<unsigned char>(text[i + 1]))) {
      word.push_back('\'');
    } else if (!word.empty()) {
      if (!emit(word)) return;
      word.clear();
    }
  }
  if (!word.empty()) emit(word);
}

bool ends_with_txt(const std::string& name) {
  return name.size() > 4 && name.compare(name.size() - 4, 4, ".txt") == 0;
}

}  // namespace

std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::int64_t record_id(std::string_view name) {
  return static_cast<std::int64_t>(fnv1a64(name) & 0x7fffffffffffffffULL);
}

std::string read_file(const std::filesystem::path& path) {
  require_regular_file(path.string(), "a text file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw DataError(path.string() + ": cannot read: " + std::strerror(errno));
  auto too_large = [&](const std::string& size) {
    std::fclose(f);
    return DataError(path.string() + ": " + size + ", more than the " + std::to_string(kMaxDocumentBytes >> 20) +
                     " MiB a document may hold (only its first words are used: cut it, or leave it out)");
  };
  struct stat st {};
  if (::fstat(fileno(f), &st) == 0 && std::uintmax_t(st.st_size) > kMaxDocumentBytes)
    throw too_large(std::to_string(std::uintmax_t(st.st_size)) + " bytes");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const std::size_t r = std::fread(buf, 1, sizeof(buf), f);
    out.append(buf, r);
    if (out.size() > kMaxDocumentBytes) throw too_large("more than " + std::to_string(out.size()) + " bytes");
    if (r < sizeof(buf)) break;
  }
  const bool bad = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (bad) throw DataError(path.string() + ": read error: " + std::strerror(err));
  return out;
}

std::vector<std::string> tokenize(std::string_view text) {
  std::vector<std::string> out;
  for_each_token(text, [&](const std::string& w) {
    out.push_back(w);
    return true;
  });
  return out;
}

// ---------------------------------------------------------------- Vocabulary

Vocabulary::Vocabulary() {
  add("<pad>", 0);
  add("<unk>", 0);
}

void Vocabulary::add(std::string word, std::int64_t count) {
  const auto id = static_cast<std::int32_t>(words_.size());
  ids_.emplace(word, id);
  words_.push_back(std::move(word));
  counts_.push_back(count);
}

Vocabulary Vocabulary::build(const std::vector<std::string>& docs, std::size_t size) {
  if (size < 2)
    throw std::invalid_argument("Vocabulary::build: size must be >= 2 (pad and unknown), got " +
                                std::to_string(size));
  if (size > static_cast<std::size_t>(INT32_MAX))
    throw std::invalid_argument("Vocabulary::build: size does not fit in int32");
  std::unordered_map<std::string, std::int64_t, Hash, std::equal_to<>> counts;
  for (const auto& doc : docs) {
    for_each_token(doc, [&](const std::string& w) {
      auto it = counts.find(std::string_view(w));
      if (it == counts.end()) counts.emplace(w, 1);
      else ++it->second;
      return true;
    });
  }
  std::vector<std::pair<std::string, std::int64_t>> ranked(counts.begin(), counts.end());
  auto before = [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  };
  const std::size_t keep = std::min(ranked.size(), size - 2);
  std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(keep), ranked.end(), before);
  Vocabulary v;
  for (std::size_t i = 0; i < keep; ++i) v.add(std::move(ranked[i].first), ranked[i].second);
  return v;
}

Vocabulary Vocabulary::hashed(std::size_t size) {
  if (size < 3 || size > kMaxTokens + 2)
    throw std::invalid_argument("Vocabulary::hashed: size must be in [3, " + std::to_string(kMaxTokens + 2) +
                                "] (pad, unknown and at least one bucket), got " + std::to_string(size));
  if (sodium_init() < 0) throw std::runtime_error("libsodium failed to initialise");
  Vocabulary v;
  v.hashed_size_ = size;
  return v;
}

Vocabulary Vocabulary::from_token_file(const std::string& path, std::size_t max_size) {
  constexpr std::uintmax_t kMaxBytes = 256u << 20;
  auto fail = [&](const std::string& why) -> void { throw DataError(path + ": " + why); };
  if (max_size < 3) throw std::invalid_argument("Vocabulary::from_token_file: max_size must be >= 3");
  std::error_code ec;
  require_regular_file(path, "a token file");
  const std::uintmax_t bytes = fs::file_size(path, ec);
  if (!ec && bytes > kMaxBytes)
    fail("too large for a vocabulary file (" + std::to_string(bytes) + " bytes; at most " + std::to_string(kMaxBytes) +
         ")");
  const std::string text = read_file(path);
  const std::size_t cap = std::min(max_size, kMaxTokens + 2) - 2;
  Vocabulary v;
  std::size_t lineno = 0;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::string at = "line " + std::to_string(lineno);
    if (line.empty()) fail(at + " is empty (one token per line, no blank lines)");
    std::size_t words = 0;
    bool same = false;
    for_each_token(line, [&](const std::string& w) {
      same = ++words == 1 && w == line;
      return words < 2;
    });
    if (!same || words != 1)
      fail(at + ": '" + std::string(line.substr(0, 60)) + (line.size() > 60 ? "..." : "") +
           "' is not one token as the tokenizer makes them (lower-case ASCII letters and digits, apostrophes inside)");
    if (const auto it = v.ids_.find(line); it != v.ids_.end())
      fail(at + ": duplicate token '" + std::string(line) + "' (first on line " + std::to_string(it->second - 1) + ")");
    if (v.words_.size() - 2 >= cap)
      fail("more than " + std::to_string(cap) + " tokens: the embedding holds " + std::to_string(cap + 2) +
           " ids, 0 and 1 being padding and unknown");
    v.add(std::string(line), 0);
  }
  if (v.words_.size() == 2) fail("empty file: a vocabulary file holds one token per line");
  return v;
}

std::int32_t Vocabulary::id(std::string_view word) const {
  if (hashed_size_ != 0) {
    unsigned char h[crypto_shorthash_BYTES];
    crypto_shorthash(h, reinterpret_cast<const unsigned char*>(word.data()), word.size(), kHashKey);
    std::uint64_t x = 0;
    for (int i = 7; i >= 0; --i) x = (x << 8) | h[i];
    return static_cast<std::int32_t>(2 + x % (hashed_size_ - 2));
  }
  const auto it = ids_.find(word);
  return it == ids_.end() ? kUnknown : it->second;
}

const std::string& Vocabulary::word(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= size())
    throw std::out_of_range("Vocabulary::word: id " + std::to_string(id) + " outside [0, " + std::to_string(size()) +
                            ")");
  if (static_cast<std::size_t>(id) >= words_.size())
    throw std::out_of_range("Vocabulary::word: id " + std::to_string(id) + " is a hash bucket, not one word");
  return words_[static_cast<std::size_t>(id)];
}

std::int64_t Vocabulary::count(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= size())
    throw std::out_of_range("Vocabulary::count: id " + std::to_string(id) + " out of range");
  return static_cast<std::size_t>(id) < counts_.size() ? counts_[static_cast<std::size_t>(id)] : 0;
}

void Vocabulary::save(const std::string& path) const {
  if (hashed_size_ != 0) throw std::invalid_argument("Vocabulary::save: a hashed vocabulary has no word list to save");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw DataError(path + ": cannot create: " + std::strerror(errno));
  out << "dpgrad-vocabulary 1 " << words_.size() << '\n';
  for (const auto& w : words_) out << w << '\n';
  out.close();
  if (!out) throw DataError(path + ": write failed");
}

Vocabulary Vocabulary::load(const std::string& path) {
  std::istringstream in(read_file(path));
  auto fail = [&](const std::string& why) -> void { throw DataError(path + ": not a vocabulary file: " + why); };
  std::string line;
  if (!std::getline(in, line)) fail("empty file");
  std::istringstream head(line);
  std::string tag, rest;
  int version = 0;
  long long declared = -1;
  if (!(head >> tag >> version >> declared) || tag != "dpgrad-vocabulary" || (head >> rest))
    fail("first line must be 'dpgrad-vocabulary 1 <size>'");
  if (version != 1) fail("unsupported version " + std::to_string(version));
  if (declared < 2 || declared > INT32_MAX) fail("bad size " + std::to_string(declared));
  Vocabulary v;
  v.words_.clear();
  v.counts_.clear();
  v.ids_.clear();
  std::size_t lineno = 1;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line.find_first_of(" \t\r") != std::string::npos)
      fail("line " + std::to_string(lineno) + " is empty or contains whitespace");
    if (v.ids_.count(std::string_view(line)))
      fail("line " + std::to_string(lineno) + ": duplicate word '" + line + "'");
    if (v.words_.size() >= static_cast<std::size_t>(declared))
      fail("more words than the declared " + std::to_string(declared));
    v.add(line, 0);
  }
  if (v.words_.size() != static_cast<std::size_t>(declared))
    fail("declares " + std::to_string(declared) + " words, has " + std::to_string(v.words_.size()));
  if (v.words_[0] != "<pad>" || v.words_[1] != "<unk>") fail("ids 0 and 1 must be <pad> and <unk>");
  return v;
}

// ---------------------------------------------------------------- folders

std::vector<std::string> class_folders(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw DataError(dir + ": no such folder");
  if (!fs::is_directory(dir, ec)) throw DataError(dir + ": not a folder");
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] != '.' && it->is_directory(ec)) names.push_back(name);
  }
  if (ec) throw DataError(dir + ": cannot list: " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

RawText read_text_folder(const std::string& dir, const std::vector<std::string>& classes) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw DataError(dir + ": no such folder");
  if (!fs::is_directory(dir, ec)) throw DataError(dir + ": not a folder");
  RawText raw;
  if (classes.empty()) {
    raw.class_names = class_folders(dir);
    if (raw.class_names.empty())
      throw DataError(dir + ": no class folders (expected " + dir + "/<class>/*.txt)");
  } else {
    raw.class_names = classes;
    for (std::size_t i = 0; i < classes.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (classes[i] == classes[j]) throw std::invalid_argument("read_text_folder: class '" + classes[i] + "' given twice");
  }
  for (std::size_t label = 0; label < raw.class_names.size(); ++label) {
    const fs::path class_dir = fs::path(dir) / raw.class_names[label];
    if (!fs::is_directory(class_dir, ec)) throw DataError(class_dir.string() + ": class folder missing");
    std::vector<fs::path> files;
    for (fs::directory_iterator it(class_dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code ec2;
      if (ends_with_txt(name) && !it->is_directory(ec2)) files.push_back(it->path());
    }
    if (ec) throw DataError(class_dir.string() + ": cannot list: " + ec.message());
    if (files.empty()) throw DataError(class_dir.string() + ": empty class (no .txt files)");
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      raw.docs.push_back(read_file(f));
      raw.labels.push_back(static_cast<std::int32_t>(label));
      raw.sources.push_back(f.string());
      raw.ids.push_back(record_id(raw.class_names[label] + "/" + f.filename().string()));
    }
  }
  return raw;
}

// ---------------------------------------------------------------- encoding

std::vector<std::int32_t> encode_doc(std::string_view text, const Vocabulary& vocab, std::size_t max_len) {
  if (max_len == 0) throw std::invalid_argument("encode: max_len must be >= 1");
  std::vector<std::int32_t> ids;
  // Stops tokenising after max_len words: long documents cost only what is kept.
  for_each_token(text, [&](const std::string& w) {
    ids.push_back(vocab.id(w));
    return ids.size() < max_len;
  });
  if (ids.empty()) ids.push_back(Vocabulary::kUnknown);
  return ids;
}

TextDataset encode(const RawText& raw, const Vocabulary& vocab, std::size_t max_len) {
  if (max_len == 0) throw std::invalid_argument("encode: max_len must be >= 1");
  if (raw.labels.size() != raw.docs.size())
    throw std::invalid_argument("encode: " + std::to_string(raw.docs.size()) + " documents but " +
                                std::to_string(raw.labels.size()) + " labels");
  if (!raw.ids.empty() && raw.ids.size() != raw.docs.size())
    throw std::invalid_argument("encode: " + std::to_string(raw.docs.size()) + " documents but " +
                                std::to_string(raw.ids.size()) + " ids");
  TextDataset ds;
  const std::size_t n = raw.docs.size();
  ds.tokens = xt::zeros<std::int32_t>(Shape{n, max_len});
  ds.lengths.resize(n);
  ds.labels = raw.labels;
  ds.class_names = raw.class_names;
  ds.ids = raw.ids;
  for (std::size_t i = 0; i < n; ++i) {
    const auto ids = encode_doc(raw.docs[i], vocab, max_len);
    std::copy(ids.begin(), ids.end(), ds.tokens.data() + i * max_len);
    ds.lengths[i] = static_cast<std::int32_t>(ids.size());
  }
  return ds;
}

}  // namespace dpgrad::data
