// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/gemm_f16x3_kernels.hpp: dpmlp's block-scaled 3xFP16 GEMMs, which take the cutlass
// backend's float GEMMs of n >= 64 on GPUs of compute capability 8.0 and newer (cutlass_3xtf32::gemm() decides;
// cutlass_3xtf32.hpp says which GEMMs reach it at all).
//
// What they compute: C = alpha op(A) op(B) (+ beta C), or a fused epilogue (Out), at fp32-level accuracy on the
// FP16 tensor cores (mma.sync.m16n8k16, twice the k of a TF32 MMA at the same issue cost). Each operand is
// read as fp32 and split, once a CTA, into fp16 hi and lo parts (the deep kernel's scheme, mma_ops.hpp,
// namespace f16x3) with a power-of-two scale for each row of op(A) and each column of op(B) over each chunk
// of 32 k (the largest of those 32 magnitudes lands in [2^14, 2^15)). A chain of k = 32 (one k-tile: two k16
// steps, each lo*hi, hi*lo, hi*hi) sums in a fresh fp32 accumulator, which is then multiplied by its row's and
// column's scales and added to the output's fp32 sum. The accuracy's reference is the tile's largest: a value
// keeps 22 bits below the largest magnitude of its row (column) in its k-tile, not below its own, so the sum
// errs by about 2^-22 of the sum over k-tiles of the row's largest times the column's largest (docs/design.md
// has what that means, and the limits near fp32's range, where the two scales' product can overflow or flush).
//
// Reproducible bits: an output element is a function of its own row of op(A), its column of op(B) and k alone
// (the scales too, chunks of k from 0, the last zero-padded; chains added in increasing k; an MMA's output does
// not depend on its neighbours), so its bits do not depend on m, n, the batch count or the tile, which may
// then follow the shape.
//
// Structure: a CTA computes a BM x BN tile with WM x WN warps. Each warp copies its share of a k-tile (regions
// of 16 free x 32 k values of A and of B) as fp32 with cp.async into a ring of three k-tiles, issued three
// k-tiles ahead; after the MMAs of k-tile kt it splits its own copies of k-tile kt + 1 (no other lane's, so its
// own wait suffices) into fp16 planes (XOR-swizzled 16-byte chunks: ldmatrix and the stores avoid bank
// conflicts) in the other of two shared-memory stages, then adds k-tile kt's chains: one __syncthreads a
// k-tile. Operands whose k is contiguous in memory (A for op N, B for op T) are stored free-major and read by
// ldmatrix; the others k-major and read by ldmatrix.trans (f16x3_layout.hpp has the index arithmetic, which
// test_gemm checks; test_f16x3_emulated runs these kernels on a CPU model of the instructions they use).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/f16x3_layout.hpp"
#include "dpmlp/backend/cuda/kernel_gemm.hpp"
#include "dpmlp/backend/cuda/mma_ops.hpp"

namespace dpmlp {
namespace linalg {
namespace gemm_f16x3 {

using Out = kernel_gemm::Out;
using Params = kernel_gemm::Params;

namespace detail {

constexpr int BK = backend::f16x3_layout::k_tile;  // a k-tile: one chain, one scale a row (column)

template <int BM_, int BN_, int WM_, int WN_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_;
  static constexpr int warps = WM * WN, threads = 32 * warps;
  static constexpr int MT = BM / WM / 16;  // a warp's m16 tiles
  static constexpr int NT = BN / WN / 8;   // a warp's n8 tiles (even: ldmatrix reads two at once)
  static constexpr int RA = BM / 16, RB = BN / 16, regions = RA + RB;  // a warp's loads: 16 free x 32 k
  static_assert(RA == warps && RB == warps, "a warp copies and splits one region of A and one of B");
  // An operand's split k-tile: its hi plane, its lo plane, then one scale a free index.
  static constexpr int plane_a = BM * BK, plane_b = BN * BK;  // halves
  static constexpr int split_a = BM * (4 * BK + 4), split_b = BN * (4 * BK + 4);  // bytes
  static constexpr int ring = 3;  // fp32 k-tiles in flight, each a warp's regions of 512 values, 2 KB apiece
  static_assert(NT % 2 == 0 && MT >= 1, "a warp takes m16 tiles and pairs of n8 tiles");
  static_assert(BM >= 64 && BN >= 64, "k-major planes need at least eight 16-byte chunks a row");
  static_assert(split_a % 16 == 0 && split_b % 16 == 0, "split k-tiles start 16-byte aligned");
};

// A CTA's shared memory: two stages, each a k-tile's split A and (unless B comes split beforehand, PreB) split
// B; the ring of fp32 k-tiles being copied (A's regions, then B's unless PreB); with PreB, a ring of B's split
// k-tiles, copied as they are, four deep (issued three k-tiles ahead, so the slot a copy overwrites was last
// read a k-tile before).
template <class T, bool PreB>
struct Smem {
  static constexpr int stage = T::split_a + (PreB ? 0 : T::split_b);
  static constexpr int ring_slot = (PreB ? T::RA : T::regions) * 2048;
  static constexpr int b_ring = PreB ? 4 : 0;
  static constexpr int bytes = 2 * stage + T::ring * ring_slot + b_ring * T::split_b;
};

using backend::f16x3_layout::plane_at;
using backend::f16x3_layout::Coord;

using backend::f16x3_layout::split_b_columns;
using backend::f16x3_layout::split_b_tile_bytes;

// One operand's view for the loads: element (f, k) of op(X) at p[f * ld + k] (k contiguous) or p[k * ld + f].
struct Operand {
  const float* p;
  std::int64_t ld;
  int free_extent;  // m or n
};

// 16 bytes from global memory at src to shared address dst, asynchronously; zeros where bytes is 0.
__device__ __forceinline__ void cp_async16(unsigned dst, const float* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

// One lane's copies of a warp's region, 16 (free) x 32 (k) values a k-tile, four float4 a lane at the offsets
// f16x3_layout::region_element gives, k-tile after k-tile (copy() is called for k-tiles 0, 1, 2, ... in turn):
// the address of its i = 0 value in the current k-tile, the steps to its i-th value and to the next k-tile,
// which of its four values' rows (columns) exist, and its k offset (the 64-bit address arithmetic once a kernel,
// not once a copy). Every float4 is whole inside the matrix or whole outside (zeros): the contiguous extent and
// the leading dimension are multiples of 4 (takes()). A lane reads back only what it copied itself, so its own
// wait suffices.
template <bool KContig>
struct RegionCopy {
  const float* at;
  const float* any;  // a valid address, for the copies that only zero-fill
  std::int64_t di, dk;
  int f_ok = 0;  // bit i: the i-th value's row of op(A) (column of op(B)) exists
  int k_lane;    // the lane's k within a k-tile, at i = 0

  __device__ RegionCopy(const Operand& x, int f0, int lane) {
    const Coord e = backend::f16x3_layout::region_element<KContig>(lane, 0);
    at = KContig ? x.p + static_cast<std::int64_t>(f0 + e.f) * x.ld + e.k
                 : x.p + static_cast<std::int64_t>(e.k) * x.ld + f0 + e.f;
    any = x.p;
    di = KContig ? 4 * x.ld : 8 * x.ld;
    dk = KContig ? BK : BK * x.ld;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (f0 + backend::f16x3_layout::region_element<KContig>(lane, i).f < x.free_extent) f_ok |= 1 << i;
    }
    k_lane = e.k;
  }
  // This k-tile's values (zeros outside the matrix) to the region's 2 KB at shared address dst, the lane's i-th
  // float4 at (32 i + lane) * 16 bytes; then on to the next k-tile.
  __device__ void copy(unsigned dst, int k0, int k, int lane) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int kk = k0 + k_lane + (KContig ? 0 : 8 * i);
      const bool in = ((f_ok >> i) & 1) != 0 && kk < k;
      cp_async16(dst + (32 * i + lane) * 16, in ? at + i * di : any, in ? 16 : 0);
    }
    at += dk;
  }
};

// The copies of op(B)'s split k-tiles (PreB) into a slot of T::split_b bytes: the tile's columns' slice of
// each part (hi plane, lo plane, scales), 16-byte chunks spread over the CTA's threads, k-tile after k-tile.
// Another thread's chunks are read only after a __syncthreads that follows every thread's wait.
template <class T>
struct SplitBCopy {
  static constexpr int chunks = T::split_b / 16, per = (chunks + T::threads - 1) / T::threads;
  static constexpr int plane = T::BN * 2 * BK;  // bytes of a plane's slice
  const unsigned char* at;                      // the k-tile's split op(B)
  std::int64_t tile;                            // bytes a k-tile
  int off[per];                                 // each chunk's offset in one
  int tid;

