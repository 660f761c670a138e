// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/cutlass_3xtf32_kernels.hpp: the CUTLASS kernels behind cutlass_3xtf32::gemm() (see
// cutlass_3xtf32.hpp for what they compute and why their bits do not depend on the row or block count).
// Included by cutlass_3xtf32.hpp where backend/cuda/entry.hpp says the kernels are compiled.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/device/gemm_universal.h>

#include "dpmlp/backend/cuda/cutlass_3xtf32.hpp"
#include "dpmlp/backend/cuda/device.hpp"
#include "dpmlp/backend/cuda/gemm_f16x3_kernels.hpp"
#include "dpmlp/backend/cuda/kernel_gemm.hpp"
#include "dpmlp/errors.hpp"
#if defined(DPMLP_HAVE_WGMMA)
#include "dpmlp/backend/cuda/wgmma_3xtf32.hpp"
#endif

namespace dpmlp {
namespace linalg {
namespace cutlass_3xtf32 {
namespace detail {

// The fused epilogues (Epi::bias_activation, Epi::activation_grad), one type each, chosen at compile time: a
// runtime choice among them in one epilogue type makes the width-64 GEMMs of a deep model several percent slower.
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
  Activation act = Activation::identity;
};

// A batch runs on a grid dimension of at most 65535 entries a launch (CUTLASS's z, the wgmma kernels' y):
// f(part, first) for each run of at most that many entries, part the GEMM of entries [first, first +
// part.batch). The entries are independent, so chunking changes no bits, and what runs here never depends on
// the batch count.
template <class F>
void in_launch_chunks(const BatchedGemm<float>& g, F&& f) {
  constexpr std::int64_t most = 65535;
  for (std::int64_t first = 0; first < g.batch; first += most) {
    BatchedGemm<float> part = g;
    part.batch = g.batch - first < most ? g.batch - first : most;
    part.a = g.a + first * g.stride_a;
    part.b = g.b + first * g.stride_b;
    part.c = g.c + first * g.stride_c;
    f(part, first);
  }
}

template <class K>
void launch_chunk(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Source& src);

template <class K>
void launch(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Source& src) {
  in_launch_chunks(g, [&](const BatchedGemm<float>& part, std::int64_t first) {
    Source s = src;
    if (s.ptr != nullptr) s.ptr += first * s.stride;
    launch_chunk<K>(space, part, s);
  });
}

template <class K>
void launch_chunk(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Source& src) {
  using Gemm = typename K::Gemm;
  typename Gemm::Arguments args(cutlass::gemm::GemmUniversalMode::kBatched, cutlass::gemm::GemmCoord(g.m, g.n, g.k),
                                static_cast<int>(g.batch), K::Epilogue::params(g.alpha, g.beta, src.act), g.a, g.b,
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
void rows_kernel(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Source& src) {
  if (g.m < 16384) {
    launch<Kernel<Row, LayoutB, 4, 64, 64, 32, 32, 3, E>>(space, g, src);
  } else if (g.n >= 128) {
    launch<Kernel<Row, LayoutB, 4, 128, 128, 32, 64, 4, E>>(space, g, src);
  } else {
    launch<Kernel<Row, LayoutB, 4, 128, 64, 64, 32, 4, E>>(space, g, src);
  }
}

// dpmlp's own kernels (wgmma, 3xFP16): what C gets, and the parameters of one launch's part of g.
inline kernel_gemm::Out kernel_out(const Epilogue& e) {
  return e.kind == Epi::bias_activation   ? kernel_gemm::Out::bias_activation
         : e.kind == Epi::activation_grad ? kernel_gemm::Out::activation_grad
                                          : kernel_gemm::Out::linear;
}
inline void kernel_params(kernel_gemm::Params& p, const BatchedGemm<float>& g, const BatchedGemm<float>& part,
                          const Epilogue& e) {
  p.m = part.m, p.n = part.n, p.k = part.k;
  p.a = part.a, p.lda = part.lda, p.stride_a = part.stride_a;
  p.b = part.b, p.ldb = part.ldb, p.stride_b = part.stride_b;
  p.c = part.c, p.ldc = part.ldc, p.stride_c = part.stride_c;
  p.alpha = part.alpha, p.beta = part.beta;
  p.src = e.src, p.src_ld = e.ld, p.act = e.act;  // fused epilogues: one batch entry
  p.pairs = !g.blocks && g.ldc % 2 == 0 && reinterpret_cast<std::uintptr_t>(g.c) % 8 == 0 &&
            (g.batch == 1 || g.stride_c % 2 == 0);
}

#if defined(DPMLP_HAVE_WGMMA)
inline void wgmma_gemm(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Epilogue& e) {
  namespace w = wgmma_3xtf32;
  const w::Out out = kernel_out(e);
  in_launch_chunks(g, [&](const BatchedGemm<float>& part, std::int64_t) {
    w::Params p;
    kernel_params(p, g, part, e);
    const cudaError_t s =
        w::gemm(space.cuda_stream(), p, static_cast<int>(part.batch), g.op_a == Op::N, g.op_b == Op::T, out);
    if (s != cudaSuccess) {
      throw CommError(std::string("dpmlp: wgmma 3xTF32 GEMM (") + std::to_string(g.m) + " x " +
                      std::to_string(g.n) + " x " + std::to_string(g.k) + ", batch " + std::to_string(g.batch) +
                      "): " + cudaGetErrorString(s));
    }
  });
}
#endif

// The block-scaled 3xFP16 kernels (gemm_f16x3_kernels.hpp): large tiles where they still give every
// multiprocessor a tile, as for CUTLASS's kernels, and the device lets a CTA have their shared memory (the
// tile changes no bits).
inline bool f16x3_gemm(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Epilogue& e) {
  namespace f = gemm_f16x3;
  const f::Out out = kernel_out(e);
  const std::int64_t large_tiles = g.batch * ((g.m + 127) / 128) * ((g.n + 127) / 128);
  const backend::CudaDevice& d = backend::cuda_device();
  const bool large = g.m >= 128 && g.n >= 128 && large_tiles >= d.sms && (g.op_a == Op::T || g.m >= 16384) &&
                     d.smem_optin >= f::smem_bytes(true);
  // op(B) split once, into the workspace, where every row shares it and the workspace holds it.
  const std::size_t split_bytes = f16x3_workspace_bytes(g);
  const unsigned char* b_split = nullptr;
  if (split_bytes > 0 && g.b_split != nullptr) {
    b_split = static_cast<const unsigned char*>(g.b_split);  // split ahead (split_b_ahead)
  } else if (split_bytes > 0 && g.workspace != nullptr && g.workspace_bytes >= split_bytes &&
             aligned16(g.workspace)) {
    const cudaError_t s = f::split_b(space.cuda_stream(), g.b, g.ldb, g.n, g.k, g.op_b == Op::T,
                                     static_cast<unsigned char*>(g.workspace));
    if (s != cudaSuccess) throw CommError(std::string("dpmlp: 3xFP16 GEMM, splitting B: ") + cudaGetErrorString(s));
    b_split = static_cast<const unsigned char*>(g.workspace);
  }
#if defined(DPMLP_HAVE_F16X3_WGMMA)
  // Hopper: the GEMMs whose planes are wgmma's layouts (rows x weights with op(B) split beforehand or op T;
  // T N) in the kernels' wgmma form (the same splits, products and order of sums).
  const bool on_wgmma =
      (g.op_a == Op::N ? b_split != nullptr || g.op_b == Op::T : g.op_b == Op::N) && f16x3_wgmma_here();
#endif
  // T N: the bias gradients (B's column sums) beside the weight gradients, in the same kernels.
  const bool column_sums = g.column_sums != nullptr && g.op_a == Op::T && g.op_b == Op::N;
  in_launch_chunks(g, [&](const BatchedGemm<float>& part, std::int64_t first) {
    f::Params p;
    kernel_params(p, g, part, e);
    p.b_split = b_split;
    if (column_sums) p.colsum = g.column_sums + first * g.stride_c;
    const int batch = static_cast<int>(part.batch);
    const bool a_n = g.op_a == Op::N, b_t = g.op_b == Op::T;
#if defined(DPMLP_HAVE_F16X3_WGMMA)  // (gemm_wgmma exists only there: not named at all elsewhere)
    const cudaError_t s = on_wgmma ? f::gemm_wgmma(space.cuda_stream(), p, batch, a_n, b_t, out, large)
                                   : f::gemm(space.cuda_stream(), p, batch, a_n, b_t, out, large);
#else
    const cudaError_t s = f::gemm(space.cuda_stream(), p, batch, a_n, b_t, out, large);
#endif
    if (s != cudaSuccess) {
      throw CommError(std::string("dpmlp: 3xFP16 GEMM (") + std::to_string(g.m) + " x " + std::to_string(g.n) +
                      " x " + std::to_string(g.k) + ", batch " + std::to_string(g.batch) +
                      "): " + cudaGetErrorString(s));
    }
  });
  return column_sums;
}

}  // namespace detail

DPMLP_CUDA_ENTRY bool f16x3_here() {
  const backend::CudaDevice& d = backend::cuda_device();
  return d.read && d.major >= 8 && d.smem_optin >= gemm_f16x3::smem_bytes(false);
}

DPMLP_CUDA_ENTRY bool wgmma_here() {
#if defined(DPMLP_HAVE_WGMMA)
  return backend::sm90a_device();
#else
  return false;
#endif
}

DPMLP_CUDA_ENTRY bool f16x3_wgmma_here() {
#if defined(DPMLP_HAVE_F16X3_WGMMA)
  return backend::sm90a_device() && f16x3_here();
#else
  return false;
#endif
}

DPMLP_CUDA_ENTRY void split_b_ahead(const Kokkos::Cuda& space, const backend::f16x3_layout::SplitBJob* jobs,
                                    int count, int max_n, int max_k) {
  const cudaError_t s = gemm_f16x3::split_b_jobs(space.cuda_stream(), jobs, count, max_n, max_k);
  if (s != cudaSuccess) throw CommError(std::string("dpmlp: 3xFP16 GEMMs, splitting B ahead: ") + cudaGetErrorString(s));
}

DPMLP_CUDA_ENTRY bool gemm(const Kokkos::Cuda& space, const BatchedGemm<float>& g, const Epilogue& e) {
  using namespace detail;
  if (!takes(g, e)) throw std::logic_error("dpmlp::linalg::cutlass_3xtf32::gemm: a GEMM it does not take");
#if defined(DPMLP_HAVE_WGMMA)
  if (runs_on_wgmma(g)) {
    wgmma_gemm(space, g, e);
    return false;
  }
#endif
  if (runs_on_f16x3(g)) return f16x3_gemm(space, g, e);
  Source src;
  src.act = e.act;
  switch (e.kind) {
    case Epi::linear: src.ptr = g.c, src.ld = g.ldc, src.stride = g.stride_c; break;
    case Epi::bias_activation: src.ptr = e.src; break;  // ld and stride 0: the same row for every row
    case Epi::activation_grad: src.ptr = e.src, src.ld = e.ld; break;
  }
  if (g.op_a == Op::T) {
    // Per-block weight gradients: n_in x n_out outputs a block, k the block's rows; C element by element.
    // Large tiles where they still give every multiprocessor a tile (few long blocks, as in a mini-batch,
    // would leave most of them idle).
    // At most 32 rows of C (a first layer's inputs) over few blocks (a mini-batch): 32 x 32 tiles of two warps,
    // twice the CTAs of half-empty 64 x 64 ones. The tile shape changes no bits (only k-tiles would).
    const std::int64_t large_tiles = g.batch * ((g.m + 127) / 128) * ((g.n + 127) / 128);
    const std::int64_t tiles64 = g.batch * ((g.m + 63) / 64) * ((g.n + 63) / 64);
    if (g.m >= 128 && g.n >= 128 && large_tiles >= backend::cuda_device().sms) {
      launch<Kernel<Col, Row, 1, 128, 128, 32, 64, 4, Epi::linear>>(space, g, src);
    } else if (g.m <= 32 && tiles64 < 4 * std::int64_t(backend::cuda_device().sms)) {
      launch<Kernel<Col, Row, 1, 32, 32, 16, 32, 3, Epi::linear>>(space, g, src);
    } else {
      launch<Kernel<Col, Row, 1, 64, 64, 32, 32, 3, Epi::linear>>(space, g, src);
    }
  } else if (g.op_b == Op::T) {
    if (e.kind == Epi::activation_grad) rows_kernel<Col, Epi::activation_grad>(space, g, src);
    else rows_kernel<Col, Epi::linear>(space, g, src);
  } else {
    if (e.kind == Epi::bias_activation) rows_kernel<Row, Epi::bias_activation>(space, g, src);
    else rows_kernel<Row, Epi::linear>(space, g, src);
  }
  return false;
}

}  // namespace cutlass_3xtf32
}  // namespace linalg
}  // namespace dpmlp
