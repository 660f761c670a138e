// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/linalg/gemm.hpp: the one GEMM entry point of dpmlp, a strided-batched row-major GEMM, and its dispatch.
//
//   C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b]      for b in [0, batch)
//
// All matrices are row-major. op(A) is m x k: with Op::N, A[b] is stored m x k (lda >= k); with Op::T, A[b] is
// stored k x m (lda >= m). Likewise op(B) is k x n. C[b] is m x n (ldc >= n). Element (i, j) of C[b] lives at
// C + b * strideC + i * ldc + j.
//
// Backends:
//   - eigen:    host spaces; Eigen::Map over the Kokkos data, one Eigen product per batch entry.
//   - cublas:   Kokkos::Cuda; cublas<t>gemmStridedBatched on the execution space's stream (backend/cuda/cublas.hpp).
//   - cublaslt: Kokkos::Cuda; cuBLASLt with the algorithm pinned per kind of GEMM (backend/cuda/cublaslt.hpp).
//   - cutlass:  Kokkos::Cuda, float; CUTLASS 3xTF32 tensor-core kernels (backend/cuda/cutlass_3xtf32.hpp) for
//               the GEMMs they take (shapes and alignment), cublaslt for the rest (and for double).
//   - portable: any space; Kokkos kernels in which each C element is summed over k in increasing order, one
//               term at a time from +0 (detail::gemm_portable: a tiled team kernel, whose bits are those of the
//               one-thread-an-element reference kernel, detail::gemm_portable_reference).
// Every backend is deterministic for a fixed (shape, batch) on a fixed machine. The portable, cublaslt and
// cutlass backends (and eigen, one product per batch entry) give each row of C, and each batch entry, bits
// that do not depend on the number of rows or the batch count, which is what reproducible reductions need;
// cublas does not (docs/design.md).
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include <Eigen/Core>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/f16x3_layout.hpp"  // (plain C++: f16x3_layout::SplitBJob on every build)
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {
namespace linalg {

enum class Op { N, T };
enum class Backend { eigen, cublas, portable, cublaslt, cutlass };

inline const char* backend_name(Backend b) {
  switch (b) {
    case Backend::eigen: return "eigen";
    case Backend::cublas: return "cublas";
    case Backend::portable: return "portable";
    case Backend::cublaslt: return "cublaslt";
    case Backend::cutlass: return "cutlass";
  }
  return "?";
}

template <class Scalar>
struct BatchedGemm {
  Op op_a = Op::N, op_b = Op::N;
  int m = 0, n = 0, k = 0;
  Scalar alpha = Scalar(1);
  const Scalar* a = nullptr;
  int lda = 0;
  std::int64_t stride_a = 0;
  const Scalar* b = nullptr;
  int ldb = 0;
  std::int64_t stride_b = 0;
  Scalar beta = Scalar(0);
  Scalar* c = nullptr;
  int ldc = 0;
  std::int64_t stride_c = 0;
  std::int64_t batch = 1;
  // A batch of blocks whose count varies (with the rank count), even when it is 1 here: the backends whose
  // choice of kernel depends on the free dimension (cublaslt) take the batch count as free, not m.
  bool blocks = false;
  // float on the cutlass backend: the GEMM may run on the block-scaled 3xFP16 kernels (EnginePlan::gemm_f16x3;
  // cutlass_3xtf32.hpp, runs_on_f16x3), whose bits differ from CUTLASS's.
  bool f16x3 = false;
  // Device memory the backend may use during the call (its kernels are done with it before later work on the
  // same space starts); null: none. The 3xFP16 kernels split an op(B) that every row shares into it once
  // (gemm_workspace_bytes() says how much), rather than in every CTA; the bits are the same either way.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // op(B) split beforehand, by split_b_ahead (a job of this GEMM's b, ldb, n, k and op_b), as the 3xFP16
  // kernels would split it into the workspace; they then skip their own split. Null: none. The caller vouches
  // that it is the split of op(B) as it is now.
  const void* b_split = nullptr;
  // Op T N (a weight gradient and, over the same rows, the bias gradient): where the backend can, gemm() also
  // writes each batch entry's column sums of B over its k rows, at column_sums + entry * stride_c + j, and
  // returns true (the cutlass backend's 3xFP16 kernels, in the order their ColumnSums gives). Null: none.
  Scalar* column_sums = nullptr;
};

namespace detail {

template <class Scalar>
using RowMajorStrided =
    Eigen::Map<const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
template <class Scalar>
using RowMajorStridedMut =
    Eigen::Map<Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;

template <class ExecSpace, class Scalar>
void gemm_eigen(const ExecSpace& space, const BatchedGemm<Scalar>& g) {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible,
                "the eigen GEMM backend needs an execution space whose memory the host can read");
  const auto G = g;  // captured by value: the lambda may run on other threads
  // One Eigen product per batch entry, batch entries spread over the space's threads. Eigen itself stays
  // single-threaded, so each entry's bits depend only on its own shape.
  Kokkos::parallel_for(
      "dpmlp::gemm_eigen", Kokkos::RangePolicy<ExecSpace>(space, 0, G.batch), [G](const std::int64_t bi) {
        const Scalar* A = G.a + bi * G.stride_a;
        const Scalar* B = G.b + bi * G.stride_b;
        Scalar* C = G.c + bi * G.stride_c;
        const int ar = G.op_a == Op::N ? G.m : G.k, ac = G.op_a == Op::N ? G.k : G.m;
        const int br = G.op_b == Op::N ? G.k : G.n, bc = G.op_b == Op::N ? G.n : G.k;
        RowMajorStrided<Scalar> Am(A, ar, ac, Eigen::OuterStride<>(G.lda));
        RowMajorStrided<Scalar> Bm(B, br, bc, Eigen::OuterStride<>(G.ldb));
        RowMajorStridedMut<Scalar> Cm(C, G.m, G.n, Eigen::OuterStride<>(G.ldc));
        if (G.beta == Scalar(0)) {
          if (G.op_a == Op::N && G.op_b == Op::N) Cm.noalias() = G.alpha * (Am * Bm);
          else if (G.op_a == Op::T && G.op_b == Op::N) Cm.noalias() = G.alpha * (Am.transpose() * Bm);
          else if (G.op_a == Op::N && G.op_b == Op::T) Cm.noalias() = G.alpha * (Am * Bm.transpose());
          else Cm.noalias() = G.alpha * (Am.transpose() * Bm.transpose());
        } else {
          if (G.beta != Scalar(1)) Cm *= G.beta;
          if (G.op_a == Op::N && G.op_b == Op::N) Cm.noalias() += G.alpha * (Am * Bm);
          else if (G.op_a == Op::T && G.op_b == Op::N) Cm.noalias() += G.alpha * (Am.transpose() * Bm);
          else if (G.op_a == Op::N && G.op_b == Op::T) Cm.noalias() += G.alpha * (Am * Bm.transpose());
          else Cm.noalias() += G.alpha * (Am.transpose() * Bm.transpose());
        }
      });
}

// The portable backend's contract: element (i, j) of C[b] is
//   acc = 0; acc += op(A)(i, p) * op(B)(p, j) for p = 0, 1, ..., k-1; C = alpha * acc (+ beta * C)
// one accumulator, one term at a time, in increasing p. Its bits are then a function of that row of op(A),
// that column of op(B), alpha, beta and the old C only: not of the batch count, the batch index, m, n, the
// tiling or the thread that computes it. Both kernels below keep it, so they give the same bits.

// The store of one C element, one helper for both kernels so that the compiler sees the same expression in
// both: on a GPU it fuses alpha * acc + beta * C into one multiply-add, and both must fuse the same product.
template <class Scalar>
KOKKOS_FORCEINLINE_FUNCTION void gemm_store(Scalar* c, Scalar acc, Scalar alpha, Scalar beta) {
  *c = beta == Scalar(0) ? alpha * acc : alpha * acc + beta * *c;
}

// The reference kernel: one thread per C element, k summed in increasing order with plain multiply-adds.
// Simple on purpose: it is the reference the tiled kernel and every other backend are tested against, and the
// portable backend's matrix-vector products on host spaces.
template <class ExecSpace, class Scalar>
void gemm_portable_reference(const ExecSpace& space, const BatchedGemm<Scalar>& g) {
  const auto G = g;
  const std::int64_t per = std::int64_t(G.m) * G.n;
  Kokkos::parallel_for(
      "dpmlp::gemm_portable_reference", Kokkos::RangePolicy<ExecSpace>(space, 0, per * G.batch),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t bi = idx / per;
        const int i = static_cast<int>((idx % per) / G.n), j = static_cast<int>(idx % G.n);
        // Element i of op(A)'s row and element j of op(B)'s column, as a base and a step along k.
        const Scalar* A = G.a + bi * G.stride_a + (G.op_a == Op::N ? std::int64_t(i) * G.lda : i);
        const Scalar* B = G.b + bi * G.stride_b + (G.op_b == Op::N ? j : std::int64_t(j) * G.ldb);
        const std::int64_t sa = G.op_a == Op::N ? 1 : G.lda, sb = G.op_b == Op::N ? G.ldb : 1;
        // Eight loads of each operand in flight before their use (a GPU thread does not reorder loads); the
        // sum is still acc + a0 b0 + a1 b1 + ... in increasing k, so the bits are those of the plain loop.
        Scalar acc = Scalar(0);
        int p = 0;
        for (; p + 8 <= G.k; p += 8) {
          Scalar a[8], b[8];
          for (int u = 0; u < 8; ++u) a[u] = A[(p + u) * sa];
          for (int u = 0; u < 8; ++u) b[u] = B[(p + u) * sb];
          for (int u = 0; u < 8; ++u) acc += a[u] * b[u];
        }
        for (; p < G.k; ++p) acc += A[p * sa] * B[p * sb];
        gemm_store(G.c + bi * G.stride_c + std::int64_t(i) * G.ldc + j, acc, G.alpha, G.beta);
      });
}

// Fully unrolled loops keep a thread's tiles (small arrays) in registers on a GPU: an array indexed by a loop
// the compiler did not unroll lives in local memory.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define DPMLP_GEMM_UNROLL _Pragma("unroll")
#else
#define DPMLP_GEMM_UNROLL
#endif

// V consecutive elements of team scratch at p, 16-byte aligned when they are 16 bytes, into dst. On a GPU a run
// of 16 bytes is one vector load (the compiler does not merge the scalar loads itself: it cannot see the
// scratch's alignment); the values are the same either way.
template <int V, class Scalar>
KOKKOS_FORCEINLINE_FUNCTION void load_run(Scalar* dst, const Scalar* p) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  if constexpr (std::is_same<Scalar, float>::value && V == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else if constexpr (std::is_same<Scalar, double>::value && V == 4) {
    const double2 v0 = reinterpret_cast<const double2*>(p)[0], v1 = reinterpret_cast<const double2*>(p)[1];
    dst[0] = v0.x, dst[1] = v0.y, dst[2] = v1.x, dst[3] = v1.y;
  } else
#endif
  {
    for (int v = 0; v < V; ++v) dst[v] = p[v];
  }
}

// V values from src to p in global memory, 16-byte aligned when they are 16 bytes; one vector store on a GPU.
template <int V, class Scalar>
KOKKOS_FORCEINLINE_FUNCTION void store_run(Scalar* p, const Scalar* src) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  if constexpr (std::is_same<Scalar, float>::value && V == 4) {
    float4 v;
    v.x = src[0], v.y = src[1], v.z = src[2], v.w = src[3];
    *reinterpret_cast<float4*>(p) = v;
  } else if constexpr (std::is_same<Scalar, double>::value && V == 4) {
    double2 v0, v1;
    v0.x = src[0], v0.y = src[1], v1.x = src[2], v1.y = src[3];
    reinterpret_cast<double2*>(p)[0] = v0;
    reinterpret_cast<double2*>(p)[1] = v1;
  } else
#endif
  {
    for (int v = 0; v < V; ++v) p[v] = src[v];
  }
}

