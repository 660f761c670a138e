// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/tensor_deep.hpp: the tensor engine's kernel for deep narrow models: two to four hidden
// layers of at most 64 units, at most 64 inputs, at most 4 outputs, where an SM holds 16 warps of it
// (deep_fits: two CTAs of eight warps, or one of two groups of eight sharing the weights, deep_groups).
// A group of eight warps takes a reduction block at a time, 64 rows (a tile) at a time, and runs the step for
// the tile on chip: the forward through every layer, the loss, the backward, and every layer's weight and bias
// gradients, which stay in registers until the block's last tile. Its only memory traffic is the tile's x and
// y and the block's row of partial sums, where the layered engine writes and reads every layer's activations
// and deltas (some 5 GB a step at 1M rows and 64 units).
//
// Products run as 3xTF32 mma.sync.m16n8k8 (mma_ops.hpp), each operand split as it is read from shared
// memory. Eight warps; a tile's matrices are 64 x 64, a warp's share 16 x 32 (one m16 tile, four n8 tiles):
//   forward   H_{k+1} = act(H_k W_k + b_k): A = H_k (rows x in), B = W_k (in x units), bias in the accumulator.
//   output    a row's outputs and its output deltas (at most 4) by a thread each, SIMT, inputs in order.
//   wgrad     gW_k += H_k^T D_k: A = H_k^T (in x rows), B = D_k (rows x units); the block's sum over its tiles
//             accumulates in the same registers, tile after tile.
//   delta     D_{k-1} = (D_k W_k^T) .* act'(H_k): A = D_k, B = W_k^T, written over H_k (no longer needed).
//   biases    gb_k = the column sums of D_k, a thread a column, rows in order.
// Every sum's order is fixed by the block's rows and the widths (the hardware's MMA order, then tiles in
// order), so a step's bits do not depend on the rank count. Padded units have zero weights and biases, so
// their activations and deltas are exact zeros; rows past the block's end or outside the window get zero
// output deltas, so their deltas are zeros and add nothing.
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)

#include <cstddef>
#include <cstdint>
#include <utility>

#include <cuda_runtime.h>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/device.hpp"
#include "dpmlp/backend/cuda/mma_ops.hpp"
#include "dpmlp/backend/cuda/tensor_shapes.hpp"
#include "dpmlp/errors.hpp"

namespace dpmlp {
namespace backend {

// NI: inputs padded (32 or 64); L: hidden layers; G: groups of eight warps a CTA (deep_groups), each taking
// its own blocks with its own tiles and barriers, all sharing one copy of the weights. LossTerm: the loss's
// device functor (loss.hpp).
template <int NI, int L, int G, class LossTerm>
struct TensorDeepKernel : DeepProblem {
  static constexpr int T = 256, R = deep_rows, U = deep_units, NO4 = deep_max_outputs;
  static_assert(NI == 32 || NI == 64, "NI: 32 or 64");
  static_assert(L >= deep_min_layers && L <= deep_max_layers, "L: the deep kernel's hidden layers");
  static_assert(R == 64 && U == 64 && T == 256, "eight warps of 16 x 32 cover a 64 x 64 tile");
  static_assert(G == deep_groups(NI, L), "G: deep_groups");
  // Sixteen warps an SM, as two CTAs of one group or one of two: registers capped at 128 a thread.
  static constexpr int MIN_BLOCKS = G == 1 ? 2 : 1;
  static constexpr int GROUP_FLOATS = static_cast<int>(deep_group_floats(NI, L));

  LossTerm loss{};

  std::size_t scratch_bytes() const { return deep_scratch_bytes(NI, L, G); }

#if defined(__CUDACC__)
  // Layer k's inputs, padded.
  __host__ __device__ static constexpr int in_of(int k) { return k == 0 ? NI : U; }

  // Where element (r, c) of a shared matrix of C columns lives: rows of C + 4 floats, permuted within each
  // group of 8 (deep_row). An MMA fragment reads 8 rows x 4 columns (an A fragment, and W^T as B) or 4 rows x 8
  // columns (a B fragment, and H^T as A); both hit 32 banks, as do a row's consecutive columns and the float2
  // stores of an accumulator fragment.
  template <int C>
  __device__ static int at(int r, int c) {
    return deep_row(r) * (C + 4) + c;
  }

