// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/standardizer.hpp: turning raw rows into features, as a Kokkos kernel on any execution space.
//
// Row mode (the seed's `standardize`): each row of `cols` raw values gives 2*cols features, the row
// standardized by its own mean and population standard deviation (+ epsilon), then the cyclic products
// v[i] * v[(i+1) % cols]. It computes in the raw data's precision (the seed: double on float32-drawn values),
// writes features in the output's precision (float for training), and returns each row's sum of features
// in double, whose reproducible total is the seed's checksum.
//
// Column mode (for user data): fit the per-column mean and standard deviation on training rows, then apply
// them to any rows (fit on train, transform test). Any finite input gives finite statistics (the sums run
// on values scaled by a power of two, so nothing overflows, and for data whose squares fit in a double the
// bits are those of the unscaled sums). A non-finite input, statistic or standardized value (in the output's
// precision: 1e300 standardized into float is inf) is an InputError naming the column and the row; with a
// communicator, on every rank (agree()).
#pragma once

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {

class Standardizer {
 public:
  explicit Standardizer(double epsilon = 1e-8) : epsilon_(epsilon) {}

  double epsilon() const { return epsilon_; }
  // The feature count of row mode: 2*cols. InputError where that does not fit an int (cols above
  // INT_MAX / 2) or cols is not positive.
  static int features(long long cols) {
    if (cols <= 0 || cols > INT_MAX / 2) {
      throw InputError("dpmlp::Standardizer: " + std::to_string(cols) + " columns: the features (2 per column) must " +
                       "number 1.." + std::to_string(INT_MAX - 1) + ", so columns 1.." + std::to_string(INT_MAX / 2));
    }
    return static_cast<int>(2 * cols);
  }

  // How messages name a row and a column of the data given to the column-mode functions. Empty: "row r"
  // (0-based, this rank's rows) and "column c" (0-based).
  struct Labels {
    std::function<std::string(std::int64_t)> row;
    std::function<std::string(int)> column;
  };

  // raw: rows x cols; out: rows x 2*cols; row_sums: rows (double). All in ExecSpace's memory; enqueued on
  // `space`, not fenced.
  template <class ExecSpace, class Raw, class Out, class Sums>
  void transform_rows(const ExecSpace& space, const Raw& raw, const Out& out, const Sums& row_sums) const {
    using T = typename Raw::non_const_value_type;
    using O = typename Out::non_const_value_type;
    const std::int64_t rows = raw.extent(0);
    const int cols = static_cast<int>(raw.extent(1));
    if (cols <= 0) throw InputError("dpmlp::Standardizer: zero columns");
    if (out.extent(0) != raw.extent(0) || out.extent(1) != 2 * raw.extent(1) || row_sums.extent(0) != raw.extent(0)) {
      throw InputError("dpmlp::Standardizer: shapes do not match (raw " + std::to_string(rows) + "x" +
                       std::to_string(cols) + ", out " + std::to_string(out.extent(0)) + "x" +
                       std::to_string(out.extent(1)) + ", sums " + std::to_string(row_sums.extent(0)) + ")");
    }
    const T eps = static_cast<T>(epsilon_);
    if constexpr (is_host_space<ExecSpace>()) {
      if (cols <= host_tile_cols) {
        transform_rows_host(space, raw, out, row_sums, eps);
        return;
      }
    }
    Kokkos::parallel_for(
        "dpmlp::Standardizer::rows", Kokkos::RangePolicy<ExecSpace>(space, 0, rows),
        KOKKOS_LAMBDA(const std::int64_t r) {
          // The seed's order of operations, so the sums match it bit for bit where the precision does.
          T sum = T(0);
          for (int i = 0; i < cols; ++i) sum += raw(r, i);
          const T mean = sum / cols;
          T spread = T(0);
          for (int i = 0; i < cols; ++i) spread += (raw(r, i) - mean) * (raw(r, i) - mean);
          const T deviation = compat::sqrt(spread / cols) + eps;
          double total = 0.0;
          for (int i = 0; i < cols; ++i) {
            const T v = (raw(r, i) - mean) / deviation;
            out(r, i) = static_cast<O>(v);
            total += static_cast<double>(v);
          }
          for (int i = 0; i < cols; ++i) {
            const T vi = (raw(r, i) - mean) / deviation;
            const int n = i + 1 == cols ? 0 : i + 1;
            const T vn = (raw(r, n) - mean) / deviation;
            const T interaction = vi * vn;
            out(r, cols + i) = static_cast<O>(interaction);
            total += static_cast<double>(interaction);
          }
          row_sums(r) = total;
        });
  }

  // Host spaces: the kernel above, host_tile_rows rows at a time with the rows side by side (a row a lane, the
  // tile's values transposed into a local array), so the compiler vectorizes every step across rows. Each row
  // gets the same operations in the same order as above (each standardized value computed once and reused,
  // the same value the kernel computes twice), so the same bits; only the short last tile goes row by row.
  static constexpr int host_tile_rows = 8, host_tile_cols = 64;

  template <class ExecSpace, class Raw, class Out, class Sums, class T>
  static void transform_rows_host(const ExecSpace& space, const Raw& raw, const Out& out, const Sums& row_sums,
                                  const T eps) {
    using O = typename Out::non_const_value_type;
    constexpr int RT = host_tile_rows;
    const std::int64_t rows = raw.extent(0);
    const int cols = static_cast<int>(raw.extent(1));
    Kokkos::parallel_for(
        "dpmlp::Standardizer::rows_host", Kokkos::RangePolicy<ExecSpace>(space, 0, (rows + RT - 1) / RT),
        [=](const std::int64_t tile) {
          const std::int64_t r0 = tile * RT;
          const int n = rows - r0 < RT ? static_cast<int>(rows - r0) : RT;
          T v[host_tile_cols][RT];  // raw values, then the standardized ones
          T w[host_tile_cols][RT];  // the interactions
          O fv[host_tile_cols][RT], fw[host_tile_cols][RT];
          T sum[RT], mean[RT], spread[RT], deviation[RT];
          double total[RT];
          if (n == RT) {
            for (int l = 0; l < RT; ++l) {
              for (int i = 0; i < cols; ++i) v[i][l] = raw(r0 + l, i);
            }
          } else {
            for (int l = 0; l < RT; ++l) {
              for (int i = 0; i < cols; ++i) v[i][l] = l < n ? raw(r0 + l, i) : T(0);
            }
          }
          for (int l = 0; l < RT; ++l) sum[l] = T(0);
          for (int i = 0; i < cols; ++i) {
            for (int l = 0; l < RT; ++l) sum[l] += v[i][l];
          }
          for (int l = 0; l < RT; ++l) {
            mean[l] = sum[l] / cols;
            spread[l] = T(0);
          }
          for (int i = 0; i < cols; ++i) {
            for (int l = 0; l < RT; ++l) spread[l] += (v[i][l] - mean[l]) * (v[i][l] - mean[l]);
          }
          for (int l = 0; l < RT; ++l) {
            deviation[l] = compat::sqrt(spread[l] / cols) + eps;
            total[l] = 0.0;
          }
          for (int i = 0; i < cols; ++i) {
            for (int l = 0; l < RT; ++l) {
              v[i][l] = (v[i][l] - mean[l]) / deviation[l];
              total[l] += static_cast<double>(v[i][l]);
              fv[i][l] = static_cast<O>(v[i][l]);
            }
          }
          for (int i = 0; i < cols; ++i) {
            const int next = i + 1 == cols ? 0 : i + 1;
            for (int l = 0; l < RT; ++l) {
              w[i][l] = v[i][l] * v[next][l];
              total[l] += static_cast<double>(w[i][l]);
              fw[i][l] = static_cast<O>(w[i][l]);
            }
          }
          for (int l = 0; l < n; ++l) row_sums(r0 + l) = total[l];
          for (int l = 0; l < n; ++l) {
            for (int i = 0; i < cols; ++i) out(r0 + l, i) = fv[i][l];
            for (int i = 0; i < cols; ++i) out(r0 + l, cols + i) = fw[i][l];
          }
        });
  }

  // ---- column mode
  // Fits per-column mean and population standard deviation on x (rows x cols, host-readable or not).
  // Collective over `comm` when given: the statistics are those of all ranks' rows together, and a refusal
  // (a non-finite value in x, reported at the lowest failing rank's first one) reaches every rank.
  template <class ExecSpace, class X>
  void fit_columns(const ExecSpace& space, const X& x, MPI_Comm comm = MPI_COMM_NULL, const Labels& labels = {}) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    (void)space;
    const std::int64_t rows = h.extent(0);
    const int cols = static_cast<int>(h.extent(1));
    std::string problem;
    for (std::int64_t r = 0; r < rows && problem.empty(); ++r) {
      for (int c = 0; c < cols; ++c) {
        const double v = static_cast<double>(h(r, c));
        if (!std::isfinite(v)) {
          problem = "dpmlp::Standardizer::fit_columns: " + column_name(labels, c) + ", " + row_name(labels, r) +
                    ": not finite (" + number(v) + ")";
          break;
        }
      }
    }
    refuse_if(comm, problem);
    // Every sum runs on x / 2^k with 2^k >= the column's largest |x| (over all ranks; 2^1023 at most, the
    // largest power of two a double holds): the values are in [-2, 2], their deviations in [-4, 4], so no sum
    // or square overflows for any finite input. Scaling by a power of two is exact (short of subnormals), so
    // where the unscaled sums do not overflow the results are theirs bit for bit.
    std::vector<double> unit(cols, 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) unit[c] = std::fmax(unit[c], std::fabs(static_cast<double>(h(r, c))));
    }
    if (comm != MPI_COMM_NULL) {
      timed_allreduce(MPI_IN_PLACE, unit.data(), cols, MPI_DOUBLE, MPI_MAX, comm,
                      "MPI_Allreduce (dpmlp::Standardizer: the columns' largest values)");
    }
    const std::vector<double> largest = unit;  // each column's largest |x|
    for (int c = 0; c < cols; ++c) {
      int exponent = 0;
      std::frexp(unit[c], &exponent);  // unit < 2^exponent (0 for a column of zeros)
      unit[c] = unit[c] > 0 ? std::ldexp(1.0, exponent < DBL_MAX_EXP - 1 ? exponent : DBL_MAX_EXP - 1) : 1.0;
    }
    std::vector<double> acc(2 * cols + 1, 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) acc[c] += static_cast<double>(h(r, c)) / unit[c];
    }
    acc[2 * cols] = static_cast<double>(rows);
    if (comm != MPI_COMM_NULL) {
      timed_allreduce(MPI_IN_PLACE, acc.data(), cols, MPI_DOUBLE, MPI_SUM, comm,
                      "MPI_Allreduce (dpmlp::Standardizer: the sums)");
      timed_allreduce(MPI_IN_PLACE, &acc[2 * cols], 1, MPI_DOUBLE, MPI_SUM, comm,
                      "MPI_Allreduce (dpmlp::Standardizer: the row count)");
    }
    const double n = acc[2 * cols];
    if (n <= 0) throw InputError("dpmlp::Standardizer::fit_columns: zero rows");
    std::vector<double> mean_unit(cols, 0.0);
    for (int c = 0; c < cols; ++c) mean_unit[c] = acc[c] / n;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const double d = static_cast<double>(h(r, c)) / unit[c] - mean_unit[c];
        acc[cols + c] += d * d;
      }
    }
    if (comm != MPI_COMM_NULL) {
      timed_allreduce(MPI_IN_PLACE, &acc[cols], cols, MPI_DOUBLE, MPI_SUM, comm,
                      "MPI_Allreduce (dpmlp::Standardizer: the squared deviations)");
    }
    std::vector<double> mean(cols), scale(cols);
    for (int c = 0; c < cols; ++c) {
      mean[c] = mean_unit[c] * unit[c];
      double sd = std::sqrt(acc[cols + c] / n) * unit[c];
      // Both are at most the column's largest |x| in exact arithmetic; where rounding carried one past the
      // double range (values within an ulp or so of DBL_MAX), that bound is the nearest finite value.
      if (!std::isfinite(mean[c])) mean[c] = std::copysign(largest[c], mean_unit[c]);
      if (!std::isfinite(sd)) sd = largest[c];
      scale[c] = sd + epsilon_;
    }
    // The statistics are the same on every rank (reduced above), so this refusal is too.
    for (int c = 0; c < cols; ++c) {
      if (!std::isfinite(mean[c]) || !std::isfinite(scale[c]) || !(scale[c] > 0)) {
        throw InputError("dpmlp::Standardizer::fit_columns: " + column_name(labels, c) + ": the fitted mean " +
                         number(mean[c]) + " and scale " + number(scale[c]) +
                         " are not both finite with a positive scale");
      }
    }
    mean_ = std::move(mean);
    scale_ = std::move(scale);
  }

  const std::vector<double>& column_mean() const { return mean_; }
  const std::vector<double>& column_scale() const { return scale_; }
  void set_columns(std::vector<double> mean, std::vector<double> scale) {
    if (mean.size() != scale.size()) throw InputError("dpmlp::Standardizer::set_columns: sizes differ");
    for (std::size_t c = 0; c < mean.size(); ++c) {
      if (!std::isfinite(mean[c]) || !std::isfinite(scale[c]) || !(scale[c] > 0)) {
        throw InputError("dpmlp::Standardizer::set_columns: column " + std::to_string(c) + ": mean " +
                         number(mean[c]) + " and scale " + number(scale[c]) +
                         " are not both finite with a positive scale");
      }
    }
    mean_ = std::move(mean);
    scale_ = std::move(scale);
  }

  // out(r, c) = (x(r, c) - mean[c]) / scale[c], with the fitted statistics. A value that is not finite in
  // out's precision (or an x that is not) is an InputError naming the first such row and column; collective
  // over `comm` when given (every rank refuses, with the lowest failing rank's message).
  template <class ExecSpace, class X, class Out>
  void transform_columns(const ExecSpace& space, const X& x, const Out& out, MPI_Comm comm = MPI_COMM_NULL,
                         const Labels& labels = {}) const {
    using O = typename Out::non_const_value_type;
    const int cols = static_cast<int>(x.extent(1));
    if (static_cast<int>(mean_.size()) != cols) {
      throw InputError("dpmlp::Standardizer::transform_columns: fitted on " + std::to_string(mean_.size()) +
                       " columns, given " + std::to_string(cols));
    }
    Kokkos::View<double* [2], typename ExecSpace::memory_space> stats("dpmlp::Standardizer::stats", cols);
    auto hs = Kokkos::create_mirror_view(stats);
    for (int c = 0; c < cols; ++c) {
      hs(c, 0) = mean_[c];
      hs(c, 1) = scale_[c];
    }
    Kokkos::deep_copy(space, stats, hs);
    const std::int64_t count = std::int64_t(x.extent(0)) * cols;
    std::int64_t first_bad = count;
    Kokkos::parallel_reduce(
        "dpmlp::Standardizer::columns", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
        KOKKOS_LAMBDA(const std::int64_t idx, std::int64_t& bad) {
          const std::int64_t r = idx / cols;
          const int c = static_cast<int>(idx % cols);
          const double v = static_cast<double>(x(r, c));
          double d = v - stats(c, 0);
          // Only where the difference overflows (v and the mean near the double range, opposite signs): the
          // same quotient from terms that cannot.
          const double z = compat::isfinite(d) ? d / stats(c, 1) : v / stats(c, 1) - stats(c, 0) / stats(c, 1);
          const O o = static_cast<O>(z);
          out(r, c) = o;
          if (!compat::isfinite(static_cast<double>(o)) && idx < bad) bad = idx;
        },
        Kokkos::Min<std::int64_t>(first_bad));
    compat::fence(space, "dpmlp::Standardizer::transform_columns");
    std::string problem;
    if (first_bad < count) {
      const std::int64_t r = first_bad / cols;
      const int c = static_cast<int>(first_bad % cols);
      typename X::non_const_value_type v{};
      Kokkos::deep_copy(v, Kokkos::subview(x, r, c));
      problem = "dpmlp::Standardizer::transform_columns: " + column_name(labels, c) + ", " + row_name(labels, r) +
                ": the value " + number(static_cast<double>(v)) + " standardized (mean " + number(mean_[c]) +
                ", scale " + number(scale_[c]) + ") is not finite in " +
                (sizeof(O) == 4 ? "float" : "the output's precision");
    }
    refuse_if(comm, problem);
  }

 private:
  static std::string row_name(const Labels& l, std::int64_t r) { return l.row ? l.row(r) : "row " + std::to_string(r); }
  static std::string column_name(const Labels& l, int c) {
    return l.column ? l.column(c) : "column " + std::to_string(c);
  }
  static std::string number(double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", v);
    return text;
  }
  // Throws `problem` (if any) here, or, with a communicator, on every rank.
  static void refuse_if(MPI_Comm comm, const std::string& problem) {
    if (comm != MPI_COMM_NULL) {
      agree(comm, problem);
    } else if (!problem.empty()) {
      throw InputError(problem);
    }
  }

  double epsilon_;
  std::vector<double> mean_, scale_;
};

}  // namespace dpmlp
