// Shared by the bundled programs (dpgrad-train, dpgrad-account, dpgrad-logreg,
// dpgrad-bench, dpgrad-audit, dpgrad-pate); not installed: one rule for numbers
// on every command line, and output that is checked (files and standard output).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/blas.hpp"   // use_best_core
#include "engine/files.hpp"  // require_output_file, write_output_file

namespace dpgrad {

/// Command-line errors of the bundled programs in one form: "PROGRAM: error:
/// what", then a pointer to --help (CLI11's own message names no program and
/// does not say it is an error).
inline void name_cli_errors(CLI::App& app, const std::string& program) {
  app.failure_message([program](const CLI::App*, const CLI::Error& e) {
    return program + ": error: " + e.what() + "\nRun with --help for more information.\n";
  });
}

/// Whole numbers >= 0 given to count options, in decimal: "-1" would otherwise
/// wrap around to a huge value in an unsigned type, CLI11 saturates a number too
/// large for its type silently, and it reads "0x10" as 16 and "010" as 8.
inline CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& s) {
        if (s.empty()) return std::string("an empty value is not a number");
        const bool digits = s.find_first_not_of("0123456789") == std::string::npos;
        if (!digits) return "must be a whole number >= 0, got '" + s + "' (decimal digits only)";
        if (s.size() > 1 && s[0] == '0')
          return "must be a whole number in decimal without a leading 0 (read as octal by some tools), got '" + s + "'";
        // at most 18 digits: below 10^18, inside every count type used
        if (s.size() > 18) return "is too large: '" + s + "'";
        return std::string();
      },
      "WHOLE NUMBER", "whole-number");
}

/// True when `text` is a decimal number as the programs take them: an optional
/// sign, digits with an optional decimal point, an optional exponent; or inf,
/// infinity, nan. Hexadecimal ("0x10", "0x1p3"), empty text and spaces are not.
inline bool is_decimal_real(std::string_view text) {
  std::size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  std::string word;
  for (std::size_t k = i; k < text.size(); ++k) word += char(std::tolower(static_cast<unsigned char>(text[k])));
  if (word == "inf" || word == "infinity" || word == "nan") return true;
  std::size_t digits = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    std::size_t exponent = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++exponent;
    if (exponent == 0) return false;
  }
  return i == text.size();
}

/// The problem with `text` as a real number ("" when it is one): not a decimal
/// number (is_decimal_real), or out of the range of double precision.
inline std::string real_number_problem(const std::string& text) {
  if (text.empty()) return "an empty value is not a number";
  if (!is_decimal_real(text)) {
    if (text.find_first_of("xX") != std::string::npos)
      return "'" + text + "' is hexadecimal: numbers are taken in decimal only";
    return "'" + text + "' is not a number";
  }
  errno = 0;
  const double v = std::strtod(text.c_str(), nullptr);
  if (errno == ERANGE)
    return "'" + text + "' is out of the range of double precision (" + (std::abs(v) > 1 ? "overflows" : "underflows") +
           ")";
  return "";
}

/// A real number in decimal that strtod reads whole, without overflow or underflow.
inline CLI::Validator real_number() {
  return CLI::Validator([](std::string& text) -> std::string { return real_number_problem(text); }, "REAL",
                        "real-number");
}

/// Text options whose empty value would otherwise read as "not given" (a file
/// name, a list of settings): an empty value is refused, naming `what` it should be.
inline CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& s) { return s.empty() ? "an empty value is not " + what : std::string(); }, "TEXT",
      "non-empty");
}

/// The one rule for numbers in every program: every option that holds numbers
/// (CLI11 types INT, UINT and FLOAT, single or lists) gets whole_number() or
/// real_number() unless it has it already. So an empty value ("--momentum ''")
/// is refused, never read as 0, and hexadecimal is refused everywhere.
/// The options apply_number_rules last saw that hold numbers (for the fuzz
/// harnesses, which check that none of them ever takes an empty value).
inline std::vector<std::string>& numeric_options_seen() {
  thread_local std::vector<std::string> names;
  return names;
}

inline void apply_number_rules(CLI::App& app) {
  numeric_options_seen().clear();
  auto has = [](CLI::Option* opt, const std::string& name) {
    try {
      opt->get_validator(name);
      return true;
    } catch (const CLI::OptionNotFound&) {
      return false;
    }
  };
  for (CLI::Option* opt : app.get_options([](CLI::Option*) { return true; })) {
    const std::string type = opt->get_type_name();
    if (type.rfind("FLOAT", 0) == 0) {
      if (!has(opt, "real-number")) opt->check(real_number());
    } else if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) {
      if (!has(opt, "whole-number")) opt->check(whole_number());
    } else {
      continue;
    }
    // every name the option answers to (get_name() is empty for a hidden option)
    for (const std::string& name : opt->get_lnames()) numeric_options_seen().push_back("--" + name);
    for (const std::string& name : opt->get_snames()) numeric_options_seen().push_back("-" + name);
  }
}

