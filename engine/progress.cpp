// Progress (engine/progress.hpp).
#include "engine/progress.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace dpgrad {

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

Progress::Progress(std::string unit, bool quiet)
    : unit_(std::move(unit)), tty_(::isatty(::fileno(stderr)) != 0 && !quiet), quiet_(quiet) {}

void Progress::update(long done, long total, const std::string& label) {
  if (quiet_ || total <= 0) return;
  if (calls_++ == 0) start_ = now();
  const double elapsed = now() - start_;
  char speed[96] = "";
  if (calls_ > 1 && elapsed > 0) {
    const double rate = double(calls_ - 1) / elapsed;
    std::snprintf(speed, sizeof speed, "  %6.1f %ss/s ETA %5.0fs", rate, unit_.c_str(), double(total - done) / rate);
  }
  const std::string head = label.empty() ? "" : label + " ";
  if (tty_) {
    constexpr int width = 30;
    const int filled = int(double(width) * double(done) / double(total));
    std::fprintf(stderr, "\r  %s[%s%s] %6ld/%ld%s ", head.c_str(), std::string(std::size_t(filled), '#').c_str(),
                 std::string(std::size_t(width - filled), '.').c_str(), done, total, speed);
    if (done == total) std::fputc('\n', stderr);
  } else if (done == total || done * 10 / total != (done - 1) * 10 / total) {
    std::fprintf(stderr, "  %s%s %ld/%ld%s\n", head.c_str(), unit_.c_str(), done, total, speed);
  }
  std::fflush(stderr);
}

}  // namespace dpgrad
