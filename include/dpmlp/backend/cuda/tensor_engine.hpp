// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/tensor_engine.hpp: the tensor engine's entry point on CUDA: one step's per-block partial
// sums by the kernel the plan chose (engine/plan.hpp), instantiated for the model's padded shape.
//
// Every kernel computes exactly what the SIMT fused kernel computes (the same per-block partial sums, in the
// parameter layout, for the same block tree), each with its own fixed summation shapes: every sum depends only
// on the block's rows and the model's widths, so a step's bits do not depend on the rank count. Each kernel is
// launched on the Kokkos::Cuda instance's stream (so CUDA-graph capture and stream order are kept) by CUDA's
// own launch: Kokkos caps team scratch at 48 KB, and they need more shared memory (up to ~150 KB a block).
// The kernels are compiled where backend/cuda/entry.hpp says (in this translation unit, or once in the
// dpmlp_cuda_kernels library).
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)

#include "dpmlp/backend/cuda/entry.hpp"
#include "dpmlp/backend/cuda/tensor_shapes.hpp"

namespace dpmlp {
namespace backend {

// One step's per-block partial sums on tensor cores, by p.kernel, for the mean squared error with the output
// weights p.loss_weights (dpmlp::Mse, loss.hpp). group: blocks a row of partials sums (1, or mma_group_blocks
// for the register-resident kernels at 32 or fewer hidden units and one output). The kernels take the loss's
// term as a template argument; this entry point, compiled once, instantiates Mse's alone (another loss would
// multiply the kernels compiled), so the engine plan runs other losses on the fused or layered engine
// (BlockEngine::caps).
DPMLP_CUDA_ENTRY void compute_tensor(const Kokkos::Cuda& space, const TensorProblem& p, int group = 1);
// The same for the deep kernel (tensor_deep.hpp): two to four hidden layers of at most 64 units.
DPMLP_CUDA_ENTRY void compute_tensor_deep(const Kokkos::Cuda& space, const DeepProblem& p);

}  // namespace backend
}  // namespace dpmlp

#if defined(DPMLP_CUDA_KERNELS_HERE)

#include <string>
#include <type_traits>

#include "dpmlp/backend/cuda/tensor_deep.hpp"
#include "dpmlp/backend/cuda/tensor_mma.hpp"
#include "dpmlp/backend/cuda/tensor_pair.hpp"
#include "dpmlp/backend/cuda/tensor_wmma.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/loss.hpp"

namespace dpmlp {
namespace backend {

DPMLP_CUDA_ENTRY void compute_tensor(const Kokkos::Cuda& space, const TensorProblem& p, int group) {
  if (p.rows == 0 || p.blocks == 0) return;
  const bool resident = p.kernel != TensorLaunch::warp_matrix;
  if (group != 1 && (!resident || group != mma_group_blocks || tensor_hp(p.H) != 32 || p.NO != 1)) {
    throw Error("dpmlp: tensor engine: a group of " + std::to_string(group) + " blocks a partial-sum row, which " +
                "only the register-resident kernel takes, as 8, at 32 or fewer hidden units and one output");
  }
  const bool narrow = tensor_ni(p.n_in) == 32;
  LossWeights<float> weights;
  for (int j = 0; j < LossWeights<float>::inline_count; ++j) weights.first[j] = p.loss_weights[j];
  const auto loss = Mse().term<float>(weights);
  const auto launch = [&](auto hp) {
    constexpr int HP = decltype(hp)::value;
    if (resident) {
      if (p.kernel == TensorLaunch::register_resident_paired) return launch_tensor_pair<HP>(space, p, loss, group);
      if (p.NO == 1) return launch_tensor_mma<HP, 1>(space, p, loss, group);
      return launch_tensor_mma<HP, 4>(space, p, loss, group);
    }
    if (narrow) return launch_tensor<32, HP>(space, p, loss);
    return launch_tensor<64, HP>(space, p, loss);
  };
  switch (tensor_hp(p.H)) {
    case 32: return launch(std::integral_constant<int, 32>());
    case 64: return launch(std::integral_constant<int, 64>());
    case 128: return launch(std::integral_constant<int, 128>());
    default: return launch(std::integral_constant<int, 256>());
  }
}

DPMLP_CUDA_ENTRY void compute_tensor_deep(const Kokkos::Cuda& space, const DeepProblem& p) {
  if (p.rows == 0 || p.blocks == 0) return;
  bool narrow_enough = p.layers >= deep_min_layers && p.layers <= deep_max_layers && p.widths[0] <= 64;
  for (int l = 1; l <= p.layers && narrow_enough; ++l) narrow_enough = p.widths[l] <= deep_units;
  if (!narrow_enough || p.widths[p.layers + 1] > deep_max_outputs || (p.widths[0] > 32 && p.layers > 3)) {
    throw Error("dpmlp: tensor engine: the deep kernel takes two to four hidden layers of at most 64 units (two "
                "or three past 32 inputs), at most 64 inputs and 4 outputs");
  }
  LossWeights<float> weights;
  for (int j = 0; j < LossWeights<float>::inline_count; ++j) weights.first[j] = p.loss_weights[j];
  const auto loss = Mse().term<float>(weights);
  // The shapes of which an SM of 228 KB (the most any GPU has) holds 16 warps (deep_fits).
  if (tensor_ni(p.widths[0]) == 64) {
    if (p.layers == 2) return launch_tensor_deep<64, 2>(space, p, loss);
    return launch_tensor_deep<64, 3>(space, p, loss);
  }
  if (p.layers == 2) return launch_tensor_deep<32, 2>(space, p, loss);
  if (p.layers == 3) return launch_tensor_deep<32, 3>(space, p, loss);
  return launch_tensor_deep<32, 4>(space, p, loss);
}

}  // namespace backend
}  // namespace dpmlp

#endif  // DPMLP_CUDA_KERNELS_HERE

#endif  // KOKKOS_ENABLE_CUDA
