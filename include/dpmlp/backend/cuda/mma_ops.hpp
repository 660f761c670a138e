// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/mma_ops.hpp: the device pieces the register-resident tensor kernels share: 3xTF32 operand
// splitting and mma.sync.m16n8k8 (tf32) products, the shared-memory alignment every tensor kernel uses, and
// CTA-scope mbarriers (the paired schedule's handoff).
//
// Why 3xTF32: TF32 keeps 10 mantissa bits, too few for results that must match an fp32 run, so each operand
// is split into a TF32 "big" part and a TF32 remainder, and a*b is computed as a_lo*b_hi + a_hi*b_lo +
// a_hi*b_hi (the dropped a_lo*b_lo is below fp32 rounding): three MMAs per product, accumulated in fp32
// (CUTLASS's 3xTF32 scheme).
//
// Block-scaled 3xFP16 (namespace f16x3, the deep kernel's): an fp16 operand keeps 11 mantissa bits, so a value
// split into hi = fp16(v') and lo = fp16(v' - hi) keeps 22, and a*b = a_lo*b_hi + a_hi*b_lo + a_hi*b_hi as
// above, in mma.sync.m16n8k16 (twice the k of the TF32 MMA at the same issue cost). fp16's range is narrow, so
// v' = v / s with s a power of two chosen for a block of values (scale_for: its largest magnitude lands in
// [2^14, 2^15)); the split is then exact in the scaling, and a product's scales multiply its sum.
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)

#include <cstdint>

#include <cuda_fp16.h>

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

namespace f16x3 {

// The largest |v| of a warp's values as bits (all lanes get it): each lane passes the largest of its own.
__device__ inline unsigned warp_max_bits(float local_max_abs) {
  return __reduce_max_sync(0xffffffffu, __float_as_uint(local_max_abs));
}
__device__ inline float abs_max(float m, float v) { return fmaxf(m, fabsf(v)); }

// The power-of-two scale of a block of values whose largest |v| has bits `maxbits`: inv = 1 / s, and v * inv
// lies below 2^15 (fp16's largest finite value is 65504) with the largest in [2^14, 2^15). Blocks below
// 2^-112 (zeros among them) take s = 2^-126, the least normal fp32 power, so s and inv stay normal; inf and
// NaN stay what they are.
__device__ inline void scale_for(unsigned maxbits, float& inv, float& s) {
  const int eb = static_cast<int>(maxbits >> 23);  // the biased exponent of the largest |v|
  if (eb < 15) {
    inv = __uint_as_float(253u << 23);
    s = __uint_as_float(1u << 23);
  } else {
    inv = __uint_as_float(static_cast<unsigned>(268 - eb) << 23);
    s = __uint_as_float(static_cast<unsigned>(eb - 14) << 23);
  }
}

// Two values' hi and lo parts, each a packed half2 (a in the low half, the lower address), a scaled by inv_a
// and b by inv_b.
__device__ inline void split2_each(float a, float b, float inv_a, float inv_b, std::uint32_t& hi, std::uint32_t& lo) {
  const float sa = a * inv_a, sb = b * inv_b;
  const __half2 h = __floats2half2_rn(sa, sb);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(sa - hf.x, sb - hf.y);
  hi = *reinterpret_cast<const std::uint32_t*>(&h);
  lo = *reinterpret_cast<const std::uint32_t*>(&l);
}
// The same, both values with one scale.
__device__ inline void split2(float a, float b, float inv, std::uint32_t& hi, std::uint32_t& lo) {
  split2_each(a, b, inv, inv, hi, lo);
}
__device__ inline void split1(float v, float inv, __half& hi, __half& lo) {
  const float sv = v * inv;
  hi = __float2half_rn(sv);
  lo = __float2half_rn(sv - __half2float(hi));
}
// A packed pair's value (hi + lo), unscaled.
__device__ inline float2 join2(std::uint32_t hi, std::uint32_t lo) {
  const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  const float2 l = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  return make_float2(h.x + l.x, h.y + l.y);
}
__device__ inline float join1(__half hi, __half lo) { return __half2float(hi) + __half2float(lo); }

// d += a b, one m16n8k16 FP16 MMA with fp32 accumulation.
__device__ inline void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a b, from a zero accumulator (no register to clear first).
__device__ inline void mma_zero(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
// acc[n] += a b[n] for N n tiles in 3xFP16: every lo*hi MMA, then every hi*lo, then every hi*hi. b[n]: the
// n tile's two registers. Init: acc[n] = a b[n] (acc's values unread).
template <int N, bool Init = false>
__device__ inline void mma3(float (&acc)[N][4], const std::uint32_t (&ahi)[4], const std::uint32_t (&alo)[4],
                            const std::uint32_t (&bhi)[N][2], const std::uint32_t (&blo)[N][2]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    if constexpr (Init) {
      mma_zero(acc[n], alo, bhi[n][0], bhi[n][1]);
    } else {
      mma(acc[n], alo, bhi[n][0], bhi[n][1]);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) mma(acc[n], ahi, blo[n][0], blo[n][1]);
#pragma unroll
  for (int n = 0; n < N; ++n) mma(acc[n], ahi, bhi[n][0], bhi[n][1]);
}

// Four 8 x 8 matrices of 16-bit values from shared memory (a lane's address: row lane % 8 of matrix lane / 8),
// as they are, or transposed (Trans).
template <bool Trans>
__device__ inline void ldsm4(std::uint32_t (&r)[4], unsigned addr) {
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  }
}

}  // namespace f16x3

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
