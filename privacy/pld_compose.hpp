// PLD accountant, part 3: composition of discretised loss distributions by FFT,
// with the tails truncated pessimistically. Internal to privacy/.
#pragma once

#include "privacy/pld.hpp"

namespace dpgrad::privacy::pld_detail {

// ---------------------------------------------------------------- composition

/// Convolution of two PLDs on the same grid; infinity atoms compose as
/// 1 - (1 - m_a)(1 - m_b). Then the tails: each side's outermost mass up to `tail`
/// is moved inwards (pessimistic: the top into +infinity, the bottom up onto the
/// first kept point; optimistic: the top down onto the last kept point, the bottom
/// dropped), and arrays longer than max_points are cut the same way.
DiscretePld compose(const DiscretePld& a, const DiscretePld& b, bool pessimistic, double tail,
                    long max_points, double& error);

DiscretePld power(const DiscretePld& a, long count, bool pessimistic, double tail, long max_points,
                  double& error);



}  // namespace dpgrad::privacy::pld_detail
