// SPDX-License-Identifier: BSD-3-Clause
// Helpers for the tests' checks (any test, MPI or not).
#pragma once

#include <cmath>
#include <limits>

namespace dpmlp_test {

// The running maximum of differences, where a NaN (seen now or before) wins: std::max(worst, NaN) keeps worst,
// so a NaN parameter would pass a "largest difference is 0" check. Every comparison with the NaN result fails.
inline double nan_max(double worst, double d) {
  if (std::isnan(worst) || std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
  return d > worst ? d : worst;
}

}  // namespace dpmlp_test
