// Shared by the bundled programs (dpgrad-train, dpgrad-account, dpgrad-logreg, dpgrad-bench); not installed.
// Command-line errors of the bundled programs in one form: "PROGRAM: error:
// what", then a pointer to --help (CLI11's own message names no program and
// does not say it is an error).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace dpgrad {

inline void name_cli_errors(CLI::App& app, const std::string& program) {
  app.failure_message([program](const CLI::App*, const CLI::Error& e) {
    return program + ": error: " + e.what() + "\nRun with --help for more information.\n";
  });
}

}  // namespace dpgrad
