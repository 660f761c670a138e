// SPDX-License-Identifier: BSD-3-Clause
#include <catch2/catch.hpp>

#include <dpmlp/random.hpp>
#include <dpmlp/reduction.hpp>
#include <dpmlp/standardizer.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
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

namespace {
using HostMatrix = Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace>;
using DeviceMatrix = Kokkos::View<double**, Kokkos::LayoutRight, Memory>;

DeviceMatrix to_device(const HostMatrix& h) {
  DeviceMatrix d("x", h.extent(0), h.extent(1));
  Kokkos::deep_copy(d, h);
  return d;
}

using dpmlp_test::refusal;
}  // namespace

TEST_CASE("column mode: the statistics of ordinary data are the plain sums' bit for bit", "[standardizer]") {
  // The sums run on values scaled by a power of two; for data whose squares fit in a double that must not
  // change a bit of the mean or the scale, computed here the plain way (sum, mean, squared deviations).
  const int rows = 37, cols = 4;
  HostMatrix h("h", rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) h(r, c) = std::pow(10.0, 3 * c - 4) * (std::sin(r * 0.9 + c) + 0.3 * c);
  dpmlp::Standardizer s;
  s.fit_columns(Space(), to_device(h));
  for (int c = 0; c < cols; ++c) {
    double sum = 0;
    for (int r = 0; r < rows; ++r) sum += h(r, c);
    const double mean = sum / rows;
    double sq = 0;
    for (int r = 0; r < rows; ++r) sq += (h(r, c) - mean) * (h(r, c) - mean);
    CHECK(s.column_mean()[c] == mean);
    CHECK(s.column_scale()[c] == std::sqrt(sq / rows) + 1e-8);
  }
}

TEST_CASE("column mode: extreme but finite columns standardize as the same data at unit scale", "[standardizer]") {
  // The reproducers: a feature column of +-1e200 (its variance overflowed: the column became zeros), a column
  // near the double range of both signs (its deviations overflowed). Scaled by a power of two near 1e200 the
  // standardized values are exactly the unit-scale data's (epsilon 0: nothing else differs).
  const int rows = 40, cols = 3;
  HostMatrix unit("unit", rows, cols), big("big", rows, cols);
  const double two_664 = std::ldexp(1.0, 664);  // about 1.2e200
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      unit(r, c) = (r % 2 ? 1.0 : -1.0) * (1.0 + 0.01 * r) + 0.1 * c;
      big(r, c) = unit(r, c) * two_664;
    }
  }
  big(0, 2) = 1.5e308;  // column 2: values near DBL_MAX of both signs
  big(1, 2) = -1.5e308;
  unit(0, 2) = 1.5e308 / two_664;
  unit(1, 2) = -1.5e308 / two_664;
  dpmlp::Standardizer su(0.0), sb(0.0);
  su.fit_columns(Space(), to_device(unit));
  sb.fit_columns(Space(), to_device(big));
  for (int c = 0; c < cols; ++c) {
    CHECK(std::isfinite(sb.column_mean()[c]));
    CHECK(std::isfinite(sb.column_scale()[c]));
    CHECK(sb.column_mean()[c] == su.column_mean()[c] * two_664);
    CHECK(sb.column_scale()[c] == su.column_scale()[c] * two_664);
  }
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> ou("ou", rows, cols), ob("ob", rows, cols);
  su.transform_columns(Space(), to_device(unit), ou);
  sb.transform_columns(Space(), to_device(big), ob);
  auto hu = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ou);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ob);
  int differ = 0;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) differ += !(hu(r, c) == hb(r, c)) || !std::isfinite(hb(r, c));
  CHECK(differ == 0);
  CHECK(std::fabs(hb(2, 0)) > 0.5);  // not the zeroed column of the overflowed variance

  // A column of 1e308 and -1e308 (the mean 0, every deviation 1e308): finite statistics, values +-1.
  HostMatrix edge("edge", 2, 1);
  edge(0, 0) = 1e308;
  edge(1, 0) = -1e308;
  dpmlp::Standardizer se(0.0);
  se.fit_columns(Space(), to_device(edge));
  CHECK(se.column_mean()[0] == 0.0);
  CHECK(se.column_scale()[0] == 1e308);
  // Columns at DBL_MAX itself: every value, and both signs. Finite statistics and standardized values.
  HostMatrix top("top", 3, 2);
  for (int r = 0; r < 3; ++r) {
    top(r, 0) = std::numeric_limits<double>::max();
    top(r, 1) = (r % 2 ? -1 : 1) * std::numeric_limits<double>::max();
  }
  dpmlp::Standardizer st;  // epsilon 1e-8: column 0 is constant (with epsilon 0 its scale 0 is refused)
  st.fit_columns(Space(), to_device(top));
  CHECK(st.column_mean()[0] == std::numeric_limits<double>::max());
  CHECK(std::isfinite(st.column_mean()[1]));
  CHECK(std::isfinite(st.column_scale()[0]));
  CHECK(std::isfinite(st.column_scale()[1]));
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> otop("otop", 3, 2);
  CHECK(refusal([&] { st.transform_columns(Space(), to_device(top), otop); }) == "");
  // A mean near DBL_MAX and a value near -DBL_MAX: the difference overflows, the quotient does not.
  HostMatrix pos("pos", 2, 1), far("far", 1, 1);
  pos(0, 0) = 1.7e308;
  pos(1, 0) = 1.5e308;
  far(0, 0) = -1.7e308;
  dpmlp::Standardizer sp(0.0);
  sp.fit_columns(Space(), to_device(pos));
  Kokkos::View<double**, Kokkos::LayoutRight, Memory> of("of", 1, 1);
  sp.transform_columns(Space(), to_device(far), of);
  auto hf = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), of);
  CHECK(hf(0, 0) == Approx(-33.0).epsilon(1e-12));  // (-1.7e308 - 1.6e308) / 1e307
}

