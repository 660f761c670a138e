// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/tensor_deep.hpp: the tensor engine's kernel for deep narrow models: two to four hidden
// layers of at most 64 units, at most 64 inputs, at most 4 outputs, where an SM holds 16 warps of it
// (deep_fits: two CTAs of eight warps, or one of two groups of eight sharing the weights, deep_groups).
// A group of eight warps takes a reduction block at a time, 64 rows (a tile) at a time, and runs the step for
// the tile on chip: the forward through every layer, the loss, the backward, and every layer's weight and bias
// gradients, which stay on chip (hidden layers' weight gradients in registers, the rest in shared memory by row
// group) until the block's last tile. Its only memory traffic is the tile's x and y and the block's row of
// partial sums, where the layered engine writes and reads every layer's activations and deltas (some 5 GB a
// step at 1M rows and 64 units).
//
// Products run as block-scaled 3xFP16 mma.sync.m16n8k16 (f16x3 in mma_ops.hpp). Every matrix an MMA reads
// sits in shared memory already split, as fp16 hi and lo planes (deep_at) with a power-of-two scale a region
// of 16 rows x 32 columns, written once by whoever produced it (the weights once a launch, x as it is
// loaded, activations and deltas by the epilogue of the MMA or SIMT phase that computed them), and the MMAs
// take their operands straight from ldmatrix. An MMA chain covers a k range of one scale pair (32 columns,
// or 16 rows where k runs over rows); its sum, multiplied by the two scales, is added into the fp32 result.
// Eight warps; a tile's matrices are 64 x 64, a warp's share 16 x 32 (one m16 tile, four n8 tiles), and
// a scale region is a warp's share:
//   forward   H_{k+1} = act(H_k W_k + b_k): A = H_k (rows x in), B = W_k (in x units).
//   output    the last forward's epilogue sums its share's 32 units into each output (the warp's butterfly);
//             a thread a row adds the two halves, the bias and the loss (SIMT, at most 4 outputs).
//   D_L       the output deltas times W_L^T .* act'(H_L), a lane a unit over its warp's 16 rows, with the
//             output layer's weight gradients and D_L's column sums over the same rows.
//   wgrad     gW_k += H_k^T D_k: A = H_k^T (in x rows), B = D_k (rows x units); the block's sum over its tiles
//             accumulates in the same registers, tile after tile, 16 rows (one scale pair) at a time.
//   delta     D_{k-1} = (D_k W_k^T) .* act'(H_k): A = D_k, B = W_k^T, written over H_k (no longer needed);
//             its column sums (gb_{k-1}) from the epilogue's registers, a fixed butterfly over the rows.
// Every sum's order is fixed by the block's rows and the widths (the hardware's MMA order, then k ranges, row
// groups and tiles in order), and every scale by the values it scales, so a step's bits do not depend on the
// rank count. Padded units have zero weights and biases, so their activations and deltas are exact zeros;
// rows past the block's end or outside the window get zero output deltas, so their deltas are zeros and add
// nothing.
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
  static constexpr int WEIGHT_BYTES = static_cast<int>(deep_weight_bytes(NI, L));
  static constexpr int GROUP_BYTES = static_cast<int>(deep_group_bytes(NI, L));

  LossTerm loss{};

  std::size_t scratch_bytes() const { return deep_scratch_bytes(NI, L, G); }

