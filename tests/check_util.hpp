// SPDX-License-Identifier: BSD-3-Clause
// Helpers for the tests' checks (any test, MPI or not).
#pragma once

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include <dpmlp/errors.hpp>

namespace dpmlp_test {

// Everything written to f so far (a tmpfile the test gave to a callback): flushed, read from the start.
inline std::string file_text(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

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
