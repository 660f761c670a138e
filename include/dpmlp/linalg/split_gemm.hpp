// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/linalg/split_gemm.hpp: the layered engine's rows x weights GEMMs (forward: N N; delta: N T) in 3xTF32
// over operands split in memory, the form Hopper's tensor-core kernels need (backend/cuda/split_3xtf32.hpp).
//
// 3xTF32 writes each fp32 operand as a TF32 part and a TF32 remainder and sums three tensor-core products,
// hi*hi + hi*lo + lo*hi. The SM80 kernels split their operands in registers. Hopper's wgmma reads its operands
// from shared memory as TMA stored them, and a tensor core reading an fp32 value takes its top 19 bits: hi is
// the value truncated (tf32_trunc), which costs nothing, and lo = tf32_lo(x), the part it misses rounded to
// TF32, is the one the caller must store. So here:
//   - an operand A (rows x k: the data, an activation, a delta) comes with A_lo, a buffer of the same shape
//     (the GEMM that wrote A writes it too: SplitGemm::c_lo);
//   - the weights B (k x n) come as B' (n x 3k, k contiguous), per k-tile of split_tile_k: [B | B_lo | B]
//     (SplitWeights, once a step);
//   - C = sum over k-tiles t, in order, of the three products of the tile, each summed on its own and added to
//     C's fp32 sum: A_t B_t, A_t B_lo,t, A_lo,t B_t, with A and B read truncated (the tensor cores' view).
// The fused epilogues are the layered engine's (the expressions of its element-wise kernels, as in
// cutlass_3xtf32.hpp), and where c_lo is set the GEMM also writes C_lo = tf32_lo(C) for the next GEMM.
//
// split_gemm() runs a GEMM on the Hopper kernels where they run (CUDA, compute capability 9.0, the kernels
// built), else the portable form here (both only for GEMMs split_takes() accepts): the same products and
// order of tiles, one thread an element of C. The two differ in their last bits (a wgmma truncates its own
// partial sums), and which runs is a property of the device, the same on every rank of a run; each gives a
// row bits that do not depend on the other rows.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dpmlp/activation.hpp"
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {
namespace linalg {

// k-tiles: the products of a tile are summed apart, and B' interleaves its parts per tile.
constexpr int split_tile_k = 32;

KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
KOKKOS_INLINE_FUNCTION float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
// x as a tensor core reads it: its top 19 bits (sign, exponent, 10 bits of mantissa).
KOKKOS_INLINE_FUNCTION float tf32_trunc(float x) { return bits_float(float_bits(x) & 0xffffe000u); }
// x rounded to TF32, to nearest with ties away from zero (PTX's cvt.rna.tf32.f32); infinities and NaNs as
// they are.
KOKKOS_INLINE_FUNCTION float tf32_rna(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  return bits_float((u + 0x1000u) & 0xffffe000u);
}
// What a tensor core misses of x when it reads it, rounded to what it can read. x - tf32_trunc(x) is exact.
// An infinity's is 0 (so the split sum of an infinite operand is the infinity, not inf - inf); a NaN's NaN.
KOKKOS_INLINE_FUNCTION float tf32_lo(float x) {
  if ((float_bits(x) & 0x7fffffffu) == 0x7f800000u) return 0.0f;
  return tf32_rna(x - tf32_trunc(x));
}

// What the GEMM's pass does after the sum (the layered engine's element-wise work):
//   linear: C = acc; bias_activation: C = activate(act, acc + src[col]);
//   activation_grad: C = acc * activate_grad_from_output(act, src[row * src_ld + col]).
enum class SplitEpilogue { linear, bias_activation, activation_grad };

// C (m x n, ldc) = A (m x k, lda) B with B given as B' (split_weights), then the epilogue; C_lo (same leading
// dimension as C) where c_lo is set.
struct SplitGemm {
  int m = 0, n = 0, k = 0;
  const float* a = nullptr;
  const float* a_lo = nullptr;  // leading dimension lda
  std::int64_t lda = 0;
  const float* b_split = nullptr;  // n x 3k
  float* c = nullptr;
  float* c_lo = nullptr;  // optional
  std::int64_t ldc = 0;
  SplitEpilogue epilogue = SplitEpilogue::linear;
  const float* src = nullptr;  // the bias (bias_activation) or the activations Y (activation_grad)
  std::int64_t src_ld = 0;
  Activation act = Activation::identity;
  // The Hopper kernels' tile rows: 0 by the row count (64 below 16384 rows, else 128), or 64 or 128 (for
  // measurements; both sum an element alike). The portable form ignores it.
  int tile_rows = 0;
};

// Whether a GEMM of this shape and these buffers runs in split form at all (the Hopper kernels' loads: k in
// whole tiles, A's rows and every buffer 16-byte aligned). A property of shapes and of the engine's own
// aligned buffers and the trainer's aligned x, so the same on every rank.
inline bool split_takes(int k, const float* a, const float* a_lo, std::int64_t lda) {
  const auto al16 = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return k > 0 && k % split_tile_k == 0 && lda % 4 == 0 && al16(a) && al16(a_lo);
}

// B' (n x 3k, k contiguous; per k-tile [B | B_lo | B]) of the weights W: transposed false, B = W (k x n,
// row-major: the forward's rows x weights); true, B = W^T with W stored n x k row-major (the delta's rows x
// weights^T). k a multiple of split_tile_k.
struct SplitWeights {
  const float* w = nullptr;
  int k = 0, n = 0;
  bool transposed = false;
  float* b_split = nullptr;
  KOKKOS_INLINE_FUNCTION std::int64_t size() const { return std::int64_t(k) * n; }
  // B(kk, col), written to its three places in B'; i = kk * n + col.
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const int kk = static_cast<int>(i / n), col = static_cast<int>(i % n);
    const float x = transposed ? w[std::int64_t(col) * k + kk] : w[i];
    const int t = kk / split_tile_k, j = kk % split_tile_k;
    float* out = b_split + std::int64_t(col) * 3 * k + std::int64_t(t) * 3 * split_tile_k;
    out[j] = x;
    out[split_tile_k + j] = tf32_lo(x);
    out[2 * split_tile_k + j] = x;
  }
};

namespace detail {

// One element of the split GEMM, in the order the Hopper kernels sum: per k-tile, the three products in turn,
// each summed apart from +0 and added to the element's sum. The truncated operands' products are exact in
// fp32 (11 significant bits each), so a tile's sum is what its order makes it.
KOKKOS_INLINE_FUNCTION float split_element(const SplitGemm& g, std::int64_t r, int col) {
  const float* a = g.a + r * g.lda;
  const float* a_lo = g.a_lo + r * g.lda;
  const float* b = g.b_split + std::int64_t(col) * 3 * g.k;
  float acc = 0.0f;
  for (int t = 0; t < g.k; t += split_tile_k) {
    const float* bt = b + std::int64_t(t) * 3;
    float part[3] = {0.0f, 0.0f, 0.0f};
    for (int j = 0; j < split_tile_k; ++j) {
      const float ah = tf32_trunc(a[t + j]);
      part[0] += ah * tf32_trunc(bt[j]);
      part[1] += ah * bt[split_tile_k + j];
      part[2] += a_lo[t + j] * tf32_trunc(bt[2 * split_tile_k + j]);
    }
    acc += part[0];
    acc += part[1];
    acc += part[2];
  }
  return acc;
}

KOKKOS_INLINE_FUNCTION float split_finish(const SplitGemm& g, std::int64_t r, int col, float acc) {
  if (g.epilogue == SplitEpilogue::bias_activation) return ::dpmlp::detail::activate(g.act, acc + g.src[col]);
  if (g.epilogue == SplitEpilogue::activation_grad) {
    return acc * ::dpmlp::detail::activate_grad_from_output(g.act, g.src[r * g.src_ld + col]);
  }
  return acc;
}

}  // namespace detail

// The portable form of the split GEMM (any space; one thread an element of C). Only for GEMMs split_takes()
// accepts.
template <class ExecSpace>
void split_gemm_portable(const ExecSpace& space, const SplitGemm& g) {
  if (g.m <= 0 || g.n <= 0) return;
  const std::int64_t n = g.n;
  Kokkos::parallel_for("dpmlp::split_gemm", Kokkos::RangePolicy<ExecSpace>(space, 0, std::int64_t(g.m) * n),
                       KOKKOS_LAMBDA(const std::int64_t i) {
                         const std::int64_t r = i / n;
                         const int col = static_cast<int>(i % n);
                         const float y = detail::split_finish(g, r, col, detail::split_element(g, r, col));
                         g.c[r * g.ldc + col] = y;
                         if (g.c_lo != nullptr) g.c_lo[r * g.ldc + col] = tf32_lo(y);
                       });
}

}  // namespace linalg
}  // namespace dpmlp

#include "dpmlp/backend/cuda/split_3xtf32.hpp"

namespace dpmlp {
namespace linalg {

// The split GEMM: on the Hopper kernels where they run, else the portable form. Only for GEMMs split_takes()
// accepts.
template <class ExecSpace>
void split_gemm(const ExecSpace& space, const SplitGemm& g) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    if (split_3xtf32::runs_here()) {
      split_3xtf32::gemm(space, g);
      return;
    }
  }
#endif
  split_gemm_portable(space, g);
}

}  // namespace linalg
}  // namespace dpmlp
