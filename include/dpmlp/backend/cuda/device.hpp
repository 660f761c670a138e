// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/device.hpp: what the CUDA backend reads of the current device, once a process (one device a
// process, as with Kokkos), and how its kernels report a failed launch.
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "dpmlp/errors.hpp"

namespace dpmlp {
namespace backend {

// The current device's compute capability, multiprocessors, opt-in shared memory a block and shared memory a
// multiprocessor (zeros where they could not be read).
struct CudaDevice {
  int major = 0, minor = 0, sms = 0, smem_optin = 0, smem_sm = 0;
  bool read = false;
};
inline const CudaDevice& cuda_device() {
  static const CudaDevice d = [] {
    CudaDevice r;
    int dev = 0;
    r.read = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&r.major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&r.minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&r.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&r.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess;
    if (!r.read) cudaGetLastError();
    return r;
  }();
  return d;
}

// Whether the current device runs sm_90a code (the wgmma/TMA kernels): compute capability 9.0 exactly, since
// architecture-specific code runs on no other.
inline bool sm90a_device() {
  const CudaDevice& d = cuda_device();
  return d.read && d.major == 9 && d.minor == 0;
}

// Whether the current device has TF32 tensor cores (compute capability 8.0 or newer), else why not.
inline std::string tensor_cores_unavailable() {
  const CudaDevice& d = cuda_device();
  if (!d.read) return "the CUDA device's compute capability could not be read";
  if (d.major < 8) {
    return "the tensor engine needs compute capability 8.0 or newer (this device: " + std::to_string(d.major) + "." +
           std::to_string(d.minor) + ")";
  }
  return {};
}

// A tensor kernel's launch error (a bad configuration), as an Error.
inline void check_tensor_launch() {
  const cudaError_t launched = cudaPeekAtLastError();
  if (launched != cudaSuccess) {
    throw Error(std::string("dpmlp: tensor kernel launch: ") + cudaGetErrorString(launched));
  }
}

#if defined(__CUDACC__)
// A register-resident kernel's setup, once a process (either schedule): the opt-in to its dynamic shared
// memory (above 48 KB), covering the grouped layout (`grouped` bytes) where it fits (the plan groups only
// then), else `bytes`; the shared-memory carveout that lets CTAs share an SM;
// and how many CTAs of `threads` threads and `bytes` bytes an SM then holds (at least 1).
template <class Fn>
inline int register_resident_setup(Fn* fn, int threads, std::size_t grouped, std::size_t bytes) {
  const std::size_t most = grouped <= static_cast<std::size_t>(cuda_device().smem_optin) ? grouped : bytes;
  cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most));
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  int n = 0;
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, bytes);
  if (e != cudaSuccess) throw Error(std::string("dpmlp: tensor kernel setup: ") + cudaGetErrorString(e));
  return n > 0 ? n : 1;
}
#endif

// A register-resident kernel's persistent grid: as many CTAs as the SMs hold at once (`resident` an SM), each
// team looping over blocks; with fewer blocks than teams, enough CTAs for the blocks, but at least one an SM
// while there are blocks for them (the team-major order then gives each SM a block before any SM a second).
// Grouped (CTA-major), a CTA a `teams` blocks.
inline unsigned register_resident_grid(std::int64_t blocks, int teams, int group, int resident) {
  const std::int64_t sms = cuda_device().sms > 0 ? cuda_device().sms : 1, slots = sms * resident;
  std::int64_t grid = (blocks + teams - 1) / teams;
  if (grid < sms && group == 1) grid = blocks < sms ? blocks : sms;
  return static_cast<unsigned>(grid < slots ? grid : slots);
}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
