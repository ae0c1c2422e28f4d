// Text classification data: a folder of class folders of .txt files (the aclImdb
// layout), a lower-casing ASCII word tokenizer, a frequency-ranked vocabulary
// built on the training split only, and fixed-length padded token id arrays
// that the embedding and LSTM layers consume.
#pragma once

#include <filesystem>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/array.hpp"
#include "examples/data/idx.hpp"   // DataError

namespace dpgrad::data {

/// Documents with their labels, before tokenisation.
struct RawText {
  std::vector<std::string> docs;            // (N)
  std::vector<std::int32_t> labels;         // (N), index into class_names
  std::vector<std::string> class_names;     // (K)
  std::vector<std::string> sources;         // (N), the file each document came from
};

/// Encoded documents: the first max_len token ids, padded with 0 at the end.
struct TextDataset {
  ArrayT<std::int32_t> tokens;              // (N, T) ids in [0, vocabulary size)
  std::vector<std::int32_t> lengths;        // (N), true lengths in [1, T]
  std::vector<std::int32_t> labels;         // (N)
  std::vector<std::string> class_names;     // (K)
};

/// Lower-cased words: maximal runs of ASCII letters and digits, where an
/// apostrophe between two such characters stays inside the word ("don't",
/// "o'brien"; "'quoted'" gives "quoted"). Every other byte separates words,
/// including every byte >= 0x80 (so non-UTF-8 input is harmless, and words with
/// non-ASCII letters are split around them: "café" gives "caf").
/// The whole file as bytes; DataError naming the file when it cannot be read.
std::string read_file(const std::filesystem::path& path);

std::vector<std::string> tokenize(std::string_view text);

/// Word -> id. Id 0 is padding ("<pad>"), id 1 is unknown ("<unk>"), then words
/// by decreasing count of occurrences (all occurrences, not documents), ties in
/// byte order of the word.
class Vocabulary {
 public:
  static constexpr std::int32_t kPad = 0;
  static constexpr std::int32_t kUnknown = 1;

  Vocabulary();   // just <pad> and <unk>

  /// The size - 2 most frequent words of docs (fewer if the corpus has fewer
  /// distinct words: size() says how many ids there are). size >= 2.
  static Vocabulary build(const std::vector<std::string>& docs, std::size_t size);

  std::int32_t id(std::string_view word) const;          // kUnknown if absent
  const std::string& word(std::int32_t id) const;        // throws std::out_of_range
  std::size_t size() const { return words_.size(); }
  /// How often each word occurred when the vocabulary was built (0 for pad/unk
  /// and after load).
  std::int64_t count(std::int32_t id) const;

  /// Text file: the line "dpgrad-vocabulary 1 <size>", then one word per line in
  /// id order (line k + 2 holds id k). load throws DataError on a malformed file.
  void save(const std::string& path) const;
  static Vocabulary load(const std::string& path);

 private:
  void add(std::string word, std::int64_t count);
  std::vector<std::string> words_;                          // (size) id -> word
  std::vector<std::int64_t> counts_;                        // (size)
  struct Hash {   // lets id() look up a string_view without a copy
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::int32_t, Hash, std::equal_to<>> ids_;
};

/// Reads dir/<class>/*.txt. Classes: the given folder names in the given order
/// (label = position), or when classes is empty every subfolder of dir whose
/// name does not start with '.', sorted by name. Files in a class are sorted by
/// name; files not ending in ".txt" are ignored. For aclImdb pass {"neg", "pos"}
/// (train/ also holds "unsup").
/// Throws DataError: missing dir, no class folders, a requested class folder
/// missing, a class with no .txt files, an unreadable file.
RawText read_text_folder(const std::string& dir, const std::vector<std::string>& classes = {});

/// Token ids of one document: the first max_len words; an empty document (no
/// words at all) becomes a single <unk>, so every length is at least 1 and no
/// document is silently dropped.
std::vector<std::int32_t> encode_doc(std::string_view text, const Vocabulary& vocab,
                                     std::size_t max_len = 150);

/// Every document of raw, padded with kPad to max_len. max_len >= 1.
TextDataset encode(const RawText& raw, const Vocabulary& vocab, std::size_t max_len = 150);

}  // namespace dpgrad::data
