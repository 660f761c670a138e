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

  // The epilogue: a lane holds rows g and g + 8 of each m16 tile, columns 2t and 2t + 1 of each n8 tile.
  float* C = p.c + bz * p.stride_c;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m0 + wm0 + 16 * mt + g + 8 * half;
      if (row >= p.m) continue;
      float* crow = C + static_cast<std::int64_t>(row) * p.ldc;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = n0 + wn0 + 8 * nt + 2 * t;
        if (col >= p.n) continue;
        const bool both = col + 1 < p.n;
        float v[2] = {acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]};
        if constexpr (O == Out::bias_activation) {
          v[0] = dpmlp::detail::activate(p.act, v[0] + p.src[col]);
          if (both) v[1] = dpmlp::detail::activate(p.act, v[1] + p.src[col + 1]);
        } else if constexpr (O == Out::activation_grad) {
          const float* y = p.src + static_cast<std::int64_t>(row) * p.src_ld + col;
          v[0] = v[0] * dpmlp::detail::activate_grad_from_output(p.act, y[0]);
          if (both) v[1] = v[1] * dpmlp::detail::activate_grad_from_output(p.act, y[1]);
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
    }
  }
#else
  (void)p;
  __trap();  // f16x3_here() refuses devices below compute capability 8.0
#endif
}

// One launch of at most 65535 batch entries (the grid's y); op(B) split beforehand where p.b_split is set.
template <class T, bool AK, bool BK_, Out O, bool PreB>
cudaError_t launch_as(cudaStream_t stream, const Params& p, int batch) {
  using S = Smem<T, PreB>;
  auto* fn = gemm_kernel<T, AK, BK_, O, PreB>;
  // The opt-in to the dynamic shared memory, and the carveout that lets CTAs share an SM (three of the small
  // tile's with op(B) split beforehand).
  static const cudaError_t set = [fn] {
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, S::bytes);
    if (e == cudaSuccess) {
      e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    }
    return e;
  }();
  if (set != cudaSuccess) return set;
  const long long tiles = static_cast<long long>((p.m + T::BM - 1) / T::BM) * ((p.n + T::BN - 1) / T::BN);
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
__global__ void __launch_bounds__(128) split_b_kernel(const float* b, std::int64_t ldb, int n, int k,
                                                      unsigned char* out) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  namespace h = backend::f16x3;
  const int f = static_cast<int>(blockIdx.x * 128 + threadIdx.x), kt = static_cast<int>(blockIdx.y);
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
  (void)b, (void)ldb, (void)n, (void)k, (void)out;
  __trap();
#endif
}

using Large = Tile<128, 128, 2, 4>;  // 8 warps of 64 x 32
using Small = Tile<64, 64, 2, 2>;    // 4 warps of 32 x 32

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

}  // namespace gemm_f16x3
}  // namespace linalg
}  // namespace dpmlp
