// SPDX-License-Identifier: BSD-3-Clause
// Helpers for the tests' checks (any test, MPI or not).
#pragma once

#include <cmath>
#include <limits>
#include <string>

#include <dpmlp/errors.hpp>

namespace dpmlp_test {

// The running maximum of differences, where a NaN (seen now or before) wins: std::max(worst, NaN) keeps worst,
// so a NaN parameter would pass a "largest difference is 0" check. Every comparison with the NaN result fails.
inline double nan_max(double worst, double d) {
  if (std::isnan(worst) || std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
  return d > worst ? d : worst;
}

// The InputError's message of f(), or "" if f does not throw one (any other exception goes through).
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const dpmlp::InputError& e) {
    return e.what();
  }
  return {};
}

}  // namespace dpmlp_test
