// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/wgmma_3xtf32_kernels.hpp: 3xTF32 GEMMs on Hopper's warpgroup MMAs (wgmma), for
// cutlass_3xtf32::gemm() on GPUs of compute capability 9.0 where the kernels are compiled for sm_90a.
//
// One warpgroup (128 threads) a CTA computes a 64 x BN tile of C (BN 64 or 128, from n only). Each k-tile of
// 32 is loaded from global memory into registers, split into TF32 hi and lo parts (tf32::split) and stored to
// shared memory in the K-major, 128-byte-swizzled layout wgmma reads (any operand layout: the split store
// transposes where the operand is not K-contiguous), two stages deep. A k-tile's 12 MMAs (lo*hi, hi*lo, then
// hi*hi, each over its four k-steps of 8) accumulate in the tile's fp32 accumulator. An H200 cuts each
// wgmma's sum toward zero (the PTX ISA promises only "at least single precision"), so over a long k this
// accumulator drifts past fp32 accuracy: the reason DPMLP_ENABLE_WGMMA stays off (docs/performance.md). The
// MMAs run asynchronously: while a k-tile's are in flight, the threads split and store the next k-tile into
// the other stage (free once every warp has seen the previous k-tile's MMAs done) and load the one after.
//
// Reproducible bits: an element of C is the same function of its row of A and column of B whatever m, the
// batch count or the grid (k-tiles in increasing order, a partial last k-tile zero-filled; BN from n), so a
// row's bits (a block's, for per-block weight gradients) do not depend on how many rows or blocks a rank has.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/mma_ops.hpp"
#include "dpmlp/backend/cuda/wgmma_3xtf32.hpp"
#include "dpmlp/backend/cuda/wgmma_layout.hpp"

namespace dpmlp {
namespace linalg {
namespace wgmma_3xtf32 {

namespace detail {

using backend::wgmma::descriptor;
using backend::wgmma::kcontig_chunk;
using backend::wgmma::kcontig_row;
using backend::wgmma::swizzled;
constexpr int kTile = backend::wgmma::k_tile;

#if defined(__CUDACC__)

using backend::shared_address;
__device__ inline void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int Pending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
template <int R>
__device__ inline void fence_registers(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DPMLP_WGMMA_DEVICE 1
// d (+)= A B, one m64n64k8 TF32 wgmma, both operands from shared memory (descriptors).
__device__ inline void mma(float (&d)[32], std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}
// d (+)= A B, one m64n128k8 TF32 wgmma, both operands from shared memory (descriptors).
__device__ inline void mma(float (&d)[64], std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}
#endif

__device__ inline float part(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

__device__ inline void store_split(float* hi, float* lo, int off, float x0, float x1, float x2, float x3) {
  std::uint32_t h[4], l[4];
  backend::tf32::split(x0, h[0], l[0]);
  backend::tf32::split(x1, h[1], l[1]);
  backend::tf32::split(x2, h[2], l[2]);
  backend::tf32::split(x3, h[3], l[3]);
  *reinterpret_cast<uint4*>(hi + off) = make_uint4(h[0], h[1], h[2], h[3]);
  *reinterpret_cast<uint4*>(lo + off) = make_uint4(l[0], l[1], l[2], l[3]);
}

// One operand's k-tile, R rows (of A: m; of B: n) x 32 k, through the registers of 128 threads. KContig:
// element (r, k) at p[r ld + k] (k contiguous); else at p[k ld + r] (r contiguous: loaded as 4 x 4 blocks
// and transposed in the store). Out-of-range rows and k read as 0; rows and k come in runs of 4 (the
// contiguous dimension a multiple of 4, the pointer 16-byte aligned).
template <int R, bool KContig>
struct Operand {
  static constexpr int kVecs = R / 16;  // float4 a thread
  float4 v[kVecs];

  // Which rows and chunk a thread's vectors hold: wgmma_layout.hpp.
  __device__ static int block_row(int u) { return backend::wgmma::block_row(u, R); }
  __device__ static int block_chunk(int u) { return backend::wgmma::block_chunk(u, R); }

  __device__ void load(const float* p, std::int64_t ld, int r0, int rows, int k0, int kdim, int t) {
    if constexpr (KContig) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int f = t + 128 * i, r = r0 + kcontig_row(f), k = k0 + 4 * kcontig_chunk(f);
        v[i] = r < rows && k < kdim ? *reinterpret_cast<const float4*>(p + r * ld + k) : make_float4(0, 0, 0, 0);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kVecs / 4; ++i) {
        const int u = t + 128 * i, r = r0 + 4 * block_row(u), k = k0 + 4 * block_chunk(u);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          v[4 * i + q] = r < rows && k + q < kdim ? *reinterpret_cast<const float4*>(p + (k + q) * ld + r)
                                                  : make_float4(0, 0, 0, 0);
        }
      }
    }
  }
  __device__ void store(float* hi, float* lo, int t) const {
    if constexpr (KContig) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int f = t + 128 * i, off = swizzled(kcontig_row(f), kcontig_chunk(f));
        store_split(hi, lo, off, v[i].x, v[i].y, v[i].z, v[i].w);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kVecs / 4; ++i) {
        const int u = t + 128 * i, r = 4 * block_row(u), chunk = block_chunk(u);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          store_split(hi, lo, swizzled(r + s, chunk), part(v[4 * i], s), part(v[4 * i + 1], s),
                      part(v[4 * i + 2], s), part(v[4 * i + 3], s));
        }
      }
    }
  }
};

