// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/f16x3_layout.hpp: where the block-scaled 3xFP16 GEMMs (gemm_f16x3_kernels.hpp) put a
// k-tile's operands in shared memory and which addresses their ldmatrix loads give: the index arithmetic alone,
// plain C++ with no CUDA in it, so that tests on any build can check it against ldmatrix's and mma.sync's
// fragment layouts (test_gemm: "3xFP16 layout").
//
// An operand's k-tile is F (free: m for A, n for B) x 32 k values, each plane (hi, lo) of fp16:
//   free-major (the operand's k contiguous in memory): row f is 32 halves, four 16-byte chunks of 8 k, chunk
//     c stored at slot c ^ ((f / 2) % 4), so the eight rows an ldmatrix reads at one chunk fall in eight
//     distinct 16-byte bank groups;
//   k-major (its free dimension contiguous): atoms of 64 free values, one after another (F / 64 of them, 32 k
//     x 128 bytes each); an atom's row k is its 64 halves, chunk c (8 free values) at slot c ^ (k % 8), likewise
//     for ldmatrix.trans's eight k rows. An atom is wgmma's MN-major operand layout with the 128-byte swizzle,
//     the atoms its repeats along the free index (the descriptor's leading byte offset: 4096 bytes).
#pragma once

#if defined(__CUDACC__)
#define DPMLP_F16X3_HD __host__ __device__
#else
#define DPMLP_F16X3_HD
#endif

namespace dpmlp {
namespace backend {
namespace f16x3_layout {

constexpr int k_tile = 32;  // k a k-tile: one chain of MMAs, one scale a row (column)
constexpr int k_major_atom = 64 * k_tile;  // halves: a k-major plane's 64 free values over a k-tile

// One GEMM's op(B) for the kernels to split ahead (gemm_f16x3::split_b_jobs, several in one launch): op(B) is
// b (k x n, leading dimension ldb) or, where b_t, its transpose (b n x k); its split goes to out, in the format
// of split_b_bytes(n, k), 16-byte aligned.
struct SplitBJob {
  const float* b = nullptr;
  long long ldb = 0;
  int n = 0, k = 0;
  int b_t = 0;
  unsigned char* out = nullptr;
};

// Where (f, k) of a plane lives, in halves from its start.
template <bool FreeMajor, int F>
DPMLP_F16X3_HD constexpr int plane_at(int f, int k) {
  static_assert(F % 64 == 0, "planes of whole 64-wide atoms");
  return FreeMajor ? f * k_tile + (((k >> 3) ^ ((f >> 1) & 3)) << 3) + (k & 7)
                   : (f >> 6) * k_major_atom + k * 64 + ((((f >> 3) & 7) ^ (k & 7)) << 3) + (f & 7);
}

// op(B) split beforehand, shared by every CTA (gemm_f16x3::split_b, for GEMMs whose B every row shares): k-tile
// after k-tile, each the hi plane of split_b_columns(n) columns (free-major, plane_at<true>), their lo plane,
// then their scales (fp32), so that a CTA copies its columns' slice of each part as it is.
DPMLP_F16X3_HD constexpr int split_b_columns(int n) { return (n + 127) / 128 * 128; }
DPMLP_F16X3_HD constexpr long long split_b_tile_bytes(int n) {
  return static_cast<long long>(split_b_columns(n)) * (4 * k_tile + 4);
}
// The bytes of op(B) split (n columns, k rows).
DPMLP_F16X3_HD constexpr long long split_b_bytes(int n, int k) { return (k + k_tile - 1) / k_tile * split_b_tile_bytes(n); }

// A warp's share of a k-tile's loads, a region of 16 (free) x 32 (k) values: lane `lane`'s i-th float4 (i < 4)
// holds the four values along the contiguous dimension from (f, k), offsets within the region: f = 4i + lane/8,
// k = 4 (lane % 8) where k is contiguous (KContig), else f = 4 (lane % 4), k = 8i + lane/4.
struct Coord {
  int f, k;
};
template <bool KContig>
DPMLP_F16X3_HD constexpr Coord region_element(int lane, int i) {
  return KContig ? Coord{4 * i + (lane >> 3), 4 * (lane & 7)} : Coord{4 * (lane & 3), 8 * i + (lane >> 2)};
}

// The row an ldmatrix.x4 lane points at for the 16 (free) x 16 (k) block at (f0, k0): the free index and k of
// the first of its eight halves. Quarter lane / 8 of the block, its row lane % 8 (a free index for free-major
// planes, read as it is; a k for k-major ones, read transposed). The quarters in the order of an A fragment
// (BPairs false: (f 0-7, k 0-7), (f 8-15, k 0-7), (f 0-7, k 8-15), (f 8-15, k 8-15)) or of two B fragments
// (BPairs: (f 0-7, k 0-7), (f 0-7, k 8-15), (f 8-15, k 0-7), (f 8-15, k 8-15): each MMA's B operand a pair of
// consecutive registers as loaded).
template <bool FreeMajor, bool BPairs>
DPMLP_F16X3_HD constexpr Coord ldsm_row(int f0, int k0, int lane) {
  const int q = lane >> 3, i = lane & 7;
  const int fq = BPairs ? (q >> 1) : (q & 1), kq = BPairs ? (q & 1) : (q >> 1);
  return FreeMajor ? Coord{f0 + i + 8 * fq, k0 + 8 * kq} : Coord{f0 + 8 * fq, k0 + 8 * kq + i};
}

}  // namespace f16x3_layout
}  // namespace backend
}  // namespace dpmlp
