// Shared by the bundled programs (dpgrad-train, dpgrad-account, dpgrad-logreg,
// dpgrad-bench, dpgrad-audit); not installed.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dpgrad {

/// Command-line errors of the bundled programs in one form: "PROGRAM: error:
/// what", then a pointer to --help (CLI11's own message names no program and
/// does not say it is an error).
inline void name_cli_errors(CLI::App& app, const std::string& program) {
  app.failure_message([program](const CLI::App*, const CLI::Error& e) {
    return program + ": error: " + e.what() + "\nRun with --help for more information.\n";
  });
}

/// Parses argv into `app`: nullopt to go on, or the exit status for --help (0)
/// and for a command-line error (2), with the message already printed.
inline std::optional<int> parse_arguments(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return std::nullopt;
}

/// Whole numbers >= 0 given to count options: "-1" would otherwise wrap around
/// to a huge value in an unsigned type, and CLI11 saturates a number too large
/// for its type silently.
inline CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& s) {
        const bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
        if (!digits) return "must be a whole number >= 0, got '" + s + "'";
        // at most 18 digits: below 10^18, inside every count type used
        if (s.find_first_not_of('0') != std::string::npos && s.size() - s.find_first_not_of('0') > 18)
          return "is too large: '" + s + "'";
        return std::string();
      },
      "WHOLE NUMBER");
}

/// A real number that strtod reads whole, without overflow or underflow.
inline CLI::Validator real_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not a number";
        if (errno == ERANGE)
          return "'" + text + "' is out of the range of double precision (" +
                 (std::abs(v) > 1 ? "overflows" : "underflows") + ")";
        return "";
      },
      "REAL");
}

}  // namespace dpgrad