template <int BN>
constexpr std::size_t shared_bytes() {
  return 2 * (2 * 64 + 2 * BN) * kTile * sizeof(float) + 1024;
}

template <int BN, bool AK, bool BK, Out O>
__global__ void __launch_bounds__(128) gemm_kernel(const Params P) {
#if defined(DPMLP_WGMMA_DEVICE)
  extern __shared__ char smem_raw[];
  const unsigned misalign = shared_address(smem_raw) & 1023u;
  float* const sm = reinterpret_cast<float*>(smem_raw + ((1024u - misalign) & 1023u));
  constexpr int SA = 64 * kTile, SB = BN * kTile, Stage = 2 * SA + 2 * SB, R = BN / 2;

  const int t = threadIdx.x;
  const int tn = blockIdx.x % P.tiles_n, tm = blockIdx.x / P.tiles_n;
  const int m0 = tm * 64, n0 = tn * BN;
  const float* A = P.a + blockIdx.y * P.stride_a;
  const float* B = P.b + blockIdx.y * P.stride_b;
  float* C = P.c + blockIdx.y * P.stride_c;
  const int kt_count = (P.k + kTile - 1) / kTile;

  Operand<64, AK> a;
  Operand<BN, BK> b;
  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;

  a.load(A, P.lda, m0, P.m, 0, P.k, t);
  b.load(B, P.ldb, n0, P.n, 0, P.k, t);
  a.store(sm, sm + SA, t);
  b.store(sm + 2 * SA, sm + 2 * SA + SB, t);
  if (kt_count > 1) {
    a.load(A, P.lda, m0, P.m, kTile, P.k, t);
    b.load(B, P.ldb, n0, P.n, kTile, P.k, t);
  }
  fence_proxy_async();
  __syncthreads();

  for (int kt = 0; kt < kt_count; ++kt) {
    const std::uint32_t base = shared_address(sm + (kt & 1) * Stage);
    const std::uint32_t a_hi = base, a_lo = base + SA * 4, b_hi = base + 2 * SA * 4, b_lo = b_hi + SB * 4;
    fence_registers(acc);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) mma(acc, descriptor(a_lo + 32 * s), descriptor(b_hi + 32 * s), 1);
#pragma unroll
    for (int s = 0; s < 4; ++s) mma(acc, descriptor(a_hi + 32 * s), descriptor(b_lo + 32 * s), 1);
#pragma unroll
    for (int s = 0; s < 4; ++s) mma(acc, descriptor(a_hi + 32 * s), descriptor(b_hi + 32 * s), 1);
    wgmma_commit();
    fence_registers(acc);
    // The previous k-tile's MMAs, which read the other stage, are done (in every warp: a warp's wait covers
    // its own part of the warpgroup's MMA, hence the barrier); this k-tile's may still run.
    wgmma_wait<1>();
    __syncthreads();
    if (kt + 1 < kt_count) {
      float* next = sm + ((kt + 1) & 1) * Stage;
      a.store(next, next + SA, t);
      b.store(next + 2 * SA, next + 2 * SA + SB, t);
      if (kt + 2 < kt_count) {
        a.load(A, P.lda, m0, P.m, (kt + 2) * kTile, P.k, t);
        b.load(B, P.ldb, n0, P.n, (kt + 2) * kTile, P.k, t);
      }
    }
    fence_proxy_async();
    __syncthreads();
  }
  wgmma_wait<0>();
  fence_registers(acc);

  // Register 4j + 2h + e of the accumulator: column 8j + 2 (lane % 4) + e of row 16 warp + lane / 4 + 8h
  // (wgmma_layout.hpp).
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = n0 + backend::wgmma::acc_col(t, 4 * j);
    if (col >= P.n) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + backend::wgmma::acc_row(t, 4 * j + 2 * h);
      if (row >= P.m) continue;
      float v[2] = {acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]};
      float* out = C + row * P.ldc + col;
      const bool both = col + 1 < P.n;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (e == 1 && !both) break;
        if constexpr (O == Out::bias_activation) {
          v[e] = dpmlp::detail::activate(P.act, v[e] + P.src[col + e]);
        } else if constexpr (O == Out::activation_grad) {
          v[e] = v[e] * dpmlp::detail::activate_grad_from_output(P.act, P.src[row * P.src_ld + col + e]);
        } else {
          v[e] = P.beta != 0.0f ? P.alpha * v[e] + P.beta * out[e] : P.alpha * v[e];
        }
      }
      if (both && P.pairs) {
        *reinterpret_cast<float2*>(out) = make_float2(v[0], v[1]);
      } else {
        out[0] = v[0];
        if (both) out[1] = v[1];
      }
    }
  }
