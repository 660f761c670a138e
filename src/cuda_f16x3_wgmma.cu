// SPDX-License-Identifier: BSD-3-Clause
// The wgmma form of dpmlp's block-scaled 3xFP16 GEMMs (include/dpmlp/backend/cuda/gemm_f16x3_kernels.hpp:
// gemm_f16x3::gemm_wgmma), compiled once for sm_90a into dpmlp_cuda_kernels on CUDA builds for Hopper
// (DPMLP_ENABLE_3XFP16_WGMMA); cutlass_3xtf32::gemm() calls it on compute capability 9.0.
#define DPMLP_WGMMA_KERNELS_HERE 1
#include "dpmlp/backend/cuda/gemm_f16x3_kernels.hpp"
