// SPDX-License-Identifier: BSD-3-Clause
// Standardizer's column mode across ranks: fit_columns with a communicator gives the statistics of all ranks'
// rows together, whatever the split.
#include <catch2/catch.hpp>

#include <dpmlp/standardizer.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
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

namespace {
using dpmlp_test::refusal;  // on this rank

// This rank's share [lo, hi) of `total` rows, as above.
Kokkos::View<double**, Kokkos::LayoutRight, Memory> share(std::int64_t total, int cols, double scale,
                                                          std::int64_t& lo) {
  const int rank = dpmlp_test::rank(), size = dpmlp_test::size();
  lo = total * rank / size;
  const std::int64_t hi = total * (rank + 1) / size;
  Kokkos::View<double**, Kokkos::LayoutRight, Memory> x("x", hi - lo, cols);
  auto hx = Kokkos::create_mirror_view(x);
  for (std::int64_t r = 0; r < hi - lo; ++r)
    for (int c = 0; c < cols; ++c) hx(r, c) = value(lo + r, c) * scale;
  Kokkos::deep_copy(x, hx);
  return x;
}
}  // namespace

TEST_CASE("fit_columns over a communicator: columns near 1e200 fit as the unit-scale data", "[standardizer][mpi]") {
  // The reproducer's feature column of +-1e200 spread over the ranks: the squares overflowed and the column
  // was zeroed. Scaled by a power of two, the statistics are exactly the unit-scale ones scaled.
  const double two_664 = std::ldexp(1.0, 664);
  std::int64_t lo = 0;
  dpmlp::Standardizer su(0.0), sb(0.0);
  su.fit_columns(Space(), share(101, 3, 1.0, lo), MPI_COMM_WORLD);
  sb.fit_columns(Space(), share(101, 3, two_664, lo), MPI_COMM_WORLD);
  bool same = true;
  for (int c = 0; c < 3; ++c) {
    same = same && std::isfinite(sb.column_scale()[c]) && sb.column_mean()[c] == su.column_mean()[c] * two_664 &&
           sb.column_scale()[c] == su.column_scale()[c] * two_664;
  }
  CHECK(dpmlp_test::all(same));
}

TEST_CASE("a non-finite value on one rank is refused on every rank, with its column and row", "[standardizer][mpi]") {
  const int rank = dpmlp_test::rank(), size = dpmlp_test::size();
  const int last = size - 1;
  std::int64_t lo = 0;
  auto train = share(101, 3, 1.0, lo);
  dpmlp::Standardizer s(0.0);
  s.fit_columns(Space(), train, MPI_COMM_WORLD);
  // A test row with 1e300 on the last rank only (the reproducer's `test mse -nan`): standardized into float it
  // is inf. Every rank refuses, with the last rank's message; the row is named as the caller labels it.
  auto test = share(20, 3, 1.0, lo);
  if (rank == last) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), test);
    h(h.extent(0) - 1, 2) = 1e300;
    Kokkos::deep_copy(test, h);
  }
  dpmlp::Standardizer::Labels labels;
  labels.row = [lo](std::int64_t r) { return "test row " + std::to_string(lo + r); };
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> out("out", test.extent(0), 3);
  const std::string message = refusal([&] { s.transform_columns(Space(), test, out, MPI_COMM_WORLD, labels); });
  const std::string expect = "rank " + std::to_string(last) +
                             ": dpmlp::Standardizer::transform_columns: column 2, test row 19: the value 1e+300 "
                             "standardized";
  CHECK(dpmlp_test::all(message.compare(0, expect.size(), expect) == 0 &&
                        message.find("not finite in float") != std::string::npos));
  // A NaN in the last rank's training rows: fit_columns refuses on every rank and keeps the statistics.
  if (rank == last) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), train);
    h(0, 1) = std::numeric_limits<double>::quiet_NaN();
    Kokkos::deep_copy(train, h);
  }
  const std::string fit = refusal([&] { s.fit_columns(Space(), train, MPI_COMM_WORLD); });
  CHECK(dpmlp_test::all(fit == "rank " + std::to_string(last) +
                                   ": dpmlp::Standardizer::fit_columns: column 1, row 0: not finite (nan)" &&
                        s.column_mean().size() == 3));
}
