// fork + exec of this program with a pipe on its stdout, an optional memory
// limit, a timeout, and the child's own peak RSS from wait4.
#include "bench/bench_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dpgrad::bench {

namespace {

long status_kb(const std::string& path, const std::string& field) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, field.size() + 1, field + ":") == 0) {
      std::istringstream s(line.substr(field.size() + 1));
      long kb = 0;
      s >> kb;
      return kb;
    }
  return 0;
}

}  // namespace

long self_status_kb(const std::string& field) { return status_kb("/proc/self/status", field); }

std::string ChildResult::describe() const {
  std::ostringstream s;
  if (timed_out) s << "timed out after " << long(seconds) << " s";
  else if (over_limit) s << "resident memory over the limit (killed)";
  else if (signal) s << "killed by signal " << signal << " (" << strsignal(signal) << ")";
  else s << "exit " << exit_code;
  return s.str();
}

ChildResult run_self(const std::vector<std::string>& args, const ChildOptions& opts) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  std::vector<char*> argv;
  std::string self = "/proc/self/exe";
  argv.push_back(self.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);

  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    dup2(fds[1], STDOUT_FILENO);
    if (opts.quiet) {
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0) dup2(null, STDERR_FILENO);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);

  ChildResult res;
  const std::string status_path = "/proc/" + std::to_string(pid) + "/status";
  const bool watch_rss = opts.limit == MemoryLimit::resident;
  bool killed = false;
  char buf[4096];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    int r = poll(&p, 1, watch_rss ? 5 : 100);
    if (r < 0 && errno != EINTR) break;
    if (r > 0) {
      ssize_t n = read(fds[0], buf, sizeof(buf));
      if (n > 0) res.out.append(buf, std::size_t(n));
      else if (n == 0 || errno != EINTR) break;  // EOF: the child closed stdout (it is ending)
    }
    if (killed) continue;
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (opts.timeout_s > 0 && secs > opts.timeout_s) res.timed_out = true;
    if (watch_rss && double(status_kb(status_path, "VmRSS")) * 1024.0 > opts.limit_bytes) res.over_limit = true;
    if (res.timed_out || res.over_limit) {
      kill(pid, SIGKILL);
      killed = true;
    }
  }
  close(fds[0]);
  int status = 0;
  rusage ru{};
  while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.peak_rss_kb = ru.ru_maxrss;
  if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) res.signal = WTERMSIG(status);
  // sampling can miss a short peak; the kernel's high-water mark cannot
  if (watch_rss && double(res.peak_rss_kb) * 1024.0 > opts.limit_bytes) res.over_limit = true;
  return res;
}

}  // namespace dpgrad::bench