  __device__ SplitBCopy(const Params& p, int n0, int tid_) : at(p.b_split), tile(split_b_tile_bytes(p.n)), tid(tid_) {
    const int cols = split_b_columns(p.n);
#pragma unroll
    for (int i = 0; i < per; ++i) {
      const int byte = 16 * (tid + i * T::threads);  // in the slot
      off[i] = byte < 2 * plane ? byte / plane * cols * 2 * BK + n0 * 2 * BK + byte % plane
                                : 2 * cols * 2 * BK + n0 * 4 + (byte - 2 * plane);
    }
  }
  __device__ void copy(unsigned dst) {
#pragma unroll
    for (int i = 0; i < per; ++i) {
      const int c = tid + i * T::threads;
      if (c < chunks) cp_async16(dst + 16 * c, reinterpret_cast<const float*>(at + off[i]), 16);
    }
    at += tile;
  }
};

// The lane's four float4 of a region's 2 KB in a ring slot.
__device__ __forceinline__ void read_region(float4 (&v)[4], const unsigned char* src, int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = reinterpret_cast<const float4*>(src)[32 * i + lane];
}

// A T N GEMM's column sums of op(B) over k (B's rows: the bias gradients beside a block's weight gradient),
// from the B regions the CTA splits anyway. In each k-tile lane (g = lane / 4, t = lane % 4) of a warp holds
// rows 8 i + g (i = 0..3) of its region's columns 4 t ..+3 (f16x3_layout::region_element) and adds them to its
// four sums in row order: chain g sums the rows r = g (mod 8) in row order, from +0, with the zeros past k up
// to the last k-tile's end. The eight chains are then combined by the fixed tree ((c0 + c1) + (c2 + c3)) +
// ((c4 + c5) + (c6 + c7)) (butterfly shuffles, after which every lane holds the same bits). The order depends
// on the block's rows alone, so a block's sums have the same bits wherever it lives.
struct ColumnSums {
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  __device__ __forceinline__ void add(const float4 (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[0] += v[i].x, s[1] += v[i].y, s[2] += v[i].z, s[3] += v[i].w;
  }
  // The sums of the warp's region (columns fr ..+15 of the tile at n0) into out (the batch entry's).
  __device__ __forceinline__ void write(float* out, int n, int n0, int fr, int lane) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      s[c] += __shfl_xor_sync(0xffffffffu, s[c], 4);
      s[c] += __shfl_xor_sync(0xffffffffu, s[c], 8);
      s[c] += __shfl_xor_sync(0xffffffffu, s[c], 16);
    }
    if (lane < 4) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = n0 + fr + 4 * lane + c;
        if (col < n) out[col] = s[c];
      }
    }
  }
};

// Whether warp `warp` of the CTA at rows m0.. sums its region of op(B)'s columns into p.colsum: the warps of
// row tile w % tiles_m (each region once; every tile's warps share the work when there are several row tiles).
__device__ __forceinline__ bool sums_region(const Params& p, int bm, int m0, int warp) {
  const int tiles_m = (p.m + bm - 1) / bm;
  return p.colsum != nullptr && warp % tiles_m == m0 / bm;
}

__device__ __forceinline__ float max4(const float4& v) {
  namespace h = backend::f16x3;
  return h::abs_max(h::abs_max(h::abs_max(fabsf(v.x), v.y), v.z), v.w);
}

// The values' scales, one a free index over the k-tile's 32 values (the largest magnitude among the lanes that
// hold them), stored at scale[f] (tile free offset fr: the region's first), and the values split into the planes.
template <bool KContig, int F>
__device__ __forceinline__ void store_region(const float4 (&v)[4], __half* hi, __half* lo, float* scale, int fr,
                                             int lane) {
  namespace h = backend::f16x3;
  float inv[4];
  if constexpr (KContig) {
    // Lane holds rows fr + 4i + lane/8; the eight lanes of a row differ in lane % 8.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = max4(v[i]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      float s;
      h::scale_for(__float_as_uint(mx), inv[i], s);
      if ((lane & 7) == 0) scale[fr + 4 * i + (lane >> 3)] = s;
    }
  } else {
    // Lane holds columns fr + 4 (lane%4) + c, c = 0..3; the eight lanes of a column differ in lane / 4.
    float mx[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      mx[0] = h::abs_max(mx[0], v[i].x), mx[1] = h::abs_max(mx[1], v[i].y);
      mx[2] = h::abs_max(mx[2], v[i].z), mx[3] = h::abs_max(mx[3], v[i].w);
    }
    float s[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], 4));
      mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], 8));
      mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], 16));
      h::scale_for(__float_as_uint(mx[c]), inv[c], s[c]);
    }
    if (lane < 4) *reinterpret_cast<float4*>(scale + fr + 4 * lane) = make_float4(s[0], s[1], s[2], s[3]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const Coord e = backend::f16x3_layout::region_element<KContig>(lane, i);  // within the region
    uint2 H, L;
    if constexpr (KContig) {
      h::split2(v[i].x, v[i].y, inv[i], H.x, L.x);
      h::split2(v[i].z, v[i].w, inv[i], H.y, L.y);
    } else {
      h::split2_each(v[i].x, v[i].y, inv[0], inv[1], H.x, L.x);
      h::split2_each(v[i].z, v[i].w, inv[2], inv[3], H.y, L.y);
    }
    const int at = plane_at<KContig, F>(fr + e.f, e.k);
    *reinterpret_cast<uint2*>(hi + at) = H;
    *reinterpret_cast<uint2*>(lo + at) = L;
  }
}

// A 16 (free) x 16 (k) block of a plane at (f0, k0) by ldmatrix.x4 (.trans for k-major planes), each register
// a lane's (f = lane/4, k = 2 (lane%4) ..+1) pair of one 8 x 8 quarter, the quarters in the order
// f16x3_layout::ldsm_row gives: an A fragment as it is (BPairs false), or two B fragments, r[0], r[1] for
// f 0-7 and r[2], r[3] for f 8-15 (BPairs).
template <bool FreeMajor, int F, bool BPairs>
__device__ __forceinline__ void frag16(std::uint32_t (&r)[4], const __half* plane, int f0, int k0, int lane) {
  const Coord row = backend::f16x3_layout::ldsm_row<FreeMajor, BPairs>(f0, k0, lane);
  backend::f16x3::ldsm4<!FreeMajor>(r, backend::shared_address(plane + plane_at<FreeMajor, F>(row.f, row.k)));
}

// frag16's blocks at (f0 + 16 j, k0) of the hi and the lo plane. In free-major planes the lane's row lies 1 KB j
// past its row at j = 0 (the swizzle sees f only through (f / 2) % 4, which 16 j keeps), so `off`, that row's
// byte offset (computed once a kernel), plus an immediate addresses it; k-major planes take frag16's arithmetic.
template <bool FreeMajor, int F, bool BPairs>
__device__ __forceinline__ void frag16_planes(std::uint32_t (&hi)[4], std::uint32_t (&lo)[4], const __half* plane_hi,
                                              const __half* plane_lo, unsigned off, int f0, int j, int k0, int lane) {
  if constexpr (FreeMajor) {
    backend::f16x3::ldsm4<false>(hi, backend::shared_address(plane_hi) + off + 1024 * j);
    backend::f16x3::ldsm4<false>(lo, backend::shared_address(plane_lo) + off + 1024 * j);
  } else {
    frag16<false, F, BPairs>(hi, plane_hi, f0 + 16 * j, k0, lane);
    frag16<false, F, BPairs>(lo, plane_lo, f0 + 16 * j, k0, lane);
  }
}

// What the output form O reads for elements (row, col) and (row, col + 1) besides their sums: the bias
// (bias_activation) or Y (activation_grad); nothing (zeros) for linear or columns past n. A thread reads all its
// elements' operands before it writes any: C may alias them for all the compiler knows, so a load after a store
// would wait for it, and the epilogue would be a chain of memory latencies.
template <Out O>
__device__ __forceinline__ void read_pair(const Params& p, int row, int col, float (&e)[2]) {
  e[0] = e[1] = 0.0f;
  if (col >= p.n) return;
  const bool both = col + 1 < p.n;
  if constexpr (O == Out::bias_activation) {
    e[0] = p.src[col];
    if (both) e[1] = p.src[col + 1];
  } else if constexpr (O == Out::activation_grad) {
    const float* y = p.src + static_cast<std::int64_t>(row) * p.src_ld + col;
    e[0] = y[0];
    if (both) e[1] = y[1];
  }
}

// Elements (row, col) and (row, col + 1) of batch entry bz's C from their sums v0, v1 and read_pair's e,
// through the output form O (columns past n skipped; row < m).
template <Out O, Activation A>
__device__ __forceinline__ void write_pair(const Params& p, std::int64_t bz, int row, int col, float v0, float v1,
                                           const float (&e)[2]) {
  if (col >= p.n) return;
  float* crow = p.c + bz * p.stride_c + static_cast<std::int64_t>(row) * p.ldc;
  const bool both = col + 1 < p.n;
  float v[2] = {v0, v1};
  if constexpr (O == Out::bias_activation) {
    v[0] = dpmlp::detail::activate(A, v[0] + e[0]);
    if (both) v[1] = dpmlp::detail::activate(A, v[1] + e[1]);
  } else if constexpr (O == Out::activation_grad) {
    v[0] = v[0] * dpmlp::detail::activate_grad_from_output(A, e[0]);
    if (both) v[1] = v[1] * dpmlp::detail::activate_grad_from_output(A, e[1]);
  } else {
    v[0] *= p.alpha, v[1] *= p.alpha;
    if (p.beta != 0.0f) {
      v[0] += p.beta * crow[col];
      if (both) v[1] += p.beta * crow[col + 1];
    }
  }
  if (both && p.pairs) {
    *reinterpret_cast<float2*>(crow + col) = make_float2(v[0], v[1]);
  } else {
    crow[col] = v[0];
    if (both) crow[col + 1] = v[1];
  }
}

