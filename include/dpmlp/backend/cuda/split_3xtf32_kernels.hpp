// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/split_3xtf32_kernels.hpp: the kernels behind split_3xtf32::launch()
// (split_3xtf32.hpp), compiled once, in src/cuda_split.cu, for sm_90a.
//
// A TF32 GEMM over k' = 3k: B' holds per k-tile [B | B_lo | B] (linalg::SplitWeights), and the producer warp
// loads A's k-tile t / 3 by TMA from A (t % 3 < 2) or A_lo (t % 3 == 2), so the k'-tiles are the three
// products of linalg/split_gemm.hpp in its order. The mainloop is CUTLASS's FP8 one (its "promotion"): each
// k'-tile's four MMAs sum in a fresh accumulator, added to the fp32 sum on the CUDA cores. A wgmma cuts its
// sum toward zero; summing 32 products a time keeps that error at the SM80 3xTF32 kernels' level.
//
// Bits: one CTA an output tile (the persistent scheduler: no split-K, no stream-K), k'-tiles in order, so a
// row's bits do not depend on the rows around it or on the tile shape (test_mlp, "split GEMM: ...", checks
// both on an H100/H200).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "dpmlp/linalg/split_gemm.hpp"

namespace dpmlp {
namespace linalg {
namespace split_3xtf32 {

namespace detail {
using namespace cute;

// CUTLASS's FP8 mainloop (promotion) with the producer's A descriptor chosen per k-tile: k' tile t reads A's
// k-tile t / 3 from A (t % 3 < 2) or A_lo (t % 3 == 2).
template <class Base>
struct Mainloop : Base {
  using typename Base::ElementA;
  using typename Base::ElementB;
  using typename Base::GmemTiledCopyA;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::StrideA;
  using typename Base::StrideB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
  static_assert(size(ClusterShape{}) == 1, "one CTA a cluster");
  static_assert(size<2>(TileShape{}) == split_tile_k, "k-tiles of split_tile_k");

  struct Arguments {
    ElementA const* ptr_A;
    ElementA const* ptr_A_lo;
    StrideA dA;
    ElementB const* ptr_B;
    StrideB dB;
    std::uint32_t mma_promotion_interval = 4;
  };
  struct Params : Base::Params {
    typename Base::Params::TMA_A tma_load_a_lo;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void* workspace) {
    auto [M, N, K3, L] = append<4>(problem_shape, 1);
    typename Base::Arguments b{args.ptr_A, args.dA, args.ptr_B, args.dB, args.mma_promotion_interval};
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(make_shape(M, N, K3, L), b, workspace);
    // A's descriptors over its real k columns (the base made one over 3k, which would read past them).
    auto layout = make_layout(make_shape(M, K3 / 3, L), args.dA);
    auto smem = SmemLayoutA{}(_, _, cute::Int<0>{});
    p.tma_load_a =
        make_tma_copy_A_sm90(GmemTiledCopyA{}, make_tensor(args.ptr_A, layout), smem, TileShape{}, ClusterShape{});
    p.tma_load_a_lo =
        make_tma_copy_A_sm90(GmemTiledCopyA{}, make_tensor(args.ptr_A_lo, layout), smem, TileShape{}, ClusterShape{});
    return p;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto [M, N, K3, L] = append<4>(problem_shape, 1);
    typename Base::Arguments b{args.ptr_A, args.dA, args.ptr_B, args.dB, args.mma_promotion_interval};
    return K3 % (3 * split_tile_k) == 0 && Base::can_implement(problem_shape, b);
  }
  // The FP8 mainloop adds each k-tile's sum into `accum` and never clears it, and the persistent kernels
  // hand it a fresh, uninitialized fragment for every tile: cleared here, so no tile starts from another's sum.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& params) {
    cute::clear(accum);
    Base::mma(pipeline, smem_pipe_read, accum, k_tile_count, thread_idx, shared_tensors, params);
  }
  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
    cute::prefetch_tma_descriptor(p.tma_load_a_lo.get_tma_descriptor());
  }
  // (A over k' for the kernel's k-tile count, B over k', A over its k columns for the loads)
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem_shape_MNKL, Params const& p) const {
    using X = Underscore;
    auto [M, N, K3, L] = problem_shape_MNKL;
    Tensor a_virtual = p.tma_load_a.get_tma_tensor(make_shape(M, K3, L));
    Tensor a = p.tma_load_a.get_tma_tensor(make_shape(M, K3 / 3, L));
    Tensor b = p.tma_load_b.get_tma_tensor(make_shape(N, K3, L));
    return cute::make_tuple(local_tile(a_virtual, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{}),
                            local_tile(b, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{}),
                            local_tile(a, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{}));
  }
  template <class LoadInputs, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           LoadInputs const& load_inputs, BlockCoord const& blk_coord, KTileIterator k_tile_iter,
                           int k_tile_count, int, std::uint32_t, TensorStorage& shared_tensors) {
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    auto tma_a = p.tma_load_a.get_slice(0);
    auto tma_b = p.tma_load_b.get_slice(0);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor tAgA = tma_a.partition_S(get<2>(load_inputs)(_, _, m_coord, _, l_coord));
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBgB = tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, l_coord));
    Tensor tBsB = tma_b.partition_D(sB);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      const int t = *k_tile_iter;
      const auto& tma = t % 3 == 2 ? p.tma_load_a_lo : p.tma_load_a;
      copy(tma.with(*barrier, 0), tAgA(_, _, _, t / 3), tAsA(_, _, _, stage));
      copy(p.tma_load_b.with(*barrier, 0), tBgB(_, _, _, t), tBsB(_, _, _, stage));
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }
};