// The tiled kernel's shape. A team computes a TM x TN tile of one C[b]; each of its T logical threads owns
// RM x RN elements of it. The team walks k in tiles of TK, in increasing order: it stages op(A)'s TM x TK and
// op(B)'s TK x TN tiles in team scratch, k-major (pitches PA = TM + PadA and PB = TN + PadB elements), and every
// thread adds the tile's terms to its elements, one k at a time. A thread's rows come in GM runs of VM
// consecutive rows, TM / GM apart (likewise its columns), so its reads of a k-row of a tile are VM (VN)
// consecutive elements, and the threads of a warp read consecutive runs (no bank conflicts; the pads keep
// the k-major stores of a row-contiguous operand free of them too).
template <int TM_, int TN_, int TK_, int RM_, int RN_, int PadA_, int PadB_, int MinTeams_>
struct GemmTile {
  static constexpr int TM = TM_, TN = TN_, TK = TK_, RM = RM_, RN = RN_;
  static constexpr int T = (TM / RM) * (TN / RN);
  static constexpr int VM = RM < 4 ? RM : 4, VN = RN < 4 ? RN : 4;
  static constexpr int GM = RM / VM, GN = RN / VN;
  static constexpr int PA = TM + PadA_, PB = TN + PadB_;
  static constexpr int LA = (TM * TK + T - 1) / T, LB = (TK * TN + T - 1) / T;  // staged elements a thread
  static constexpr int stage_elems = TK * PA + TK * PB;                          // one k-tile of both operands
  static constexpr int min_teams = MinTeams_;  // teams an SM the register budget must allow (launch bounds)
  static_assert(TM % RM == 0 && TN % RN == 0 && RM % VM == 0 && RN % VN == 0, "GemmTile: uneven tile");
  static_assert(PA % 4 == 0 || RM == 1, "GemmTile: runs of 4 rows must stay 16-byte aligned");
  static_assert(PB % 4 == 0 || RN == 1, "GemmTile: runs of 4 columns must stay 16-byte aligned");
};