#if defined(__CUDACC__)
  // Layer k's inputs, padded.
  __host__ __device__ static constexpr int in_of(int k) { return k == 0 ? NI : U; }

  // A matrix in shared memory: `rows` x C values as hi and lo fp16 planes (deep_at), and its scales, one a
  // region of 16 rows x 32 columns (sc[row / 16][column / 32]; the weights have one for the whole matrix).
  template <int C>
  struct Split {
    __half* hi;
    int lo;     // the lo plane's offset from hi, in halves
    float* sc;  // [4][2]
    // The shared address of row r's 16-byte chunk (hi plane).
    __device__ unsigned address(int r, int chunk) const {
      return shared_address(hi) + 2u * static_cast<unsigned>(r * C + ((chunk ^ deep_swizzle(r, C)) << 3));
    }
    __device__ float value(int r, int c, float s) const {
      const int e = deep_at(r, c, C);
      return f16x3::join1(hi[e], hi[e + lo]) * s;
    }
    // Values v (row r, columns c and c + 1; c even) split at scale 1 / inv.
    __device__ void store2(int r, int c, float v0, float v1, float inv) const {
      std::uint32_t h, l;
      f16x3::split2(v0, v1, inv, h, l);
      const int e = deep_at(r, c, C);
      *reinterpret_cast<std::uint32_t*>(hi + e) = h;
      *reinterpret_cast<std::uint32_t*>(hi + e + lo) = l;
    }
    __device__ float2 load2(int r, int c, float s) const {
      const int e = deep_at(r, c, C);
      const float2 v = f16x3::join2(*reinterpret_cast<const std::uint32_t*>(hi + e),
                                    *reinterpret_cast<const std::uint32_t*>(hi + e + lo));
      return make_float2(v.x * s, v.y * s);
    }
    __device__ void store1(int r, int c, float v, float inv) const {
      const int e = deep_at(r, c, C);
      f16x3::split1(v, inv, hi[e], hi[e + lo]);
    }
  };

  // Byte offsets: the weights' from the CTA's base, a group's tiles' from the group's base.
  __host__ __device__ static constexpr int w_at(int k) { return k == 0 ? 0 : w_at(k - 1) + 4 * in_of(k - 1) * U; }
  static constexpr int B_AT = w_at(L), WO_AT = B_AT + 4 * L * U, BO_AT = WO_AT + 4 * U * NO4, WSC_AT = BO_AT + 4 * NO4,
                       WMAX_AT = WSC_AT + 4 * L;
  __host__ __device__ static constexpr int h_at(int k) { return 4 * R * NI + 4 * R * U * k; }
  static constexpr int XSC_AT = h_at(L), DL_AT = XSC_AT + 32 * (1 + L), RL_AT = DL_AT + 4 * R * NO4,
                       PO_AT = RL_AT + 4 * R, SB_AT = PO_AT + 8 * R * NO4, SW_AT = SB_AT + 16 * L * U,
                       SO_AT = SW_AT + 16 * U * NO4, GROUP_END = SO_AT + 8 * (NO4 + 1);
  static_assert(WMAX_AT + 4 * L <= WEIGHT_BYTES && GROUP_END <= GROUP_BYTES, "deep_weight_bytes, deep_group_bytes");

  // Shared memory: two bases (the weights', the group's), every piece at a constant offset from one, so a
  // thread keeps two addresses live instead of one a piece.
  struct Smem {
    char* wb;      // the weights (shared by the groups)
    char* gb;      // the group's tiles
    unsigned bar;  // the group's named barrier (G > 1)
    __device__ float* f(char* base, int at) const { return reinterpret_cast<float*>(base + at); }
    __device__ __half* w(int k) const { return reinterpret_cast<__half*>(wb + w_at(k)); }  // in_of(k) x U, two planes
    __device__ float* b(int k) const { return f(wb, B_AT + 4 * U * k); }                    // U
    __device__ float* wo() const { return f(wb, WO_AT); }                                   // U x NO4
    __device__ float* bo() const { return f(wb, BO_AT); }                                   // NO4
    __device__ float* wsc() const { return f(wb, WSC_AT); }                                 // L: the weights' scales
    __device__ unsigned* wmax() const { return reinterpret_cast<unsigned*>(wb + WMAX_AT); }  // L: their largest |w|
    __device__ Split<NI> x() const {  // R x NI
      return {reinterpret_cast<__half*>(gb), R * NI, f(gb, XSC_AT)};
    }
    __device__ Split<U> h(int k) const {  // R x U: H_{k+1}, then D_k
      return {reinterpret_cast<__half*>(gb + h_at(k)), R * U, f(gb, XSC_AT + 32 * (1 + k))};
    }
    __device__ float* dl() const { return f(gb, DL_AT); }  // R x NO4: the output deltas
    __device__ float* rl() const { return f(gb, RL_AT); }  // R: the rows' loss terms
    __device__ float* po() const { return f(gb, PO_AT); }  // 2 x R x NO4: output sums over each half of H_L
    // The block's sums by row group (warp % 4), added tile by tile, a slot a thread: every hidden layer's bias
    // gradients (L x 4 x U: column share_column(g, t) of a warp's share, fc0 + lane for the last layer), the
    // output layer's weight gradients (4 x U x NO4), and warps 0 and 1's output-layer bias gradients and loss
    // (2 x (NO4 + 1)).
    __device__ float* sb() const { return f(gb, SB_AT); }
    __device__ float* sw() const { return f(gb, SW_AT); }
    __device__ float* so() const { return f(gb, SO_AT); }
    // The group's barrier.
    __device__ void sync() const {
      if constexpr (G == 1) {
        __syncthreads();
      } else {
        asm volatile("bar.sync %0, %1;" ::"r"(bar), "n"(T) : "memory");
      }
    }
  };

  __device__ Smem carve(char* raw, int group) const {
    char* base = reinterpret_cast<char*>(align_shared_128(raw));
    return Smem{base, base + WEIGHT_BYTES + group * GROUP_BYTES, static_cast<unsigned>(1 + group)};
  }

  // Every layer's parameters into shared memory, zero-padded; the hidden layers' weights split at one scale a
  // layer.
  __device__ void load_params(const Smem& s, int tid) const {
    constexpr int CT = T * G;  // the CTA's threads
    if (tid < L) s.wmax()[tid] = 0u;
    __syncthreads();
    for (int k = 0; k < L; ++k) {
      const int n_in = widths[k], n_out = widths[k + 1];
      const float* w = params + woff[k];
      float m = 0.0f;
      for (int e = tid; e < n_in * n_out; e += CT) m = f16x3::abs_max(m, w[e]);
      atomicMax(s.wmax() + k, __float_as_uint(m));
      for (int j = tid; j < U; j += CT) s.b(k)[j] = j < n_out ? params[boff[k] + j] : 0.0f;
    }
    const int n_last = widths[L], NO = widths[L + 1];
    for (int e = tid; e < U * NO4; e += CT) {
      const int i = e / NO4, o = e - i * NO4;
      s.wo()[e] = (i < n_last && o < NO) ? params[woff[L] + i * NO + o] : 0.0f;
    }
    if (tid < NO4) s.bo()[tid] = tid < NO ? params[boff[L] + tid] : 0.0f;
    __syncthreads();
    for (int k = 0; k < L; ++k) {
      const int n_in = widths[k], n_out = widths[k + 1];
      const float* w = params + woff[k];
      float inv, sc;
      f16x3::scale_for(s.wmax()[k], inv, sc);
      if (tid == 0) s.wsc()[k] = sc;
      for (int e = tid; e < in_of(k) * U; e += CT) {
        const int i = e / U, j = e - i * U;
        const int at = deep_at(i, j, U);
        f16x3::split1((i < n_in && j < n_out) ? w[i * n_out + j] : 0.0f, inv, s.w(k)[at], s.w(k)[at + in_of(k) * U]);
      }
    }
  }

  // The tile of rows [row0, row0 + R) that ends at `end` into s.x() (zeros past `end` and past the inputs):
  // warp w < NI / 8 takes the scale region (w % 4, w / 4), a column a lane.
  __device__ void load_x(const Smem& s, std::int64_t row0, std::int64_t end, int warp, int lane) const {
    if (warp >= NI / 8) return;
    const int n_in = widths[0], q = warp & 3, c = 32 * (warp >> 2) + lane;
    float v[16], m = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const std::int64_t r = row0 + 16 * q + i;
      v[i] = (r < end && c < n_in) ? x[r * n_in + c] : 0.0f;
      m = f16x3::abs_max(m, v[i]);
    }
    float inv, sc;
    f16x3::scale_for(f16x3::warp_max_bits(m), inv, sc);
