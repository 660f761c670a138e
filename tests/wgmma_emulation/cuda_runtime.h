// SPDX-License-Identifier: BSD-3-Clause
// Stands in for <cuda_runtime.h> in test_wgmma_emulated only (its include path puts this folder first): the
// wgmma kernels' headers include it for CUDA's types, which emulation.hpp gives on the host.
#pragma once
#include "emulation.hpp"