/// Parses argv into `app` under the number rules (apply_number_rules): nullopt
/// to go on, or the exit status for --help (0) and for a command-line error (2),
/// with the message already printed.
inline std::optional<int> parse_arguments(CLI::App& app, int argc, const char* const* argv) {
  apply_number_rules(app);
  try {
    // CLI11 drops a list's empty items ("3,,7" reads as 3,7, "1," as 1): refused instead
    for (int i = 1; i < argc; ++i) {
      const std::string word = argv[i];
      if (word.rfind("--", 0) != 0) continue;
      const std::size_t eq = word.find('=');
      const CLI::Option* opt = app.get_option_no_throw(word.substr(0, eq));
      if (opt == nullptr || opt->get_delimiter() == '\0') continue;
      if (eq == std::string::npos && i + 1 == argc) continue;  // no value: CLI11 says so
      const std::string value = eq == std::string::npos ? argv[i + 1] : word.substr(eq + 1);
      const char d = opt->get_delimiter();
      if (value.empty() || value.front() == d || value.back() == d || value.find(std::string(2, d)) != std::string::npos)
        throw CLI::ValidationError(word.substr(0, eq), "an empty value in the list '" + value +
                                                        "' (items separated by single '" + std::string(1, d) + "')");
    }
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- standard output

/// A library message in a program's words: each setting it names by its field
/// (clip_norm, checkpoints.every_steps) becomes the flag that sets it
/// (--clip-norm). `flags` are the program's flags without "--": those of two or
/// more words are found in their field's spelling ('_' for '-'); `renamed` maps
/// the fields whose flag is spelled otherwise. Other words, and parts of paths, are left as they are.
inline std::string in_flag_words(const std::string& message, const std::vector<std::string>& flags,
                                 const std::vector<std::pair<std::string, std::string>>& renamed = {}) {
  std::vector<std::pair<std::string, std::string>> fields = renamed;
  for (std::string f : flags)
    if (f.find('-') != std::string::npos) {
      const std::string flag = "--" + f;
      std::replace(f.begin(), f.end(), '-', '_');
      fields.emplace_back(f, flag);
    }
  auto in_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; };
  std::string out;
  for (std::size_t i = 0; i < message.size();) {
    std::size_t j = i;
    while (j < message.size() && in_word(message[j])) ++j;
    while (j > i && message[j - 1] == '.') --j;  // a full stop ends a sentence, not a field
    if (j == i) {
      out += message[i++];
      continue;
    }
    const std::string word = message.substr(i, j - i);
    const bool in_path = (i > 0 && message[i - 1] == '/') || (j < message.size() && message[j] == '/');
    const auto f = std::find_if(fields.begin(), fields.end(), [&](const auto& p) { return p.first == word; });
    out += f == fields.end() || in_path ? word : f->second;
    i = j;
  }
  return out;
}

/// A program's "say": each line of text it shows beside its results, on standard
/// output, or on standard error when standard output carries JSON (`json_out`).
/// Flushed, so that a pipe or file shows it in order with the progress lines.
inline std::function<void(const std::string&)> line_printer(bool json_out) {
  return [json_out](const std::string& line) {
    std::FILE* out = json_out ? stderr : stdout;
    std::fprintf(out, "%s\n", line.c_str());
    std::fflush(out);
  };
}

/// Exit status of a program whose output could not be written.
inline constexpr int kExitOutputFailed = 1;

/// Call first in main: a program whose standard output is closed could show
/// nothing of its work (and the first file it opened would take descriptor 1),
/// so it stops at once with a message on standard error and status 2.
inline std::optional<int> refuse_closed_standard_output(const std::string& program) {
  if (::fcntl(STDOUT_FILENO, F_GETFD) != -1 || errno != EBADF) return std::nullopt;
  // keep descriptor 1 taken, so that no file opened from here on becomes standard output
  const int null = ::open("/dev/null", O_WRONLY);
  if (null >= 0 && null != STDOUT_FILENO) ::close(null);
  std::fprintf(stderr, "%s: error: standard output is closed: nothing of the run could be shown\n", program.c_str());
  return 2;
}

/// Whether a lost standard output was already reported (check_standard_output threw).
inline bool& standard_output_failure_reported() {
  static bool reported = false;
  return reported;
}

/// Throws std::runtime_error when what was printed so far has not all reached
/// standard output (a full disk, /dev/full): for programs that print as they go
/// and stop at the first lost line.
inline void check_standard_output() {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    standard_output_failure_reported() = true;
    throw std::runtime_error(std::string("could not write to standard output (") +
                             (errno ? std::strerror(errno) : "write error") + "): the results were not shown");
  }
}

/// Call last in main: flushes standard output; when anything printed did not
/// reach it, says so on standard error and returns kExitOutputFailed instead of
/// a success `status`.
inline int finish_standard_output(const std::string& program, int status) {
  try {
    check_standard_output();
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return status == 0 ? kExitOutputFailed : status;
  }
  return status;
}

/// Call first in every program's main, with the program's name (a string
/// literal): refuses a closed standard output (refuse_closed_standard_output),
/// then checks at the program's exit, however main ends (a return after --help
/// or an error, exit()), that all it printed reached standard output; when it
/// did not (a full disk, /dev/full), says so on standard error and ends the
/// process with kExitOutputFailed, never 0.
inline std::optional<int> guard_standard_output(const char* program) {
  if (const auto closed = refuse_closed_standard_output(program)) return closed;
  static const char* name = nullptr;
  name = program;
  std::atexit([] {
    std::cout.flush();  // CLI11's help and messages go through std::cout (synchronised with stdout)
    errno = 0;
    if ((std::fflush(stdout) == 0 && !std::ferror(stdout)) || standard_output_failure_reported()) return;
    std::fprintf(stderr, "%s: error: could not write to standard output (%s): the results were not shown\n", name,
                 errno ? std::strerror(errno) : "write error");
    std::fflush(stderr);
    std::_Exit(kExitOutputFailed);
  });
  return std::nullopt;
}

/// Call first in every program's main, before any other work: when OpenBLAS
/// took the CPU for an older one and the user set no OPENBLAS_CORETYPE, runs the
/// program again with the right kernels (blas::use_best_core); says so in one
/// line on standard error.
inline void use_best_blas_core(const char* program, int argc, char** argv) {
  const std::string line = blas::use_best_core(argc, argv);
  if (!line.empty()) std::fprintf(stderr, "%s: %s\n", program, line.c_str());
}

}  // namespace dpgrad
