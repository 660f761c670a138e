// SPDX-License-Identifier: BSD-3-Clause
// The seed's data, for one shard of rows: raw values and targets drawn with JAX's PRNG (PRNGKey(0), split:
// the first key gives rows x cols raw normals, the second rows x 1 targets), the raw rows standardized
// natively into 2*cols features. Shared by examples/multi_gpu_train and benchmarks/train_bench.
#pragma once

#include <dpmlp/dpmlp.hpp>

#include <chrono>

namespace seed {

template <class ExecSpace>
struct Data {
  using Memory = typename ExecSpace::memory_space;
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> x;  // rows x 2*cols features
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> y;  // rows x 1 targets
  Kokkos::View<double*, Memory> row_sums;                // each row's sum of features (the checksum's parts)
  double prep_ms = 0;                                    // the Standardizer alone, fenced
};

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Rows [shard.first_row, shard.end_row) of the seed's problem with `cols` raw columns.
template <class ExecSpace>
Data<ExecSpace> make(const ExecSpace& space, const dpmlp::Shard& shard, int cols) {
  namespace rnd = dpmlp::random;
  using Memory = typename ExecSpace::memory_space;
  const auto keys = rnd::split(rnd::PRNGKey(0), 2);
  const std::int64_t rows = shard.rows();
  Data<ExecSpace> d;
  // Element i of the draw depends on the key and i alone, so a rank draws just its own rows. Widened to
  // double, as the seed's array('d', ...) does.
  Kokkos::View<double*, Memory> raw_flat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "raw"), rows * cols);
  rnd::normal(space, keys[0], raw_flat, static_cast<std::uint64_t>(shard.first_row * cols));
  Kokkos::View<const double**, Kokkos::LayoutRight, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> raw(
      raw_flat.data(), rows, cols);
  d.x = decltype(d.x)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "x"), rows, dpmlp::Standardizer::features(cols));
  d.y = decltype(d.y)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "y"), rows, 1);
  d.row_sums = decltype(d.row_sums)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "row_sums"), rows);
  Kokkos::View<float*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> y_flat(d.y.data(), rows);
  rnd::normal(space, keys[1], y_flat, static_cast<std::uint64_t>(shard.first_row));
  dpmlp::compat::fence(space, "seed::make: drawn");
  const double t0 = now_ms();
  dpmlp::Standardizer().transform_rows(space, raw, d.x, d.row_sums);
  dpmlp::compat::fence(space, "seed::make: standardized");
  d.prep_ms = now_ms() - t0;
  return d;
}

}  // namespace seed
