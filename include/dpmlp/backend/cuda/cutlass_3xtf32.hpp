// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/cutlass_3xtf32.hpp: the tensor-core backend of dpmlp::linalg::gemm for float on
// Kokkos::Cuda (linalg::Backend::cutlass): CUTLASS GEMMs in 3xTF32 (each operand split into a TF32 "big" part
// and a TF32 remainder, three tensor-core products per term: big*big + big*small + small*big, accumulated in
// FP32), which is as accurate as FP32 and several times its speed on the tensor cores.
//
// Reproducible bits: every CUTLASS kernel here sums an output element over k in the same order, whatever the
// free dimension, the batch count or the tile: one threadblock per output tile (no split-K, no stream-K),
// k-tiles of 16 in increasing order (the partial tile, where k is not a multiple of 16, first), each the same
// two m16n8k8 steps. So a row's bits (a block's, for per-block weight gradients) do not depend on how many rows
// or blocks a rank has, nor on the tile shape, which may then follow the rows (test_mlp checks both on the
// GPU). The wgmma kernels that take a Hopper GPU's GEMMs of n >= 64 where they are compiled
// (wgmma_3xtf32_kernels.hpp) keep the same property by their own fixed order.
//
// What runs here: float; op(A) op(B) as N N (forward: rows x weights), N T (delta: rows x weights^T) or T N
// (per-block weight gradients: rows^T x deltas); the contiguous dimension of A and B a multiple of 4 elements,
// their pointers 16-byte aligned and their leading dimensions and batch strides multiples of 4 (the kernels'
// vector loads). C is written with vector stores where it is aligned likewise, except for batches of blocks
// (per-block weight gradients), whose C rows sit at a rank's own offsets in the partial sums and are always
// written element by element. takes() says whether a GEMM runs here; linalg::gemm sends the rest to the
// pinned cuBLASLt backend. Every property takes() reads is the same on every rank (shapes, the model's and
// dpmlp's own buffers, the trainer's aligned x).
//
// This header is what the library's code sees: which GEMMs run here (takes()) and the entry point gemm(). The
// kernels behind it are in cutlass_3xtf32_kernels.hpp, compiled where backend/cuda/entry.hpp says: in every
// translation unit that calls gemm() (header-only), or once, in the dpmlp_cuda_kernels library.
//
// Include dpmlp/linalg/gemm.hpp rather than this header: it includes this one after BatchedGemm.
#pragma once

#include "dpmlp/kokkos_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)

#include <cstdint>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/entry.hpp"
#include "dpmlp/backend/cuda/f16x3_layout.hpp"