// f(std::integral_constant<Activation, a>) for the call's activation a (identity for the linear form), so that
// an epilogue's every element is the activation's own code, not a branch over the three (in a kernel, or on
// the host to pick a kernel instantiated for it).
template <Out O, class F>
__host__ __device__ __forceinline__ void with_activation(Activation a, F&& f) {
  if constexpr (O == Out::linear) {
    f(std::integral_constant<Activation, Activation::identity>());
  } else if (a == Activation::relu) {
    f(std::integral_constant<Activation, Activation::relu>());
  } else if (a == Activation::tanh) {
    f(std::integral_constant<Activation, Activation::tanh>());
  } else {
    f(std::integral_constant<Activation, Activation::identity>());
  }
}

template <class T, bool AK, bool BK_, Out O, bool PreB>
__global__ void __launch_bounds__(T::threads, 1) gemm_kernel(const Params p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // cp.async, mma.sync.m16n8k16.f16
  namespace h = backend::f16x3;
  using S = Smem<T, PreB>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int MT = T::MT, NT = T::NT;
  constexpr bool BFree = BK_ || PreB;  // B's planes free-major (split beforehand: always)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp / T::WN, warp_n = warp % T::WN;
  const int tiles_n = (p.n + T::BN - 1) / T::BN;
  const int tm = static_cast<int>(blockIdx.x / tiles_n), tn = static_cast<int>(blockIdx.x % tiles_n);
  const int m0 = tm * T::BM, n0 = tn * T::BN;
  const std::int64_t bz = blockIdx.y;

  // op(A) row f, column k: A[f][k] (op N, k contiguous) or A[k][f]; op(B) column f, row k: B[k][f] (op N) or
  // B[f][k] (op T, k contiguous). The tile's own origin folded into the pointers.
  Operand A{p.a + bz * p.stride_a + (AK ? static_cast<std::int64_t>(m0) * p.lda : m0), p.lda, p.m - m0};
  Operand B{p.b + bz * p.stride_b + (BK_ ? static_cast<std::int64_t>(n0) * p.ldb : n0), p.ldb, p.n - n0};

  // Stage s holds k-tiles s, s + 2, ... of split A (and of split B unless PreB); B's split k-tile kt is in
  // stage kt % 2 after A's, or (PreB) in slot kt % 4 of its own ring.
  unsigned char* const ring = smem_raw + 2 * S::stage;
  unsigned char* const b_ring = ring + T::ring * S::ring_slot;
  auto stage_ptr = [&](int s) { return smem_raw + s * S::stage; };
  auto a_hi = [&](int s) { return reinterpret_cast<__half*>(stage_ptr(s)); };
  auto a_lo = [&](int s) { return a_hi(s) + T::plane_a; };
  auto a_scales = [&](int s) { return reinterpret_cast<float*>(stage_ptr(s) + 4 * T::plane_a); };
  auto b_tile = [&](int kt) -> unsigned char* {
    if constexpr (PreB) {
      static_assert(S::b_ring == 4, "slot kt % 4");
      return b_ring + (kt & 3) * T::split_b;
    } else {
      return stage_ptr(kt & 1) + T::split_a;
    }
  };
  auto b_hi = [&](int kt) { return reinterpret_cast<__half*>(b_tile(kt)); };
  auto b_lo = [&](int kt) { return b_hi(kt) + T::plane_b; };
  auto b_scales = [&](int kt) { return reinterpret_cast<float*>(b_tile(kt) + 4 * T::plane_b); };

  const int kts = (p.k + BK - 1) / BK;
  // Issue k-tile kt's copies into ring slot kt % ring (this warp's regions: region `warp` of A, rows
  // 16 warp ..+15 of the tile, and of B, columns) or, PreB, B's split k-tile into its slot; a group committed
  // even when kt is past the end, so the count of groups in flight stays fixed.
  RegionCopy<AK> a_copy(A, 16 * warp, lane);
  auto b_copy = [&] {
    if constexpr (PreB) {
      return SplitBCopy<T>(p, n0, static_cast<int>(threadIdx.x));
    } else {
      return RegionCopy<BK_>(B, 16 * warp, lane);
    }
  }();
  // (r: kt % T::ring, kept by the loop rather than divided for.)
  auto issue = [&](int kt, int r) {
    if (kt < kts) {
      const unsigned slot = backend::shared_address(ring + r * S::ring_slot);
      a_copy.copy(slot + warp * 2048, kt * BK, p.k, lane);
      if constexpr (PreB) {
        b_copy.copy(backend::shared_address(b_tile(kt)));
      } else {
        b_copy.copy(slot + (T::RA + warp) * 2048, kt * BK, p.k, lane);
      }
    }
    copy_commit();
  };
  // The split of a k-tile (landed) in two steps: this warp's fp32 regions from ring slot r into registers
  // (va: A's; vb: B's, unless PreB), then split into k-tile kt's stage (kt % 2).
  auto load = [&](float4 (&va)[4], float4 (&vb)[4], int r) {
    const unsigned char* slot = ring + r * S::ring_slot;
    read_region(va, slot + warp * 2048, lane);
    if constexpr (!PreB) read_region(vb, slot + (T::RA + warp) * 2048, lane);
  };
  auto store = [&](const float4 (&va)[4], const float4 (&vb)[4], int kt) {
    const int s = kt & 1;
    store_region<AK, T::BM>(va, a_hi(s), a_lo(s), a_scales(s), 16 * warp, lane);
    if constexpr (!PreB) store_region<BK_, T::BN>(vb, b_hi(kt), b_lo(kt), b_scales(kt), 16 * warp, lane);
  };

  // T N with p.colsum: warp w's region of op(B)'s columns is also summed (ColumnSums) by the CTAs of row tile
  // w % tiles_m, so each region once and the extra work spread over the row tiles.
  const bool sums = !AK && !BK_ && !PreB && sums_region(p, T::BM, m0, warp);
  ColumnSums column_sums;

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    }
  }

  const int wm0 = warp_m * MT * 16, wn0 = warp_n * NT * 8;
  // The lane's ldmatrix rows' byte offsets in free-major planes at j = 0 (frag16_planes), for both k16 steps.
  unsigned a_off[2] = {0, 0}, b_off[2] = {0, 0};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const Coord ra = backend::f16x3_layout::ldsm_row<true, false>(wm0, 16 * h, lane);
    const Coord rb = backend::f16x3_layout::ldsm_row<true, true>(wn0, 16 * h, lane);
    a_off[h] = 2 * plane_at<true, T::BM>(ra.f, ra.k);
    b_off[h] = 2 * plane_at<true, T::BN>(rb.f, rb.k);
  }
