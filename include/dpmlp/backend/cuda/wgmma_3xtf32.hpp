// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/wgmma_3xtf32.hpp: the interface of the wgmma 3xTF32 GEMMs (wgmma_3xtf32_kernels.hpp), the
// Hopper form of cutlass_3xtf32::gemm(): what a call passes, and the entry point. The kernels need sm_90a
// (wgmma is not in sm_90's instruction set), which Kokkos's nvcc_wrapper cannot add beside the build's own
// architecture, so they are compiled apart, in src/cuda_wgmma.cu (CMake's CUDA language, sm_90a), into the
// dpmlp_cuda_kernels library, which then defines DPMLP_HAVE_WGMMA for its own translation units.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dpmlp/backend/cuda/kernel_gemm.hpp"

namespace dpmlp {
namespace linalg {
namespace wgmma_3xtf32 {

using Out = kernel_gemm::Out;

// The call's parameters (kernel_gemm.hpp) and the launch's own: the tiles along n.
struct Params : kernel_gemm::Params {
  int tiles_n = 1;
};

// C = op(A) op(B) with output o, for `batch` entries (at most 65535; grid y). a_kcontig: A is m x k row-major
// (else stored k x m); b_kcontig: B is stored n x k (else k x n, row-major). The contiguous dimension of A and
// B a multiple of 4, their pointers 16-byte aligned, their leading dimensions and batch strides multiples of
// 4. Defined in src/cuda_wgmma.cu; only where DPMLP_HAVE_WGMMA is defined, and only on compute capability 9.0.
cudaError_t gemm(cudaStream_t stream, const Params& p, int batch, bool a_kcontig, bool b_kcontig, Out o);

}  // namespace wgmma_3xtf32
}  // namespace linalg
}  // namespace dpmlp
