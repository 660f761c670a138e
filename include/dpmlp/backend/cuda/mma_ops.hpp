// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/mma_ops.hpp: the device pieces the register-resident tensor kernels share: 3xTF32 operand
// splitting and mma.sync.m16n8k8 (tf32) products, the shared-memory alignment every tensor kernel uses, and
// CTA-scope mbarriers (the paired schedule's handoff).
//
// Why 3xTF32: TF32 keeps 10 mantissa bits, too few for results that must match an fp32 run, so each operand
// is split into a TF32 "big" part and a TF32 remainder, and a*b is computed as a_lo*b_hi + a_hi*b_lo +
// a_hi*b_hi (the dropped a_lo*b_lo is below fp32 rounding): three MMAs per product, accumulated in fp32
// (CUTLASS's 3xTF32 scheme).
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)

#include <cstdint>

namespace dpmlp {
namespace backend {

// The dynamic shared memory `smem` moved up to a 128-byte boundary, by pointer arithmetic on smem itself: a
// pointer aligned through an integer (uintptr_t) loses the compiler's knowledge that it points to shared
// memory, and every access through it becomes a generic LD / ST instead of LDS / STS.
__device__ inline float* align_shared_128(char* smem) {
  const unsigned misalign = static_cast<unsigned>(__cvta_generic_to_shared(smem)) & 127u;
  return reinterpret_cast<float*>(smem + ((128u - misalign) & 127u));
}

namespace tf32 {

// hi: v rounded to TF32 (to nearest, ties away, as cvt.rna: an integer add and a mask, where cvt.rna costs
// a compare more; it differs from cvt.rna only within 2^-11 of FLT_MAX, where hi becomes inf); lo = v - hi,
// exact in fp32, passed whole: the tensor cores read a TF32 operand's top 19 bits, so lo is truncated
// there, an error of at most 2^-11 |lo| <= 2^-22 |v|, the size of the dropped lo*lo. PTX leaves the low
// bits of a .tf32 operand to the implementation: sm_80 and sm_90 ignore them (the CUDA ctest's tensor tests,
// against fp64, are the check on a new architecture).
__device__ inline void split(float v, std::uint32_t& hi, std::uint32_t& lo) {
  hi = (__float_as_uint(v) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(v - __uint_as_float(hi));
}
// d += a b, one m16n8k8 TF32 MMA with fp32 accumulation.
__device__ inline void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a b + c, c separate from d.
__device__ inline void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                           const float (&c)[4]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
// acc[m][n] += a[m] b[n], one MMA for every tile pair (Init: acc[m][n] = a[m] b[n] + c[m], c the first MMA's
// C operand instead of acc's own value).
template <int M, int N, bool Init = false>
__device__ inline void mma_each(float (&acc)[M][N][4], const std::uint32_t (&a)[M][4], const std::uint32_t (&b)[N][2],
                                const float (*c)[4] = nullptr) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      if constexpr (Init) {
        mma(acc[m][n], a[m], b[n][0], b[n][1], c[m]);
      } else {
        mma(acc[m][n], a[m], b[n][0], b[n][1]);
      }
    }
  }
}
// acc[m][n] += a[m] b[n] for every tile pair, in 3xTF32: every lo*hi MMA, then every hi*lo, then every
// hi*hi, so an accumulator's three dependent MMAs are M*N MMAs apart. Init: acc[m][n] starts from c[m].
template <int M, int N, bool Init = false>
__device__ inline void mma3(float (&acc)[M][N][4], const std::uint32_t (&ahi)[M][4], const std::uint32_t (&alo)[M][4],
                            const std::uint32_t (&bhi)[N][2], const std::uint32_t (&blo)[N][2],
                            const float (*c)[4] = nullptr) {
  mma_each<M, N, Init>(acc, alo, bhi, c);
  mma_each(acc, ahi, blo);
  mma_each(acc, ahi, bhi);
}
// acc[m][n] += a[m] b[n] where a is exact in TF32 (a mask of 0s and 1s): every a*lo MMA, then every a*hi.
template <int M, int N>
__device__ inline void mma2(float (&acc)[M][N][4], const std::uint32_t (&a)[M][4], const std::uint32_t (&bhi)[N][2],
                            const std::uint32_t (&blo)[N][2]) {
  mma_each(acc, a, blo);
  mma_each(acc, a, bhi);
}

}  // namespace tf32

// A CTA-scope mbarrier in shared memory (sm_80 and newer): init by one thread before a __syncthreads; arrive;
// wait for the phase of the given parity to complete.
__device__ inline unsigned shared_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ inline void mbarrier_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ inline void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared.b64 st, [%0];\n}" ::"r"(shared_address(bar)) : "memory");
}
__device__ inline void mbarrier_wait(std::uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  do {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(shared_address(bar)), "r"(parity)
                 : "memory");
#else
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(shared_address(bar)), "r"(parity)
                 : "memory");
#endif
  } while (done == 0);
}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA && __CUDACC__