#pragma unroll
  for (int kt = 0; kt < T::ring; ++kt) issue(kt, kt);
  copy_wait<T::ring - 1>();
  float4 va[4], vb[4];
  load(va, vb, 0);
  if (sums) column_sums.add(vb);
  store(va, vb, 0);
  __syncthreads();
  int r = 0;  // kt % T::ring
  for (int kt = 0; kt < kts; ++kt) {
    const int s = kt & 1;
    const int r1 = r + 1 == T::ring ? 0 : r + 1;  // (kt + 1) % T::ring
    issue(kt + T::ring, r);  // into the slot k-tile kt's split emptied
    // K-tile kt + 1's values (landed: groups kt + 2 .. kt + ring may still be in flight) into registers now, and
    // split into the other stage between this k-tile's two k16 steps, so that the split's arithmetic issues
    // while the MMAs run. Past the last k-tile it splits what the slot holds into a stage nothing reads.
    copy_wait<T::ring - 1>();
    load(va, vb, r1);
    if (sums && kt + 1 < kts) column_sums.add(vb);
    float chain[MT][NT][4];
#pragma unroll
    for (int k16 = 0; k16 < BK; k16 += 16) {
      std::uint32_t bhi[NT][2], blo[NT][2];
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        std::uint32_t q[4], w[4];
        frag16_planes<BFree, T::BN, true>(q, w, b_hi(kt), b_lo(kt), b_off[k16 / 16], wn0, np, k16, lane);
        bhi[2 * np][0] = q[0], bhi[2 * np][1] = q[1], bhi[2 * np + 1][0] = q[2], bhi[2 * np + 1][1] = q[3];
        blo[2 * np][0] = w[0], blo[2 * np][1] = w[1], blo[2 * np + 1][0] = w[2], blo[2 * np + 1][1] = w[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        std::uint32_t ahi[4], alo[4];
        frag16_planes<AK, T::BM, false>(ahi, alo, a_hi(s), a_lo(s), a_off[k16 / 16], wm0, mt, k16, lane);
        if (k16 == 0) {
          h::mma3<NT, true>(chain[mt], ahi, alo, bhi, blo);
        } else {
          h::mma3<NT, false>(chain[mt], ahi, alo, bhi, blo);
        }
      }
      if (k16 == 0) store(va, vb, kt + 1);
    }
    // The chain's sums, times their rows' and columns' scales (powers of two), into the fp32 sums.
    const float* sca = a_scales(s);
    const float* scb = b_scales(kt);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float sa0 = sca[wm0 + 16 * mt + g], sa1 = sca[wm0 + 16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float2 sb = *reinterpret_cast<const float2*>(scb + wn0 + 8 * nt + 2 * t);
        acc[mt][nt][0] = fmaf(chain[mt][nt][0], sa0 * sb.x, acc[mt][nt][0]);
        acc[mt][nt][1] = fmaf(chain[mt][nt][1], sa0 * sb.y, acc[mt][nt][1]);
        acc[mt][nt][2] = fmaf(chain[mt][nt][2], sa1 * sb.x, acc[mt][nt][2]);
        acc[mt][nt][3] = fmaf(chain[mt][nt][3], sa1 * sb.y, acc[mt][nt][3]);
      }
    }
    __syncthreads();
    r = r1;
  }
  if (sums) column_sums.write(p.colsum + bz * p.stride_c, p.n, n0, 16 * warp, lane);

  // The epilogue: a lane holds rows g and g + 8 of each m16 tile, columns 2t and 2t + 1 of each n8 tile.
  const int g = lane >> 2, t = lane & 3;
  float e[MT][2][NT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m0 + wm0 + 16 * mt + g + 8 * half;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (row < p.m) read_pair<O>(p, row, n0 + wn0 + 8 * nt + 2 * t, e[mt][half][nt]);
      }
    }
  }
  with_activation<O>(p.act, [&](auto act) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + wm0 + 16 * mt + g + 8 * half;
        if (row >= p.m) continue;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          write_pair<O, decltype(act)::value>(p, bz, row, n0 + wn0 + 8 * nt + 2 * t, acc[mt][nt][2 * half],
                                              acc[mt][nt][2 * half + 1], e[mt][half][nt]);
        }
      }
    }
  });
#else
  (void)p;
  __trap();  // f16x3_here() refuses devices below compute capability 8.0
#endif
}

// Kernel fn's opt-in to `bytes` of dynamic shared memory, and the carveout that lets CTAs share an SM (three of
// the small tile's with op(B) split beforehand): what each launcher does once a kernel.
template <class Kernel>
cudaError_t opt_in(Kernel fn, int bytes) {
  cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  return e;
}
// The BM x BN tiles over p's m x n (a grid takes at most 2^31 - 1).
template <class T>
long long tile_count(const Params& p) {
  return static_cast<long long>((p.m + T::BM - 1) / T::BM) * ((p.n + T::BN - 1) / T::BN);
}

// One launch of at most 65535 batch entries (the grid's y); op(B) split beforehand where p.b_split is set.
template <class T, bool AK, bool BK_, Out O, bool PreB>
cudaError_t launch_as(cudaStream_t stream, const Params& p, int batch) {
  using S = Smem<T, PreB>;
  auto* fn = gemm_kernel<T, AK, BK_, O, PreB>;
  static const cudaError_t set = opt_in(fn, S::bytes);
  if (set != cudaSuccess) return set;
  const long long tiles = tile_count<T>(p);
  if (tiles > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  gemm_kernel<T, AK, BK_, O, PreB><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(batch)), T::threads,
                                     S::bytes, stream>>>(p);
  return cudaGetLastError();
}
template <class T, bool AK, bool BK_, Out O>
cudaError_t launch(cudaStream_t stream, const Params& p, int batch) {
  if constexpr (AK) {  // rows x weights: B may come split (T N's per-block B never does)
    if (p.b_split != nullptr) return launch_as<T, AK, BK_, O, true>(stream, p, batch);
  }
  return launch_as<T, AK, BK_, O, false>(stream, p, batch);
}

// Column f of op(B)'s k-tile kt, split as the GEMM kernels split it (the same scale and parts), into the
// format of split_b_bytes(); zeros past n and k.
template <bool KContig>
__device__ __forceinline__ void split_b_column(const float* b, std::int64_t ldb, int n, int k, unsigned char* out,
                                               int f, int kt) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  namespace h = backend::f16x3;
  const int cols = split_b_columns(n);
  float v[BK];
#pragma unroll
  for (int i = 0; i < BK; ++i) {
    const int kk = kt * BK + i;
    v[i] = f < n && kk < k ? (KContig ? b[static_cast<std::int64_t>(f) * ldb + kk] : b[static_cast<std::int64_t>(kk) * ldb + f])
                           : 0.0f;
  }
  // The largest magnitude, from where the kernels' split starts (|the first| where k is contiguous, else 0:
  // the same scale for a k-tile of NaNs too).
  float mx = KContig ? fabsf(v[0]) : 0.0f;
#pragma unroll
  for (int i = KContig ? 1 : 0; i < BK; ++i) mx = h::abs_max(mx, v[i]);
  float inv, s;
  h::scale_for(__float_as_uint(mx), inv, s);
  unsigned char* tile = out + kt * split_b_tile_bytes(n);
  __half* hi = reinterpret_cast<__half*>(tile);
  __half* lo = hi + cols * BK;
#pragma unroll
  for (int c = 0; c < BK / 8; ++c) {
    uint4 H, L;
    h::split2(v[8 * c], v[8 * c + 1], inv, H.x, L.x);
    h::split2(v[8 * c + 2], v[8 * c + 3], inv, H.y, L.y);
    h::split2(v[8 * c + 4], v[8 * c + 5], inv, H.z, L.z);
    h::split2(v[8 * c + 6], v[8 * c + 7], inv, H.w, L.w);
    const int at = plane_at<true, 128>(f, 8 * c);
    *reinterpret_cast<uint4*>(hi + at) = H;
    *reinterpret_cast<uint4*>(lo + at) = L;
  }
  reinterpret_cast<float*>(tile + 4 * BK * cols)[f] = s;
#else
  (void)b, (void)ldb, (void)n, (void)k, (void)out, (void)f, (void)kt;
  __trap();
#endif
}

// A thread a column of one k-tile: grid (split_b_columns(n) / 128, k-tiles).
template <bool KContig>
__global__ void __launch_bounds__(128) split_b_kernel(const float* b, std::int64_t ldb, int n, int k,
                                                      unsigned char* out) {
  split_b_column<KContig>(b, ldb, n, k, out, static_cast<int>(blockIdx.x * 128 + threadIdx.x),
                          static_cast<int>(blockIdx.y));
}

// split_b_kernel for several GEMMs' op(B) at once: job blockIdx.z, in a grid as large as the largest job's.
// (A template, Job = f16x3_layout::SplitBJob, so that every translation unit may define it.)
template <class Job>
__global__ void __launch_bounds__(128) split_b_jobs_kernel(const Job* jobs) {
  const Job j = jobs[blockIdx.z];
  const int f = static_cast<int>(blockIdx.x * 128 + threadIdx.x), kt = static_cast<int>(blockIdx.y);
  if (f >= split_b_columns(j.n) || kt >= (j.k + BK - 1) / BK) return;
  if (j.b_t) {
    split_b_column<true>(j.b, j.ldb, j.n, j.k, j.out, f, kt);
  } else {
    split_b_column<false>(j.b, j.ldb, j.n, j.k, j.out, f, kt);
  }
}

// ---- The wgmma form (Hopper; compiled for sm_90a only, in src/cuda_wgmma.cu: gemm_wgmma()). The rows x
// weights GEMMs (op(A) N; op(B)'s planes free-major: op T, or split beforehand) and T N, with the same copies,
// split and planes as gemm_kernel, whose free-major planes are wgmma's K-major operand layout with the 64-byte
// swizzle (rows of 64 bytes, 16-byte chunk c at c ^ ((row / 2) % 4) of each 512-byte group of eight rows) and
// whose k-major planes (64-wide atoms) its MN-major layout with the 128-byte swizzle (wgmma_descriptor,
// wgmma_descriptor_mn); the warpgroup MMAs (m64nBNk16, both operands in shared memory) run asynchronously
// beside the split, where gemm_kernel's mma.sync issue from the same warps as the split. Warpgroup w takes
// rows 64 w ..+63 of the tile and all its columns. A k-tile's six MMAs (each k16 step: lo*hi, hi*lo, hi*hi,
// gemm_kernel's order) sum in a fresh accumulator, one of two that alternate: while k-tile kt's MMAs run, the
// thread splits k-tile kt + 1 and adds k-tile kt - 1's chain, times its scales, to the fp32 sums. Three stages
// of split A (kt - 1 and kt being read, kt + 1 being written) and, with op(B) split beforehand, a ring of five
// split B k-tiles (issued three ahead, so the slot a copy overwrites was last read two k-tiles before, by MMAs
// retired since).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DPMLP_F16X3_WGMMA 1
#endif
#if defined(DPMLP_F16X3_WGMMA)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// The compiler must not move the accumulators' reads or writes across a fence or wait.
template <int R>
__device__ __forceinline__ void fence_registers(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// d (+)= A B, one m64n64k16 FP16 wgmma with fp32 accumulation, both operands in shared memory (descriptors):
// K-major (Trans 0) or both MN-major, transposed (Trans 1); scale_d 0: d = A B.
template <int Trans>
__device__ __forceinline__ void wgmma_f16(float (&d)[32], std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, %35, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d), "n"(Trans));
}
// The same, m64n128k16.
template <int Trans>
__device__ __forceinline__ void wgmma_f16(float (&d)[64], std::uint64_t da, std::uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, %67, %67;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d), "n"(Trans));
}
// The warp-specialized form's: mbarrier transactions, bulk copies, register reallocation.
__device__ __forceinline__ void mbarrier_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(backend::shared_address(bar)),
               "r"(bytes)
               : "memory");
}
// `bytes` (a multiple of 16) from global src to shared dst, both 16-byte aligned, completing on bar.
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(backend::shared_address(bar))
               : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// The 128-byte line at p into L2.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
