// Output files written safely (the library's plots, the programs' outputs): a
// path that exists and is not a regular file is never replaced, and a file is
// written beside its path and renamed over it only once complete. Not installed.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dpgrad {

/// Throws std::invalid_argument naming `flag` unless a regular file can be
/// written at `path`: a path that exists and is not a regular file (a folder, a
/// device, a FIFO, a socket, a symbolic link) is never replaced, and the folder
/// must take a new file (checked by creating and removing a scratch file beside
/// it). For checks before any work.
inline void require_output_file(const std::string& path, const std::string& flag) {
  if (path.empty()) throw std::invalid_argument(flag + " needs a file name");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw std::invalid_argument(flag + " " + path + " is a folder, not a file name");
    if (S_ISLNK(st.st_mode))
      throw std::invalid_argument(flag + " " + path + " is a symbolic link: it is not replaced; name a regular file");
    if (!S_ISREG(st.st_mode))
      throw std::invalid_argument(flag + " " + path +
                                  " exists and is not a regular file (a device, FIFO or socket): it is not replaced");
  } else if (errno != ENOENT) {
    throw std::invalid_argument(flag + " " + path + ": cannot write there (" + std::strerror(errno) + ")");
  }
  const std::string probe = path + ".write-test-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw std::invalid_argument(flag + " " + path + ": cannot write there (" + std::strerror(errno) + ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

/// Writes `bytes` to `path` through a scratch file beside it, renamed over it
/// only once written, synced and closed: a failed write leaves what was there.
/// Refuses (std::runtime_error naming `flag`) a path that is no longer a regular
/// file or absent when the write comes (require_output_file checked it before).
inline void write_output_file(const std::string& path, std::string_view bytes, const std::string& flag) {
  auto fail = [&](const std::string& why) { throw std::runtime_error(flag + " " + path + ": " + why); };
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) fail(std::string("cannot create a file beside it (") + std::strerror(errno) + ")");
  std::string error;
  for (std::size_t done = 0; done < bytes.size() && error.empty();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) error = std::string("write failed (") + std::strerror(n < 0 ? errno : EIO) + ")";
    else done += std::size_t(n);
  }
  if (error.empty() && ::fsync(fd) != 0) error = std::string("write failed (") + std::strerror(errno) + ")";
  if (::close(fd) != 0 && error.empty()) error = std::string("write failed (") + std::strerror(errno) + ")";
  struct stat st {};
  if (error.empty() && ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    error = "is no longer a regular file: it is not replaced";
  if (error.empty() && ::rename(tmp.c_str(), path.c_str()) != 0)
    error = std::string("cannot replace it (") + std::strerror(errno) + ")";
  if (!error.empty()) {
    ::unlink(tmp.c_str());
    fail(error);
  }
}

}  // namespace dpgrad
