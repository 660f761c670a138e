// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/wgmma_layout.hpp: where the wgmma 3xTF32 kernels (wgmma_3xtf32_kernels.hpp) put a k-tile's
// operands in shared memory and find C in their accumulators: the index arithmetic alone, plain C++ with no
// CUDA in it, so that tests on any build can check it against the layout the MMA descriptors describe
// (test_gemm: "wgmma layout").
//
// A k-tile of an operand is R rows (of A: m; of B: n) x 32 k in fp32, K-major with the 128-byte swizzle: row r
// is 128 bytes, eight 16-byte chunks of four k, chunk c stored at slot c ^ (r mod 8); 8-row groups 1024 bytes
// apart; the tile's base 1024-byte aligned. That is the canonical layout ((8, n), 2) : ((8, SBO), 1) in 16-byte
// units with SBO = 1024 bytes that wgmma's descriptor names for a K-major .tf32 operand, one k-step of 8 at a
// time, the start moved 32 bytes a k-step.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DPMLP_WGMMA_HD __host__ __device__
#else
#define DPMLP_WGMMA_HD
#endif

namespace dpmlp {
namespace backend {
namespace wgmma {

constexpr int k_tile = 32;  // k a k-tile: one 128-byte swizzled row of fp32

// The float offset of chunk `chunk` (k / 4) of row r in a tile.
DPMLP_WGMMA_HD constexpr int swizzled(int r, int chunk) { return r * k_tile + ((chunk ^ (r & 7)) << 2); }

// The descriptor of a K-major, 128-byte-swizzled operand whose k-step starts at shared address `addr`: start
// address (bits 0-13, in 16 bytes), leading byte offset 1 (unused with a swizzle), stride byte offset 1024
// (bits 32-45, in 16 bytes), base offset 0, layout type 1 = 128-byte swizzle (bits 62-63).
DPMLP_WGMMA_HD constexpr std::uint64_t descriptor(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) | (std::uint64_t(1) << 16) |
         (std::uint64_t(1024 >> 4) << 32) | (std::uint64_t(1) << 62);
}

// How 128 threads move a k-tile of R rows. K-contiguous operands: float4 f (of R * 8) is row f / 8, chunk
// f % 8: eight threads read a row's 128 bytes. Transposed operands (r contiguous in memory): 4 x 4 block u
// (of 2R) is rows 4 block_row(u) .. + 3 at chunk block_chunk(u); bit 0 of u picks the row group's parity and
// bits 1-2 the chunk's low bits, so the 8 threads of a store phase write 8 different 16-byte slots (no bank
// conflicts), and the 8 threads that share a chunk read 8 adjacent blocks (128 bytes) of a row of memory.
DPMLP_WGMMA_HD constexpr int kcontig_row(int f) { return f >> 3; }
DPMLP_WGMMA_HD constexpr int kcontig_chunk(int f) { return f & 7; }
DPMLP_WGMMA_HD constexpr int block_row(int u, int rows) { return (u & 1) | (((u >> 3) % (rows / 8)) << 1); }
DPMLP_WGMMA_HD constexpr int block_chunk(int u, int rows) { return ((u >> 1) & 3) | (((u >> 3) / (rows / 8)) << 2); }

// The m64nNk8 accumulator (.f32): register v of thread t (of the warpgroup's 128) holds row acc_row(t, v) and
// column acc_col(t, v) of the 64 x N tile: register 4j + 2h + e at row 16 warp + lane / 4 + 8h, column
// 8j + 2 (lane % 4) + e.
DPMLP_WGMMA_HD constexpr int acc_row(int t, int v) { return 16 * (t >> 5) + ((t & 31) >> 2) + 8 * ((v >> 1) & 1); }
DPMLP_WGMMA_HD constexpr int acc_col(int t, int v) { return 8 * (v >> 2) + 2 * (t & 3) + (v & 1); }

}  // namespace wgmma
}  // namespace backend
}  // namespace dpmlp