namespace dpmlp {
namespace linalg {
namespace cutlass_3xtf32 {
namespace detail {

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// The epilogues: C = alpha * acc (+ beta * C), or the layered engine's element-wise work in the GEMM's pass,
// with the expressions of its own element-wise kernels (so the bits are those of the GEMM and then the kernel):
//   bias_activation: C = activate(act, acc + bias[column])   (the source: the bias, leading dimension 0)
//   activation_grad: C = acc * activate_grad_from_output(act, Y)   (the source: the layer's outputs Y)
enum class Epi { linear, bias_activation, activation_grad };

}  // namespace detail

// What the GEMM's pass adds (detail::Epi): `src` the bias (bias_activation) or the activations Y with leading
// dimension `ld` (activation_grad).
struct Epilogue {
  detail::Epi kind = detail::Epi::linear;
  const float* src = nullptr;
  std::int64_t ld = 0;
  Activation act = Activation::identity;
};

// Whether g, with epilogue e, runs on this backend.
inline bool takes(const BatchedGemm<float>& g, const Epilogue& e = Epilogue()) {
  using detail::aligned16;
  using detail::Epi;
  const bool a_t = g.op_a == Op::T, b_t = g.op_b == Op::T;
  if ((a_t && b_t) || (g.blocks && !(a_t && !b_t))) return false;
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return false;
  // The contiguous dimension of each operand: k for row-major A (op N), m for A stored k x m (op T); n for
  // row-major B, k for B stored n x k (op T).
  const int a_contig = a_t ? g.m : g.k, b_contig = b_t ? g.k : g.n;
  const auto four = [](std::int64_t v) { return v % 4 == 0; };
  if (!four(a_contig) || !four(b_contig) || !four(g.lda) || !four(g.ldb) || !aligned16(g.a) || !aligned16(g.b)) {
    return false;
  }
  if (g.batch > 1 && (!four(g.stride_a) || !four(g.stride_b))) return false;
  // C: batches of blocks are written element by element; rows with vector stores, so aligned alike.
  if (!g.blocks && (a_t || !four(g.n) || !four(g.ldc) || !aligned16(g.c) || (g.batch > 1 && !four(g.stride_c)))) {
    return false;
  }
  if (e.kind != Epi::linear) {
    // The fused epilogues: rows x weights, one GEMM, alpha 1, no old C; the source aligned like C.
    const bool layout = e.kind == Epi::bias_activation ? !b_t : b_t;
    if (!layout || a_t || g.batch != 1 || g.alpha != 1.0f || g.beta != 0.0f || !aligned16(e.src)) return false;
    if (e.kind == Epi::activation_grad && !four(e.ld)) return false;
  }
  return true;
}

// Whether the GEMMs of n >= 64 run on dpmlp's wgmma 3xTF32 kernels (backend/cuda/wgmma_3xtf32.hpp) here:
// the kernels compiled (DPMLP_HAVE_WGMMA, in dpmlp_cuda_kernels) and the device of compute capability 9.0.
// Their bits differ from CUTLASS's kernels', so the plan records it (EnginePlan::gemm_wgmma).
DPMLP_CUDA_ENTRY bool wgmma_here();

// Whether g (one that takes() accepts) runs on the wgmma 3xTF32 kernels rather than CUTLASS's: where they run at
// all, at n >= 64 (a narrower n would leave most of a 64-column MMA idle), unless g asks for the 3xFP16 kernels
// (whose wgmma form then takes it, runs_on_f16x3). Decided from the request, the shape and the device only,
// never from m or the batch count, so every rank picks the same kernels for the same GEMM.
inline bool runs_on_wgmma(const BatchedGemm<float>& g) { return g.n >= 64 && !g.f16x3 && wgmma_here(); }

// Whether dpmlp's block-scaled 3xFP16 kernels (gemm_f16x3_kernels.hpp; experimental) can run here: a device of
// compute capability 8.0 or newer that lets a CTA have the small tile's shared memory (81 KB; the large tile,
// 162 KB, runs where it fits).
DPMLP_CUDA_ENTRY bool f16x3_here();

// Whether their wgmma form (gemm_f16x3::gemm_wgmma) runs here: compiled (DPMLP_HAVE_F16X3_WGMMA, in
// dpmlp_cuda_kernels, on CUDA builds for Hopper) and the device of compute capability 9.0; it then takes the
// 3xFP16 GEMMs whose planes are the layouts wgmma reads. The plan records it (EnginePlan::gemm_wgmma).
DPMLP_CUDA_ENTRY bool f16x3_wgmma_here();

// Whether g (one that takes() accepts) runs on them: where it asks to (BatchedGemm::f16x3, which the layered
// engine sets from EnginePlan::gemm_f16x3: their bits differ from CUTLASS's), at n >= 64. Decided from the
// request, n and the device only, never from m or the batch count.
inline bool runs_on_f16x3(const BatchedGemm<float>& g) { return g.f16x3 && g.n >= 64 && f16x3_here(); }

// Whether the 3xFP16 kernels split g's op(B) once, into g.workspace, rather than in every CTA (the same bits):
// where every row shares it (op(A) N: rows x weights, one B for the whole batch), its k-tiles fit one launch's
// grid (65535) and the workspace holds it.
inline bool f16x3_splits_b(const BatchedGemm<float>& g) {
  return g.op_a == Op::N && (g.batch == 1 || g.stride_b == 0) && (g.k + 31) / 32 <= 65535;
}
inline std::size_t f16x3_workspace_bytes(const BatchedGemm<float>& g) {
  return f16x3_splits_b(g) && runs_on_f16x3(g)
             ? static_cast<std::size_t>(backend::f16x3_layout::split_b_bytes(g.n, g.k))
             : 0;
}

// The 3xFP16 kernels' split of several GEMMs' op(B) in one launch (linalg::split_b_ahead).
DPMLP_CUDA_ENTRY void split_b_ahead(const Kokkos::Cuda& space, const backend::f16x3_layout::SplitBJob* jobs,
                                    int count, int max_n, int max_k);

// C = alpha op(A) op(B) (+ beta C), or with a fused epilogue (Epilogue). Only for GEMMs takes() accepts.
// Returns whether it also wrote g.column_sums (T N on the 3xFP16 kernels).
DPMLP_CUDA_ENTRY bool gemm(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Epilogue& e = Epilogue());

}  // namespace cutlass_3xtf32
}  // namespace linalg
}  // namespace dpmlp

#if defined(DPMLP_CUDA_KERNELS_HERE)
#include "dpmlp/backend/cuda/cutlass_3xtf32_kernels.hpp"
#endif

#endif
