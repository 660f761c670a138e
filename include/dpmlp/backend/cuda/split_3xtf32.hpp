// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/split_3xtf32.hpp: the Hopper backend of linalg::split_gemm() (linalg/split_gemm.hpp):
// CUTLASS 3's TMA warp-specialized TF32 wgmma kernels over the split operands, each k-tile's three products
// summed in a fresh accumulator and added to C's fp32 sum on the CUDA cores (split_3xtf32_kernels.hpp).
//
// The kernels need sm_90a (wgmma and TMA are not in sm_90's instruction set), which Kokkos's nvcc_wrapper
// cannot add beside the build's own architecture, so they are compiled apart, in src/cuda_split.cu (CMake's
// CUDA language, sm_90a), into the dpmlp_cuda_kernels library, which then defines DPMLP_HAVE_SPLIT3 for its
// own translation units. Elsewhere runs_here() is false and split_gemm() runs its portable form.
//
// Include dpmlp/linalg/split_gemm.hpp rather than this header: it includes this one after SplitGemm.
#pragma once

#include "dpmlp/kokkos_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dpmlp/backend/cuda/device.hpp"
#include "dpmlp/backend/cuda/entry.hpp"
#include "dpmlp/exceptions.hpp"

namespace dpmlp {
namespace linalg {
namespace split_3xtf32 {

// Whether split GEMMs run on the Hopper kernels here: the kernels compiled (DPMLP_HAVE_SPLIT3, in
// dpmlp_cuda_kernels) and the device of compute capability 9.0.
DPMLP_CUDA_ENTRY bool runs_here();

// The GEMM on the Hopper kernels: pingpong 64 x 128 tiles below 16384 rows, cooperative 128 x 128 from
// there, unless SplitGemm::tile_rows says (both sum an element alike: the same k-tiles in order, the same
// MMAs, one tile a CTA). Only where runs_here(), for GEMMs split_takes() accepts. Throws CommError if the
// launch fails.
DPMLP_CUDA_ENTRY void gemm(const Kokkos::Cuda& space, const SplitGemm& g);

// Defined in src/cuda_split.cu (sm_90a).
cudaError_t launch(cudaStream_t stream, const SplitGemm& g);

#if defined(DPMLP_CUDA_KERNELS_HERE) && !defined(DPMLP_SPLIT3_KERNELS_HERE)

DPMLP_CUDA_ENTRY bool runs_here() {
#if defined(DPMLP_HAVE_SPLIT3)
  return backend::sm90a_device();
#else
  return false;
#endif
}

DPMLP_CUDA_ENTRY void gemm(const Kokkos::Cuda& space, const SplitGemm& g) {
#if defined(DPMLP_HAVE_SPLIT3)
  if (!split_takes(g.k, g.a, g.a_lo, g.lda) || reinterpret_cast<std::uintptr_t>(g.b_split) % 16 != 0 ||
      (g.tile_rows != 0 && g.tile_rows != 64 && g.tile_rows != 128)) {
    throw std::logic_error("dpmlp::linalg::split_3xtf32::gemm: a GEMM it does not take");
  }
  const cudaError_t s = launch(space.cuda_stream(), g);
  if (s != cudaSuccess) {
    throw CommError(std::string("dpmlp: split 3xTF32 GEMM (") + std::to_string(g.m) + " x " + std::to_string(g.n) +
                    " x " + std::to_string(g.k) + "): " + cudaGetErrorString(s));
  }
#else
  (void)space, (void)g;
  throw std::logic_error("dpmlp::linalg::split_3xtf32::gemm: the Hopper kernels are not built");
#endif
}

#endif

}  // namespace split_3xtf32
}  // namespace linalg
}  // namespace dpmlp

#endif
