// SPDX-License-Identifier: BSD-3-Clause
// The split-operand 3xTF32 GEMMs (include/dpmlp/backend/cuda/split_3xtf32_kernels.hpp), compiled once for
// sm_90a into dpmlp_cuda_kernels; linalg::split_gemm() calls them on compute capability 9.0. The library's
// entry points are defined in src/cuda_kernels.cpp; here they are only declared (entry.hpp).
#define DPMLP_CUDA_KERNELS_SEPARATE 1
#define DPMLP_SPLIT3_KERNELS_HERE 1
#include "dpmlp/backend/cuda/split_3xtf32_kernels.hpp"
