// dpgrad-train's plot (programs/train/plot.hpp): gnuplot run as a child process.
#include "programs/train/plot.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <fmt/core.h>

namespace dpgrad::train {

using json = nlohmann::json;

/// Runs `gnuplot ARGS...`; returns its exit status (127 when it cannot be started).
namespace {
int run_gnuplot(std::vector<std::string> args) {
  std::vector<char*> argv;
  std::string prog = "gnuplot";
  argv.push_back(prog.data());
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv.data(), environ) != 0) return 127;
  int st = 0;
  if (waitpid(pid, &st, 0) < 0) return 127;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

}  // namespace

void require_gnuplot() {
  if (run_gnuplot({"-e", "exit"}) != 0)
    throw std::invalid_argument(
        "--plot needs gnuplot, which was not found: install it with 'sudo apt-get install gnuplot-nox' (./dev deps does)");
}

void require_writable_file(const std::string& path, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw std::invalid_argument(flag + " " + path + " is a folder, not a file name");
  const std::string probe = path + ".write-test-" + std::to_string(getpid());
  {
    std::ofstream out(probe);
    if (!out) throw std::invalid_argument(flag + " " + path + ": cannot write there (" + std::strerror(errno) + ")");
  }
  fs::remove(probe, ec);
}

void plot_history(const std::string& out, const nlohmann::json& history, bool with_epsilon, const std::string& title) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("dpgrad-plot-" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream data(dir / "history.dat");
    data << "# epoch test_accuracy_percent epsilon\n";
    for (const auto& row : history) {
      const json& e = row.contains("epsilon") ? row["epsilon"] : json();
      data << row["epoch"].get<long>() << ' ' << 100 * row["test_accuracy"].get<double>() << ' '
           << (e.is_number() ? fmt::format("{}", e.get<double>()) : std::string("NaN")) << '\n';
    }
    std::string tmp_png = out + ".tmp" + std::to_string(getpid());
    std::ofstream gp(dir / "plot.gp");
    gp << "set terminal pngcairo size 900,560 font 'sans,11'\n"
       << "set output '" << tmp_png << "'\n"
       << "set title \"" << title << "\" noenhanced\n"
       << "set xlabel 'epoch'\nset ylabel 'test accuracy (%)'\nset grid\nset key bottom right\n"
       << (history.size() <= 20 ? "set xtics 1\n" : "")
       << "set datafile missing 'NaN'\n";
    if (with_epsilon) {
      gp << "set y2label 'epsilon'\nset y2tics\nset ytics nomirror\n"
         << "plot '" << (dir / "history.dat").string() << "' using 1:2 with linespoints lw 2 title 'test accuracy', "
         << "'' using 1:3 axes x1y2 with linespoints lw 2 title 'epsilon (spent so far)'\n";
    } else {
      gp << "plot '" << (dir / "history.dat").string() << "' using 1:2 with linespoints lw 2 title 'test accuracy'\n";
    }
  }
  int rc = run_gnuplot({(dir / "plot.gp").string()});
  std::error_code ec;
  std::string tmp_png = out + ".tmp" + std::to_string(getpid());
  if (rc == 0) fs::rename(tmp_png, out, ec);
  fs::remove_all(dir);
  if (rc != 0 || ec) {
    fs::remove(tmp_png, ec);
    throw std::runtime_error("gnuplot could not write " + out + (rc != 0 ? fmt::format(" (exit status {})", rc) : ""));
  }
}

}  // namespace dpgrad::train
