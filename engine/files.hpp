// Output files written safely: the one path every output file of the library and
// the programs goes through (plots, predictions, ONNX exports, benchmark tables).
// A path that exists and is not a regular file is never replaced, and a file is
// written to a scratch file of its own beside it, renamed over it once complete. Not installed.
#pragma once

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dpgrad {

/// `path` without trailing '/' and "/." parts, so that a symbolic link named
/// "link/" is looked at itself (lstat of "link/" follows it). "/" stays "/".
inline std::string without_trailing_separators(std::string path) {
  for (;;) {
    if (path.size() > 1 && path.back() == '/') path.pop_back();
    else if (path.size() > 2 && path.compare(path.size() - 2, 2, "/.") == 0) path.resize(path.size() - 2);
    else return path;
  }
}

/// The folder of the file `path` names ("." for a bare name).
inline std::string folder_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// 16 random hex digits, for scratch-file names no one can plant in advance.
inline std::string random_suffix() {
  std::uint64_t r = 0;
  if (::getrandom(&r, sizeof r, 0) != ssize_t(sizeof r))
    r = (std::uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(r));
  return text;
}

/// A file created beside `path` (same folder, a hidden random name) exclusively
/// (O_EXCL, never through a symbolic link): its descriptor and name, or fd -1 with errno set.
struct ScratchFile {
  int fd = -1;
  std::string name;
  explicit ScratchFile(const std::string& path, mode_t mode) {
    const std::string folder = folder_of(path), base = path.substr(path.rfind('/') + 1);
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
      name = (folder == "/" ? "/" : folder + "/") + "." + base.substr(0, 64) + ".tmp-" + random_suffix();
      fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
      if (fd < 0 && errno != EEXIST) break;
    }
  }
};

/// The problem with `path` as an output file ("" when there is none): a path that
/// exists and is not a regular file (a folder, a device, a FIFO, a socket, a symbolic
/// link) is never replaced; a missing folder, or one that does not take a new file,
/// cannot hold it.
inline std::string output_file_problem(const std::string& given) {
  if (given.empty()) return "needs a file name";
  const std::string path = without_trailing_separators(given);
  if (path != given) return given + " ends in '/': name a file, not a folder";
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return path + " is a folder, not a file name";
    if (S_ISLNK(st.st_mode)) return path + " is a symbolic link: it is not replaced; name a regular file";
    if (!S_ISREG(st.st_mode))
      return path + " exists and is not a regular file (a device, FIFO or socket): it is not replaced";
  } else if (errno != ENOENT) {
    return path + ": cannot write there (" + std::strerror(errno) + ")";
  }
  const std::string folder = folder_of(path);
  if (::stat(folder.c_str(), &st) != 0)
    return path + ": its folder " + folder +
           (errno == ENOENT ? " does not exist" : std::string(" cannot be read (") + std::strerror(errno) + ")");
  if (!S_ISDIR(st.st_mode)) return path + ": " + folder + " is not a folder";
  ScratchFile probe(path, 0600);  // the folder must take a new file
  if (probe.fd < 0) return path + ": cannot write in its folder " + folder + " (" + std::strerror(errno) + ")";
  ::close(probe.fd);
  ::unlink(probe.name.c_str());
  return "";
}

/// Throws std::invalid_argument naming `flag` and the path unless a regular file
/// can be written at `path` (output_file_problem). For the checks before any work:
/// every output path is checked before any data is read.
inline void require_output_file(const std::string& path, const std::string& flag) {
  const std::string problem = output_file_problem(path);
  if (!problem.empty()) throw std::invalid_argument(flag + " " + problem);
}

/// Writes `bytes` to `path`: to a scratch file created exclusively beside it
/// (ScratchFile; `mode` less the umask: 0600 for checkpoints and keys), written,
/// fsynced and closed, then renamed over `path` and the folder fsynced, so a failed
/// write leaves what was there. Throws std::runtime_error naming `flag` when `path`
/// is no longer fit (output_file_problem, checked again) or a step fails.
inline void write_output_file(const std::string& path, std::string_view bytes, const std::string& flag,
                              mode_t mode = 0666) {
  auto fail = [&](const std::string& why) { throw std::runtime_error(flag + " " + path + ": " + why); };
  struct stat st {};
  if (path.empty() || without_trailing_separators(path) != path) fail("not a file name");
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) fail("is not a regular file: it is not replaced");
  ScratchFile tmp(path, mode);
  if (tmp.fd < 0) fail(std::string("cannot create a file beside it (") + std::strerror(errno) + ")");
  std::string error;
  for (std::size_t done = 0; done < bytes.size() && error.empty();) {
    const ssize_t n = ::write(tmp.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) error = std::string("write failed (") + std::strerror(n < 0 ? errno : EIO) + ")";
    else done += std::size_t(n);
  }
  if (error.empty() && ::fsync(tmp.fd) != 0) error = std::string("write failed (") + std::strerror(errno) + ")";
  if (::close(tmp.fd) != 0 && error.empty()) error = std::string("write failed (") + std::strerror(errno) + ")";
  if (error.empty() && ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    error = "is no longer a regular file: it is not replaced";
  if (error.empty() && ::rename(tmp.name.c_str(), path.c_str()) != 0)
    error = std::string("cannot replace it (") + std::strerror(errno) + ")";
  if (!error.empty()) {
    ::unlink(tmp.name.c_str());
    fail(error);
  }
  const int folder = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (folder >= 0) {  // the rename itself on disk
    ::fsync(folder);
    ::close(folder);
  }
}

}  // namespace dpgrad