#pragma unroll
    for (int i = 0; i < 16; ++i) s.x().store1(16 * q + i, c, v[i], inv);
    if (lane == 0) s.x().sc[2 * q + (warp >> 2)] = sc;
  }

  // acc (4 n tiles: columns n0 + 8 n ..) += A B over the 16 k values from k0, in 3xFP16, unscaled: A's rows
  // (m) m0..m0 + 15 from a (its transpose there: TA), B's columns n0..n0 + 31 from b (its transpose: TB).
  // Layouts as stored: A as rows x k (TA: k x rows), B as k x columns (TB: columns x k). Init: acc = A B.
  template <int CA, bool TA, int CB, bool TB, bool Init = false>
  __device__ static void mma_k16(float (&acc)[4][4], const Split<CA>& a, const Split<CB>& b, int m0, int n0, int k0,
                                 int lane) {
    const int q = lane >> 3, r8 = lane & 7;
    std::uint32_t ahi[4], alo[4], bhi[4][2], blo[4][2];
    {
      const unsigned at = TA ? a.address(k0 + r8 + 8 * (q >> 1), (m0 >> 3) + (q & 1))
                             : a.address(m0 + (lane & 15), (k0 >> 3) + (lane >> 4));
      f16x3::ldsm4<TA>(ahi, at);
      f16x3::ldsm4<TA>(alo, at + 2 * a.lo);
    }
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      // TB: stored columns x k, read as it is; else stored k x columns, read transposed.
      const unsigned at = TB ? b.address(n0 + 16 * p + r8 + 8 * (q >> 1), (k0 >> 3) + (q & 1))
                             : b.address(k0 + r8 + 8 * (q & 1), ((n0 + 16 * p) >> 3) + (q >> 1));
      std::uint32_t h[4], l[4];
      f16x3::ldsm4<!TB>(h, at);
      f16x3::ldsm4<!TB>(l, at + 2 * b.lo);
      bhi[2 * p][0] = h[0], bhi[2 * p][1] = h[1], bhi[2 * p + 1][0] = h[2], bhi[2 * p + 1][1] = h[3];
      blo[2 * p][0] = l[0], blo[2 * p][1] = l[1], blo[2 * p + 1][0] = l[2], blo[2 * p + 1][1] = l[3];
    }
    f16x3::mma3<4, Init>(acc, ahi, alo, bhi, blo);
  }
  __device__ static void zero(float (&acc)[4][4]) {
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  }
  __device__ static void add_scaled(float (&acc)[4][4], const float (&part)[4][4], float sc) {
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] = fmaf(part[n][e], sc, acc[n][e]);
  }
  // A warp's 16 x 32 share (rows r0.., columns c0..: the accumulator layout) into region (r0 / 16, c0 / 32)
  // of m, at the scale its largest magnitude gives.
  __device__ static void store_share(const Split<U>& m, const float (&v)[4][4], int r0, int c0, int g, int t,
                                     int lane) {
    float mx = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx = f16x3::abs_max(mx, v[n][e]);
    float inv, sc;
    f16x3::scale_for(f16x3::warp_max_bits(mx), inv, sc);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int c = c0 + 8 * n + 2 * t;
      m.store2(r0 + g, c, v[n][0], v[n][1], inv);
      m.store2(r0 + g + 8, c, v[n][2], v[n][3], inv);
    }
    if (lane == 0) m.sc[2 * (r0 >> 4) + (c0 >> 5)] = sc;
  }
  // The column sums of a warp's 16 x 32 share (the accumulator layout), added to `sum`: lane (g, t) takes
  // column 8 (g / 2) + 2 t + g % 2 of the share (share_column), the rows' pairs, then lanes g ^ 4, g ^ 2,
  // g ^ 1 (a fixed order).
  __device__ static int share_column(int g, int t) { return 8 * (g >> 1) + 2 * t + (g & 1); }
  __device__ static void add_column_sums(float* sum, const float (&v)[4][4], int lane) {
    constexpr unsigned all = 0xffffffffu;
    float s[8];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      s[2 * n] = v[n][0] + v[n][2];
      s[2 * n + 1] = v[n][1] + v[n][3];
    }
    const bool b1 = (lane >> 4) & 1, b2 = (lane >> 3) & 1, b3 = (lane >> 2) & 1;
    float w[4], u[2];
