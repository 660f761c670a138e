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
// them to any rows (fit on train, transform test).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {

class Standardizer {
 public:
  explicit Standardizer(double epsilon = 1e-8) : epsilon_(epsilon) {}

  double epsilon() const { return epsilon_; }
  static int features(int cols) { return 2 * cols; }

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

  // ---- column mode
  // Fits per-column mean and population standard deviation on x (rows x cols, host-readable or not).
  // Collective over `comm` when given: the statistics are those of all ranks' rows together.
  template <class ExecSpace, class X>
  void fit_columns(const ExecSpace& space, const X& x, MPI_Comm comm = MPI_COMM_NULL) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    (void)space;
    const std::int64_t rows = h.extent(0);
    const int cols = static_cast<int>(h.extent(1));
    std::vector<double> acc(2 * cols + 1, 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) acc[c] += static_cast<double>(h(r, c));
    }
    acc[2 * cols] = static_cast<double>(rows);
    if (comm != MPI_COMM_NULL) {
      detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, acc.data(), cols, MPI_DOUBLE, MPI_SUM, comm), "MPI_Allreduce");
      detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &acc[2 * cols], 1, MPI_DOUBLE, MPI_SUM, comm), "MPI_Allreduce");
    }
    const double n = acc[2 * cols];
    if (n <= 0) throw InputError("dpmlp::Standardizer::fit_columns: zero rows");
    mean_.assign(cols, 0.0);
    for (int c = 0; c < cols; ++c) mean_[c] = acc[c] / n;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const double d = static_cast<double>(h(r, c)) - mean_[c];
        acc[cols + c] += d * d;
      }
    }
    if (comm != MPI_COMM_NULL) {
      detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &acc[cols], cols, MPI_DOUBLE, MPI_SUM, comm), "MPI_Allreduce");
    }
    scale_.assign(cols, 1.0);
    for (int c = 0; c < cols; ++c) scale_[c] = std::sqrt(acc[cols + c] / n) + epsilon_;
  }

  const std::vector<double>& column_mean() const { return mean_; }
  const std::vector<double>& column_scale() const { return scale_; }
  void set_columns(std::vector<double> mean, std::vector<double> scale) {
    if (mean.size() != scale.size()) throw InputError("dpmlp::Standardizer::set_columns: sizes differ");
    mean_ = std::move(mean);
    scale_ = std::move(scale);
  }

  // out(r, c) = (x(r, c) - mean[c]) / scale[c], with the fitted statistics.
  template <class ExecSpace, class X, class Out>
  void transform_columns(const ExecSpace& space, const X& x, const Out& out) const {
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
    Kokkos::parallel_for(
        "dpmlp::Standardizer::columns", Kokkos::RangePolicy<ExecSpace>(space, 0, std::int64_t(x.extent(0)) * cols),
        KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t r = idx / cols;
          const int c = static_cast<int>(idx % cols);
          out(r, c) = static_cast<O>((static_cast<double>(x(r, c)) - stats(c, 0)) / stats(c, 1));
        });
    compat::fence(space, "dpmlp::Standardizer::transform_columns");
  }

 private:
  double epsilon_;
  std::vector<double> mean_, scale_;
};

}  // namespace dpmlp
