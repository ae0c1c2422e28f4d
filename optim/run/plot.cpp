// A run's plot (optim/run/report.hpp): gnuplot run as a child process on a
// fixed script, in a private temporary folder.
#include "optim/run/report.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/files.hpp"
#include "privacy/accountant.hpp"  // format_number

namespace dpgrad {

using json = nlohmann::json;

namespace {

/// Runs `gnuplot ARGS...` without a shell; returns its exit status (127 when it cannot be started).
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

/// The script: ARG1 the data file, ARG2 the image, ARG3 the title, ARG4 "epsilon"
/// for a second axis, ARG5 "clip" for a panel of the adaptive clip norm. String
/// variables are values to gnuplot, never code.
constexpr const char* kScript =
    "if (ARG5 eq 'clip') { set terminal pngcairo size 900,860 font 'sans,11' } "
    "else { set terminal pngcairo size 900,560 font 'sans,11' }\n"
    "set output ARG2\n"
    "if (ARG5 eq 'clip') set multiplot layout 2,1\n"
    "set title ARG3 noenhanced font ',9'\n"
    "set xlabel 'epoch'\nset ylabel 'test accuracy (%)'\nset grid\nset key bottom right\n"
    "set datafile missing 'NaN'\n"
    "stats ARG1 using 1 nooutput\n"
    "if (STATS_records <= 20) set xtics 1\n"
    "if (ARG4 eq 'epsilon') {\n"
    "  set y2label 'epsilon'\n  set y2tics\n  set ytics nomirror\n"
    "  plot ARG1 using 1:2 with linespoints lw 2 title 'test accuracy', "
    "'' using 1:3 axes x1y2 with linespoints lw 2 title 'epsilon (spent so far)'\n"
    "} else {\n"
    "  plot ARG1 using 1:2 with linespoints lw 2 title 'test accuracy'\n"
    "}\n"
    "if (ARG5 eq 'clip') {\n"
    "  unset y2label\n  unset y2tics\n  set ytics mirror\n  unset title\n  set logscale y\n"
    "  set ylabel 'clip norm C'\n  set key top right\n"
    "  plot ARG1 using 1:4 with linespoints lw 2 title 'clip norm after the epoch (adaptive)'\n"
    "  unset multiplot\n"
    "}\n";

/// A private folder under the temporary directory, removed with its contents.
struct TempFolder {
  std::filesystem::path path;
  TempFolder() {
    std::string pattern = (std::filesystem::temp_directory_path() / "dpgrad-plot-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a temporary folder for the plot");
    path = pattern;
  }
  ~TempFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

void require_gnuplot(const std::string& flag) {
  if (run_gnuplot({"-e", "exit"}) != 0)
    throw std::invalid_argument(
        flag + " needs gnuplot, which was not found: install it with 'sudo apt-get install gnuplot-nox' (./dev deps does)");
}

void plot_history(const std::string& out, const json& history, const std::string& title, const std::string& flag) {
  require_output_file(out, flag);  // before gnuplot runs
  TempFolder dir;
  const std::filesystem::path data = dir.path / "history.dat", script = dir.path / "plot.gp", png = dir.path / "plot.png";
  {
    std::ofstream d(data);
    d << "# epoch test_accuracy_percent epsilon clip_norm\n";
    auto number = [](const json& row, const char* key, double scale = 1) {
      return row.contains(key) && row[key].is_number() ? privacy::format_number(scale * row[key].get<double>()) : std::string("NaN");
    };
    for (const auto& row : history)
      d << row.at("epoch").get<long>() << ' ' << number(row, "test_accuracy", 100) << ' ' << number(row, "epsilon")
        << ' ' << number(row, "clip_norm") << '\n';
    std::ofstream s(script);
    s << kScript;
    if (!d || !s) throw std::runtime_error("cannot write the plot's data in " + dir.path.string());
  }
  // control characters would only garble the title: shown as '?'
  std::string shown = title;
  for (char& c : shown)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  const bool clip = !history.empty() && history.back().contains("clip_norm");
  bool with_epsilon = false;
  for (const auto& row : history) with_epsilon = with_epsilon || row.contains("epsilon");
  const int rc = run_gnuplot(
      {"-c", script.string(), data.string(), png.string(), shown, with_epsilon ? "epsilon" : "-", clip ? "clip" : "-"});
  std::ifstream in(png, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (rc != 0 || bytes.empty())
    throw std::runtime_error("gnuplot could not draw the plot for " + out +
                             (rc != 0 ? " (exit status " + std::to_string(rc) + ")" : std::string()));
  write_output_file(out, bytes, flag);
}

}  // namespace dpgrad