// 128 x 128 tiles, 8 x 8 a thread: the large products (both m and n above 64).
using GemmTileLarge = GemmTile<128, 128, 8, 8, 8, 4, 4, 2>;
// 64 x 64 tiles, 4 x 4 a thread: m or n of 64 or less.
using GemmTileMedium = GemmTile<64, 64, 16, 4, 4, 4, 4, 3>;
// 32 x 128 tiles, 4 x 4 a thread: m of 32 or less with a wide n.
using GemmTileShort = GemmTile<32, 128, 16, 4, 4, 4, 4, 3>;
// 256 x 1 tiles, one element a thread: matrix-vector products (n below 4), bound by reading op(A). PadA 2
// keeps a warp's k-major stores of a row-contiguous A (16 k's of 2 rows) on 32 distinct banks; k-tiles of 8
// in double keep the two stages within 48 KiB.
template <class Scalar>
using GemmTileThin = GemmTile<256, 1, sizeof(Scalar) <= 4 ? 16 : 8, 1, 1, 2, 0, 4>;
// 64 x 1 tiles: the thin products with too few 256-row tiles to occupy a GPU (a few batch entries of a few
// hundred rows each: the weight gradient of a one-output layer over large blocks, whose every element is one
// long sum over the block's rows), up to eight teams a multiprocessor. k-tiles of 32 (16 in double): eight
// teams' two stages fit in a multiprocessor's shared memory. The odd pitch keeps a warp's k-major stores of a
// row-contiguous A on distinct banks.
template <class Scalar>
using GemmTileThinFew = GemmTile<64, 1, sizeof(Scalar) <= 4 ? 32 : 16, 1, 1, 1, 0, 8>;