// The epilogue, element by element from the accumulator fragment (the pattern of CUTLASS's DefaultEpilogue),
// with the portable form's expressions (linalg::detail::split_finish, tf32_lo), so both write the same C and
// C_lo for the same sums.
struct Epilogue {
  using EpilogueSchedule = cutlass::gemm::EpilogueDefault;
  using DispatchPolicy = EpilogueSchedule;
  using ElementC = float;
  using ElementD = float;
  using ElementOutput = float;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using StrideC = cute::Stride<std::int64_t, cute::Int<1>, std::int64_t>;
  using StrideD = StrideC;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  using ThreadEpilogueOp = cutlass::epilogue::thread::LinearCombination<float, 1, float, float>;  // the adapter's name
  struct SharedStorage {};
  using TensorStorage = SharedStorage;
  using Arguments = SplitGemm;
  using Params = SplitGemm;
  template <class P>
  static constexpr Params to_underlying_arguments(P const&, Arguments const& a, void*) {
    return a;
  }
  template <class P>
  static std::size_t get_workspace_size(P const&, Arguments const&) {
    return 0;
  }
  template <class P>
  static cutlass::Status initialize_workspace(P const&, Arguments const&, void*, cudaStream_t,
                                             cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class P>
  static bool can_implement(P const&, Arguments const&) {
    return true;
  }
  CUTLASS_HOST_DEVICE Epilogue(Params const& p, SharedStorage const& = SharedStorage()) : params(p) {}
  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& acc,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    const int M = get<0>(problem_shape_mnkl), N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    Tensor tile =
        local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_MNK), make_coord(m_coord, n_coord));
    Tensor coord = tiled_mma.get_thread_slice(thread_idx).partition_C(tile);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); ++i) {
      const int r = get<0>(coord(i)), c = get<1>(coord(i));
      if (r >= M || c >= N) continue;
      const float y = linalg::detail::split_finish(params, r, c, acc(i));
      const std::int64_t at = std::int64_t(r) * params.ldc + c;
      params.c[at] = y;
      if (params.c_lo != nullptr) params.c_lo[at] = tf32_lo(y);
    }
  }
  Params params;
};

// One kernel: the tile and schedule (cooperative 128 x 128 or pingpong 64 x 128), the epilogue.
template <class TileShape, class Schedule>
struct Kernel {
  using ClusterShape = Shape<_1, _1, _1>;
  using Epi = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Epilogue>;
  using Base = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, float, cutlass::layout::RowMajor, 4, float,
      cutlass::layout::ColumnMajor, 4, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Promoted = cutlass::gemm::collective::CollectiveMma<
      cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<Base::DispatchPolicy::Stages, ClusterShape, Schedule>,
      TileShape, typename Base::ElementA, typename Base::StrideA, typename Base::ElementB, typename Base::StrideB,
      typename Base::TiledMma, typename Base::GmemTiledCopyA, typename Base::SmemLayoutAtomA,
      typename Base::SmemCopyAtomA, typename Base::TransformA, typename Base::GmemTiledCopyB,
      typename Base::SmemLayoutAtomB, typename Base::SmemCopyAtomB, typename Base::TransformB>;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop<Promoted>, Epi,
                                                          cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};


template <class K>
cudaError_t run(cudaStream_t s, const SplitGemm& g) {
  using Gemm = typename K::Gemm;
  using GK = typename K::GemmKernel;
  typename Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {g.m, g.n, 3 * g.k, 1};
  typename GK::StrideA sa = cute::make_stride(g.lda, cute::Int<1>{}, std::int64_t(0));
  // B': n x 3k, k contiguous
  typename GK::StrideB sb = cute::make_stride(std::int64_t(3) * g.k, cute::Int<1>{}, std::int64_t(0));
  args.mainloop = {g.a, g.a_lo, sa, g.b_split, sb, 4u};
  args.epilogue = g;
  Gemm op;
  if (op.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (Gemm::get_workspace_size(args) != 0) return cudaErrorInvalidValue;  // the persistent scheduler needs none
  if (op.initialize(args, nullptr, s) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (op.run(s) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
  return cudaGetLastError();
}

}  // namespace detail

#if defined(DPMLP_SPLIT3_KERNELS_HERE)
cudaError_t launch(cudaStream_t stream, const SplitGemm& g) {
  using namespace cute;
  if (g.tile_rows == 64 || (g.tile_rows == 0 && g.m < 16384)) {
    using Pingpong = detail::Kernel<Shape<_64, _128, _32>, cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
    return detail::run<Pingpong>(stream, g);
  }
  using Cooperative = detail::Kernel<Shape<_128, _128, _32>, cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  return detail::run<Cooperative>(stream, g);
}
#endif

}  // namespace split_3xtf32
}  // namespace linalg
}  // namespace dpmlp
