// Gradient checks for ops and layers, in double precision: the vjp against
// central finite differences (dot-product test), the jvp against the same
// differences, forward against reverse mode, and the full Jacobian for tiny
// inputs. Tests use it for every op; users use it for the layers they add.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.hpp"

namespace dpgrad {

/// The function gradcheck checks: its inputs, one tensor per array of `inputs`
/// in that order, to one output tensor, built from dpgrad ops.
using GradFn = std::function<TensorT<double>(const std::vector<TensorT<double>>&)>;

/// How gradcheck probes and how close its comparisons must be.
struct GradcheckOptions {
  double step = 1e-6;        // finite-difference step
  double tolerance = 1e-6;   // relative error allowed against finite differences
  double exact_tolerance = 1e-10;  // forward vs reverse: no FD noise
  int probes = 3;            // random (u, v) pairs
  std::size_t tangents = 3;  // k in the multi-tangent check
  std::uint64_t seed = 1;    // of the random probes and directions
  /// Inputs (by index) that get no tangent and no gradient (e.g. integer-like data).
  std::vector<std::size_t> constant_inputs = {};
};

/// What gradcheck found: the worst error of each check; ok when none exceeded its tolerance.
struct GradcheckResult {
  double vjp_error = 0;      // max relative error, <u, J v>: vjp vs finite differences
  double jvp_error = 0;      // max relative error, J v: jvp vs finite differences (elementwise)
  double mode_error = 0;     // max relative error, <u, J v> from jvp vs <J^T u, v> from vjp
  double jacobian_error = 0; // tiny inputs: full Jacobian, vjp rows vs finite differences
  bool ok = false;           // every check within its tolerance
  std::string report;        // what failed, with values
};

/// Checks f's derivatives at `inputs`.
GradcheckResult gradcheck(const GradFn& f, const std::vector<ArrayT<double>>& inputs, GradcheckOptions opts = {});

}  // namespace dpgrad
