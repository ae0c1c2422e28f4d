// dpgrad-train's plot: test accuracy and epsilon against epochs, drawn by gnuplot.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dpgrad::train {

/// Throws std::invalid_argument when gnuplot cannot be started (checked before training).
void require_gnuplot();

/// Throws std::invalid_argument naming `flag` unless a file can be created at `path`
/// (checked by creating and removing a scratch file beside it, before training).
void require_writable_file(const std::string& path, const std::string& flag);

/// Test accuracy (left axis) and epsilon (right axis, private runs) against epochs, as a PNG.
void plot_history(const std::string& out, const nlohmann::json& history, bool with_epsilon, const std::string& title);

}  // namespace dpgrad::train
