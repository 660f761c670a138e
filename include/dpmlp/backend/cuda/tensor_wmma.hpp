// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/tensor_wmma.hpp: the tensor engine's warp-matrix kernel (CUDA's nvcuda::wmma, TF32, sm_80
// and newer, fp32-equivalent 3xTF32: backend/cuda/mma_ops.hpp says why), for any one-hidden-layer shape the
// fused engines take. tensor_engine.hpp launches it where the plan (engine/plan.hpp) chooses it.
//
// Why tensor cores: the SIMT fused kernel (engine/fused_simt.hpp) reaches only a few TFLOP/s of fp32 FMA: its
// register tiles are small and shared-memory loads bound it. Its two GEMMs, the forward X W0 and the weight
// gradient X^T dZ, are what tensor cores do.
//
// Layout of the work, one CUDA block (8 warps) per reduction block, rows in chunks of C = 64:
//   forward   Hpre[C x HP] = X[C x NI] W0[NI x HP]    warps own 16x16 output tiles (MMA)
//   outputs   h = act(Hpre + b0), the outputs, residuals, output deltas d, the b1 and loss sums: one warp
//             a row, lanes over hidden units, a fixed butterfly for the output sums (SIMT)
//   deltas    dZ = (d W1^T) * act'(h) in place of h, the b0 and W1 sums: a thread a hidden unit (SIMT)
//   backward  gW0[NI x HP] += X^T[NI x C] dZ[C x HP]   warps own 16x16 tiles, accumulators in registers for
//             the whole block (MMA)
// The next chunk's rows are loaded into registers while the backward MMAs run, a chunk's targets while its
// forward MMAs run, and the block's parameters and first chunk all at once: with 64-row blocks (a block a
// CTA, one chunk a block) the kernel is one pass through these phases, so its time is their chain of latencies.
//
// It computes exactly what the SIMT kernel computes (the same per-block partial sums, in the parameter layout,
// for the same block tree), with different but equally fixed summation shapes: every sum depends only on the
// block's rows and the model's widths, so it is reproducible across rank counts.
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <mma.h>
#endif

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/device.hpp"
#include "dpmlp/backend/cuda/mma_ops.hpp"
#include "dpmlp/backend/cuda/tensor_shapes.hpp"
#include "dpmlp/errors.hpp"

namespace dpmlp {
namespace backend {

using detail::activate;
using detail::activate_grad_from_output;

// NI: padded inputs (32 or 64); HP: padded hidden units (32, 64, 128 or 256); LossTerm: the loss's device
// functor (loss.hpp). The problem is its base, so the kernel's fields are the problem's.
template <int NI, int HP, class LossTerm>
struct FusedTensorCoreKernel : TensorProblem {
  static constexpr int T = 256, W = T / 32, C = tensor_chunk, MaxOut = 4;
  static constexpr int LDX = NI + 4, LDH = HP + 4, LDW = HP + 4;  // padded rows: conflict-free fragment loads
  static constexpr int JL = HP / 32;  // hidden units a lane adds in the output phase
  static constexpr int G = T / HP;    // row groups in the hidden-delta phase (a thread a hidden unit each)
  // Forward tiles: 4 row tiles x HP/16 column tiles; warp w takes row tile w % 4 and every other column tile.
  static constexpr int FRT = C / 16, FCT = HP / 16;
  // Backward tiles: NI/16 x HP/16. With fewer than 8 (32 x 32), two warps share a tile, each taking every
  // other 8-row step of the chunk (KS = 2); their two sums are added at the block's end in a fixed order.
  static constexpr int BMT = NI / 16, BCT = HP / 16, BTILES = BMT * BCT;
  static constexpr int KS = BTILES >= W ? 1 : W / BTILES;
  static constexpr int BTPW = BTILES * KS / W;  // backward tiles a warp owns
  static constexpr int XPT = C * NI / T;        // x elements a thread loads a chunk
  static constexpr int RW = C / W;              // rows a warp takes in the output phase
  static constexpr int RU = JL == 1 ? 2 : 1;   // of which at once (two chains overlap best at 32 units)
  static_assert(RW * MaxOut <= 32 && RW % RU == 0, "a lane a target of the warp's output rows");
  static_assert(NI == 32 || NI == 64, "NI: 32 or 64");
  static_assert(HP == 32 || HP == 64 || HP == 128 || HP == 256, "HP: 32, 64, 128 or 256");
  static_assert(KS * BTILES >= W && (W % BMT) == 0, "backward tiles must cover the warps");