TEST_CASE("column mode: non-finite inputs and standardized values are refused with the column and the row",
          "[standardizer]") {
  HostMatrix train("train", 4, 2), test("test", 5, 2);
  for (int r = 0; r < 4; ++r) {
    train(r, 0) = r;
    train(r, 1) = 2.0 * r - 1;
  }
  for (int r = 0; r < 5; ++r) {
    test(r, 0) = r + 0.5;
    test(r, 1) = -r;
  }
  dpmlp::Standardizer s;
  s.fit_columns(Space(), to_device(train));
  // The reproducer: one 1e300 in a test row (standardized into float: inf; the test mse was -nan).
  test(3, 1) = 1e300;
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> out("out", 5, 2);
  CHECK(refusal([&] { s.transform_columns(Space(), to_device(test), out); }) ==
        "dpmlp::Standardizer::transform_columns: column 1, row 3: the value 1e+300 standardized (mean 2, scale "
        "2.23607) is not finite in float");
  // The labels name them as the caller's data does.
  dpmlp::Standardizer::Labels labels;
  labels.row = [](std::int64_t r) { return "line " + std::to_string(r + 2); };
  labels.column = [](int c) { return "column '" + std::string(c ? "b" : "a") + "'"; };
  const std::string labelled =
      refusal([&] { s.transform_columns(Space(), to_device(test), out, MPI_COMM_NULL, labels); });
  CHECK(labelled.find("column 'b', line 5: the value 1e+300") != std::string::npos);
  // In double the same value is finite, and accepted.
  Kokkos::View<double**, Kokkos::LayoutRight, Memory> wide("wide", 5, 2);
  CHECK(refusal([&] { s.transform_columns(Space(), to_device(test), wide); }).empty());
  // Non-finite data given to fit_columns or transform_columns.
  train(2, 0) = std::numeric_limits<double>::infinity();
  CHECK(refusal([&] { s.fit_columns(Space(), to_device(train)); }) ==
        "dpmlp::Standardizer::fit_columns: column 0, row 2: not finite (inf)");
  CHECK(s.column_mean()[0] == 1.5);  // the refused fit left the statistics as they were
  test(3, 1) = 0;
  test(4, 0) = std::nan("");
  CHECK(refusal([&] { s.transform_columns(Space(), to_device(test), wide); }).find("column 0, row 4: the value nan") !=
        std::string::npos);
  // A constant column with epsilon 0 has scale 0: every value would standardize to 0/0.
  HostMatrix flat("flat", 3, 1);
  Kokkos::deep_copy(flat, 5.0);
  dpmlp::Standardizer exact(0.0);
  CHECK(refusal([&] { exact.fit_columns(Space(), to_device(flat)); }) ==
        "dpmlp::Standardizer::fit_columns: column 0: the fitted mean 5 and scale 0 are not both finite with a positive "
        "scale");
  // Statistics set by hand are checked too.
  CHECK(refusal([&] { s.set_columns({0.0}, {0.0}); }).find("column 0: mean 0 and scale 0") != std::string::npos);
  CHECK(refusal([&] { s.set_columns({std::nan("")}, {1.0}); }).find("not both finite") != std::string::npos);
}

TEST_CASE("row mode: a feature count that does not fit an int is refused", "[standardizer]") {
  CHECK(dpmlp::Standardizer::features(16) == 32);
  CHECK(dpmlp::Standardizer::features(1073741823) == 2147483646);
  CHECK(refusal([] { dpmlp::Standardizer::features(1073741824); }) ==
        "dpmlp::Standardizer: 1073741824 columns: the features (2 per column) must number 1..2147483646, so columns "
        "1..1073741823");
  CHECK_FALSE(refusal([] { dpmlp::Standardizer::features(0); }).empty());
}