// The tiled kernel, one team a (batch entry, tile). OnHost: a team of any size (1 on host spaces) runs the T
// logical threads in turn and keeps the accumulators in scratch between k-tiles; stores and loads do not
// change a value, so the sums are those of a device team, whose T threads keep them in registers. Either way
// each accumulator starts at +0 and takes its terms in increasing k, one at a time; only the last k-tile is
// short, and its loop stops at k (padded entries of a tile feed only elements outside C, never a sum that is
// stored).
template <class ExecSpace, class Scalar, class Tile, bool OnHost>
struct TiledGemm {
  // Launch bounds: the tile's register budget in float; in double (two registers a value) the most a thread of
  // 256 may have.
  using policy = Kokkos::TeamPolicy<ExecSpace, Kokkos::LaunchBounds<Tile::T, (sizeof(Scalar) > 4 ? 2 : Tile::min_teams)>>;
  using member = typename policy::member_type;
  static constexpr int TM = Tile::TM, TN = Tile::TN, TK = Tile::TK, RM = Tile::RM, RN = Tile::RN, T = Tile::T;
  static constexpr int PA = Tile::PA, PB = Tile::PB;

  BatchedGemm<Scalar> g;
  std::int64_t batch0 = 0;  // the first batch entry of this launch
  int tiles_n = 1, tiles = 1;

  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    const std::size_t elems = OnHost ? std::size_t(Tile::stage_elems) + std::size_t(TM) * TN : 2 * Tile::stage_elems;
    return elems * sizeof(Scalar) + 16;  // + room to align to 16 bytes
  }

  // Staging. A k-tile of an operand is, in the operand's storage, an R x W block (W along the stored rows,
  // which are contiguous: W = TK for op(A) = A, TM for op(A) = A^T, and likewise for B). Logical thread t
  // takes column t % W of it, rows t / W + s * (T / W) for s = 0, 1, ...: consecutive threads read consecutive
  // elements (coalesced), and a thread's elements are one pointer and one stride apart.
  template <int W, int R, int L>
  KOKKOS_FORCEINLINE_FUNCTION static void fetch_block(const Scalar* M, int ld, int row0, int col0, int rows,
                                                      int cols, int t, Scalar (&v)[L]) {
    static_assert(T % W == 0 && L * T >= R * W, "fetch_block: a team's shares must cover the block");
    constexpr int RS = T / W;
    const int c = t % W, r = t / W;
    const bool in_cols = col0 + c < cols;
    const int rows_left = rows - row0 - r;  // this thread's rows that are inside the stored matrix
    const Scalar* p = M + (std::int64_t(row0 + r) * ld + col0 + c);
    const std::int64_t step = std::int64_t(RS) * ld;
    DPMLP_GEMM_UNROLL
    for (int s = 0; s < L; ++s, p += step) {
      const bool in_block = (R * W) % T == 0 || r + s * RS < R;
      v[s] = in_block && in_cols && s * RS < rows_left ? *p : Scalar(0);  // zero: the tile's padding
    }
  }
  // The same elements into the stage: stored row x, column y of the block goes to S[x * srow + y * scol].
  template <int W, int R, int L>
  KOKKOS_FORCEINLINE_FUNCTION static void put_block(Scalar* S, int srow, int scol, int t, const Scalar (&v)[L]) {
    constexpr int RS = T / W;
    const int c = t % W, r = t / W;
    DPMLP_GEMM_UNROLL
    for (int s = 0; s < L; ++s) {
      if ((R * W) % T == 0 || r + s * RS < R) S[(r + s * RS) * srow + c * scol] = v[s];
    }
  }

  // Logical thread t's share of the k-tile at k0 of op(A) and op(B), into pa and pb (the loads all in flight).
  KOKKOS_FORCEINLINE_FUNCTION void fetch(const Scalar* A, const Scalar* B, int i0, int j0, int k0, int t,
                                         Scalar (&pa)[Tile::LA], Scalar (&pb)[Tile::LB]) const {
    if (g.op_a == Op::N) {
      fetch_block<TK, TM>(A, g.lda, i0, k0, g.m, g.k, t, pa);
    } else {
      fetch_block<TM, TK>(A, g.lda, k0, i0, g.k, g.m, t, pa);
    }
    if (g.op_b == Op::N) {
      fetch_block<TN, TK>(B, g.ldb, k0, j0, g.k, g.n, t, pb);
    } else {
      fetch_block<TK, TN>(B, g.ldb, j0, k0, g.n, g.k, t, pb);
    }
  }
  // ... stored into the stage S, k-major: op(A)(ii, kk) at S[kk * PA + ii], op(B)(kk, jj) at S[TK * PA + kk * PB
  // + jj].
  KOKKOS_FORCEINLINE_FUNCTION void put(Scalar* S, int t, const Scalar (&pa)[Tile::LA],
                                       const Scalar (&pb)[Tile::LB]) const {
    if (g.op_a == Op::N) {
      put_block<TK, TM>(S, 1, PA, t, pa);
    } else {
      put_block<TM, TK>(S, PA, 1, t, pa);
    }
    if (g.op_b == Op::N) {
      put_block<TN, TK>(S + TK * PA, PB, 1, t, pb);
    } else {
      put_block<TK, TN>(S + TK * PA, 1, PB, t, pb);
    }
  }

  // Row r of a thread's elements within the tile (likewise columns): runs of VM rows, TM / GM apart.
  KOKKOS_FORCEINLINE_FUNCTION static int row(int tm, int r) {
    return (r / Tile::VM) * (TM / Tile::GM) + tm * Tile::VM + r % Tile::VM;
  }
  KOKKOS_FORCEINLINE_FUNCTION static int col(int tn, int c) {
    return (c / Tile::VN) * (TN / Tile::GN) + tn * Tile::VN + c % Tile::VN;
  }

  // The terms of k-row kk of the staged tiles, added to a thread's accumulators.
  KOKKOS_FORCEINLINE_FUNCTION static void step(const Scalar* As, const Scalar* Bs, int kk, int tm, int tn,
                                               Scalar (&acc)[RM][RN]) {
    Scalar a[RM], b[RN];
    DPMLP_GEMM_UNROLL
    for (int r = 0; r < RM; r += Tile::VM) load_run<Tile::VM>(a + r, As + kk * PA + row(tm, r));
    DPMLP_GEMM_UNROLL
    for (int c = 0; c < RN; c += Tile::VN) load_run<Tile::VN>(b + c, Bs + kk * PB + col(tn, c));
    DPMLP_GEMM_UNROLL
    for (int r = 0; r < RM; ++r) {
      DPMLP_GEMM_UNROLL
      for (int c = 0; c < RN; ++c) acc[r][c] += a[r] * b[c];
    }
  }

  // The kt (<= TK) k-rows of one staged k-tile; a whole tile as a fully unrolled loop.
  KOKKOS_FORCEINLINE_FUNCTION static void tile_terms(const Scalar* S, int kt, int tm, int tn, Scalar (&acc)[RM][RN]) {
    const Scalar* As = S;
    const Scalar* Bs = S + TK * PA;
    if (kt == TK) {
      DPMLP_GEMM_UNROLL
      for (int kk = 0; kk < TK; ++kk) step(As, Bs, kk, tm, tn, acc);
    } else {
      for (int kk = 0; kk < kt; ++kk) step(As, Bs, kk, tm, tn, acc);
    }
  }

  // The thread's elements into C. With beta == 0 (the engine's GEMMs) an element is alpha * acc, one rounding
  // whatever the code around it, so a run of 4 in a 16-byte aligned row may go out as one vector store; with
  // beta != 0 every element goes through gemm_store, the reference kernel's expression.
  KOKKOS_FORCEINLINE_FUNCTION void store(Scalar* C, int i0, int j0, int tm, int tn, const Scalar (&acc)[RM][RN]) const {
    const bool runs = Tile::VN == 4 && g.beta == Scalar(0) && g.ldc % 4 == 0 &&
                      reinterpret_cast<std::uintptr_t>(C) % (4 * sizeof(Scalar)) == 0;
    DPMLP_GEMM_UNROLL
    for (int r = 0; r < RM; ++r) {
      const int i = i0 + row(tm, r);
      if (i >= g.m) continue;
      Scalar* Ci = C + std::int64_t(i) * g.ldc;
      DPMLP_GEMM_UNROLL
      for (int c = 0; c < RN; c += Tile::VN) {
        const int j = j0 + col(tn, c);
        if (runs && j + Tile::VN <= g.n) {
          Scalar v[Tile::VN];
          DPMLP_GEMM_UNROLL
          for (int u = 0; u < Tile::VN; ++u) v[u] = g.alpha * acc[r][c + u];
          store_run<Tile::VN>(Ci + j, v);
        } else {
          DPMLP_GEMM_UNROLL
          for (int u = 0; u < Tile::VN; ++u) {
            if (j + u < g.n) gemm_store(Ci + j + u, acc[r][c + u], g.alpha, g.beta);
          }
        }
      }
    }
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member& team) const {
    const std::int64_t bi = batch0 + team.league_rank() / tiles;
    const int tile = team.league_rank() % tiles;
    const int i0 = (tile / tiles_n) * TM, j0 = (tile % tiles_n) * TN;
    const Scalar* A = g.a + bi * g.stride_a;
    const Scalar* B = g.b + bi * g.stride_b;
    Scalar* C = g.c + bi * g.stride_c;
    // 16-byte aligned; the pitches and offsets in it are multiples of 16 bytes (GemmTile), so is every run.
    Scalar* sh = static_cast<Scalar*>(team.team_scratch(0).get_shmem_aligned(scratch_bytes() - 16, 16));
    const int tiles_k = g.k > 0 ? (g.k + TK - 1) / TK : 0;
    if constexpr (OnHost) {
      Scalar* S = sh;
      Scalar* accs = sh + Tile::stage_elems;  // logical thread t's accumulators at accs[t * RM * RN]
      for (int t = team.team_rank(); t < T; t += team.team_size()) {
        for (int e = 0; e < RM * RN; ++e) accs[t * RM * RN + e] = Scalar(0);
      }
      for (int kt = 0; kt < tiles_k; ++kt) {
        const int k0 = kt * TK;
        for (int t = team.team_rank(); t < T; t += team.team_size()) {
          Scalar pa[Tile::LA], pb[Tile::LB];
          fetch(A, B, i0, j0, k0, t, pa, pb);
          put(S, t, pa, pb);
        }
        team.team_barrier();
        const int kn = g.k - k0 < TK ? g.k - k0 : TK;
        for (int t = team.team_rank(); t < T; t += team.team_size()) {
          Scalar acc[RM][RN];
          for (int e = 0; e < RM * RN; ++e) acc[e / RN][e % RN] = accs[t * RM * RN + e];
          tile_terms(S, kn, t / (TN / RN), t % (TN / RN), acc);
          for (int e = 0; e < RM * RN; ++e) accs[t * RM * RN + e] = acc[e / RN][e % RN];
        }
        team.team_barrier();
      }
      for (int t = team.team_rank(); t < T; t += team.team_size()) {
        Scalar acc[RM][RN];
        for (int e = 0; e < RM * RN; ++e) acc[e / RN][e % RN] = accs[t * RM * RN + e];
        store(C, i0, j0, t / (TN / RN), t % (TN / RN), acc);
      }
    } else {
      // One logical thread a team thread. Two stages: while the team adds the terms of one k-tile, each thread
      // holds its share of the next in registers (the loads in flight), then stores it into the other stage.
      const int t = team.team_rank(), tm = t / (TN / RN), tn = t % (TN / RN);
      Scalar acc[RM][RN];
      DPMLP_GEMM_UNROLL
      for (int r = 0; r < RM; ++r) {
        DPMLP_GEMM_UNROLL
        for (int c = 0; c < RN; ++c) acc[r][c] = Scalar(0);
      }
      Scalar pa[Tile::LA], pb[Tile::LB];
      if (tiles_k > 0) {
        fetch(A, B, i0, j0, 0, t, pa, pb);
        put(sh, t, pa, pb);
        team.team_barrier();
      }
      for (int kt = 0; kt < tiles_k; ++kt) {
        const bool more = kt + 1 < tiles_k;
        const int k0 = kt * TK;
        if (more) fetch(A, B, i0, j0, k0 + TK, t, pa, pb);
        tile_terms(sh + (kt & 1) * Tile::stage_elems, g.k - k0 < TK ? g.k - k0 : TK, tm, tn, acc);
        if (more) put(sh + ((kt + 1) & 1) * Tile::stage_elems, t, pa, pb);
        team.team_barrier();
      }
      store(C, i0, j0, tm, tn, acc);
    }
  }
};