template <int Regs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
template <int Regs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
#endif  // DPMLP_F16X3_WGMMA

// The descriptor of a K-major operand with the 64-byte swizzle whose k16 step starts at shared address addr
// (its 512-byte group of rows 512-byte aligned): start address (bits 0-13, in 16 bytes), leading byte offset 1
// (unused with a swizzle), stride byte offset 512 (the next eight rows; bits 32-45), layout type 2 (bits
// 62-63: the 64-byte swizzle).
DPMLP_F16X3_HD constexpr std::uint64_t wgmma_descriptor(unsigned addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) | (std::uint64_t(1) << 16) |
         (std::uint64_t(512 >> 4) << 32) | (std::uint64_t(2) << 62);
}
// The same for an MN-major operand with the 128-byte swizzle (gemm_kernel's k-major planes: atoms of 64 free
// indices, whose row k is 128 bytes, chunk c at c ^ (k % 8), so eight k make a 1024-byte swizzle pattern, 1024
// bytes aligned): stride byte offset 1024 (the next eight k), layout type 1 (the 128-byte swizzle); the leading
// byte offset, the stride between 64-wide atoms along the free index (f16x3_layout::k_major_atom halves), read
// only by operands wider than 64 (B of m64n128k16), is 1 at 64 (unused, CuTe's value).
template <int Free>
DPMLP_F16X3_HD constexpr std::uint64_t wgmma_descriptor_mn(unsigned addr) {
  static_assert(Free == 64 || Free == 128, "one or two atoms");
  constexpr std::uint64_t atom_bytes = 2 * backend::f16x3_layout::k_major_atom;
  constexpr std::uint64_t lbo = Free == 64 ? 1 : atom_bytes >> 4;
  return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) | (lbo << 16) | (std::uint64_t(1024 >> 4) << 32) |
         (std::uint64_t(1) << 62);
}

// The wgmma form's shared memory: three stages of split A (and of split B unless PreB), the ring of fp32
// k-tiles being copied, and (PreB) five split B k-tiles; every plane aligned to its swizzle's pattern (the
// swizzle is of addresses: 512 bytes for free-major planes, 1024 for k-major ones), the whole aligned to 1024
// bytes in the kernel.
template <class T, bool AK, bool PreB>
struct WgmmaSmem {
  static constexpr int align = AK ? 512 : 1024;
  static constexpr int a_bytes = (T::split_a + align - 1) / align * align;
  static constexpr int b_slot = (T::split_b + align - 1) / align * align;
  static constexpr int stage = a_bytes + (PreB ? 0 : b_slot);
  static constexpr int ring_slot = (PreB ? T::RA : T::regions) * 2048;
  static constexpr int b_ring = PreB ? 5 : 0;
  static constexpr int bytes = 3 * stage + T::ring * ring_slot + b_ring * b_slot + 1024;
};

