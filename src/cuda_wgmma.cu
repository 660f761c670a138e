// SPDX-License-Identifier: BSD-3-Clause
// dpmlp's Hopper GEMMs, compiled once for sm_90a into dpmlp_cuda_kernels: the wgmma 3xTF32 GEMMs
// (include/dpmlp/backend/cuda/wgmma_3xtf32_kernels.hpp) and the wgmma form of the 3xFP16 GEMMs
// (gemm_f16x3_kernels.hpp: gemm_f16x3::gemm_wgmma); cutlass_3xtf32::gemm() calls them on compute capability 9.0.
#define DPMLP_WGMMA_KERNELS_HERE 1
#include "dpmlp/backend/cuda/wgmma_3xtf32_kernels.hpp"
#include "dpmlp/backend/cuda/gemm_f16x3_kernels.hpp"