// Runs the tiled kernel with tile shape Tile: a league of (batch entry, tile) teams, in launches of at most
// INT_MAX teams.
template <class Tile, class ExecSpace, class Scalar>
void gemm_tiled_launch(const ExecSpace& space, const BatchedGemm<Scalar>& g) {
  constexpr bool on_host = is_host_space<ExecSpace>();
  using kernel = TiledGemm<ExecSpace, Scalar, Tile, on_host>;
  const std::int64_t tiles_m = (std::int64_t(g.m) + Tile::TM - 1) / Tile::TM;
  const std::int64_t tiles_n = (std::int64_t(g.n) + Tile::TN - 1) / Tile::TN;
  const std::int64_t tiles = tiles_m * tiles_n;
  if (tiles > INT_MAX) {  // a C too large for one launch's league; the reference kernel gives the same bits
    gemm_portable_reference(space, g);
    return;
  }
  kernel f;
  f.g = g;
  f.tiles_n = static_cast<int>(tiles_n);
  f.tiles = static_cast<int>(tiles);
  const std::int64_t per_launch = INT_MAX / tiles;
  for (std::int64_t b0 = 0; b0 < g.batch; b0 += per_launch) {
    const std::int64_t entries = g.batch - b0 < per_launch ? g.batch - b0 : per_launch;
    f.batch0 = b0;
    typename kernel::policy policy(space, static_cast<int>(entries * tiles), on_host ? 1 : Tile::T);
    policy.set_scratch_size(0, Kokkos::PerTeam(kernel::scratch_bytes()));
    Kokkos::parallel_for("dpmlp::gemm_portable_tiled", policy, f);
  }
}

