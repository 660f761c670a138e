// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/engine/options.hpp: what a caller may ask of the per-block gradient engine. engine/plan.hpp turns
// these, the model, the device and the step's size into the one EnginePlan that runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dpmlp/errors.hpp"
#include "dpmlp/linalg/gemm.hpp"

namespace dpmlp {

// Which per-block engine computes the gradient partials.
//   fused      one SIMT kernel a step for one-hidden-layer models, fp32 FMA (any space; engine/fused_simt.hpp)
//   tensor     the same work on NVIDIA tensor cores in fp32-equivalent 3xTF32 (CUDA spaces, float, compute
//              capability 8.0 or newer; backend/cuda/)
//   layered    a GEMM and an element-wise kernel per layer and phase; any depth, any space (host spaces: the
//              GEMMs are Eigen's)
//   host       host spaces (Serial, OpenMP): any depth, each block's rows through the whole model in one pass,
//              in vectorized fused multiply-adds (engine/host_engine.hpp)
//   automatic  tensor where it can run, else fused on device spaces when the model fits it, else layered;
//              on host spaces host (layered where a GEMM backend is asked for)
// Every engine is reproducible across rank counts; different engines give different last bits.
enum class Engine { automatic, fused, layered, tensor, host };

// Which of the tensor engine's kernels runs (EngineOptions::tensor_kernel).
//   automatic                 the plan's choice (engine/plan.hpp says how it chooses)
//   warp_matrix               nvcuda::wmma, any shape the fused engines take (backend/cuda/tensor_wmma.hpp)
//   register_resident         raw mma.sync with every phase in registers, 32 or fewer inputs, one warp doing
//                             a batch's whole chain (backend/cuda/tensor_mma.hpp)
//   register_resident_paired  the same arithmetic split over a forward and a backward warp (one output, relu
//                             or identity; backend/cuda/tensor_pair.hpp): the same bits as register_resident
// The two register-resident schedules sum in the same shapes; the warp-matrix kernel in other ones, so its
// bits differ from theirs in the last places.
enum class TensorKernel { automatic, warp_matrix, register_resident, register_resident_paired };

// A three-way switch: the plan's choice, or forced off or on.
enum class Toggle { automatic, off, on };

inline const char* engine_name(Engine e) {
  switch (e) {
    case Engine::automatic: return "automatic";
    case Engine::fused: return "fused";
    case Engine::layered: return "layered";
    case Engine::tensor: return "tensor";
    case Engine::host: return "host";
  }
  return "?";
}

// "automatic", "fused", "tensor", "layered" or "host" -> the Engine; anything else -> InputError.
inline Engine engine_from_name(const std::string& name) {
  for (Engine e : {Engine::automatic, Engine::fused, Engine::layered, Engine::tensor, Engine::host}) {
    if (name == engine_name(e)) return e;
  }
  throw InputError("unknown engine '" + name + "' (automatic, fused, tensor, layered or host)");
}

inline const char* tensor_kernel_name(TensorKernel k) {
  switch (k) {
    case TensorKernel::automatic: return "automatic";
    case TensorKernel::warp_matrix: return "warp-matrix";
    case TensorKernel::register_resident: return "register-resident";
    case TensorKernel::register_resident_paired: return "register-resident-paired";
  }
  return "?";
}

// "automatic", "warp-matrix", "register-resident" or "register-resident-paired" -> the TensorKernel.
inline TensorKernel tensor_kernel_from_name(const std::string& name) {
  for (TensorKernel k : {TensorKernel::automatic, TensorKernel::warp_matrix, TensorKernel::register_resident,
                         TensorKernel::register_resident_paired}) {
    if (name == tensor_kernel_name(k)) return k;
  }
  throw InputError("unknown tensor kernel '" + name +
                   "' (automatic, warp-matrix, register-resident or register-resident-paired)");
}

inline const char* toggle_name(Toggle t) {
  return t == Toggle::automatic ? "automatic" : t == Toggle::off ? "off" : "on";
}

inline Toggle toggle_from_name(const std::string& name) {
  for (Toggle t : {Toggle::automatic, Toggle::off, Toggle::on}) {
    if (name == toggle_name(t)) return t;
  }
  throw InputError("unknown setting '" + name + "' (automatic, off or on)");
}

// How a step's per-block gradient sums are computed. Every field's default lets the plan choose; a forced
// choice that cannot run here is refused with an InputError that says why. None of them changes the bits
// of a run with the same plan, and every rank must pass the same options.
struct EngineOptions {
  Engine engine = Engine::automatic;
  // Rows a reduction block; 0: the plan's default (a function of the global row count and the model only).
  std::int64_t block_rows = 0;
  // The layered engine's GEMMs; default: linalg::default_backend<ExecSpace>(reproducible).
  std::optional<linalg::Backend> gemm;
  // The tensor engine's kernel (tests and measurements compare the kernels with it).
  TensorKernel tensor_kernel = TensorKernel::automatic;
  // Whether the register-resident kernel (or the host engine) sums groups of 8 consecutive blocks itself, in
  // the block tree's shape (the same bits as a row a block): on is refused where the register-resident kernel
  // cannot group (more than 32 hidden units, several outputs, or its shared memory) and for the other engines.
  // The host engine's automatic groups are 8, 4, 2 or 1 blocks (engine/plan.hpp, host_leaf_group).
  Toggle leaf_groups = Toggle::automatic;
  // Whether the layered engine runs its float forward and delta GEMMs over operands split in memory
  // (linalg/split_gemm.hpp: each activation and delta such a GEMM reads stored with its TF32 remainder, the
  // weights split once a step), the form of Hopper's tensor-core kernels. automatic: where those kernels run
  // (a GPU of compute capability 9.0, built with DPMLP_ENABLE_SPLIT_GEMM) with the cutlass GEMMs; on: anywhere
  // (with the automatic engine, it asks for the layered one), elsewhere on the split GEMM's portable form
  // (slow: one thread an element); refused for double and for an engine other than the layered one asked
  // for. The bits differ from those of the GEMMs that split in registers.
  Toggle split_operands = Toggle::automatic;
  // Whether the layered engine's float GEMMs of 64 or more columns on the cutlass backend run on dpmlp's
  // block-scaled 3xFP16 kernels (backend/cuda/gemm_f16x3_kernels.hpp: each operand split in shared memory
  // into fp16 hi and lo parts with a power-of-two scale a row (column) and 32 k, FP16 tensor-core MMAs) rather
  // than CUTLASS's 3xTF32 kernels, on a GPU of compute capability 8.0 or newer. automatic: where they can run,
  // for steps of 2^16 global rows or more (a full batch or mini-batch of that many rows, whatever the rank
  // count), where they are the faster; on: at any size, refused where they cannot run (another engine or GEMM
  // backend, double, an older GPU or none, split operands in use). The bits differ from CUTLASS's, and so does
  // the accuracy's reference: a value keeps 22 bits below the largest magnitude of its row (column) in its
  // 32-k tile, not below its own (docs/design.md), as in the tensor engine's deep kernel.
  Toggle gemm_3xfp16 = Toggle::automatic;
};

}  // namespace dpmlp
