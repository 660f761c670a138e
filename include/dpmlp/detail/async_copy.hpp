// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/detail/async_copy.hpp: copies from global memory into a team's scratch with every copy in flight at
// once, for the block tree's local kernel (BlockTreeReducer::reduce_local_in_scratch, reduction.hpp) and the
// layered engine's narrow_forward.
//
// Why: that kernel first stages a subtree's partial sums (one value a block and column) in team scratch.
// Written as loads into registers then stores, ptxas (sm_90) interleaves each load with its store to keep
// registers free (the PTX has the loads batched; the SASS does not), so a thread waited out one memory
// latency every few values; with these copies the kernel takes about half the time. On CUDA devices of
// compute capability >= 8.0 a copy is one `cp.async` (global to shared, no register), so all of a thread's
// copies are in flight together;
// async_copy_wait() then waits for them (a team barrier must follow before other threads read them).
// Elsewhere (host spaces, HIP, older GPUs) a copy is a plain load and store and the wait does nothing. The
// values copied, and so every sum made of them, are the same either way.
#pragma once

#include <Kokkos_Core.hpp>

namespace dpmlp {
namespace detail {

// *dst = *src, where dst points into team scratch (shared memory on a GPU) and src into global memory; not
// visible to the thread itself, or to others, before async_copy_wait() (and then a team barrier).
template <class T>
KOKKOS_INLINE_FUNCTION void async_copy(T* dst, const T* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "async_copy: 4- or 8-byte values (cp.async.ca)");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(src), "n"(sizeof(T)) : "memory");
#else
  *dst = *src;
#endif
}

// The same for the 16 bytes at src (16 / sizeof(T) values; dst and src 16-byte aligned): one copy on those
// devices, so a thread has a quarter of the copies of 4-byte values to issue.
template <class T>
KOKKOS_INLINE_FUNCTION void async_copy16(T* dst, const T* src) {
  static_assert(16 % sizeof(T) == 0, "async_copy16: values that tile 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
#else
  for (int i = 0; i < static_cast<int>(16 / sizeof(T)); ++i) dst[i] = src[i];
#endif
}

// async_copy (N = 1) or async_copy16 (N values of 16 bytes in all), for code written once for both widths.
template <int N, class T>
KOKKOS_INLINE_FUNCTION void async_copy_n(T* dst, const T* src) {
  static_assert(N == 1 || N * sizeof(T) == 16, "async_copy_n: one value, or 16 bytes of them");
  if constexpr (N == 1) {
    async_copy(dst, src);
  } else {
    async_copy16(dst, src);
  }
}

// Waits until every async_copy this thread issued has landed.
KOKKOS_INLINE_FUNCTION void async_copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

}  // namespace detail
}  // namespace dpmlp