  LossTerm loss;

  std::size_t scratch_bytes() const { return tensor_scratch_bytes(NI, HP, NO); }

#if defined(__CUDACC__)
  using frag_a_row = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32,
                                            nvcuda::wmma::row_major>;
  using frag_a_col = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32,
                                            nvcuda::wmma::col_major>;
  using frag_b = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32,
                                        nvcuda::wmma::row_major>;
  using frag_c = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float>;

  // hi <- the fp32 values loaded into it, rounded to TF32; lo <- the remainder, rounded to TF32.
  template <class Frag>
  __device__ static void split(Frag& hi, Frag& lo) {
#pragma unroll
    for (int e = 0; e < hi.num_elements; ++e) {
      const float v = hi.x[e];
      const float h = nvcuda::wmma::__float_to_tf32(v);
      hi.x[e] = h;
      lo.x[e] = nvcuda::wmma::__float_to_tf32(v - h);
    }
  }
  // acc += a * b in 3xTF32, small terms first.
  template <class FA>
  __device__ static void mma3(frag_c& acc, const FA& a_hi, const FA& a_lo, const frag_b& b_hi,
                              const frag_b& b_lo) {
    nvcuda::wmma::mma_sync(acc, a_lo, b_hi, acc);
    nvcuda::wmma::mma_sync(acc, a_hi, b_lo, acc);
    nvcuda::wmma::mma_sync(acc, a_hi, b_hi, acc);
  }

  // The chunk's x values this thread loads (zero past the block's rows or the inputs).
  __device__ void load_x(std::int64_t c0, int n, int t, float (&v)[XPT]) const {
#pragma unroll
    for (int k = 0; k < XPT; ++k) {
      const int e = t + k * T, r = e / NI, i = e % NI;
      v[k] = (r < n && i < n_in) ? x[(c0 + r) * n_in + i] : 0.0f;
    }
  }
  __device__ static void store_x(float* xs, int t, const float (&v)[XPT]) {
#pragma unroll
    for (int k = 0; k < XPT; ++k) {
      const int e = t + k * T;
      xs[(e / NI) * LDX + e % NI] = v[k];
    }
  }

