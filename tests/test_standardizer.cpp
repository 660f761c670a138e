// SPDX-License-Identifier: BSD-3-Clause
#include <catch2/catch.hpp>

#include <dpmlp/random.hpp>
#include <dpmlp/reduction.hpp>
#include <dpmlp/standardizer.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

#include "check_util.hpp"

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;

std::vector<float> read_f32(const std::string& path, std::size_t n) {
  std::vector<float> v(n);
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  REQUIRE(static_cast<std::size_t>(in.gcount()) == n * sizeof(float));
  return v;
}

// The seed's standardize(), transcribed as plain sequential C++ over doubles.
double seed_standardize(const std::vector<double>& raw, std::vector<double>& out, int rows, int cols) {
  double total = 0.0;
  for (int row = 0; row < rows; ++row) {
    const int base = row * cols, target = row * cols * 2;
    double sum = 0.0;
    for (int i = 0; i < cols; ++i) sum += raw[base + i];
    const double mean = sum / cols;
    double spread = 0.0;
    for (int i = 0; i < cols; ++i) spread += (raw[base + i] - mean) * (raw[base + i] - mean);
    const double deviation = std::sqrt(spread / cols) + 1e-8;
    for (int i = 0; i < cols; ++i) {
      const double value = (raw[base + i] - mean) / deviation;
      out[target + i] = value;
      total += value;
    }
    for (int i = 0; i < cols; ++i) {
      const double interaction = out[target + i] * out[target + (i + 1) % cols];
      out[target + cols + i] = interaction;
      total += interaction;
    }
  }
  return total;
}

}  // namespace

TEST_CASE("the Standardizer reproduces the seed's checksum and features", "[standardizer]") {
  const int rows = 20000, cols = 16;
  const auto raw32 = read_f32(DPMLP_REFERENCE_DIR "/seed_raw.f32", std::size_t(rows) * cols);
  std::vector<double> raw(raw32.begin(), raw32.end());
  std::vector<double> expect(std::size_t(rows) * cols * 2);
  const double seed_total = seed_standardize(raw, expect, rows, cols);

  Kokkos::View<double**, Kokkos::LayoutRight, Memory> draw("raw", rows, cols);
  auto hd = Kokkos::create_mirror_view(draw);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) hd(r, c) = raw[r * cols + c];
  Kokkos::deep_copy(draw, hd);
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> out("out", rows, 2 * cols);
  Kokkos::View<double*, Memory> sums("sums", rows);
  dpmlp::Standardizer().transform_rows(Space(), draw, out, sums);
  const dpmlp::BlockTreePlan plan(rows, 256, 0, 1);
  const double checksum = dpmlp::reproducible_row_sum(Space(), dpmlp::NoCommunicator(), plan, sums)[0];

  CHECK(std::fabs(checksum - (-21433.891895)) < 5e-7);  // the JAX original's printed value, to 6 decimals
  CHECK(std::fabs(checksum - seed_total) < 1e-8);
  auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  double worst = 0;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < 2 * cols; ++c)
      worst = dpmlp_test::nan_max(worst, std::fabs(double(ho(r, c)) - double(float(expect[std::size_t(r) * 2 * cols + c]))));
  CHECK(worst == 0.0);  // the same doubles, rounded once to float
}

TEST_CASE("the Standardizer's checksum drawn in-library matches the reference draw", "[standardizer]") {
  const int rows = 20000, cols = 16;
  const auto keys = dpmlp::random::split(dpmlp::random::PRNGKey(0), 2);
  Kokkos::View<double*, Memory> flat("flat", std::size_t(rows) * cols);
  dpmlp::random::normal(Space(), keys[0], flat, 0);
  Kokkos::View<double**, Kokkos::LayoutRight, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> raw(flat.data(), rows,
                                                                                                   cols);
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> out("out", rows, 2 * cols);
  Kokkos::View<double*, Memory> sums("sums", rows);
  dpmlp::Standardizer().transform_rows(Space(), raw, out, sums);
  const dpmlp::BlockTreePlan plan(rows, 256, 0, 1);
  const double checksum = dpmlp::reproducible_row_sum(Space(), dpmlp::NoCommunicator(), plan, sums)[0];
  CHECK(std::fabs(checksum - (-21433.891895)) < 5e-7);
}

TEST_CASE("column mode fits on one set and applies to another", "[standardizer]") {
  const int rows = 50, cols = 3;
  Kokkos::View<double**, Kokkos::LayoutRight, Memory> x("x", rows, cols);
  auto hx = Kokkos::create_mirror_view(x);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) hx(r, c) = (c + 1) * 10.0 + std::sin(r * 1.3 + c) * (c + 2);
  Kokkos::deep_copy(x, hx);
  dpmlp::Standardizer s(0.0);
  s.fit_columns(Space(), x);
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> out("out", rows, cols);
  s.transform_columns(Space(), x, out);
  auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int c = 0; c < cols; ++c) {
    double mean = 0, sq = 0;
    for (int r = 0; r < rows; ++r) mean += ho(r, c);
    mean /= rows;
    for (int r = 0; r < rows; ++r) sq += (ho(r, c) - mean) * (ho(r, c) - mean);
    CHECK(std::fabs(mean) < 1e-6);
    CHECK(std::sqrt(sq / rows) == Approx(1.0).epsilon(1e-5));
  }
  // The fitted statistics are x's (population standard deviation), computed here independently.
  std::vector<double> mu(cols, 0.0), sd(cols, 0.0);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r) mu[c] += hx(r, c);
    mu[c] /= rows;
    for (int r = 0; r < rows; ++r) sd[c] += (hx(r, c) - mu[c]) * (hx(r, c) - mu[c]);
    sd[c] = std::sqrt(sd[c] / rows);
    CHECK(s.column_mean()[c] == Approx(mu[c]).epsilon(1e-12));
    CHECK(s.column_scale()[c] == Approx(sd[c]).epsilon(1e-12));
  }
  // Applied to another set (x shifted and scaled), with x's statistics, not the other set's own: the result
  // is not standardized (its column means are 100 / sd, not 0).
  Kokkos::View<double**, Kokkos::LayoutRight, Memory> x2("x2", rows, cols);
  auto hx2 = Kokkos::create_mirror_view(x2);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) hx2(r, c) = 2.0 * hx(r, c) + 100.0;
  Kokkos::deep_copy(x2, hx2);
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> out2("out2", rows, cols);
  s.transform_columns(Space(), x2, out2);
  auto ho2 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out2);
  double worst = 0;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const double want = (hx2(r, c) - mu[c]) / sd[c];
      worst = dpmlp_test::nan_max(worst, std::fabs(double(ho2(r, c)) - want) / (1.0 + std::fabs(want)));
    }
  }
  CHECK(worst < 1e-6);
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> wrong("wrong", rows, cols + 1);
  CHECK_THROWS_AS(s.transform_columns(Space(), wrong, wrong), dpmlp::InputError);
}
