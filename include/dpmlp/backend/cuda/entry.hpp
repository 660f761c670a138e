// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/entry.hpp: where the CUDA backend's kernels are compiled.
//
// The tensor engine (tensor_engine.hpp) and the CUTLASS GEMMs (cutlass_3xtf32.hpp) are reached through two
// non-template entry points, backend::compute_tensor() and linalg::cutlass_3xtf32::gemm(); behind them are
// some thirty kernel instantiations, which a model's runtime shape picks from. Either
//   - header-only (the default for a plain compiler command line): the entry points are inline and every
//     translation unit that trains compiles the kernels, or
//   - separate (DPMLP_CUDA_KERNELS_SEPARATE, which CMake's dpmlp::dpmlp target sets on CUDA builds unless
//     DPMLP_SEPARATE_CUDA_KERNELS is OFF): the headers only declare the entry points, and the kernels are
//     compiled once, into the dpmlp_cuda_kernels library (src/cuda_kernels.cpp, which defines
//     DPMLP_CUDA_KERNELS_DEFINE). A translation unit that trains then compiles none of them. The same
//     library holds the common trainers (DPMLP_CUDA_TRAINERS in data_parallel_trainer.hpp,
//     src/cuda_trainers_*.cpp), which that macro declares extern there.
// Both forms run the same code; only where it is compiled differs.
#pragma once

#if defined(DPMLP_CUDA_KERNELS_DEFINE)
#define DPMLP_CUDA_KERNELS_HERE 1
#define DPMLP_CUDA_ENTRY
#elif defined(DPMLP_CUDA_KERNELS_SEPARATE)
#define DPMLP_CUDA_ENTRY
#else
#define DPMLP_CUDA_KERNELS_HERE 1
#define DPMLP_CUDA_ENTRY inline
#endif
