// SPDX-License-Identifier: BSD-3-Clause
// dpmlp's experimental wgmma 3xTF32 GEMMs (include/dpmlp/backend/cuda/wgmma_3xtf32_kernels.hpp), compiled
// once for sm_90a into dpmlp_cuda_kernels where DPMLP_ENABLE_WGMMA asks for them; cutlass_3xtf32::gemm() calls
// them on compute capability 9.0.
#define DPMLP_WGMMA_KERNELS_HERE 1
#include "dpmlp/backend/cuda/wgmma_3xtf32_kernels.hpp"