#pragma unroll
    for (int m = 0; m < 4; ++m) w[m] = (b1 ? s[4 + m] : s[m]) + __shfl_xor_sync(all, b1 ? s[m] : s[4 + m], 16);
#pragma unroll
    for (int m = 0; m < 2; ++m) u[m] = (b2 ? w[2 + m] : w[m]) + __shfl_xor_sync(all, b2 ? w[m] : w[2 + m], 8);
    *sum += (b3 ? u[1] : u[0]) + __shfl_xor_sync(all, b3 ? u[0] : u[1], 4);
  }

  // H_{k+1} = act(H_k W_k + b_k) for the warp's 16 x 32 share, into s.h(k); after the last, the output
  // layer's sums over the share's units (s.po()).
  template <Activation A, int k>
  __device__ void forward_layer(const Smem& s, int fr0, int fc0, int g, int t, int lane) const {
    float acc[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float b0 = s.b(k)[fc0 + 8 * n + 2 * t], b1 = s.b(k)[fc0 + 8 * n + 2 * t + 1];
      acc[n][0] = b0, acc[n][1] = b1, acc[n][2] = b0, acc[n][3] = b1;
    }
    const Split<U> w{s.w(k), in_of(k) * U, nullptr};
#pragma unroll
    for (int c = 0; c < in_of(k) / 32; ++c) {
      float part[4][4];
      if constexpr (k == 0) {
        mma_k16<NI, false, U, false, true>(part, s.x(), w, fr0, fc0, 32 * c, lane);
        mma_k16<NI, false, U, false>(part, s.x(), w, fr0, fc0, 32 * c + 16, lane);
        add_scaled(acc, part, s.x().sc[2 * (fr0 >> 4) + c] * s.wsc()[k]);
      } else {
        mma_k16<U, false, U, false, true>(part, s.h(k - 1), w, fr0, fc0, 32 * c, lane);
        mma_k16<U, false, U, false>(part, s.h(k - 1), w, fr0, fc0, 32 * c + 16, lane);
        add_scaled(acc, part, s.h(k - 1).sc[2 * (fr0 >> 4) + c] * s.wsc()[k]);
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] = detail::activate(A, acc[n][e]);
    store_share(s.h(k), acc, fr0, fc0, g, t, lane);
    if constexpr (k == L - 1) {
      // Rows fr0 + g and fr0 + g + 8: the sums over the share's 32 units (its 8, then lanes t ^ 1, t ^ 2).
      const int NO = widths[L + 1];
      float p0[NO4], p1[NO4];
#pragma unroll
      for (int o = 0; o < NO4; ++o) p0[o] = p1[o] = 0.0f;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int c = fc0 + 8 * n + 2 * t;
#pragma unroll
        for (int o = 0; o < NO4; ++o) {
          if (o < NO) {
            const float w0 = s.wo()[c * NO4 + o], w1 = s.wo()[(c + 1) * NO4 + o];
            p0[o] = fmaf(acc[n][1], w1, fmaf(acc[n][0], w0, p0[o]));
            p1[o] = fmaf(acc[n][3], w1, fmaf(acc[n][2], w0, p1[o]));
          }
        }
      }
#pragma unroll
      for (int o = 0; o < NO4; ++o) {
        if (o < NO) {
          p0[o] += __shfl_xor_sync(0xffffffffu, p0[o], 1);
          p1[o] += __shfl_xor_sync(0xffffffffu, p1[o], 1);
          p0[o] += __shfl_xor_sync(0xffffffffu, p0[o], 2);
          p1[o] += __shfl_xor_sync(0xffffffffu, p1[o], 2);
          if (t == 0) {
            s.po()[((fc0 >> 5) * R + fr0 + g) * NO4 + o] = p0[o];
            s.po()[((fc0 >> 5) * R + fr0 + g + 8) * NO4 + o] = p1[o];
          }
        }
      }
    }
    s.sync();
  }
  template <Activation A, int... K>
  __device__ void forward_all(const Smem& s, int fr0, int fc0, int g, int t, int lane,
                              std::integer_sequence<int, K...>) const {
    (forward_layer<A, K>(s, fr0, fc0, g, t, lane), ...);
  }

  // Hidden layer k's backward for the tile, D_k complete in s.h(k) once the first barrier passes: gW_k +=
  // H_k^T D_k (warp tiles of 16 inputs x 32 units, in_of(k) / 16 * 2 of them) and, below the first layer,
  // D_{k-1} = (D_k W_k^T) .* act'(H_k) over H_k, its column sums into gb_{k-1}.
  template <Activation A, int k>
  __device__ void backward_layer(const Smem& s, float (&gwk)[4][4], int warp, int fr0, int fc0, int g, int t,
                                 int lane) const {
    s.sync();  // D_k is complete
    const Split<U> dk = s.h(k);
    constexpr int ti = in_of(k) / 16;
    if (warp < ti * 2) {
      const int i0 = 16 * (warp % ti), j0 = 32 * (warp / ti);
#pragma unroll
      for (int q = 0; q < R / 16; ++q) {
        float part[4][4];
        if constexpr (k == 0) {
          mma_k16<NI, true, U, false, true>(part, s.x(), dk, i0, j0, 16 * q, lane);
          add_scaled(gwk, part, s.x().sc[2 * q + (i0 >> 5)] * dk.sc[2 * q + (j0 >> 5)]);
        } else {
          mma_k16<U, true, U, false, true>(part, s.h(k - 1), dk, i0, j0, 16 * q, lane);
          add_scaled(gwk, part, s.h(k - 1).sc[2 * q + (i0 >> 5)] * dk.sc[2 * q + (j0 >> 5)]);
        }
      }
    }
    if constexpr (k > 0) {
      // The two 32-unit halves of k, each at its own scale: the first's sum scaled, the second's added.
      const Split<U> w{s.w(k), U * U, nullptr};
      float acc[4][4], part[4][4];
      mma_k16<U, false, U, true, true>(acc, dk, w, fr0, fc0, 0, lane);
      mma_k16<U, false, U, true>(acc, dk, w, fr0, fc0, 16, lane);
      mma_k16<U, false, U, true, true>(part, dk, w, fr0, fc0, 32, lane);
      mma_k16<U, false, U, true>(part, dk, w, fr0, fc0, 48, lane);
      const float s0 = dk.sc[2 * (fr0 >> 4)] * s.wsc()[k], s1 = dk.sc[2 * (fr0 >> 4) + 1] * s.wsc()[k];
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = fmaf(part[n][e], s1, acc[n][e] * s0);
      s.sync();  // every reader of H_k (the wgrad above) is done
      const Split<U> hm = s.h(k - 1);
      const float hs = hm.sc[2 * (fr0 >> 4) + (fc0 >> 5)];
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int c = fc0 + 8 * n + 2 * t;
        const float2 h0 = hm.load2(fr0 + g, c, hs), h1 = hm.load2(fr0 + g + 8, c, hs);
        acc[n][0] *= detail::activate_grad_from_output(A, h0.x);
        acc[n][1] *= detail::activate_grad_from_output(A, h0.y);
        acc[n][2] *= detail::activate_grad_from_output(A, h1.x);
        acc[n][3] *= detail::activate_grad_from_output(A, h1.y);
      }
      add_column_sums(s.sb() + ((k - 1) * 4 + (warp & 3)) * U + fc0 + share_column(g, t), acc, lane);
      __syncwarp();  // the warp's reads of its region's scale come before its new one
      store_share(hm, acc, fr0, fc0, g, t, lane);
    }
  }
  template <Activation A, int... K>
  __device__ void backward_all(const Smem& s, float (&gw)[L][4][4], int warp, int fr0, int fc0, int g, int t, int lane,
                               std::integer_sequence<int, K...>) const {
    (backward_layer<A, L - 1 - K>(s, gw[L - 1 - K], warp, fr0, fc0, g, t, lane), ...);
  }

  // Where block blk's rows end.
  __device__ std::int64_t block_end(std::int64_t blk) const {
    return blk * block + block < rows ? blk * block + block : rows;
  }

  __device__ void run(char* raw) const {
    switch (act) {
      case Activation::relu: return run_as<Activation::relu>(raw);
      case Activation::tanh: return run_as<Activation::tanh>(raw);
      default: return run_as<Activation::identity>(raw);
    }
  }

  // The activation is a template argument: a runtime switch per element costs more than the MMAs' issue.
  template <Activation A>
  __device__ void run_as(char* raw) const {
    constexpr unsigned all = 0xffffffffu;
    const int group = G == 1 ? 0 : static_cast<int>(threadIdx.x) / T;
    const Smem s = carve(raw, group);
    load_params(s, static_cast<int>(threadIdx.x));
    __syncthreads();
    const int tid = static_cast<int>(threadIdx.x) - group * T, warp = tid >> 5, lane = tid & 31, g = lane >> 2,
              t = lane & 3;
    const int NO = widths[L + 1];
    // The forward's and the delta's share of a tile (and its scale region): rows fr0.., units fc0...
    const int fr0 = 16 * (warp & 3), fc0 = 32 * (warp >> 2);
    const Split<U> hl = s.h(L - 1);
    for (std::int64_t blk = std::int64_t(blockIdx.x) * G + group; blk < blocks; blk += std::int64_t(gridDim.x) * G) {
      const std::int64_t first = blk * block, end = block_end(blk);
      float gw[L][4][4];
#pragma unroll
      for (int k = 0; k < L; ++k) zero(gw[k]);
      // This thread's slots of the block's sums by row group (Smem::sb, sw, so).
      const int rg = warp & 3;
      float* const gwo = s.sw() + (rg * U + fc0 + lane) * NO4;
      float* const gbo = s.so() + warp * (NO4 + 1);  // warps 0 and 1; the loss at [NO4]
#pragma unroll
      for (int k = 0; k < L; ++k) s.sb()[(k * 4 + rg) * U + fc0 + lane] = 0.0f;  // a bijection, as share_column's
#pragma unroll
      for (int o = 0; o < NO4; ++o) gwo[o] = 0.0f;
      if (tid < R && lane == 0) {
#pragma unroll
        for (int o = 0; o <= NO4; ++o) gbo[o] = 0.0f;
      }
      for (std::int64_t row0 = first; row0 < end; row0 += R) {
        // The lane and warp as values the compiler cannot carry across tiles: every shared address derived
        // from them is computed where it is used, instead of all of them once, before the loop, and kept live
        // (spilled) through it.
        int lane_t = lane, warp_t = warp;
        asm volatile("" : "+r"(lane_t), "+r"(warp_t));
        const int fr0_t = 16 * (warp_t & 3), fc0_t = 32 * (warp_t >> 2), g_t = lane_t >> 2, t_t = lane_t & 3;
        const int valid = end - row0 < R ? static_cast<int>(end - row0) : R;
        s.sync();  // the last tile's readers of x, dl and rl are done
        load_x(s, row0, end, warp_t, lane_t);
        s.sync();
        // Forward through the hidden layers.
        forward_all<A>(s, fr0_t, fc0_t, g_t, t_t, lane_t, std::make_integer_sequence<int, L>());
        // The output layer: a row's predictions, loss terms and output deltas (thread r); the tile's sums of
        // the deltas and the loss terms by each of the two warps (a fixed butterfly).
        if (tid < R) {
          const int r = tid;
          const bool learn = r < valid && window.contains(row0 + r);
          float term = 0.0f;
#pragma unroll
          for (int o = 0; o < NO4; ++o) {
            float d = 0.0f;
            if (o < NO) {
              const float p = s.bo()[o] + s.po()[r * NO4 + o] + s.po()[(R + r) * NO4 + o];
              const float res = learn ? p - y[(row0 + r) * NO + o] : 0.0f;
              term += loss.value(res, o);
              d = loss.grad(res, o, scale);
              float sum = d;
#pragma unroll
              for (int m = 16; m >= 1; m >>= 1) sum += __shfl_xor_sync(all, sum, m);
              if (lane == 0) gbo[o] += sum;
            }
            s.dl()[r * NO4 + o] = d;
          }
#pragma unroll
          for (int m = 16; m >= 1; m >>= 1) term += __shfl_xor_sync(all, term, m);
          if (lane == 0) gbo[NO4] += term;
        }
        s.sync();
        // D_{L-1} = (D_L W_L^T) .* act'(H_L), over H_L, by the warps' shares (their 16 rows, a lane a unit),
        // with the output layer's weight gradients and the column sums of D_{L-1} over the share's rows.
        {
          const int u = fc0_t + lane_t;
          const float hs = hl.sc[2 * (fr0_t >> 4) + (fc0_t >> 5)];
          float wu[NO4];
#pragma unroll
          for (int o = 0; o < NO4; ++o) wu[o] = s.wo()[u * NO4 + o];
          float d[16], m = 0.0f, col = 0.0f, go[NO4];
#pragma unroll
          for (int o = 0; o < NO4; ++o) go[o] = 0.0f;
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const int r = fr0_t + i;
            const float h = hl.value(r, u, hs);
            float v = 0.0f;
#pragma unroll
            for (int o = 0; o < NO4; ++o) {
              if (o < NO) {
                const float dro = s.dl()[r * NO4 + o];
                v = fmaf(dro, wu[o], v);
                go[o] = fmaf(h, dro, go[o]);
              }
            }
            d[i] = v * detail::activate_grad_from_output(A, h);
            col += d[i];
            m = f16x3::abs_max(m, d[i]);
          }
          s.sb()[((L - 1) * 4 + rg) * U + u] += col;
#pragma unroll
          for (int o = 0; o < NO4; ++o) {
            if (o < NO) gwo[o] += go[o];
          }
          float inv, sc;
          f16x3::scale_for(f16x3::warp_max_bits(m), inv, sc);
#pragma unroll
          for (int i = 0; i < 16; ++i) hl.store1(fr0_t + i, u, d[i], inv);
          __syncwarp();  // the warp's reads of its region's scale come before its new one
          if (lane_t == 0) hl.sc[2 * (fr0_t >> 4) + (fc0_t >> 5)] = sc;
        }
        // The hidden layers, top down.
        backward_all<A>(s, gw, warp_t, fr0_t, fc0_t, g_t, t_t, lane_t, std::make_integer_sequence<int, L>());
      }
      // The block's row of partial sums: the weight gradients are whole in each warp; the sums by row group
      // (Smem::sb, sw, so) are added in order.
      float* out = partials + blk * ld;
#pragma unroll
      for (int k = 0; k < L; ++k) {
        const int ti = in_of(k) / 16, ni = widths[k], no = widths[k + 1];
        if (warp < ti * 2) {
          const int i0 = 16 * (warp % ti), j0 = 32 * (warp / ti);
#pragma unroll
          for (int n = 0; n < 4; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int i = i0 + g + (e >= 2 ? 8 : 0), j = j0 + 8 * n + 2 * t + (e & 1);
              if (i < ni && j < no) out[woff[k] + i * no + j] = gw[k][n][e];
            }
          }
        }
      }
      s.sync();  // every warp's sums are in
      for (int e = tid; e < L * U; e += T) {
        const int k = e / U, j = e - k * U;
        if (j < widths[k + 1]) {
          const float* v = s.sb() + k * 4 * U + j;
          out[boff[k] + j] = ((v[0] + v[U]) + v[2 * U]) + v[3 * U];
        }
      }
      {
        const int i = tid & (U - 1), o = tid >> 6;
        if (o < NO && i < widths[L]) {
          const float* v = s.sw() + i * NO4 + o;
          out[woff[L] + i * NO + o] = ((v[0] + v[U * NO4]) + v[2 * U * NO4]) + v[3 * U * NO4];
        }
        if (o < NO && i == 0) out[boff[L] + o] = s.so()[o] + s.so()[NO4 + 1 + o];
        if (tid == T - 1) out[ld - 1] = s.so()[NO4] + s.so()[2 * NO4 + 1];
      }
      s.sync();  // the sums are read before the next block clears them
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
