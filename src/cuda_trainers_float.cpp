// SPDX-License-Identifier: BSD-3-Clause
// Part of the dpmlp_cuda_kernels library: the CUDA trainers in float compiled once (src/cuda_trainers.inc).
#define DPMLP_CUDA_TRAINERS_SCALAR float
#include "cuda_trainers.inc"
