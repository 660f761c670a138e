// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/cutlass_3xtf32.hpp: the tensor-core backend of dpmlp::linalg::gemm for float on
// Kokkos::Cuda (linalg::Backend::cutlass): CUTLASS GEMMs in 3xTF32 (each operand split into a TF32 "big" part
// and a TF32 remainder, three tensor-core products per term: big*big + big*small + small*big, accumulated in
// FP32), which is as accurate as FP32 and several times its speed on the tensor cores.
//
// Reproducible bits: every kernel here sums an output element over k in the same order, whatever the free
// dimension, the batch count or the tile: one threadblock per output tile (no split-K, no stream-K), k-tiles
// of 16 in increasing order (the partial tile, where k is not a multiple of 16, first), each the same two
// m16n8k8 steps. So a row's bits (a block's, for per-block weight gradients) do not depend on how many rows or
// blocks a rank has, nor on the tile shape, which may then follow the rows (test_mlp checks both on the GPU).
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
// Include dpmlp/linalg/gemm.hpp rather than this header: it includes this one after BatchedGemm.
#pragma once

#include "dpmlp/kokkos_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/device/gemm_universal.h>

#include "dpmlp/activation.hpp"
#include "dpmlp/errors.hpp"

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

template <int Count, Epi E>
class ActivationEpilogue : public cutlass::epilogue::thread::LinearCombination<float, Count, float, float> {
 public:
  using Base = cutlass::epilogue::thread::LinearCombination<float, Count, float, float>;
  using FragmentOutput = typename Base::FragmentOutput;
  using FragmentSource = typename Base::FragmentSource;
  using FragmentAccumulator = typename Base::FragmentAccumulator;
  struct Params : Base::Params {
    Activation act = Activation::identity;
    CUTLASS_HOST_DEVICE Params() {}
    CUTLASS_HOST_DEVICE explicit Params(Activation a) : Base::Params(1.0f, 1.0f), act(a) {}
  };
  CUTLASS_HOST_DEVICE explicit ActivationEpilogue(const Params& p) : Base(p), act_(p.act) {}
  CUTLASS_HOST_DEVICE bool is_source_needed() const { return true; }
  CUTLASS_HOST_DEVICE FragmentOutput operator()(const FragmentAccumulator& acc, const FragmentSource& src) const {
    FragmentOutput out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Count; ++i) {
      if constexpr (E == Epi::bias_activation) {
        out[i] = dpmlp::detail::activate(act_, acc[i] + src[i]);
      } else {
        out[i] = acc[i] * dpmlp::detail::activate_grad_from_output(act_, src[i]);
      }
    }
    return out;
  }
  // Not called (the source is always needed); here for the interface.
  CUTLASS_HOST_DEVICE FragmentOutput operator()(const FragmentAccumulator& acc) const {
    FragmentOutput out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Count; ++i) out[i] = acc[i];
    return out;
  }

 private:
  Activation act_;
};

template <int AlignC, Epi E>
struct EpilogueOf {
  using type = ActivationEpilogue<AlignC, E>;
  static typename type::Params params(float, float, Activation act) { return typename type::Params(act); }
};
template <int AlignC>
struct EpilogueOf<AlignC, Epi::linear> {
  using type = cutlass::epilogue::thread::LinearCombination<float, AlignC, float, float>;
  static typename type::Params params(float alpha, float beta, Activation) { return typename type::Params(alpha, beta); }
};

// One kernel: layouts of A and B, C's vector width, the tile (threadblock and warp shapes; k is 16 in all),
// the pipeline depth and the epilogue.
template <class LayoutA, class LayoutB, int AlignC, int TM, int TN, int WM, int WN, int Stages, Epi E>
struct Kernel {
  using Epilogue = EpilogueOf<AlignC, E>;
  using Gemm = cutlass::gemm::device::GemmUniversal<
      float, LayoutA, float, LayoutB, float, cutlass::layout::RowMajor, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, cutlass::gemm::GemmShape<TM, TN, 16>, cutlass::gemm::GemmShape<WM, WN, 16>,
      cutlass::gemm::GemmShape<16, 8, 8>, typename Epilogue::type,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>, Stages, 4, 4, cutlass::arch::OpMultiplyAddFastF32>;
};

// The epilogue's source operand: the old C (linear, read where beta != 0), the bias broadcast over the rows
// (leading dimension and batch stride 0), or the activations Y.
struct Source {
  const float* ptr = nullptr;
  std::int64_t ld = 0, stride = 0;
};

// A batch runs on the grid's z dimension, at most 65535 entries a launch: longer batches go in chunks (the
// entries are independent, so chunking changes no bits, and what runs here never depends on the batch count).
template <class K>
void launch_chunk(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Source& src, Activation act);