  struct Smem {
    unsigned bar;            // the group's named barrier (G > 1)
    float* x;                // R x NI
    float* h[L];             // R x U each: H_{k+1}, then D_k
    float* w[L];             // in_of(k) x U each
    float* b[L];             // U each
    float* wo;               // U x NO4
    float* bo;               // NO4
    float* dl;               // R x NO4: the output deltas
    float* rl;               // R: the rows' loss terms
    // The group's barrier.
    __device__ void sync() const {
      if constexpr (G == 1) {
        __syncthreads();
      } else {
        asm volatile("bar.sync %0, %1;" ::"r"(bar), "n"(T) : "memory");
      }
    }
  };

  // The weights first (shared by the groups), then group `group`'s tiles.
  __device__ Smem carve(char* raw, int group) const {
    Smem s;
    s.bar = 1 + group;
    float* p = align_shared_128(raw);
    for (int k = 0; k < L; ++k) {
      s.w[k] = p;
      p += in_of(k) * (U + 4);
    }
    for (int k = 0; k < L; ++k) {
      s.b[k] = p;
      p += U;
    }
    s.wo = p;
    p += U * NO4;
    s.bo = p;
    p += NO4;
    p += group * GROUP_FLOATS;
    s.x = p;
    p += R * (NI + 4);
    for (int k = 0; k < L; ++k) {
      s.h[k] = p;
      p += R * (U + 4);
    }
    s.dl = p;
    p += R * NO4;
    s.rl = p;
    return s;
  }

  // Every layer's parameters into shared memory, zero-padded.
  __device__ void load_params(const Smem& s, int tid) const {
    constexpr int CT = T * G;  // the CTA's threads
    for (int k = 0; k < L; ++k) {
      const int n_in = widths[k], n_out = widths[k + 1];
      const float* w = params + woff[k];
      for (int e = tid; e < in_of(k) * U; e += CT) {
        const int i = e / U, j = e - i * U;
        s.w[k][at<U>(i, j)] = (i < n_in && j < n_out) ? w[i * n_out + j] : 0.0f;
      }
      for (int j = tid; j < U; j += CT) s.b[k][j] = j < n_out ? params[boff[k] + j] : 0.0f;
    }
    const int n_last = widths[L], NO = widths[L + 1];
    for (int e = tid; e < U * NO4; e += CT) {
      const int i = e / NO4, o = e - i * NO4;
      s.wo[e] = (i < n_last && o < NO) ? params[woff[L] + i * NO + o] : 0.0f;
    }
    if (tid < NO4) s.bo[tid] = tid < NO ? params[boff[L] + tid] : 0.0f;
  }

  // The tile of rows [row0, row0 + R) that ends at `end` into s.x (zeros past `end` and past the inputs).
  __device__ void load_x(const Smem& s, std::int64_t row0, std::int64_t end, int tid) const {
    const int n_in = widths[0];
    for (int e = tid; e < R * NI; e += T) {
      const int r = e / NI, c = e - r * NI;
      s.x[at<NI>(r, c)] = (row0 + r < end && c < n_in) ? x[(row0 + r) * n_in + c] : 0.0f;
    }
  }

  // acc (a warp's 16 x 32 share: rows r0.., columns c0..; r0 and c0 multiples of 8) += A B in 3xTF32 over K:
  // A at `a` (a matrix of CA columns) or, TA, its transpose there; B at `b` (K x N, CB columns) or, TB, its
  // transpose there. Every address is a per-thread base plus a constant (deep_row keeps a group's permutation
  // within the group), so the unrolled loads take immediate offsets.
  template <int K, int CA, int CB, bool TA, bool TB>
  __device__ static void mma_tile(float (&acc)[1][4][4], const float* a, const float* b, int r0, int c0, int g,
                                  int t) {
    constexpr int LA = CA + 4, LB = CB + 4;
    // A fragment: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4) of the 16 x 8 tile at (r0, k0).
    const float* pa = TA ? a + deep_row(t) * LA + r0 + g : a + deep_row(r0 + g) * LA + t;
    // B fragment of n tile n: b0 (k = t, n = g), b1 (k = t + 4, n = g) of the 8 x 8 tile at (k0, c0 + 8 n).
    const float* pb = TB ? b + deep_row(c0 + g) * LB + t : b + deep_row(t) * LB + c0 + g;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 8) {
      std::uint32_t ahi[1][4], alo[1][4], bhi[4][2], blo[4][2];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int dr = q & 1 ? 8 : 0, dk = q >= 2;  // row + 8; k + 4 (row 4 of a group sits at its row 1)
        const float v = TA ? pa[k0 * LA + dk * LA + dr] : pa[dr * LA + k0 + 4 * dk];
        tf32::split(v, ahi[0][q], alo[0][q]);
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const float v0 = TB ? pb[8 * n * LB + k0] : pb[k0 * LB + 8 * n];
        const float v1 = TB ? pb[8 * n * LB + k0 + 4] : pb[k0 * LB + LB + 8 * n];
        tf32::split(v0, bhi[n][0], blo[n][0]);
        tf32::split(v1, bhi[n][1], blo[n][1]);
      }
      tf32::mma3<1, 4>(acc, ahi, alo, bhi, blo);
    }
  }