#else
  __trap();
#endif
}


// Launches the kernel for p over `batch` entries (grid y; at most 65535), n tiles adjacent in the grid so
// CTAs that read the same rows of A run together.
template <int BN, bool AK, bool BK, Out O>
inline cudaError_t launch(cudaStream_t stream, Params p, int batch) {
  constexpr std::size_t bytes = shared_bytes<BN>();
  static const cudaError_t setup =
      cudaFuncSetAttribute(gemm_kernel<BN, AK, BK, O>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (setup != cudaSuccess) return setup;
  p.tiles_n = (p.n + BN - 1) / BN;
  const long long tiles = static_cast<long long>(p.tiles_n) * ((p.m + 63) / 64);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(batch));
  gemm_kernel<BN, AK, BK, O><<<grid, 128, bytes, stream>>>(p);
  return cudaGetLastError();
}

template <int BN, Out O>
inline cudaError_t launch_layout(cudaStream_t stream, const Params& p, int batch, bool a_kcontig, bool b_kcontig) {
  if (a_kcontig) {
    return b_kcontig ? launch<BN, true, true, O>(stream, p, batch) : launch<BN, true, false, O>(stream, p, batch);
  }
  return b_kcontig ? launch<BN, false, true, O>(stream, p, batch) : launch<BN, false, false, O>(stream, p, batch);
}

#endif  // __CUDACC__

}  // namespace detail

#if defined(__CUDACC__) && defined(DPMLP_WGMMA_KERNELS_HERE)
cudaError_t gemm(cudaStream_t stream, const Params& p, int batch, bool a_kcontig, bool b_kcontig, Out o) {
  using detail::launch_layout;
  const bool ak = a_kcontig, bk = b_kcontig;
  if (p.n > 64) {
    switch (o) {
      case Out::linear: return launch_layout<128, Out::linear>(stream, p, batch, ak, bk);
      case Out::bias_activation: return launch_layout<128, Out::bias_activation>(stream, p, batch, ak, bk);
      case Out::activation_grad: return launch_layout<128, Out::activation_grad>(stream, p, batch, ak, bk);
    }
  }
  switch (o) {
    case Out::linear: return launch_layout<64, Out::linear>(stream, p, batch, ak, bk);
    case Out::bias_activation: return launch_layout<64, Out::bias_activation>(stream, p, batch, ak, bk);
    case Out::activation_grad: return launch_layout<64, Out::activation_grad>(stream, p, batch, ak, bk);
  }
  return cudaErrorInvalidValue;
}
#endif
}  // namespace wgmma_3xtf32
}  // namespace linalg
}  // namespace dpmlp