template <class K>
void launch(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Source& src, Activation act) {
  constexpr std::int64_t most = 65535;
  if (g.batch <= most) {
    launch_chunk<K>(space, g, src, act);
    return;
  }
  for (std::int64_t first = 0; first < g.batch; first += most) {
    BatchedGemm<float> part = g;
    part.batch = g.batch - first < most ? g.batch - first : most;
    part.a = g.a + first * g.stride_a;
    part.b = g.b + first * g.stride_b;
    part.c = g.c + first * g.stride_c;
    Source s = src;
    if (s.ptr != nullptr) s.ptr += first * s.stride;
    launch_chunk<K>(space, part, s, act);
  }
}

template <class K>
void launch_chunk(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Source& src, Activation act) {
  using Gemm = typename K::Gemm;
  typename Gemm::Arguments args(cutlass::gemm::GemmUniversalMode::kBatched, cutlass::gemm::GemmCoord(g.m, g.n, g.k),
                                static_cast<int>(g.batch), K::Epilogue::params(g.alpha, g.beta, act), g.a, g.b,
                                src.ptr, g.c, g.stride_a, g.stride_b, src.stride, g.stride_c, g.lda, g.ldb, src.ld,
                                g.ldc);
  Gemm op;
  cutlass::Status s = op.can_implement(args);
  if (s == cutlass::Status::kSuccess) s = op.initialize(args, nullptr, space.cuda_stream());
  if (s == cutlass::Status::kSuccess) s = op.run(space.cuda_stream());
  if (s != cutlass::Status::kSuccess) {
    throw CommError(std::string("dpmlp: CUTLASS 3xTF32 GEMM (") + std::to_string(g.m) + " x " + std::to_string(g.n) +
                    " x " + std::to_string(g.k) + ", batch " + std::to_string(g.batch) +
                    "): " + cutlass::cutlassGetStatusString(s));
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw CommError(std::string("dpmlp: CUTLASS 3xTF32 GEMM launch: ") + cudaGetErrorString(e));
}

using Row = cutlass::layout::RowMajor;
using Col = cutlass::layout::ColumnMajor;

// Rows x weights (op N N or N T) with epilogue E: small tiles for fewer rows than fill the GPU with large ones
// (a mini-batch), else the tile from n.
template <class LayoutB, Epi E>
void rows_kernel(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Source& src, Activation act) {
  if (g.m < 16384) {
    launch<Kernel<Row, LayoutB, 4, 64, 64, 32, 32, 3, E>>(space, g, src, act);
  } else if (g.n >= 128) {
    launch<Kernel<Row, LayoutB, 4, 128, 128, 32, 64, 4, E>>(space, g, src, act);
  } else {
    launch<Kernel<Row, LayoutB, 4, 128, 64, 64, 32, 4, E>>(space, g, src, act);
  }
}

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

// C = alpha op(A) op(B) (+ beta C), or with a fused epilogue (Epilogue). Only for GEMMs takes() accepts.
inline void gemm(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Epilogue& e = Epilogue()) {
  using namespace detail;
  if (!takes(g, e)) throw std::logic_error("dpmlp::linalg::cutlass_3xtf32::gemm: a GEMM it does not take");
  Source src;
  switch (e.kind) {
    case Epi::linear: src.ptr = g.c, src.ld = g.ldc, src.stride = g.stride_c; break;
    case Epi::bias_activation: src.ptr = e.src; break;  // ld and stride 0: the same row for every row
    case Epi::activation_grad: src.ptr = e.src, src.ld = e.ld; break;
  }
  if (g.op_a == Op::T) {
    // Per-block weight gradients: n_in x n_out outputs a block, k the block's rows; C element by element.
    if (g.m >= 128 && g.n >= 128) {
      launch<Kernel<Col, Row, 1, 128, 128, 32, 64, 4, Epi::linear>>(space, g, src, e.act);
    } else {
      launch<Kernel<Col, Row, 1, 64, 64, 32, 32, 3, Epi::linear>>(space, g, src, e.act);
    }
  } else if (g.op_b == Op::T) {
    if (e.kind == Epi::activation_grad) rows_kernel<Col, Epi::activation_grad>(space, g, src, e.act);
    else rows_kernel<Col, Epi::linear>(space, g, src, e.act);
  } else {
    if (e.kind == Epi::bias_activation) rows_kernel<Row, Epi::bias_activation>(space, g, src, e.act);
    else rows_kernel<Row, Epi::linear>(space, g, src, e.act);
  }
}

}  // namespace cutlass_3xtf32
}  // namespace linalg
}  // namespace dpmlp

#endif
