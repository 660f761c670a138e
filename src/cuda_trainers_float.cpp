// SPDX-License-Identifier: BSD-3-Clause
// Part of the dpmlp_cuda_kernels library: the CUDA trainers in float that data_parallel_trainer.hpp declares
// compiled once (DPMLP_CUDA_TRAINERS). Their tensor-engine and CUTLASS kernels are in src/cuda_kernels.cpp.
#if !defined(DPMLP_CUDA_KERNELS_SEPARATE)
#define DPMLP_CUDA_KERNELS_SEPARATE 1
#endif

#include <Kokkos_Core.hpp>

#if !defined(KOKKOS_ENABLE_CUDA)
#error "dpmlp_cuda_kernels is built on CUDA builds of Kokkos only"
#endif

#include "dpmlp/data_parallel_trainer.hpp"

namespace dpmlp {
#define DPMLP_CUDA_TRAINER_DEFINE(OPTIMIZER, SCALAR) \
  template class DataParallelTrainer<Kokkos::Cuda, default_communicator_t<Kokkos::Cuda>, OPTIMIZER, SCALAR, Mse>;
DPMLP_CUDA_TRAINERS(DPMLP_CUDA_TRAINER_DEFINE, float)
#undef DPMLP_CUDA_TRAINER_DEFINE
}  // namespace dpmlp