// A chain's sums ch, times their rows' scales (sca, by the tile's row) and their columns' (scb, by the tile's
// column), into the fp32 sums acc; both in the wgmma accumulator map (register 4j + 2h + e: row row0 + 8h,
// column 8j + 2 tq + e).
template <int R>
__device__ __forceinline__ void add_scaled_chain(float (&acc)[R], const float (&ch)[R], const float* sca,
                                                 const float* scb, int row0, int tq) {
  const float sa0 = sca[row0], sa1 = sca[row0 + 8];
#pragma unroll
  for (int j = 0; j < R / 4; ++j) {
    const float2 sb = *reinterpret_cast<const float2*>(scb + 8 * j + 2 * tq);
    acc[4 * j + 0] = fmaf(ch[4 * j + 0], sa0 * sb.x, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(ch[4 * j + 1], sa0 * sb.y, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(ch[4 * j + 2], sa1 * sb.x, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(ch[4 * j + 3], sa1 * sb.y, acc[4 * j + 3]);
  }
}

template <class T, bool AK, bool BK_, Out O, bool PreB>
__global__ void __launch_bounds__(T::threads, 1) wgmma_kernel(const Params p) {
#if defined(DPMLP_F16X3_WGMMA)
  static_assert(AK ? (BK_ || PreB) : (!BK_ && !PreB),
                "rows x weights with op(B)'s planes free-major (op T, or split beforehand), or T N");
  static_assert(T::warps == 4 * (T::BM / 64) && T::BM % 64 == 0, "a warpgroup takes 64 rows and every column");
  using S = WgmmaSmem<T, AK, PreB>;
  constexpr int R = T::BN / 2;  // accumulator registers a thread: 64 x BN over the warpgroup's 128
  extern __shared__ __align__(16) unsigned char smem_dyn[];
  unsigned char* const smem = smem_dyn + ((1024u - (backend::shared_address(smem_dyn) & 1023u)) & 1023u);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tiles_n = (p.n + T::BN - 1) / T::BN;
  const int tm = static_cast<int>(blockIdx.x / tiles_n), tn = static_cast<int>(blockIdx.x % tiles_n);
  const int m0 = tm * T::BM, n0 = tn * T::BN;
  const std::int64_t bz = blockIdx.y;
  Operand A{p.a + bz * p.stride_a + (AK ? static_cast<std::int64_t>(m0) * p.lda : m0), p.lda, p.m - m0};
  Operand B{p.b + bz * p.stride_b + (BK_ ? static_cast<std::int64_t>(n0) * p.ldb : n0), p.ldb, p.n - n0};

  // Stage kt % 3 holds k-tile kt's split A (and B unless PreB); PreB: B's split k-tile kt in slot kt % 5.
  unsigned char* const ring = smem + 3 * S::stage;
  unsigned char* const b_ring = ring + T::ring * S::ring_slot;
  auto a_hi = [&](int s) { return reinterpret_cast<__half*>(smem + s * S::stage); };
  auto a_lo = [&](int s) { return a_hi(s) + T::plane_a; };
  auto a_scales = [&](int s) { return reinterpret_cast<float*>(smem + s * S::stage + 4 * T::plane_a); };
  auto b_tile = [&](int kt) -> unsigned char* {
    if constexpr (PreB) {
      return b_ring + (kt % 5) * S::b_slot;
    } else {
      return smem + (kt % 3) * S::stage + S::a_bytes;
    }
  };
  auto b_hi = [&](int kt) { return reinterpret_cast<__half*>(b_tile(kt)); };
  auto b_lo = [&](int kt) { return b_hi(kt) + T::plane_b; };
  auto b_scales = [&](int kt) { return reinterpret_cast<float*>(b_tile(kt) + 4 * T::plane_b); };

  const int kts = (p.k + BK - 1) / BK;
  RegionCopy<AK> a_copy(A, 16 * warp, lane);
  auto b_copy = [&] {
    if constexpr (PreB) {
      return SplitBCopy<T>(p, n0, static_cast<int>(threadIdx.x));
    } else {
      return RegionCopy<BK_>(B, 16 * warp, lane);
    }
  }();
  // gemm_kernel's issue, load and store, with this form's stages.
  auto issue = [&](int kt, int r) {
    if (kt < kts) {
      const unsigned slot = backend::shared_address(ring + r * S::ring_slot);
      a_copy.copy(slot + warp * 2048, kt * BK, p.k, lane);
      if constexpr (PreB) {
        b_copy.copy(backend::shared_address(b_tile(kt)));
      } else {
        b_copy.copy(slot + (T::RA + warp) * 2048, kt * BK, p.k, lane);
      }
    }
    copy_commit();
  };
  auto load = [&](float4 (&va)[4], float4 (&vb)[4], int r) {
    const unsigned char* slot = ring + r * S::ring_slot;
    read_region(va, slot + warp * 2048, lane);
    if constexpr (!PreB) read_region(vb, slot + (T::RA + warp) * 2048, lane);
  };
  auto store = [&](const float4 (&va)[4], const float4 (&vb)[4], int kt) {
    const int s = kt % 3;
    store_region<AK, T::BM>(va, a_hi(s), a_lo(s), a_scales(s), 16 * warp, lane);
    if constexpr (!PreB) store_region<BK_, T::BN>(vb, b_hi(kt), b_lo(kt), b_scales(kt), 16 * warp, lane);
  };
  // One MMA of k16 step h over planes at shared addresses a and b: free-major planes (K-major operands) at 32
  // bytes into each row; k-major ones (MN-major, transposed) at two 8-k atoms (2048 bytes) into the plane.
  auto mma = [](float (&d)[R], unsigned a, unsigned b, int h, int scale_d) {
    if constexpr (AK) {
      wgmma_f16<0>(d, wgmma_descriptor(a + 32 * h), wgmma_descriptor(b + 32 * h), scale_d);
    } else {
      wgmma_f16<1>(d, wgmma_descriptor_mn<64>(a + 2048 * h), wgmma_descriptor_mn<T::BN>(b + 2048 * h), scale_d);
    }
  };

  // T N with p.colsum: warp w's region of op(B)'s columns also summed by row tile w % tiles_m, as in gemm_kernel.
  const bool sums = !AK && !PreB && sums_region(p, T::BM, m0, warp);
  ColumnSums column_sums;

  float acc[R], c0[R], c1[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f, c0[i] = 0.0f, c1[i] = 0.0f;
#pragma unroll
  for (int kt = 0; kt < T::ring; ++kt) issue(kt, kt);
  copy_wait<T::ring - 1>();
  float4 va[4], vb[4];
  load(va, vb, 0);
  if (sums) column_sums.add(vb);
  store(va, vb, 0);
  fence_proxy_async();  // the split's stores (and landed copies), seen by the MMAs after the barrier
  __syncthreads();

  // Accumulator register 4j + 2h + e: row 16 (warp % 4) + lane / 4 + 8h of the warpgroup's 64, column
  // 8j + 2 (lane % 4) + e.
  const int g = lane >> 2, t = lane & 3;
  const int row0 = 64 * (warp >> 2) + 16 * (warp & 3) + g;
  // The warpgroup's rows' bytes: 64 rows of 64 bytes (free-major planes), or one atom (k-major).
  const unsigned a_rows =
      (AK ? 64u * 64u : 2u * backend::f16x3_layout::k_major_atom) * static_cast<unsigned>(warp >> 2);
  // A chain's sums, times their rows' and columns' scales (k-tile kt's), into the fp32 sums.
  auto add_chain = [&](const float (&ch)[R], int kt) {
    add_scaled_chain(acc, ch, a_scales(kt % 3), b_scales(kt), row0, t);
  };
  int r = 0;  // kt % T::ring
  // K-tile kt: its MMAs into cur; while they run, k-tile kt + 1's split and k-tile kt - 1's chain (prev).
  auto step = [&](int kt, float (&cur)[R], float (&prev)[R]) {
    const int s = kt % 3;
    const int r1 = r + 1 == T::ring ? 0 : r + 1;
    issue(kt + T::ring, r);
    const unsigned ah = backend::shared_address(a_hi(s)) + a_rows, al = backend::shared_address(a_lo(s)) + a_rows;
    const unsigned bh = backend::shared_address(b_hi(kt)), bl = backend::shared_address(b_lo(kt));
    fence_registers(cur);
    wgmma_fence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mma(cur, al, bh, h, h);
      mma(cur, ah, bl, h, 1);
      mma(cur, ah, bh, h, 1);
    }
    wgmma_commit();
    copy_wait<T::ring - 1>();
    load(va, vb, r1);
    if (sums && kt + 1 < kts) column_sums.add(vb);
    store(va, vb, kt + 1);  // into stage (kt + 1) % 3, last read by k-tile kt - 2's MMAs (retired)
    if (kt > 0) {
      wgmma_wait<1>();  // k-tile kt - 1's MMAs (this warp's share; the barrier below: every warp's)
      fence_registers(prev);
      add_chain(prev, kt - 1);
    }
    fence_proxy_async();
    __syncthreads();
    r = r1;
  };
  for (int kt = 0; kt < kts; kt += 2) {
    step(kt, c0, c1);
    if (kt + 1 < kts) step(kt + 1, c1, c0);
  }
  // The last chain: its wait inside each branch (a wait before the branch over the two chains makes ptxas
  // serialize every MMA, warning C7514).
  auto last = [&](float (&ch)[R]) {
    wgmma_wait<0>();
    fence_registers(ch);
    add_chain(ch, kts - 1);
  };
  if ((kts - 1) % 2 == 0) {
    last(c0);
  } else {
    last(c1);
  }
  if (sums) column_sums.write(p.colsum + bz * p.stride_c, p.n, n0, 16 * warp, lane);

  float e[2][T::BN / 8][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + row0 + 8 * h;
#pragma unroll
    for (int j = 0; j < T::BN / 8; ++j) {
      if (row < p.m) read_pair<O>(p, row, n0 + 8 * j + 2 * t, e[h][j]);
    }
  }
  with_activation<O>(p.act, [&](auto act) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + row0 + 8 * h;
      if (row >= p.m) continue;
#pragma unroll
      for (int j = 0; j < T::BN / 8; ++j) {
        write_pair<O, decltype(act)::value>(p, bz, row, n0 + 8 * j + 2 * t, acc[4 * j + 2 * h],
                                            acc[4 * j + 2 * h + 1], e[h][j]);
      }
    }
  });
#else
  (void)p;
  __trap();  // gemm_wgmma() exists only where this was compiled for sm_90a
#endif
}

template <class T, bool AK, bool BK_, Out O, bool PreB>
cudaError_t launch_wgmma(cudaStream_t stream, const Params& p, int batch) {
  using S = WgmmaSmem<T, AK, PreB>;
  auto* fn = wgmma_kernel<T, AK, BK_, O, PreB>;
  static const cudaError_t set = opt_in(fn, S::bytes);
  if (set != cudaSuccess) return set;
  const long long tiles = tile_count<T>(p);
  if (tiles > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  wgmma_kernel<T, AK, BK_, O, PreB><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(batch)), T::threads,
                                      S::bytes, stream>>>(p);
  return cudaGetLastError();
}

using Large = Tile<128, 128, 2, 4>;  // 8 warps of 64 x 32
using Small = Tile<64, 64, 2, 2>;    // 4 warps of 32 x 32

// ---- The warp-specialized wgmma form: the rows x weights GEMMs with op(B) split beforehand on the 128 x 128
// tile. wgmma_kernel's warps each copy, split, multiply and add chains, with a barrier a k-tile, and a CTA
// takes one tile, so the MMAs wait on the split and every tile starts with its copies' latency; here a CTA an
// SM takes tile after tile (persistent), a producer warpgroup copies and splits, and two consumer warpgroups
// only multiply, add chains and write the outputs, the two handing stages over through mbarriers (full: a
// stage's split A stored and its split B landed; empty: every consumer's MMAs that read it retired and its
// scales read). The producer copies A as fp32 with cp.async into a ring of WsRing k-tiles (issued WsRing - 1
// ahead within a tile), splits each k-tile's eight regions (two a warp, store_region) into stage it %
// WsStages, and brings op(B)'s split k-tile (three contiguous slices: hi plane, lo plane, scales) with bulk
// copies that complete on the stage's full barrier; it runs on into the next tile while the consumers finish
// one. The splits, scales, MMAs, chains and their order are wgmma_kernel's: the same bits. Registers: the
// producer gives its share to the consumers (setmaxnreg), whose three 64 x 128 sets (sums and two chains)
// need about 200 a thread.
constexpr int WsStages = 4, WsRing = 5, WsProducerRegs = 72, WsConsumerRegs = 216;

template <class T>
struct WsSmem {
  static constexpr int a_bytes = (T::split_a + 511) / 512 * 512;
  static constexpr int b_bytes = (T::split_b + 511) / 512 * 512;
  static constexpr int stage = a_bytes + b_bytes;
  static constexpr int ring_slot = T::RA * 2048;
  static constexpr int barriers = WsStages * stage + WsRing * ring_slot;  // full[WsStages], then empty[WsStages]
  static constexpr int bytes = barriers + 16 * WsStages + 1024;
  static_assert(stage % 512 == 0 && ring_slot % 512 == 0, "planes on their swizzle's 512-byte pattern");
};

// The warp-specialized kernel's arguments: the GEMM, its batch entries, and the CTAs it runs on (at most one an
// SM: each takes tiles ctas apart, in order, batch entry after batch entry).
struct WsParams {
  Params p;
  int batch;
  int ctas;
};

// Act: p.act as a constant (launch_wgmma_ws dispatches): the persistent kernel's epilogue is then one
// activation's code alone, which ran faster than with_activation's three in one kernel.
template <class T, Out O, Activation Act>
__global__ void __launch_bounds__(T::threads + 128, 1) wgmma_ws_kernel(const WsParams w) {
#if defined(DPMLP_F16X3_WGMMA)
  static_assert(T::BM == 128 && T::warps == 8, "two consumer warpgroups of 64 rows");
  static_assert(WsProducerRegs * 128 + WsConsumerRegs * T::threads <= 65536, "the register file");
  using S = WsSmem<T>;
  constexpr int R = T::BN / 2;
  const Params& p = w.p;
  extern __shared__ __align__(16) unsigned char smem_dyn[];
  unsigned char* const smem = smem_dyn + ((1024u - (backend::shared_address(smem_dyn) & 1023u)) & 1023u);
  std::uint64_t* const full = reinterpret_cast<std::uint64_t*>(smem + S::barriers);
  std::uint64_t* const empty = full + WsStages;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tiles_n = (p.n + T::BN - 1) / T::BN;
  const long long tiles = static_cast<long long>((p.m + T::BM - 1) / T::BM) * tiles_n;
  const long long total = tiles * w.batch;
  const int kts = (p.k + BK - 1) / BK;
  // Tile t: batch entry bz, rows m0.., columns n0.. (the two column tiles of a row tile one after another).
  auto tile_of = [&](long long t, std::int64_t& bz, int& m0, int& n0) {
    bz = t / tiles;
    const long long r = t - bz * tiles;
    m0 = static_cast<int>(r / tiles_n) * T::BM;
    n0 = static_cast<int>(r % tiles_n) * T::BN;
  };

  auto a_hi = [&](int s) { return reinterpret_cast<__half*>(smem + s * S::stage); };
  auto a_lo = [&](int s) { return a_hi(s) + T::plane_a; };
  auto a_scales = [&](int s) { return reinterpret_cast<float*>(smem + s * S::stage + 4 * T::plane_a); };
  auto b_hi = [&](int s) { return reinterpret_cast<__half*>(smem + s * S::stage + S::a_bytes); };
  auto b_lo = [&](int s) { return b_hi(s) + T::plane_b; };
  auto b_scales = [&](int s) { return reinterpret_cast<float*>(smem + s * S::stage + S::a_bytes + 4 * T::plane_b); };

  if (threadIdx.x == 0) {
    for (int s = 0; s < WsStages; ++s) {
      backend::mbarrier_init(full + s, 128);
      backend::mbarrier_init(empty + s, T::threads);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  // Both roles count the k-tiles of the CTA's tiles as one sequence: the it-th is in stage it % WsStages, the
  // (it / WsStages)-th use of it, so the producer runs on into the next tile while the consumers finish one.
  if (warp >= T::warps) {  // the producer warpgroup
    setmaxnreg_dec<WsProducerRegs>();
    const int pw = warp - T::warps;
    unsigned char* const ring = smem + WsStages * S::stage;
    const int cols = split_b_columns(p.n);
    const std::int64_t b_tile = split_b_tile_bytes(p.n);
    constexpr unsigned plane = T::BN * 2 * BK;
    unsigned it = 0;
#pragma unroll 1
    for (long long t = blockIdx.x; t < total; t += w.ctas) {
      std::int64_t bz;
      int m0, n0;
      tile_of(t, bz, m0, n0);
      Operand A{p.a + bz * p.stride_a + static_cast<std::int64_t>(m0) * p.lda, p.lda, p.m - m0};
      RegionCopy<true> c0(A, 16 * pw, lane), c1(A, 16 * (pw + 4), lane);
      // Ring slot kt % WsRing; the previous tile's slots were all read back before its last split.
      auto issue = [&](int kt) {
        if (kt < kts) {
          const unsigned slot = backend::shared_address(ring + (kt % WsRing) * S::ring_slot);
          c0.copy(slot + pw * 2048, kt * BK, p.k, lane);
          c1.copy(slot + (pw + 4) * 2048, kt * BK, p.k, lane);
        }
        copy_commit();
      };
      // op(B)'s split k-tile kt: this tile's columns' slice of its hi plane, its lo plane and its scales.
      const unsigned char* b_at = p.b_split;
#pragma unroll 1
      for (int kt = 0; kt < WsRing - 1; ++kt) issue(kt);
#pragma unroll 1
      for (int kt = 0; kt < kts; ++kt, ++it) {
        const int s = static_cast<int>(it % WsStages);
        if (it >= WsStages) backend::mbarrier_wait(empty + s, ((it / WsStages) - 1) & 1);
        if (threadIdx.x == T::threads) {
          mbarrier_expect_tx(full + s, 2 * plane + 4 * T::BN);
          const unsigned dst = backend::shared_address(b_hi(s));
          bulk_copy(dst, b_at + n0 * 2 * BK, plane, full + s);
          bulk_copy(dst + plane, b_at + cols * 2 * BK + n0 * 2 * BK, plane, full + s);
          bulk_copy(dst + 2 * plane, b_at + 2 * cols * 2 * BK + n0 * 4, 4 * T::BN, full + s);
        }
        b_at += b_tile;
        issue(kt + WsRing - 1);
        copy_wait<WsRing - 1>();
        const unsigned char* slot = ring + (kt % WsRing) * S::ring_slot;
        float4 v[4];
        read_region(v, slot + pw * 2048, lane);
        store_region<true, T::BM>(v, a_hi(s), a_lo(s), a_scales(s), 16 * pw, lane);
        read_region(v, slot + (pw + 4) * 2048, lane);
        store_region<true, T::BM>(v, a_hi(s), a_lo(s), a_scales(s), 16 * (pw + 4), lane);
        fence_proxy_async();  // the split's stores, seen by the MMAs after the consumers' wait
        backend::mbarrier_arrive(full + s);
      }
      if constexpr (O == Out::activation_grad) {
        // The tile's k-tiles handed over: its epilogue's Y rows into L2 a few k-tiles before the consumers read
        // them (a row a thread), so that its loads, which no MMA overlaps, wait on L2 rather than on memory.
        const int row = m0 + static_cast<int>(threadIdx.x) - T::threads;
        if (row < p.m) {
          const float* y = p.src + static_cast<std::int64_t>(row) * p.src_ld + n0;
#pragma unroll
          for (int c = 0; c < T::BN; c += 32) {
            if (n0 + c < p.n) prefetch_l2(y + c);
          }
        }
      }
    }
    return;
  }

  setmaxnreg_inc<WsConsumerRegs>();
  float acc[R];
  // wgmma_kernel's accumulator map: register 4j + 2h + e is row 16 (warp % 4) + lane / 4 + 8h of the
  // warpgroup's 64, column 8j + 2 (lane % 4) + e.
  const int g = lane >> 2, tq = lane & 3;
  const int row0 = 64 * (warp >> 2) + 16 * (warp & 3) + g;
  const unsigned a_rows = 64u * 64u * static_cast<unsigned>(warp >> 2);
  auto add_chain = [&](const float (&ch)[R], int s) {
    add_scaled_chain(acc, ch, a_scales(s), b_scales(s), row0, tq);
  };
  unsigned it = 0;  // the tile's first k-tile in the CTA's sequence
  // K-tile kt: wait for its stage, its MMAs into cur; while they run, k-tile kt - 1's chain (prev), then its
  // stage released.
  auto step = [&](int kt, float (&cur)[R], float (&prev)[R]) {
    const unsigned q = it + static_cast<unsigned>(kt);
    const int s = static_cast<int>(q % WsStages);
    backend::mbarrier_wait(full + s, (q / WsStages) & 1);
    const unsigned ah = backend::shared_address(a_hi(s)) + a_rows, al = backend::shared_address(a_lo(s)) + a_rows;
    const unsigned bh = backend::shared_address(b_hi(s)), bl = backend::shared_address(b_lo(s));
    fence_registers(cur);
    wgmma_fence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wgmma_f16<0>(cur, wgmma_descriptor(al + 32 * h), wgmma_descriptor(bh + 32 * h), h);
      wgmma_f16<0>(cur, wgmma_descriptor(ah + 32 * h), wgmma_descriptor(bl + 32 * h), 1);
      wgmma_f16<0>(cur, wgmma_descriptor(ah + 32 * h), wgmma_descriptor(bh + 32 * h), 1);
    }
    wgmma_commit();
    if (kt > 0) {
      wgmma_wait<1>();  // k-tile kt - 1's MMAs (this warpgroup's)
      fence_registers(prev);
      const int sp = static_cast<int>((q - 1) % WsStages);
      add_chain(prev, sp);
      backend::mbarrier_arrive(empty + sp);
    }
  };
  auto last = [&](float (&ch)[R]) {
    wgmma_wait<0>();
    fence_registers(ch);
    const int sp = static_cast<int>((it + static_cast<unsigned>(kts) - 1) % WsStages);
    add_chain(ch, sp);
    backend::mbarrier_arrive(empty + sp);
  };
#pragma unroll 1
  for (long long t = blockIdx.x; t < total; t += w.ctas) {
    std::int64_t bz;
    int m0, n0;
    tile_of(t, bz, m0, n0);
    float c0[R], c1[R];  // a tile's own: its first MMA overwrites them (scale-d 0)
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.0f, c0[i] = 0.0f, c1[i] = 0.0f;
#pragma unroll 1
    for (int kt = 0; kt < kts; kt += 2) {
      step(kt, c0, c1);
      if (kt + 1 < kts) step(kt + 1, c1, c0);
    }
    if ((kts - 1) % 2 == 0) {
      last(c0);
    } else {
      last(c1);
    }
    it += static_cast<unsigned>(kts);

    // The epilogue a row at a time (h), each row's operands read before any of its outputs is written: half
    // of wgmma_kernel's registers for them, which the persistent loop needs (Y, for the activation's
    // gradient, already in L2: the producer prefetched it).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + row0 + 8 * h;
      if (row >= p.m) continue;
      float e[T::BN / 8][2];
#pragma unroll
      for (int j = 0; j < T::BN / 8; ++j) read_pair<O>(p, row, n0 + 8 * j + 2 * tq, e[j]);
#pragma unroll
      for (int j = 0; j < T::BN / 8; ++j) {
        write_pair<O, Act>(p, bz, row, n0 + 8 * j + 2 * tq, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], e[j]);
      }
    }
  }
#else
  (void)w;
  __trap();
#endif
}