  // Block b of the step, thread t of 256; smem: scratch_bytes() of dynamic shared memory.
  __device__ void run(const int t, const std::int64_t b, char* smem) const {
    namespace wmma = nvcuda::wmma;
    const int warp = t / 32, lane = t % 32;
    const std::int64_t r_begin = b * block;
    const std::int64_t r_end = r_begin + block < rows ? r_begin + block : rows;

    // scratch_bytes() includes 128 bytes of slack for this alignment (the fragment loads need 32).
    float* const w0s = align_shared_128(smem);
    float* const b0s = w0s + NI * LDW;
    float* const w1s = b0s + HP;
    float* const xs = w1s + HP * NO;
    float* const hs = xs + C * LDX;
    float* const ds = hs + C * LDH;  // the chunk's output deltas, C x NO

    // The parameters, zero-padded (padded hidden units then contribute exact zeros everywhere), and the first
    // chunk's x: the global loads are issued before the shared-memory stores, so the block's start waits for
    // one round trip to memory (W0 in passes of at most 8 values a thread, for the registers), not one an
    // array: with a block a CTA and one chunk a block, as at the seed's size, the kernel is a chain of such
    // waits and barriers.
    constexpr int W0PT = (NI * HP + T - 1) / T, B0PT = (HP + T - 1) / T, W1PT = (HP * MaxOut + T - 1) / T;
    constexpr int W0P = W0PT < 8 ? W0PT : 8;
    static_assert(W0PT % W0P == 0, "W0 in whole passes");
    float b0v[B0PT], w1v[W1PT], b1[MaxOut];
#pragma unroll
    for (int k = 0; k < B0PT; ++k) {
      const int j = t + k * T;
      b0v[k] = j < H ? params[b0off + j] : 0.0f;  // H <= HP
    }
#pragma unroll
    for (int k = 0; k < W1PT; ++k) {
      const int e = t + k * T;  // row e / NO of W1 (H x NO): inside while e < H * NO
      w1v[k] = e < H * NO ? params[w1off + e] : 0.0f;
    }
#pragma unroll
    for (int o = 0; o < MaxOut; ++o) b1[o] = o < NO ? params[b1off + o] : 0.0f;
    float xv[XPT];
    load_x(r_begin, r_end - r_begin < C ? static_cast<int>(r_end - r_begin) : C, t, xv);
#pragma unroll
    for (int k0 = 0; k0 < W0PT; k0 += W0P) {
      float w0v[W0P];
#pragma unroll
      for (int k = 0; k < W0P; ++k) {
        const int e = t + (k0 + k) * T, i = e / HP, j = e % HP;
        w0v[k] = (e < NI * HP && i < n_in && j < H) ? params[w0off + i * H + j] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < W0P; ++k) {
        const int e = t + (k0 + k) * T;
        if (e < NI * HP) w0s[(e / HP) * LDW + e % HP] = w0v[k];
      }
    }
#pragma unroll
    for (int k = 0; k < B0PT; ++k) {
      if (t + k * T < HP) b0s[t + k * T] = b0v[k];
    }
#pragma unroll
    for (int k = 0; k < W1PT; ++k) {
      if (t + k * T < HP * NO) w1s[t + k * T] = w1v[k];
    }
    store_x(xs, t, xv);

    // This thread's sums for the whole block: its warp's gW0 tiles (MMA accumulators); its hidden unit's b0
    // and W1 sums over its rows; its warp's b1 and loss sums (the same in every lane).
    frag_c gw0[BTPW];
#pragma unroll
    for (int k = 0; k < BTPW; ++k) wmma::fill_fragment(gw0[k], 0.0f);
    float gb0 = 0.0f, gw1[MaxOut] = {}, gb1[MaxOut] = {}, gloss = 0.0f;

    for (std::int64_t c0 = r_begin; c0 < r_end; c0 += C) {
      const int n = r_end - c0 < C ? static_cast<int>(r_end - c0) : C;
      __syncthreads();  // xs holds this chunk; hs is free

      // The targets and the learning rows of the rows this warp takes in the output phase, loaded now, so that
      // their global loads' latency hides behind the forward MMAs: lane l holds output l % NO of row
      // warp + W * (l / NO); bit i of `learn`: whether row warp + W * i learns.
      float yv = 0.0f;
      {
        const int i = lane / NO, r = warp + W * i;
        if (i < RW && r < n) yv = y[(c0 + r) * NO + (lane - i * NO)];
      }
      const unsigned learn =
          __ballot_sync(0xffffffffu, lane < RW && warp + W * lane < n && window.contains(c0 + warp + W * lane));

      // Forward MMAs: Hpre = X W0. With 32 inputs a warp keeps its row tile's split fragments for all its
      // column tiles; with 64 it reloads them (registers).
      {
        const int rt = warp % FRT, cg = warp / FRT;
        constexpr int CG = W / FRT, KF = NI / 8, KA = NI == 32 ? KF : 1;
        frag_a_row a_hi[KA], a_lo[KA];
        if constexpr (KA == KF) {
#pragma unroll
          for (int ks = 0; ks < KF; ++ks) {
            wmma::load_matrix_sync(a_hi[ks], xs + rt * 16 * LDX + ks * 8, LDX);
            split(a_hi[ks], a_lo[ks]);
          }
        }
        for (int ct = cg; ct < FCT; ct += CG) {
          frag_c acc;
          wmma::fill_fragment(acc, 0.0f);
#pragma unroll
          for (int ks = 0; ks < KF; ++ks) {
            const int ka = KA == KF ? ks : 0;
            if constexpr (KA != KF) {
              wmma::load_matrix_sync(a_hi[0], xs + rt * 16 * LDX + ks * 8, LDX);
              split(a_hi[0], a_lo[0]);
            }
            frag_b b_hi, b_lo;
            wmma::load_matrix_sync(b_hi, w0s + ks * 8 * LDW + ct * 16, LDW);
            split(b_hi, b_lo);
            mma3(acc, a_hi[ka], a_lo[ka], b_hi, b_lo);
          }
          wmma::store_matrix_sync(hs + rt * 16 * LDH + ct * 16, acc, LDH, wmma::mem_row_major);
        }
      }
      __syncthreads();

      // Outputs: warp w takes rows w, w + 8, ..., RU at a time (independent chains, whose latencies overlap);
      // lane l adds hidden units l, l + 32, ... of h = act(Hpre + b0) (stored back), then a butterfly gives
      // every lane the same bits of the sum. Output deltas to ds.
      for (int i0 = 0; i0 < RW; i0 += RU) {
        float p[RU][MaxOut] = {};
#pragma unroll
        for (int u = 0; u < RU; ++u) {
          const int r = warp + W * (i0 + u);
#pragma unroll
          for (int q = 0; q < JL; ++q) {
            const int j = lane + 32 * q;
            const float h = activate(act, hs[r * LDH + j] + b0s[j]);
            hs[r * LDH + j] = h;
#pragma unroll
            for (int o = 0; o < MaxOut; ++o) {
              if (o < NO) p[u][o] += h * w1s[j * NO + o];
            }
          }
        }
#pragma unroll
        for (int u = 0; u < RU; ++u) {
#pragma unroll
          for (int o = 0; o < MaxOut; ++o) {
            if (o >= NO) continue;
#pragma unroll
            for (int m = 16; m >= 1; m /= 2) p[u][o] += __shfl_xor_sync(0xffffffffu, p[u][o], m);
          }
        }
#pragma unroll
        for (int u = 0; u < RU; ++u) {
          const int i = i0 + u, r = warp + W * i;
#pragma unroll
          for (int o = 0; o < MaxOut; ++o) {
            if (o >= NO) continue;
            const float target = __shfl_sync(0xffffffffu, yv, i * NO + o);
            float d = 0.0f;
            if ((learn >> i) & 1u) {
              const float res = p[u][o] + b1[o] - target;
              d = loss.grad(res, o, scale);
              gloss += loss.value(res, o);
              gb1[o] += d;
            }
            if (lane == o) ds[r * NO + o] = d;
          }
        }
      }
      __syncthreads();

      // Hidden deltas, in place: thread t owns hidden unit t % HP and rows t / HP, + G, ... (its b0 and W1
      // sums run over those rows in order).
      {
        const int j = t % HP;
        float w1j[MaxOut];
#pragma unroll
        for (int o = 0; o < MaxOut; ++o) w1j[o] = o < NO ? w1s[j * NO + o] : 0.0f;
#pragma unroll 8
        for (int i = 0; i < C / G; ++i) {  // rows t / HP + G * i, in order (t / HP < G)
          const int r = t / HP + G * i;
          const float h = hs[r * LDH + j];
          float g = 0.0f;
#pragma unroll
          for (int o = 0; o < MaxOut; ++o) {
            if (o < NO) {
              const float d = ds[r * NO + o];
              g += d * w1j[o];
              gw1[o] += h * d;
            }
          }
          const float dz = g * activate_grad_from_output(act, h);
          gb0 += dz;
          hs[r * LDH + j] = dz;
        }
      }
      __syncthreads();

      // The next chunk's rows, in flight during the backward MMAs.
      const std::int64_t c1 = c0 + C;
      const bool more = c1 < r_end;
      if (more) load_x(c1, r_end - c1 < C ? static_cast<int>(r_end - c1) : C, t, xv);

      // Backward MMAs: gW0 += X^T dZ.
      {
        const int mt = warp % BMT, rest = warp / BMT;
        constexpr int CG = W / BMT;
        const int kslot = KS == 1 ? 0 : rest / BCT;
#pragma unroll
        for (int ks = 0; ks < C / 8; ++ks) {
          if (ks % KS != kslot) continue;
          frag_a_col a_hi, a_lo;
          wmma::load_matrix_sync(a_hi, xs + ks * 8 * LDX + mt * 16, LDX);
          split(a_hi, a_lo);
#pragma unroll
          for (int k = 0; k < BTPW; ++k) {
            const int ct = KS == 1 ? rest + CG * k : rest % BCT;
            frag_b b_hi, b_lo;
            wmma::load_matrix_sync(b_hi, hs + ks * 8 * LDH + ct * 16, LDH);
            split(b_hi, b_lo);
            mma3(gw0[k], a_hi, a_lo, b_hi, b_lo);
          }
        }
      }
      __syncthreads();
      if (more) store_x(xs, t, xv);
    }
    __syncthreads();  // hs free: stage the block's sums there

    float* const out = partials + b * ld;
    // gW0: the tiles into hs (KS copies), then summed in kslot order and written within bounds.
    {
      const int mt = warp % BMT, rest = warp / BMT;
      constexpr int CG = W / BMT;
      const int kslot = KS == 1 ? 0 : rest / BCT;
#pragma unroll
      for (int k = 0; k < BTPW; ++k) {
        const int ct = KS == 1 ? rest + CG * k : rest % BCT;
        wmma::store_matrix_sync(hs + kslot * NI * HP + mt * 16 * HP + ct * 16, gw0[k], HP, wmma::mem_row_major);
      }
    }
    __syncthreads();
    for (int e = t; e < NI * HP; e += T) {
      float v = hs[e];
      for (int s = 1; s < KS; ++s) v += hs[s * NI * HP + e];
      const int i = e / HP, j = e % HP;
      if (i < n_in && j < H) out[w0off + i * H + j] = v;
    }
    __syncthreads();
    // b0 and W1: each row group's sums into hs, then summed over the groups in order; b1 and the loss: each
    // warp's, summed over the warps in order.
    float* const sb0 = hs;                 // G x HP
    float* const sw1 = sb0 + G * HP;       // G x HP x NO
    float* const sb1 = sw1 + G * HP * NO;  // W x NO
    float* const sl = sb1 + W * NO;        // W
    sb0[t] = gb0;  // t = group * HP + unit
#pragma unroll
    for (int o = 0; o < MaxOut; ++o) {
      if (o < NO) sw1[t * NO + o] = gw1[o];
    }
    if (lane == 0) {
#pragma unroll
      for (int o = 0; o < MaxOut; ++o) {
        if (o < NO) sb1[warp * NO + o] = gb1[o];
      }
      sl[warp] = gloss;
    }
    __syncthreads();
    if (t < HP && t < H) {
      float v = 0.0f;
      for (int g = 0; g < G; ++g) v += sb0[g * HP + t];
      out[b0off + t] = v;
      for (int o = 0; o < NO; ++o) {
        float s = 0.0f;
        for (int g = 0; g < G; ++g) s += sw1[(g * HP + t) * NO + o];
        out[w1off + t * NO + o] = s;
      }
    }
    if (t < NO) {
      float v = 0.0f;
      for (int w = 0; w < W; ++w) v += sb1[w * NO + t];
      out[b1off + t] = v;
    } else if (t == NO) {
      float v = 0.0f;
      for (int w = 0; w < W; ++w) v += sl[w];
      out[ld - 1] = v;  // the sum of the loss terms: the last column
    }
  }
#endif  // __CUDACC__
};

#if defined(__CUDACC__)
// Two blocks an SM (registers capped at 128): one block's barriers and row phases overlap the other's MMAs.
// At 32 x 256 ptxas spills a little at that cap; one block an SM without spills is slower still.
template <int NI, int HP, class LossTerm>
__global__ void __launch_bounds__(256, 2) fused_tensor_core(const FusedTensorCoreKernel<NI, HP, LossTerm> k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ char dpmlp_tensor_smem[];
  k.run(static_cast<int>(threadIdx.x), static_cast<std::int64_t>(blockIdx.x), dpmlp_tensor_smem);
#else
  (void)k;
  __trap();  // the engine plan refuses devices below compute capability 8.0
#endif
}
#endif

template <int NI, int HP, class LossTerm>
inline void launch_tensor(const Kokkos::Cuda& space, const TensorProblem& p, const LossTerm& loss) {
  using kernel_t = FusedTensorCoreKernel<NI, HP, LossTerm>;
  const kernel_t k{p, loss};
#if defined(__CUDACC__)
  // Above 48 KB a kernel must opt in to its dynamic shared memory: once a process (one device a process,
  // as with Kokkos), for the most any output count needs.
  static const cudaError_t opted = cudaFuncSetAttribute(
      fused_tensor_core<NI, HP, LossTerm>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(tensor_scratch_bytes(NI, HP, kernel_t::MaxOut)));
  if (opted != cudaSuccess) {
    throw Error(std::string("dpmlp: cudaFuncSetAttribute (tensor kernel): ") + cudaGetErrorString(opted));
  }
  fused_tensor_core<NI, HP, LossTerm><<<static_cast<unsigned>(p.blocks), kernel_t::T, k.scratch_bytes(), space.cuda_stream()>>>(k);
  check_tensor_launch();
#else
  (void)space, (void)k;
  throw Error("dpmlp: the tensor engine must be compiled by a CUDA compiler");
#endif
}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