// The tiled kernel with the tile shape that suits m and n. The shape changes how the work is split, never an
// element's sum, so the bits do not depend on it.
template <class ExecSpace, class Scalar>
void gemm_portable_tiled(const ExecSpace& space, const BatchedGemm<Scalar>& g) {
  if (g.n < 4) {
    // Fewer 256-row teams than would give each multiprocessor two (a device's concurrency is its resident
    // threads, 2048 a multiprocessor on NVIDIA GPUs): 64-row teams, four times as many.
    if constexpr (!is_host_space<ExecSpace>()) {
      const std::int64_t teams = g.batch * ((std::int64_t(g.m) + 255) / 256);
      if (teams * 1024 < std::int64_t(space.concurrency())) {
        gemm_tiled_launch<GemmTileThinFew<Scalar>>(space, g);
        return;
      }
    }
    gemm_tiled_launch<GemmTileThin<Scalar>>(space, g);
  } else if (g.m <= 32 && g.n > 64) {
    gemm_tiled_launch<GemmTileShort>(space, g);
  } else {
    if constexpr (sizeof(Scalar) <= 4) {  // 8 x 8 doubles a thread would not fit in registers
      if (g.m > 64 && g.n > 64) {
        gemm_tiled_launch<GemmTileLarge>(space, g);
        return;
      }
    }
    gemm_tiled_launch<GemmTileMedium>(space, g);
  }
}