template <class T, Out O, Activation Act>
cudaError_t launch_wgmma_ws_as(cudaStream_t stream, const Params& p, int batch) {
  using S = WsSmem<T>;
  auto* fn = wgmma_ws_kernel<T, O, Act>;
  static const cudaError_t set = opt_in(fn, S::bytes);
  if (set != cudaSuccess) return set;
  const long long tiles = tile_count<T>(p);
  if (tiles > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  const long long total = tiles * batch;
  const WsParams w{p, batch, static_cast<int>(total < sms ? total : sms)};
  if (w.ctas <= 0) return cudaSuccess;
  wgmma_ws_kernel<T, O, Act><<<dim3(static_cast<unsigned>(w.ctas)), T::threads + 128, S::bytes, stream>>>(w);
  return cudaGetLastError();
}
template <class T, Out O>
cudaError_t launch_wgmma_ws(cudaStream_t stream, const Params& p, int batch) {
  cudaError_t e = cudaSuccess;
  with_activation<O>(p.act, [&](auto act) { e = launch_wgmma_ws_as<T, O, decltype(act)::value>(stream, p, batch); });
  return e;
}

}  // namespace detail

// The dynamic shared memory a CTA of the large (128 x 128) or small (64 x 64) tiles takes at most: 162 KB or
// 81 KB (less with op(B) split beforehand).
inline constexpr int smem_bytes(bool large) {
  return large ? detail::Smem<detail::Large, false>::bytes : detail::Smem<detail::Small, false>::bytes;
}

