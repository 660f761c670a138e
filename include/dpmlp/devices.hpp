// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/devices.hpp: which device a rank uses, and how many *physical* accelerators a job has.
//
// The seed refuses to run on fewer than two physical accelerators: a CPU is not a GPU, and two ranks on one
// GPU are one GPU. So on CUDA the count is the number of distinct GPU UUIDs across the communicator, and on
// host spaces it is zero unless the caller explicitly allows CPU devices (a test exercise, never a hardware
// pass).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/comm/timed.hpp"
#include "dpmlp/kokkos_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif
#if defined(KOKKOS_ENABLE_HIP)
#include <hip/hip_runtime.h>
#endif

namespace dpmlp {

// The rank's index among the ranks of its node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)).
inline int local_rank(MPI_Comm comm) {
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

// GPUs this process can see (0 on a build without a GPU backend, or with no visible GPU).
inline int visible_gpus() {
  int n = 0;
#if defined(KOKKOS_ENABLE_CUDA)
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  (void)cudaGetLastError();
#elif defined(KOKKOS_ENABLE_HIP)
  if (hipGetDeviceCount(&n) != hipSuccess) n = 0;
#endif
  return n;
}

// Initializes Kokkos so that each rank takes its local rank's GPU (local rank modulo the visible GPUs). The
// library itself never initializes Kokkos or MPI; examples and test mains call this. KOKKOS_DEVICE_ID, if set,
// wins; thread counts come from KOKKOS_NUM_THREADS as Kokkos reads it.
inline void initialize_kokkos_for_rank(MPI_Comm comm) {
  int device = -1;
  const int gpus = visible_gpus();
  if (gpus > 0 && std::getenv("KOKKOS_DEVICE_ID") == nullptr) device = local_rank(comm) % gpus;
  compat::initialize(device);
}

// "cuda", "hip" or "cpu": the platform word the example prints, like JAX's device.platform.
template <class ExecSpace>
const char* platform_name() {
#if defined(KOKKOS_ENABLE_CUDA)
  if (std::is_same<ExecSpace, Kokkos::Cuda>::value) return "cuda";
#endif
#if defined(KOKKOS_ENABLE_HIP)
#if DPMLP_KOKKOS4
  if (std::is_same<ExecSpace, Kokkos::HIP>::value) return "hip";
#else
  if (std::is_same<ExecSpace, Kokkos::Experimental::HIP>::value) return "hip";
#endif
#endif
  return "cpu";
}

namespace detail {
// A 16-byte identity of the GPU this rank's Kokkos instance drives: the UUID on CUDA, node name plus PCI
// location on HIP (HIP 5.2 has no portable UUID query).
template <class ExecSpace>
std::array<unsigned char, 64> device_identity(const ExecSpace& space) {
  std::array<unsigned char, 64> id{};
  (void)space;
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, space.cuda_device()) == cudaSuccess) {
      std::memcpy(id.data(), prop.uuid.bytes, 16);
    }
    return id;
  }
#endif
#if defined(KOKKOS_ENABLE_HIP)
  int device = 0;
  hipDeviceProp_t prop;
  if (hipGetDevice(&device) == hipSuccess && hipGetDeviceProperties(&prop, device) == hipSuccess) {
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::snprintf(reinterpret_cast<char*>(id.data()), id.size(), "%.40s/%x:%x:%x", name, prop.pciDomainID,
                  prop.pciBusID, prop.pciDeviceID);
  }
#endif
  return id;
}
}  // namespace detail

// The number of distinct physical accelerators the ranks of `comm` drive with ExecSpace. Collective.
// On host execution spaces: 0, or one CPU device per rank when allow_cpu_devices is set.
template <class ExecSpace>
int count_physical_devices(MPI_Comm comm, bool allow_cpu_devices, const ExecSpace& space = ExecSpace()) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (is_host_space<ExecSpace>()) return allow_cpu_devices ? size : 0;
  const auto mine = detail::device_identity(space);
  std::vector<unsigned char> all(mine.size() * static_cast<std::size_t>(size));
  timed_allgather(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(), static_cast<int>(mine.size()),
                  MPI_BYTE, comm, "MPI_Allgather (dpmlp::count_physical_devices)");
  std::vector<std::string> ids;
  for (int r = 0; r < size; ++r) {
    ids.emplace_back(reinterpret_cast<const char*>(all.data()) + r * mine.size(), mine.size());
  }
  std::sort(ids.begin(), ids.end());
  return static_cast<int>(std::unique(ids.begin(), ids.end()) - ids.begin());
}

}  // namespace dpmlp
