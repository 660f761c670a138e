// SPDX-License-Identifier: BSD-3-Clause
// The seed's data, for one shard of rows: raw values and targets drawn with JAX's PRNG (PRNGKey(0), split:
// the first key gives rows x cols raw normals, the second rows x 1 targets), the raw rows standardized
// natively into 2*cols features. Shared by examples/multi_gpu_train and benchmarks/train_bench.
#pragma once

#include <dpmlp/dpmlp.hpp>

#include <chrono>
#include <climits>
#include <string>

#include "cli.hpp"

namespace seed {

// The options multi_gpu_train and train_bench share: the seed's problem and how to train on it, bound to o's
// fields of the same names. `steps` and `warmup`: what those two mean in the program.
template <class O>
void add_options(cli::Parser& p, O& o, const char* comms, const char* steps, const char* warmup) {
  p.value("--rows", "N", o.rows, "rows of the seed's data, over all ranks");
  p.value("--cols", "C", o.cols, "raw columns per row; the model sees 2*C standardized features");
  p.value("--hidden", "H", o.hidden, "hidden units");
  p.value("--steps", "S", o.steps, steps);
  p.value("--warmup", "S", o.warmup, warmup);
  p.value("--rate", "R", o.rate, "SGD learning rate");
  p.value("--comm", comms, o.comm, "the communicator");
  p.value("--reduction", "reproducible|fast", o.reduction,
          "the gradient sum: reproducible (the same bits at any rank count) or fast (the allreduce's order)");
  p.value("--block-rows", "B", o.block_rows, "rows per reduction block; 0 lets the trainer choose");
  p.custom("--engine", "automatic|fused|tensor|layered|host", dpmlp::engine_name(o.engine), "the per-block gradient engine",
           [&o](const cli::Args& a, int& i) { o.engine = dpmlp::engine_from_name(a.value(i)); });
  p.custom("--tensor-kernel", "automatic|warp-matrix|register-resident|register-resident-paired",
           dpmlp::tensor_kernel_name(o.tensor_kernel), "the tensor engine's kernel (EngineOptions::tensor_kernel)",
           [&o](const cli::Args& a, int& i) { o.tensor_kernel = dpmlp::tensor_kernel_from_name(a.value(i)); });
  p.flag("--graph", o.graph,
         "on CUDA with NCCL, capture one step as a CUDA graph and replay it (TrainerOptions::cuda_graph)");
  p.flag("--peer", o.peer,
         "on CUDA, write the subtree sums straight into the other GPUs' memory (TrainerOptions::peer_exchange)");
}

// --cols C: the model sees 2*C features, an int (dpmlp::Standardizer::features), and the raw rows hold
// C values each. Refused up front, before any device starts, where 2*C does not fit an int.
inline void check_cols(int cols) {
  if (cols > INT_MAX / 2) {
    throw dpmlp::InputError("--cols " + std::to_string(cols) + ": the model would see 2*C = " +
                            std::to_string(2LL * cols) + " features, more than an int holds (--cols at most " +
                            std::to_string(INT_MAX / 2) + ")");
  }
}

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