// The portable backend: the tiled kernel, except for matrix-vector products (n below 4) on host spaces, where
// staging a tile costs a CPU more than it saves (each staged element of op(A) is used once) and the reference
// kernel is several times faster. Either kernel gives the same bits.
template <class ExecSpace, class Scalar>
void gemm_portable(const ExecSpace& space, const BatchedGemm<Scalar>& g) {
  if (is_host_space<ExecSpace>() && g.n < 4) {
    gemm_portable_reference(space, g);
  } else {
    gemm_portable_tiled(space, g);
  }
}

#undef DPMLP_GEMM_UNROLL

}  // namespace detail
}  // namespace linalg
}  // namespace dpmlp

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
#include "dpmlp/backend/cuda/cublas.hpp"
#include "dpmlp/backend/cuda/cublaslt.hpp"
#include "dpmlp/backend/cuda/cutlass_3xtf32.hpp"
#endif

namespace dpmlp {
namespace linalg {

// The backend a space uses by default: eigen on host spaces; on CUDA the CUTLASS 3xTF32 kernels where CUTLASS
// was found (with cuBLAS), else the pinned cuBLASLt backend (both give a row bits that do not depend on the
// row or batch count, so they serve the reproducible reduction too); else the portable kernel.
template <class ExecSpace>
Backend default_backend(bool reproducible) {
  (void)reproducible;
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible) {
    return Backend::eigen;
  }
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
#if defined(DPMLP_HAVE_CUTLASS)
  if (std::is_same<ExecSpace, Kokkos::Cuda>::value) return Backend::cutlass;
#endif
  if (std::is_same<ExecSpace, Kokkos::Cuda>::value) return Backend::cublaslt;
#endif
  return Backend::portable;
}

// C = alpha op(A) op(B) + beta C on `backend`. Returns whether it also wrote g.column_sums (never where that is
// null); the caller sums B's columns itself where it did not.
template <class ExecSpace, class Scalar>
bool gemm(const ExecSpace& space, Backend backend, const BatchedGemm<Scalar>& g) {
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return false;
  switch (backend) {
    case Backend::eigen:
      if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible) {
        detail::gemm_eigen(space, g);
        return false;
      }
      break;
    case Backend::cublas:
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
      if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
        cublas::gemm(space, g);
        return false;
      }
#endif
      break;
    case Backend::portable:
      detail::gemm_portable(space, g);
      return false;
    case Backend::cutlass:
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
      if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value && std::is_same<Scalar, float>::value) {
        if (cutlass_3xtf32::takes(g)) {
          return cutlass_3xtf32::gemm(space, g);
        }
      }
#endif
      [[fallthrough]];
    case Backend::cublaslt:
      if (g.k == 0) {  // beta * C: nothing to pin
        detail::gemm_portable(space, g);
        return false;
      }
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
      if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
        cublaslt::gemm(space, g);
        return false;
      }
