// SPDX-License-Identifier: BSD-3-Clause
// Standardizer's column mode across ranks: fit_columns with a communicator gives the statistics of all ranks'
// rows together, whatever the split.
#include <catch2/catch.hpp>

#include <dpmlp/standardizer.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "check_util.hpp"
#include "mpi_test_util.hpp"

namespace {
using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;

// Row r, column c of the whole set (every rank can compute any of it).
double value(std::int64_t r, int c) { return (c + 1) * 3.0 + std::sin(0.7 * r + c) * (c + 1.5) + 0.01 * r; }
}  // namespace

TEST_CASE("fit_columns over a communicator gives every rank the whole set's statistics", "[standardizer][mpi]") {
  const int rank = dpmlp_test::rank(), size = dpmlp_test::size(), cols = 3;
  const std::int64_t total = 101;  // not a multiple of 2 or 3: the ranks' shares differ
  // Rank q holds rows [lo, hi): uneven shares, the last rank the longest.
  const std::int64_t lo = total * rank / size, hi = total * (rank + 1) / size, mine = hi - lo;
  Kokkos::View<double**, Kokkos::LayoutRight, Memory> x("x", mine, cols);
  auto hx = Kokkos::create_mirror_view(x);
  for (std::int64_t r = 0; r < mine; ++r)
    for (int c = 0; c < cols; ++c) hx(r, c) = value(lo + r, c);
  Kokkos::deep_copy(x, hx);
  dpmlp::Standardizer s(0.0);
  s.fit_columns(Space(), x, MPI_COMM_WORLD);
  // The whole set's mean and population standard deviation, computed here on every rank.
  double worst = 0;
  for (int c = 0; c < cols; ++c) {
    double mu = 0, sq = 0;
    for (std::int64_t r = 0; r < total; ++r) mu += value(r, c);
    mu /= total;
    for (std::int64_t r = 0; r < total; ++r) sq += (value(r, c) - mu) * (value(r, c) - mu);
    const double sd = std::sqrt(sq / total);
    worst = dpmlp_test::nan_max(worst, std::fabs(s.column_mean()[c] - mu) / std::fabs(mu));
    worst = dpmlp_test::nan_max(worst, std::fabs(s.column_scale()[c] - sd) / sd);
  }
  CHECK(dpmlp_test::all(s.column_mean().size() == std::size_t(cols) && worst < 1e-12));
  // Without the communicator a rank fits its own rows only (different statistics where there are several).
  dpmlp::Standardizer local(0.0);
  local.fit_columns(Space(), x);
  if (size > 1) CHECK(local.column_mean()[0] != s.column_mean()[0]);
}