  // H_{k+1} = act(H_k W_k + b_k) for the warp's 16 x 32 share, into s.h[k].
  template <int k>
  __device__ void forward_layer(const Smem& s, const float* xs, int fr0, int fc0, int g, int t) const {
    float acc[1][4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float b0 = s.b[k][fc0 + 8 * n + 2 * t], b1 = s.b[k][fc0 + 8 * n + 2 * t + 1];
      acc[0][n][0] = b0, acc[0][n][1] = b1, acc[0][n][2] = b0, acc[0][n][3] = b1;
    }
    if constexpr (k == 0) {
      mma_tile<NI, NI, U, false, false>(acc, xs, s.w[k], fr0, fc0, g, t);
    } else {
      mma_tile<U, U, U, false, false>(acc, s.h[k - 1], s.w[k], fr0, fc0, g, t);
    }
    float* out = s.h[k];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      // Columns 2t and 2t + 1 stay adjacent (the swizzle leaves bits 0-1): one 8-byte store each row.
      const int c = fc0 + 8 * n + 2 * t;
      *reinterpret_cast<float2*>(out + at<U>(fr0 + g, c)) =
          make_float2(detail::activate(act, acc[0][n][0]), detail::activate(act, acc[0][n][1]));
      *reinterpret_cast<float2*>(out + at<U>(fr0 + g + 8, c)) =
          make_float2(detail::activate(act, acc[0][n][2]), detail::activate(act, acc[0][n][3]));
    }
    s.sync();
  }
  template <int... K>
  __device__ void forward_all(const Smem& s, const float* xs, int fr0, int fc0, int g, int t,
                              std::integer_sequence<int, K...>) const {
    (forward_layer<K>(s, xs, fr0, fc0, g, t), ...);
  }

  // Hidden layer k's backward for the tile, D_k complete in s.h[k] once the first barrier passes: gW_k +=
  // H_k^T D_k (warp tiles of 16 inputs x 32 units, in_of(k) / 16 * 2 of them), gb_k += the column sums of D_k
  // (threads 192..255), and, below the first layer, D_{k-1} = (D_k W_k^T) .* act'(H_k) over H_k.
  template <int k>
  __device__ void backward_layer(const Smem& s, const float* xs, float (&gwk)[1][4][4], float& gbk, int tid,
                                 int warp, int fr0, int fc0, int g, int t) const {
    s.sync();  // D_k is complete
    const float* dk = s.h[k];
    constexpr int ti = in_of(k) / 16;
    if (warp < ti * 2) {
      const int i0 = 16 * (warp % ti), j0 = 32 * (warp / ti);
      if constexpr (k == 0) {
        mma_tile<R, NI, U, true, false>(gwk, xs, dk, i0, j0, g, t);
      } else {
        mma_tile<R, U, U, true, false>(gwk, s.h[k - 1], dk, i0, j0, g, t);
      }
    }
    if (tid >= T - U) {
      const int j = tid - (T - U);
      float v = gbk;
      for (int r = 0; r < R; ++r) v += dk[at<U>(r, j)];
      gbk = v;
    }
    if constexpr (k > 0) {
      float acc[1][4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[0][n][q] = 0.0f;
      mma_tile<U, U, U, false, true>(acc, dk, s.w[k], fr0, fc0, g, t);
      s.sync();  // every reader of H_k (the wgrad above) is done
      float* hm = s.h[k - 1];
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int c = fc0 + 8 * n + 2 * t;
        float2* p0 = reinterpret_cast<float2*>(hm + at<U>(fr0 + g, c));
        float2* p1 = reinterpret_cast<float2*>(hm + at<U>(fr0 + g + 8, c));
        const float2 h0 = *p0, h1 = *p1;
        *p0 = make_float2(acc[0][n][0] * detail::activate_grad_from_output(act, h0.x),
                          acc[0][n][1] * detail::activate_grad_from_output(act, h0.y));
        *p1 = make_float2(acc[0][n][2] * detail::activate_grad_from_output(act, h1.x),
                          acc[0][n][3] * detail::activate_grad_from_output(act, h1.y));
      }
    }
  }
  template <int... K>
  __device__ void backward_all(const Smem& s, const float* xs, float (&gw)[L][1][4][4], float (&gb)[L], int tid,
                               int warp, int fr0, int fc0, int g, int t, std::integer_sequence<int, K...>) const {
    (backward_layer<L - 1 - K>(s, xs, gw[L - 1 - K], gb[L - 1 - K], tid, warp, fr0, fc0, g, t), ...);
  }

  // Where block blk's rows end.
  __device__ std::int64_t block_end(std::int64_t blk) const {
    return blk * block + block < rows ? blk * block + block : rows;
  }

  __device__ void run(char* raw) const {
    const int group = G == 1 ? 0 : static_cast<int>(threadIdx.x) / T;
    const Smem s = carve(raw, group);
    load_params(s, static_cast<int>(threadIdx.x));
    __syncthreads();
    const int tid = static_cast<int>(threadIdx.x) - group * T, warp = tid >> 5, lane = tid & 31, g = lane >> 2,
              t = lane & 3;
    const int NO = widths[L + 1], n_last = widths[L];
    // The forward's and the delta's share of a tile: rows fr0.., units fc0...
    const int fr0 = 16 * (warp & 3), fc0 = 32 * (warp >> 2);
    for (std::int64_t blk = std::int64_t(blockIdx.x) * G + group; blk < blocks; blk += std::int64_t(gridDim.x) * G) {
      const std::int64_t first = blk * block, end = block_end(blk);
      float gw[L][1][4][4];
#pragma unroll
      for (int k = 0; k < L; ++k)
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
          for (int q = 0; q < 4; ++q) gw[k][0][n][q] = 0.0f;
      float gb[L];  // threads 192..255: column tid - 192 of every layer's bias gradient
#pragma unroll
      for (int k = 0; k < L; ++k) gb[k] = 0.0f;
      float gwo = 0.0f, gbo = 0.0f, sse = 0.0f;  // thread (i = tid % 64, o = tid / 64): gW_L[i][o]; gb_L[o]; tid 255
      for (std::int64_t row0 = first; row0 < end; row0 += R) {
        const int valid = end - row0 < R ? static_cast<int>(end - row0) : R;
        s.sync();  // the last tile's readers of x, dl and rl are done
        load_x(s, row0, end, tid);
        s.sync();
        const float* xs = s.x;
        // Forward through the hidden layers.
        forward_all(s, xs, fr0, fc0, g, t, std::make_integer_sequence<int, L>());
        // The output layer: a row's predictions, loss terms and output deltas (thread r).
        const float* hl = s.h[L - 1];
        if (tid < R) {
          const int r = tid;
          const bool learn = r < valid && window.contains(row0 + r);
          float term = 0.0f;
          for (int o = 0; o < NO4; ++o) {
            float d = 0.0f;
            if (o < NO) {
              float p = s.bo[o];
              for (int i = 0; i < n_last; ++i) p = fmaf(hl[at<U>(r, i)], s.wo[i * NO4 + o], p);
              const float res = learn ? p - y[(row0 + r) * NO + o] : 0.0f;
              term += loss.value(res, o);
              d = loss.grad(res, o, scale);
            }
            s.dl[r * NO4 + o] = d;
          }
          s.rl[r] = term;
        }
        s.sync();
        // The output layer's gradients: thread (i, o) sums its weight's over the tile's rows in order.
        {
          const int i = tid & (U - 1), o = tid >> 6;
          if (o < NO) {
            for (int r = 0; r < R; ++r) gwo = fmaf(hl[at<U>(r, i)], s.dl[r * NO4 + o], gwo);
            if (i == 0) {
              for (int r = 0; r < R; ++r) gbo += s.dl[r * NO4 + o];
            }
          }
          if (tid == T - 1) {
            for (int r = 0; r < R; ++r) sse += s.rl[r];
          }
        }
        s.sync();
        // D_{L-1} = (D_L W_L^T) .* act'(H_L), over H_L: thread (r = tid / 4) takes units tid % 4 + 4 q.
        {
          const int r = tid >> 2;
          float dr[NO4];
#pragma unroll
          for (int o = 0; o < NO4; ++o) dr[o] = s.dl[r * NO4 + o];
#pragma unroll 4
          for (int q = 0; q < U / 4; ++q) {
            const int i = (tid & 3) + 4 * q;
            float v = 0.0f;
#pragma unroll
            for (int o = 0; o < NO4; ++o) {
              if (o < NO) v = fmaf(dr[o], s.wo[i * NO4 + o], v);
            }
            float* hp = s.h[L - 1] + at<U>(r, i);
            *hp = v * detail::activate_grad_from_output(act, *hp);
          }
        }
        // The hidden layers, top down.
        backward_all(s, xs, gw, gb, tid, warp, fr0, fc0, g, t, std::make_integer_sequence<int, L>());
      }
      // The block's row of partial sums.
      float* out = partials + blk * ld;
#pragma unroll
      for (int k = 0; k < L; ++k) {
        const int ti = in_of(k) / 16, ni = widths[k], no = widths[k + 1];
        if (warp < ti * 2) {
          const int i0 = 16 * (warp % ti), j0 = 32 * (warp / ti);
#pragma unroll
          for (int n = 0; n < 4; ++n) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const int i = i0 + g + (q >= 2 ? 8 : 0), j = j0 + 8 * n + 2 * t + (q & 1);
              if (i < ni && j < no) out[woff[k] + i * no + j] = gw[k][0][n][q];
            }
          }
        }
        if (tid >= T - U && tid - (T - U) < no) out[boff[k] + tid - (T - U)] = gb[k];
      }
      {
        const int i = tid & (U - 1), o = tid >> 6;
        if (o < NO && i < n_last) out[woff[L] + i * NO + o] = gwo;
        if (o < NO && i == 0) out[boff[L] + o] = gbo;
        if (tid == T - 1) out[ld - 1] = sse;
      }
    }
  }
