// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/detail/tree_order.hpp: the block tree's summation order, written once for every kernel that sums in it
// (the local tree and the combine in reduction.hpp, the peer exchange in backend/cuda/peer.hpp, the grouped
// register-resident tensor kernel in backend/cuda/tensor_mma.hpp). The same pairs added in the same order give
// the same bits, so these kernels agree with each other bit for bit.
//
// A subtree of n consecutive values v[0..n) is summed level by level: at level `stride` (1, 2, 4, ...), each
// node g (a multiple of 2 stride) becomes v[g] + v[g + stride] where g + stride < n, and stays v[g] where the
// right half lies past the end. Its sum ends in v[0]. The combine above the ranks' subtrees is a program of
// steps value[dst] = value[a] + value[b] (BlockTreePlan::program, reduction.hpp), run in order.
#pragma once

#include <cstdint>

#include "dpmlp/kokkos_compat.hpp"

// Fully unrolled where the bounds are constants, on a GPU: the held values stay in registers.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define DPMLP_TREE_UNROLL _Pragma("unroll")
#else
#define DPMLP_TREE_UNROLL
#endif

namespace dpmlp {
namespace detail {
namespace tree {

// This thread's share of one level over n values, as lane `lane` of `lanes` (the pairs lane, lane + lanes, ...);
// at(i) is a reference to value i. The level's pairs are independent, so any split over lanes gives the same
// bits; a barrier must separate the levels.
template <class I, class At>
KOKKOS_FORCEINLINE_FUNCTION void level(I n, I stride, I lane, I lanes, const At& at) {
  for (I g = 2 * stride * lane; g + stride < n; g += 2 * stride * lanes) at(g) += at(g + stride);
}

// The pairs one level over n values has (n > stride); pair k is node 2 stride k.
template <class I>
KOKKOS_FORCEINLINE_FUNCTION I level_pairs(I n, I stride) {
  return (n - stride + 2 * stride - 1) / (2 * stride);
}

// A whole subtree of the first m of N values held by one thread (N a power of two), summed in place into v[0].
// Whole: m == N (no bounds to test).
template <bool Whole, int N, class T>
KOKKOS_FORCEINLINE_FUNCTION void sum_held(T (&v)[N], int m) {
  DPMLP_TREE_UNROLL
  for (int stride = 1; stride < N; stride *= 2) {
    DPMLP_TREE_UNROLL
    for (int k = 0; k + stride < N; k += 2 * stride) {
      if (Whole || k + stride < m) v[k] += v[k + stride];
    }
  }
}

// The combine program's steps in order over values at(v): ops holds (dst, a, b) for each of `steps` steps.
template <class Ops, class At>
KOKKOS_FORCEINLINE_FUNCTION void run_program(const Ops& op, int steps, const At& at) {
  for (int s = 0; s < steps; ++s) at(op(s, 0)) = at(op(s, 1)) + at(op(s, 2));
}

}  // namespace tree
}  // namespace detail
}  // namespace dpmlp
