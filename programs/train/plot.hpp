// dpgrad-train's plot: test accuracy and epsilon against epochs, drawn by gnuplot.
// The script is fixed text; the title, the data file and the image reach gnuplot
// as its arguments (ARG1..ARG3 of `gnuplot -c`), never as script text.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dpgrad::train {

/// Throws std::invalid_argument when gnuplot cannot be started (checked before training).
void require_gnuplot();

/// Test accuracy (left axis) and epsilon (right axis, private runs) against
/// epochs, as a PNG written to `out` by write_output_file (programs/cli.hpp):
/// an existing path that is not a regular file is refused, not replaced.
void plot_history(const std::string& out, const nlohmann::json& history, bool with_epsilon, const std::string& title);

}  // namespace dpgrad::train