#endif
      break;
  }
  throw std::invalid_argument(std::string("dpmlp::linalg::gemm: backend '") + backend_name(backend) +
                              "' is not available for execution space " + ExecSpace::name());
}

// The 3xFP16 kernels' splits of several GEMMs' op(B) (`count` jobs in device memory, the largest op(B)
// max_n x max_k), ahead of those GEMMs and in one launch on `space`; each GEMM then takes its job's output as
// BatchedGemm::b_split (the same bits as its own split). A job's output holds gemm_workspace_bytes() of its
// GEMM, so there are jobs only where that is not 0: the cutlass backend's float GEMMs on CUDA.
template <class ExecSpace>
void split_b_ahead(const ExecSpace& space, Backend backend, const backend::f16x3_layout::SplitBJob* jobs, int count,
                   int max_n, int max_k) {
  if (count <= 0) return;
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    if (backend == Backend::cutlass) {
      cutlass_3xtf32::split_b_ahead(space, jobs, count, max_n, max_k);
      return;
    }
  }
#endif
  (void)space, (void)backend, (void)jobs, (void)max_n, (void)max_k;
  throw std::logic_error("dpmlp::linalg::split_b_ahead: jobs for a backend with no 3xFP16 kernels");
}

// The workspace (BatchedGemm::workspace) the backend makes use of for a GEMM of g's shape and options: 0 where
// it uses none. The cutlass backend's 3xFP16 kernels take one where every row shares op(B) (rows x weights).
template <class ExecSpace, class Scalar>
std::size_t gemm_workspace_bytes(const ExecSpace&, Backend backend, const BatchedGemm<Scalar>& g) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value && std::is_same<Scalar, float>::value) {
    if (backend == Backend::cutlass) return cutlass_3xtf32::f16x3_workspace_bytes(g);
  }
#endif
  (void)backend, (void)g;
  return 0;
}

// The GEMM, and where the backend can do it in the same pass, the bias (one value per column of C) added and
// the activation applied: C = activate(act, alpha op(A) op(B) + bias), the expression of the layered engine's
// own element-wise kernel. cutlass does it for any activation (where it takes the GEMM), cublaslt for relu and
// identity. Returns whether it did; if not, C holds the plain product and the caller adds the rest.
template <class ExecSpace, class Scalar>
bool gemm_with_bias(const ExecSpace& space, Backend backend, const BatchedGemm<Scalar>& g, const Scalar* bias,
                    Activation act) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
#if defined(DPMLP_HAVE_CUTLASS)
    if constexpr (std::is_same<Scalar, float>::value) {
      const cutlass_3xtf32::Epilogue e{cutlass_3xtf32::detail::Epi::bias_activation, bias, 0, act};
      if (backend == Backend::cutlass && cutlass_3xtf32::takes(g, e)) {
        cutlass_3xtf32::gemm(space, g, e);
        return true;
      }
    }
#endif
    // The bias pointer's alignment is the model's layout's, the same on every rank.
    if ((backend == Backend::cublaslt || backend == Backend::cutlass) && act != Activation::tanh && g.batch == 1 &&
        !g.blocks && g.k > 0 && g.m > 0 && g.n > 0 && reinterpret_cast<std::uintptr_t>(bias) % 16 == 0) {
      cublaslt::gemm(space, g, act == Activation::relu ? cublaslt::Epilogue::relu_bias : cublaslt::Epilogue::bias,
                     bias);
      return true;
    }
  }
#endif
  (void)bias, (void)act;
  gemm(space, backend, g);
  return false;
}

// The same with relu (true) or identity (false).
template <class ExecSpace, class Scalar>
bool gemm_with_bias(const ExecSpace& space, Backend backend, const BatchedGemm<Scalar>& g, const Scalar* bias,
                    bool relu) {
  return gemm_with_bias(space, backend, g, bias, relu ? Activation::relu : Activation::identity);
}

// The GEMM, and where the backend can do it in the same pass (cutlass), C multiplied element-wise by the
// activation's derivative, read from the activation's outputs Y (same shape as C, leading dimension ld_y):
// C = (alpha op(A) op(B)) * activate_grad_from_output(act, Y), the layered engine's back-propagation step.
// Returns whether it did; if not, C holds the plain product.
template <class ExecSpace, class Scalar>
bool gemm_with_activation_grad(const ExecSpace& space, Backend backend, const BatchedGemm<Scalar>& g, const Scalar* y,
                               std::int64_t ld_y, Activation act) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value && std::is_same<Scalar, float>::value) {
    const cutlass_3xtf32::Epilogue e{cutlass_3xtf32::detail::Epi::activation_grad, y, ld_y, act};
    if (backend == Backend::cutlass && cutlass_3xtf32::takes(g, e)) {
      cutlass_3xtf32::gemm(space, g, e);
      return true;
    }
  }
#endif
  (void)y, (void)ld_y, (void)act;
  gemm(space, backend, g);
  return false;
}

}  // namespace linalg
}  // namespace dpmlp
