// SPDX-License-Identifier: BSD-3-Clause
// The dpmlp_cuda_kernels library: dpmlp's CUDA kernels (the tensor engine, the CUTLASS 3xTF32 GEMMs and the
// entry of the split-operand GEMMs), compiled once behind their entry points, so that a translation unit that trains compiles none of them
// (dpmlp/backend/cuda/entry.hpp). Built by CMake on CUDA builds; consumers reach it through dpmlp::dpmlp.
#define DPMLP_CUDA_KERNELS_DEFINE 1

#include <Kokkos_Core.hpp>

#if !defined(KOKKOS_ENABLE_CUDA)
#error "dpmlp_cuda_kernels is built on CUDA builds of Kokkos only"
#endif

#include "dpmlp/backend/cuda/tensor_engine.hpp"
#include "dpmlp/linalg/gemm.hpp"
#include "dpmlp/linalg/split_gemm.hpp"