// Writes op(B) (n columns, k rows; op T where b_t) split for gemm() with Params::b_split, the values and scales
// the kernels' own split of B gives (the same bits): f16x3_layout::split_b_bytes(n, k) bytes at out, 16-byte
// aligned.
inline cudaError_t split_b(cudaStream_t stream, const float* b, std::int64_t ldb, int n, int k, bool b_t,
                           unsigned char* out) {
  const dim3 grid(static_cast<unsigned>(detail::split_b_columns(n) / 128),
                  static_cast<unsigned>((k + detail::BK - 1) / detail::BK));
  if (b_t) {
    detail::split_b_kernel<true><<<grid, 128, 0, stream>>>(b, ldb, n, k, out);
  } else {
    detail::split_b_kernel<false><<<grid, 128, 0, stream>>>(b, ldb, n, k, out);
  }
  return cudaGetLastError();
}

// split_b() for `count` GEMMs in one launch: jobs (device memory, count of them, at most 65535) whose op(B)
// have at most max_n columns and max_k rows. The same bits as split_b() of each.
inline cudaError_t split_b_jobs(cudaStream_t stream, const backend::f16x3_layout::SplitBJob* jobs, int count,
                                int max_n, int max_k) {
  if (count <= 0) return cudaSuccess;
  if (count > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(detail::split_b_columns(max_n) / 128),
                  static_cast<unsigned>((max_k + detail::BK - 1) / detail::BK), static_cast<unsigned>(count));
  detail::split_b_jobs_kernel<backend::f16x3_layout::SplitBJob><<<grid, 128, 0, stream>>>(jobs);
  return cudaGetLastError();
}

// C = op(A) op(B) for `batch` entries (at most 65535), op(A) N (a_n) or T, op(B) N or T (b_t): N N and N T
// (rows x weights, any Out that matches: bias_activation for N N, activation_grad for N T; op(B) split
// beforehand where p.b_split is set, the same bits) and T N (per-block weight gradients, linear; p.b_split
// null). `large`: 128 x 128 tiles, else 64 x 64 (the same bits).
inline cudaError_t gemm(cudaStream_t stream, const Params& p, int batch, bool a_n, bool b_t, Out out, bool large) {
  using namespace detail;
  if (a_n && !b_t) {
    if (out == Out::bias_activation) {
      return large ? launch<Large, true, false, Out::bias_activation>(stream, p, batch)
                   : launch<Small, true, false, Out::bias_activation>(stream, p, batch);
    }
    return large ? launch<Large, true, false, Out::linear>(stream, p, batch)
                 : launch<Small, true, false, Out::linear>(stream, p, batch);
  }
  if (a_n && b_t) {
    if (out == Out::activation_grad) {
      return large ? launch<Large, true, true, Out::activation_grad>(stream, p, batch)
                   : launch<Small, true, true, Out::activation_grad>(stream, p, batch);
    }
    return large ? launch<Large, true, true, Out::linear>(stream, p, batch)
                 : launch<Small, true, true, Out::linear>(stream, p, batch);
  }
  if (!a_n && !b_t && out == Out::linear) {
    return large ? launch<Large, false, false, Out::linear>(stream, p, batch)
                 : launch<Small, false, false, Out::linear>(stream, p, batch);
  }
  return cudaErrorNotSupported;
}

// gemm()'s GEMMs whose planes are the layouts wgmma reads on Hopper's warpgroup MMAs (the wgmma form above):
// the rows x weights GEMMs whose op(B) planes are free-major (N N with op(B) split beforehand, p.b_split set;
// N T either way), and T N (per-block weight gradients, linear); those with op(B) split beforehand on the
// large tile in the warp-specialized kernel. The same splits, products and order of sums. Defined in
// src/cuda_f16x3_wgmma.cu, compiled for sm_90a into dpmlp_cuda_kernels, which
// then defines DPMLP_HAVE_WGMMA; call it only there, and only on a device of compute capability 9.0.
cudaError_t gemm_wgmma(cudaStream_t stream, const Params& p, int batch, bool a_n, bool b_t, Out out, bool large);

#if defined(DPMLP_WGMMA_KERNELS_HERE)
cudaError_t gemm_wgmma(cudaStream_t stream, const Params& p, int batch, bool a_n, bool b_t, Out out, bool large) {
  using namespace detail;
  if (!a_n) {  // T N: k-major planes, the MMAs' MN-major layout
    if (b_t || out != Out::linear || p.b_split != nullptr) return cudaErrorNotSupported;
    return large ? launch_wgmma<Large, false, false, Out::linear, false>(stream, p, batch)
                 : launch_wgmma<Small, false, false, Out::linear, false>(stream, p, batch);
  }
  const bool pre = p.b_split != nullptr;
  if (pre && large) {  // op(B)'s orientation is the split's business: one kernel for N N and N T
    if (out == Out::bias_activation && !b_t) return launch_wgmma_ws<Large, Out::bias_activation>(stream, p, batch);
    if (out == Out::activation_grad && b_t) return launch_wgmma_ws<Large, Out::activation_grad>(stream, p, batch);
    if (out == Out::linear) return launch_wgmma_ws<Large, Out::linear>(stream, p, batch);
    return cudaErrorNotSupported;
  }
  if (!b_t) {
    if (!pre) return cudaErrorNotSupported;
    if (out == Out::bias_activation) {
      return large ? launch_wgmma<Large, true, false, Out::bias_activation, true>(stream, p, batch)
                   : launch_wgmma<Small, true, false, Out::bias_activation, true>(stream, p, batch);
    }
    if (out != Out::linear) return cudaErrorNotSupported;
    return large ? launch_wgmma<Large, true, false, Out::linear, true>(stream, p, batch)
                 : launch_wgmma<Small, true, false, Out::linear, true>(stream, p, batch);
  }
  if (out == Out::activation_grad) {
    if (pre) {
      return large ? launch_wgmma<Large, true, true, Out::activation_grad, true>(stream, p, batch)
                   : launch_wgmma<Small, true, true, Out::activation_grad, true>(stream, p, batch);
    }
    return large ? launch_wgmma<Large, true, true, Out::activation_grad, false>(stream, p, batch)
                 : launch_wgmma<Small, true, true, Out::activation_grad, false>(stream, p, batch);
  }
  if (out != Out::linear) return cudaErrorNotSupported;
  if (pre) {
    return large ? launch_wgmma<Large, true, true, Out::linear, true>(stream, p, batch)
                 : launch_wgmma<Small, true, true, Out::linear, true>(stream, p, batch);
  }
  return large ? launch_wgmma<Large, true, true, Out::linear, false>(stream, p, batch)
               : launch_wgmma<Small, true, true, Out::linear, false>(stream, p, batch);
}
#endif

}  // namespace gemm_f16x3
}  // namespace linalg
}  // namespace dpmlp