#endif  // __CUDACC__
};

#if defined(__CUDACC__)
template <int NI, int L, int G, class LossTerm>
__global__ void __launch_bounds__(256 * G, TensorDeepKernel<NI, L, G, LossTerm>::MIN_BLOCKS)
    fused_tensor_deep(const TensorDeepKernel<NI, L, G, LossTerm> k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ char dpmlp_tensor_smem[];
  k.run(dpmlp_tensor_smem);
#else
  (void)k;
  __trap();  // the engine plan refuses devices below compute capability 8.0
#endif
}
#endif

template <int NI, int L, class LossTerm>
inline void launch_tensor_deep(const Kokkos::Cuda& space, const DeepProblem& p, const LossTerm& loss) {
  constexpr int G = deep_groups(NI, L);
  using kernel_t = TensorDeepKernel<NI, L, G, LossTerm>;
  kernel_t k{p, {}};
  k.loss = loss;
#if defined(__CUDACC__)
  static const int resident = register_resident_setup(fused_tensor_deep<NI, L, G, LossTerm>, kernel_t::T * G,
                                                      k.scratch_bytes(), k.scratch_bytes());
  const std::int64_t slots = std::int64_t(cuda_device().sms > 0 ? cuda_device().sms : 1) * resident;
  const std::int64_t ctas = (p.blocks + G - 1) / G;
  const unsigned grid = static_cast<unsigned>(ctas < slots ? ctas : slots);
  fused_tensor_deep<NI, L, G, LossTerm><<<grid, kernel_t::T * G, k.scratch_bytes(), space.cuda_stream()>>>(k);
  check_tensor_launch();
#else
  (void)space, (void)k;
  throw Error("dpmlp: the tensor engine must be compiled by a CUDA compiler");
#endif
}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
