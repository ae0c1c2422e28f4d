// Text classification data: a folder of class folders of .txt files (the aclImdb
// layout), a lower-casing ASCII word tokenizer, vocabularies that never look at
// the private documents (feature hashing, or a public token list; see
// docs/data-privacy.md), and fixed-length padded token id arrays for the
// embedding and LSTM layers.
#pragma once

#include <filesystem>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/array.hpp"
#include "data/idx.hpp"   // DataError

namespace dpgrad::data {

/// Documents with their labels, before tokenisation.
struct RawText {
  std::vector<std::string> docs;            // (N)
  std::vector<std::int32_t> labels;         // (N), index into class_names
  std::vector<std::string> class_names;     // (K)
  std::vector<std::string> sources;         // (N), the file each document came from
  std::vector<std::int64_t> ids;            // (N), record_id of the file's name (see record_id)
};

/// Encoded documents: the first max_len token ids, padded with 0 at the end.
struct TextDataset {
  ArrayT<std::int32_t> tokens;              // (N, T) ids in [0, vocabulary size)
  std::vector<std::int32_t> lengths;        // (N), true lengths in [1, T]
  std::vector<std::int32_t> labels;         // (N)
  std::vector<std::string> class_names;     // (K)
  std::vector<std::int64_t> ids;            // (N), RawText::ids
};

/// 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3): a
/// portable hash (std::hash is implementation-defined).
std::uint64_t fnv1a64(std::string_view bytes);

/// A document's record id: fnv1a64(name) with the top bit cleared, where name
/// is the file's path below the dataset's root ("pos/a.txt", "spam-1/00001.x.txt").
/// It depends on that one file's name alone, so adding or removing another file
/// changes no other document's id (docs/data-privacy.md).
std::int64_t record_id(std::string_view name);

/// Lower-cased words: maximal runs of ASCII letters and digits, where an
/// apostrophe between two such characters stays inside the word ("don't",
/// "o'brien"; "'quoted'" gives "quoted"). Every other byte separates words,
/// including every byte >= 0x80 (so non-UTF-8 input is harmless, and words with
/// non-ASCII letters are split around them: "café" gives "caf").
/// The largest document read_file takes: 64 MiB (a text model keeps its first
/// few hundred words; a larger file is the wrong one, and would exhaust memory).
inline constexpr std::uintmax_t kMaxDocumentBytes = std::uintmax_t{64} << 20;

/// The whole file as bytes; DataError naming the file when it cannot be read,
/// and naming it with its size when it is larger than kMaxDocumentBytes.
std::string read_file(const std::filesystem::path& path);

/// The words of `text` in order, by the rule of the "Lower-cased words" comment
/// above kMaxDocumentBytes.
std::vector<std::string> tokenize(std::string_view text);

/// Word -> id. Id 0 is padding ("<pad>"), id 1 is unknown ("<unk>"). The other
/// ids come from one of three sources:
///  - hashed(size): feature hashing, no word list; every word has an id;
///  - from_token_file(path): a public token list, ids in line order;
///  - build(docs, size): the most frequent words of docs. This reads the
///    documents: never use it on private training data (the programs do not).
class Vocabulary {
 public:
  /// The ids of padding ("<pad>") and of unknown words ("<unk>").
  static constexpr std::int32_t kPad = 0;
  static constexpr std::int32_t kUnknown = 1;
  /// Most tokens from_token_file reads (and largest hashed size): far more than
  /// any embedding table here holds.
  static constexpr std::size_t kMaxTokens = 10'000'000;

  Vocabulary();   // just <pad> and <unk>

  /// Words by decreasing count of occurrences in docs (all occurrences, not
  /// documents), ties in byte order of the word: the size - 2 most frequent
  /// (fewer if the corpus has fewer distinct words: size() says how many ids
  /// there are). size >= 2. Depends on every document: not for private data.
  static Vocabulary build(const std::vector<std::string>& docs, std::size_t size);

  /// Feature hashing into size - 2 buckets: id(w) = 2 + h(w) mod (size - 2),
  /// h = SipHash-2-4 (libsodium crypto_shorthash) of the word's bytes under the
  /// fixed public key kHashKey, read as a little-endian 64-bit number. Distinct
  /// words may share an id. Depends on no data. size in [3, kMaxTokens + 2].
  static Vocabulary hashed(std::size_t size);
  static constexpr unsigned char kHashKey[16] = {'d', 'p', 'g', 'r', 'a', 'd', '-', 'v',
                                                 'o', 'c', 'a', 'b', '-', 'v', '1', 0};

  /// A public token list: one token per line (a final newline and "\r" line
  /// ends are fine), token k (from 0) gets id k + 2. Every line must be one token
  /// exactly as tokenize() makes them (lower-case ASCII letters and digits,
  /// apostrophes inside). At most max_size - 2 tokens (the ids an embedding holds).
  /// Throws DataError naming the file (and line): missing or unreadable, larger
  /// than 256 MB, no tokens, an empty line, a line that is not one token, a
  /// duplicate, more tokens than fit.
  static Vocabulary from_token_file(const std::string& path, std::size_t max_size);

  std::int32_t id(std::string_view word) const;          // kUnknown if absent
  /// Throws std::out_of_range outside [0, size()), and for the ids >= 2 of a
  /// hashed vocabulary (a bucket has no one word).
  const std::string& word(std::int32_t id) const;
  std::size_t size() const { return hashed_size_ ? hashed_size_ : words_.size(); }
  bool is_hashed() const { return hashed_size_ != 0; }
  /// How often each word occurred when the vocabulary was built (0 for pad/unk
  /// and after load).
  std::int64_t count(std::int32_t id) const;

  /// Text file: the line "dpgrad-vocabulary 1 <size>", then one word per line in
  /// id order (line k + 2 holds id k). load throws DataError on a malformed file;
  /// save throws std::invalid_argument for a hashed vocabulary (no word list).
  void save(const std::string& path) const;
  static Vocabulary load(const std::string& path);

 private:
  void add(std::string word, std::int64_t count);
  std::vector<std::string> words_;                          // (size) id -> word
  std::vector<std::int64_t> counts_;                        // (size)
  std::size_t hashed_size_ = 0;                             // > 0: feature hashing
  struct Hash {   // lets id() look up a string_view without a copy
    /// Lets the map be searched with a std::string_view (with std::equal_to<>).
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::int32_t, Hash, std::equal_to<>> ids_;
};

/// The class folders of dir: its subfolders whose names do not start with '.',
/// sorted by name. Throws DataError when dir is missing, not a folder or unreadable.
std::vector<std::string> class_folders(const std::string& dir);

/// Reads dir/<class>/*.txt (ids: record_id("<class>/<file name>")). Classes: the given folder names in the given order
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

/// Every document of raw, padded with kPad to max_len, with raw's ids. max_len >= 1.
TextDataset encode(const RawText& raw, const Vocabulary& vocab, std::size_t max_len = 150);

}  // namespace dpgrad::data
