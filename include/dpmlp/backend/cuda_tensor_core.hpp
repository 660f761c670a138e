// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda_tensor_core.hpp: the fused one-hidden-layer kernel on NVIDIA tensor cores
// (sm_80 and newer), in fp32-equivalent precision ("3xTF32").
//
// Why: the SIMT fused kernel (detail/fused_one_hidden.hpp) reaches only a few TFLOP/s of fp32 FMA: its register
// tiles are small and shared-memory loads bound it. Its two GEMMs, the forward X W0 and the weight gradient
// X^T dZ, are what tensor cores do. TF32 alone keeps 10 mantissa bits, too few for results that must match
// an fp32 run, so each operand is split into a TF32 "big" part and a TF32 remainder, and a*b is computed as
// a_lo*b_hi + a_hi*b_lo + a_hi*b_hi (the dropped a_lo*b_lo is below fp32 rounding): three MMAs per product,
// accumulated in fp32 (CUTLASS's 3xTF32 scheme).
//
// Two kernels, chosen by tensor_kernel_for (below): the register-resident one (TensorMmaKernel, raw
// mma.sync, 32 or fewer inputs) for one-output relu/identity models at every step size, for other models
// in steps with enough blocks to fill it; the warp-matrix one (FusedTensorCoreKernel, CUDA's nvcuda::wmma,
// any shape the fused engines take) otherwise. This is the only
// file that uses either. Each is launched here, on the Kokkos::Cuda instance's stream (so CUDA-graph capture
// and stream order are kept): Kokkos caps team scratch at 48 KB, and both need more shared memory (up to
// ~150 KB a block). Both compute exactly what the SIMT kernel computes (the same per-block partial sums, in
// the parameter layout, for the same block tree), with different but equally fixed summation shapes, so
// they are reproducible across rank counts the same way: every sum depends only on the block's rows and the
// model's widths.
//
// The warp-matrix kernel:
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
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <mma.h>
#endif

#include "dpmlp/activation.hpp"
#include "dpmlp/detail/fused_one_hidden.hpp"
#include "dpmlp/errors.hpp"

namespace dpmlp {
namespace backend {

using detail::activate;
using detail::activate_grad_from_output;
using detail::RowWindow;

// Whether the current CUDA device has TF32 tensor cores (compute capability 8.0 or newer), else why not.
inline std::string tensor_cores_unavailable() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    return "the CUDA device's compute capability could not be read";
  }
  if (major < 8) return "the tensor engine needs compute capability 8.0 or newer (this device: " +
                        std::to_string(major) + ".x)";
  return {};
}

// The kernel's padded shape for a model: inputs to 32 or 64, hidden units to a power of two in [32, 256].
inline int tensor_ni(int inputs) { return inputs <= 32 ? 32 : 64; }
inline int tensor_hp(int hidden) {
  int hp = 32;
  while (hp < hidden) hp *= 2;
  return hp;
}
inline constexpr int tensor_chunk = 64;  // rows a block holds at once

// Shared memory a block, in bytes, for padded shape (ni, hp) and `no` outputs: W0 (ni x (hp + 4)), b0 (hp),
// W1 (hp x no), the chunk's x (64 x (ni + 4)), its h / dZ (64 x (hp + 4)), which also stages the block's
// sums at the end, and its output deltas (64 x no). Rows padded by 4 floats make the fragment loads
// conflict-free; 128 bytes align the start.
inline std::size_t tensor_scratch_bytes(int ni, int hp, int no) {
  const std::size_t C = tensor_chunk;
  return (std::size_t(ni) * (hp + 4) + hp + std::size_t(hp) * no + C * (ni + 4) + C * (hp + 4) + C * no) *
             sizeof(float) +
         128;
}

// The tensor engine's two kernels (tensor_kernel_for says which runs).
enum class TensorKernel { none, mma, wmma };

// What the tensor engine needs to run a step: the model's shape and parameter offsets, the data, where the
// partial sums go (one row of `ld` a block), and which kernel (chosen once, the same on every rank).
struct TensorProblem {
  const float* x = nullptr;  // rows x n_in, row-major
  const float* y = nullptr;  // rows x NO, row-major
  const float* params = nullptr;
  float* partials = nullptr;  // ceil(blocks / group) x ld (compute_tensor's group); the last column: sum of r^2
  std::int64_t ld = 0, rows = 0, block = 0, blocks = 0;
  int n_in = 0, H = 0, NO = 1;
  std::int64_t w0off = 0, b0off = 0, w1off = 0, b1off = 0;
  float scale = 1;
  Activation act = Activation::relu;
  RowWindow window;
  TensorKernel kernel = TensorKernel::none;  // none: tensor_kernel_for(n_in, H, NO, act, blocks, block)
};

// A tensor kernel's launch error (a bad configuration), as an Error.
inline void check_tensor_launch() {
  const cudaError_t launched = cudaPeekAtLastError();
  if (launched != cudaSuccess) {
    throw Error(std::string("dpmlp: tensor kernel launch: ") + cudaGetErrorString(launched));
  }
}

#if defined(__CUDACC__)
// The dynamic shared memory `smem` moved up to a 128-byte boundary, by pointer arithmetic on smem itself: a
// pointer aligned through an integer (uintptr_t) loses the compiler's knowledge that it points to shared
// memory, and every access through it becomes a generic LD / ST instead of LDS / STS (found in the SASS).
__device__ inline float* align_shared_128(char* smem) {
  const unsigned misalign = static_cast<unsigned>(__cvta_generic_to_shared(smem)) & 127u;
  return reinterpret_cast<float*>(smem + ((128u - misalign) & 127u));
}
#endif

// NI: padded inputs (32 or 64); HP: padded hidden units (32, 64, 128 or 256). The problem is its base, so
// the kernel's fields are the problem's.
template <int NI, int HP>
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
  static constexpr int RU = JL == 1 ? 2 : 1;   // of which at once (2: 11.2 against 11.4 us with 1, 4 or 8)
  static_assert(RW * MaxOut <= 32 && RW % RU == 0, "a lane a target of the warp's output rows");
  static_assert(NI == 32 || NI == 64, "NI: 32 or 64");
  static_assert(HP == 32 || HP == 64 || HP == 128 || HP == 256, "HP: 32, 64, 128 or 256");
  static_assert(KS * BTILES >= W && (W % BMT) == 0, "backward tiles must cover the warps");

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
              d = 2.0f * scale * res;
              gloss += res * res;
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
      out[ld - 1] = v;  // the sum of squared residuals: the last column
    }
  }
#endif  // __CUDACC__
};

#if defined(__CUDACC__)
// Two blocks an SM (registers capped at 128): one block's barriers and row phases overlap the other's MMAs.
// At 32 x 256 ptxas spills a little at that cap (272 bytes of stack, sm_90); one block an SM with no
// spills measured slower on the H200 (1M x 32: 58.1 against 35.8 ms per 100 steps, 2 GPUs).
template <int NI, int HP>
__global__ void __launch_bounds__(256, 2) fused_tensor_core(const FusedTensorCoreKernel<NI, HP> k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ char dpmlp_tensor_smem[];
  k.run(static_cast<int>(threadIdx.x), static_cast<std::int64_t>(blockIdx.x), dpmlp_tensor_smem);
#else
  (void)k;
  __trap();  // tensor_unsupported refuses devices below compute capability 8.0
#endif
}
#endif


template <int NI, int HP>
inline void launch_tensor(const Kokkos::Cuda& space, const TensorProblem& p) {
  using kernel_t = FusedTensorCoreKernel<NI, HP>;
  const kernel_t k{p};
#if defined(__CUDACC__)
  // Above 48 KB a kernel must opt in to its dynamic shared memory: once a process (one device a process,
  // as with Kokkos), for the most any output count needs.
  static const cudaError_t opted = cudaFuncSetAttribute(
      fused_tensor_core<NI, HP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(tensor_scratch_bytes(NI, HP, kernel_t::MaxOut)));
  if (opted != cudaSuccess) {
    throw Error(std::string("dpmlp: cudaFuncSetAttribute (tensor kernel): ") + cudaGetErrorString(opted));
  }
  fused_tensor_core<NI, HP><<<static_cast<unsigned>(p.blocks), kernel_t::T, k.scratch_bytes(), space.cuda_stream()>>>(k);
  check_tensor_launch();
#else
  (void)space, (void)k;
  throw Error("dpmlp: the tensor engine must be compiled by a CUDA compiler");
#endif
}


// ---------------------------------------------------------------------------------------------------------
// The register-resident kernel (32 inputs): raw `mma.sync` instead of the warp-matrix API.
//
// Why a second kernel: the one above goes through shared memory between its phases (wmma fragments have no
// documented layout), so its bias / activation / output / delta phases are SIMT loops over shared memory
// with a block barrier each, and they, not the MMAs, bound it. mma.sync.m16n8k8 (tf32) has a documented
// fragment layout, which lets every phase stay in the registers the forward MMA left its results in:
//   forward   Z^T[hidden x rows] = W0^T X^T: A = W0^T (kept in registers for the whole kernel, split once),
//             B = X^T from the chunk in shared memory. A thread then holds z for hidden units {g, g+8} of
//             each 16-unit tile and rows {2t, 2t+1} of each 8-row tile (g = lane / 4, t = lane % 4).
//   outputs   bias, activation, the output partial sums over the warp's hidden units (a fixed butterfly
//             over g), one shared-memory exchange between the warps of a team for the full sums.
//   deltas    dZ in the same registers.
//   backward  gW0^T[hidden x inputs] += dZ^T X. dZ^T is the A operand straight from the accumulator
//             registers: A wants rows {t, t+4} of each 8-row k step where the accumulator has {2t, 2t+1},
//             and a k step's order does not matter to a sum as long as B (X, read from shared memory) uses
//             the same one, so row 2t is k = t and row 2t+1 is k = t + 4. No shuffles, no staging.
// Warps: a team of WH = HP / 32 warps covers the hidden units (32 each: two 16-unit MMA tiles); a CTA of 8
// warps has WR = 8 / WH teams. A team takes whole reduction blocks (team-major: team t of CTA c takes block
// t * CTAs + c, then every teams-th after it), 32 rows at a time (four 8-row MMA tiles), and writes each
// block's sums itself: a block's partial sums depend on its rows and the widths only (rank-count
// reproducible), and teams never wait for each other. Grouped (mma_group: enough blocks to fill every team),
// a CTA's teams take WR consecutive blocks instead, stage their sums in shared memory and meet to add them up
// in the block tree's shape, one row of partials a CTA's round (combine_group).
// Pipelining: the warps of a team meet at a barrier twice a batch (the output sums cross warps), so without
// it every warp of an SM would run its MMAs at the same time and its SIMT phases at the same time. Instead a
// batch's output phase (SIMT) runs alongside the next batch's forward MMAs, which do not depend on it; the
// next batch's pre-activations and the gW0 accumulators wait in shared memory while not in use, which keeps
// the registers under 255 without spills. x rows arrive by cp.async a batch ahead of that forward (three
// buffers: the batch in its backward, the next in its forward, the one after in flight).
// Whether a model takes the register-resident kernel's mask form of the backward: one output and an
// activation whose derivative is 0 or 1 (relu, identity); TensorMmaKernel::masked_grad says what it is. The
// paired teams (mma_pair_runs) and the kernel choice at every block count (mma_at_every_count) need it too.
KOKKOS_INLINE_FUNCTION constexpr bool mask_form(int outputs, Activation a) {
  return outputs == 1 && (a == Activation::relu || a == Activation::identity);
}

inline constexpr int mma_batch_rows = 32;  // rows a team takes at once
inline constexpr int mma_stages = 3;       // x batches a team keeps in flight

// Shared memory of the register-resident kernel, in bytes: per team, mma_stages x batches (32 x 36 floats:
// rows padded by 4 make both fragment reads conflict-free) and the output exchange (WH x 32 x no); the split
// W0^T fragments (hp x 32 x 2); per thread of the 256, two parked arrays of 32 floats (the gW0^T
// accumulators and the next batch's pre-activations, between their uses); and, when grouped (mma_group),
// each team's block sums (32 hp + hp + hp no + no + 1 floats), which the group's teams add up.
inline std::size_t mma_scratch_bytes(int hp, int no, bool grouped = false) {
  const std::size_t wh = hp / 32, teams = 8 / wh, parked = 2 * 256 * 32;
  const std::size_t staged = grouped ? teams * (std::size_t(33 + no) * hp + no + 1) : 0;
  return (teams * mma_stages * mma_batch_rows * 36 + teams * wh * mma_batch_rows * no + std::size_t(hp) * 32 * 2 +
          parked + staged) *
             sizeof(float) +
         128;
}

// The register-resident kernel's group (mma_group): a field where it groups (32 hidden units), else the
// constant 1, so the other kernels' parameters and code stay those they were tuned with (any change there
// moved their registers and their time: 4M x 256, one H200, 297.7 -> 304.2 ms per 100 steps).
template <bool On>
struct MmaGroupField {
  int group = 1;
};
template <>
struct MmaGroupField<false> {
  static constexpr int group = 1;
};

// HP: padded hidden units (32..256); NOC: the most outputs this instantiation handles (1 or 4).
template <int HP, int NOC>
struct TensorMmaKernel : TensorProblem, MmaGroupField<HP == 32> {
  using MmaGroupField<HP == 32>::group;
  static constexpr int NI = 32, T = 256, RB = mma_batch_rows, NB = RB / 8, KT = NI / 8, FT = NI / 8, MT = 2;
  static constexpr int WH = HP / 32, WR = 8 / WH, LDX = NI + 4, ST = mma_stages;
  // One CTA an SM (255 registers a thread). DPMLP_TENSOR_MMA_MIN_BLOCKS=2 asks for two where their shared
  // memory fits (64 hidden units and up), registers then capped at 128: measured slower on the H200 (4M x 256,
  // 2 GPUs: 364.2 against 260.3 ms per 100 steps), the spills cost more than the second CTA's warps gain.
#if defined(DPMLP_TENSOR_MMA_MIN_BLOCKS)
  static constexpr int MIN_BLOCKS = HP >= 64 ? DPMLP_TENSOR_MMA_MIN_BLOCKS : 1;
#else
  static constexpr int MIN_BLOCKS = 1;
#endif
  static_assert(HP == 32 || HP == 64 || HP == 128 || HP == 256, "HP: 32, 64, 128 or 256");
  static_assert(NOC == 1 || NOC == 4, "NOC: 1 or 4");
  // Whether this instantiation has the grouped path (mma_group): 32 hidden units, eight one-warp teams a CTA.
  static constexpr bool GROUPS = HP == 32;
  // Whether b0 stays in a register quad per row tile, the C operand of the forward's first MMAs, instead of
  // being copied into the accumulators every batch (32 moves a batch; ptxas keeps one register per value and
  // builds the quad with moves unless the two copies are distinct loads). Measured on one H200 (docs/
  // benchmarks.md, 23:53 UTC): 4M x 256 258.9 -> 254.1 ms per 100 steps, 1M x 128 unchanged, 1M x 32 2%
  // slower (its registers were at the 255 cap already).
  static constexpr bool BIAS_QUAD = HP == 256;
  // Whether the backward takes the mask form: one output and an activation whose derivative is 0 or 1 (relu,
  // identity). Then dZ[r][j] = d_r w1_j m_r[j] (m the derivative), so gW0[i][j] = w1_j sum_r m_r[j] (d_r x_r[i])
  // and gb0[j] = w1_j sum_r m_r[j] d_r: the backward MMAs' A operand is the mask, exact in TF32, so a product
  // takes two MMAs instead of three and only d x is split (not dZ as well), and the hidden-delta phase is a
  // compare and two FMAs a value; w1 is applied once a block. Same precision class (d x rounded once where d w1
  // was, and w1 times each block's sum), other bits than the three-MMA form; rank counts still agree bitwise
  // (every per-block sum is still fixed by the block's rows and the widths).
  KOKKOS_INLINE_FUNCTION static constexpr bool masked_grad(Activation a) {
    return mask_form(NOC, a);
  }
  static_assert(T == 256 && MT * FT * 4 == 32 && MT * NB * 4 == 32,
                "mma_scratch_bytes parks two arrays of 32 floats for each of 256 threads");

  bool vec16 = false;  // x rows can be copied 16 bytes at a time

  std::size_t scratch_bytes() const { return mma_scratch_bytes(HP, NOC, group > 1); }

#if defined(__CUDACC__)
  // hi: v rounded to TF32 (to nearest, ties away, as cvt.rna: an integer add and a mask, where cvt.rna costs
  // a compare more; it differs from cvt.rna only within 2^-11 of FLT_MAX, where hi becomes inf); lo = v - hi,
  // exact in fp32, passed whole: the tensor cores read a TF32 operand's top 19 bits, so lo is truncated
  // there, an error of at most 2^-11 |lo| <= 2^-22 |v|, the size of the dropped lo*lo. PTX leaves the low
  // bits of a .tf32 operand to the implementation: sm_80 and sm_90 ignore them (the CUDA ctest's tensor tests,
  // against fp64, are the check on a new architecture). Splits were a third of the kernel's instructions.
  __device__ static void split(float v, std::uint32_t& hi, std::uint32_t& lo) {
    hi = (__float_as_uint(v) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(v - __uint_as_float(hi));
  }
  // d += a b, one m16n8k8 TF32 MMA with fp32 accumulation.
  __device__ static void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // d = a b + c, c separate from d.
  __device__ static void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                             const float (&c)[4]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
  // acc[m][n] += a[m] b[n], one MMA for every tile pair (Init: acc[m][n] = a[m] b[n] + c[m], c the first MMA's
  // C operand instead of acc's own value).
  template <int M, int N, bool Init = false>
  __device__ static void mma_each(float (&acc)[M][N][4], const std::uint32_t (&a)[M][4], const std::uint32_t (&b)[N][2],
                                  const float (*c)[4] = nullptr) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        if constexpr (Init) {
          mma(acc[m][n], a[m], b[n][0], b[n][1], c[m]);
        } else {
          mma(acc[m][n], a[m], b[n][0], b[n][1]);
        }
      }
    }
  }
  // acc[m][n] += a[m] b[n] for every tile pair, in 3xTF32: every lo*hi MMA, then every hi*lo, then every
  // hi*hi, so an accumulator's three dependent MMAs are M*N MMAs apart. Init: acc[m][n] starts from c[m].
  template <int M, int N, bool Init = false>
  __device__ static void mma3(float (&acc)[M][N][4], const std::uint32_t (&ahi)[M][4], const std::uint32_t (&alo)[M][4],
                              const std::uint32_t (&bhi)[N][2], const std::uint32_t (&blo)[N][2],
                              const float (*c)[4] = nullptr) {
    mma_each<M, N, Init>(acc, alo, bhi, c);
    mma_each(acc, ahi, blo);
    mma_each(acc, ahi, bhi);
  }
  // acc[m][n] += a[m] b[n] where a is exact in TF32 (a mask of 0s and 1s): every a*lo MMA, then every a*hi.
  template <int M, int N>
  __device__ static void mma2(float (&acc)[M][N][4], const std::uint32_t (&a)[M][4], const std::uint32_t (&bhi)[N][2],
                              const std::uint32_t (&blo)[N][2]) {
    mma_each(acc, a, blo);
    mma_each(acc, a, bhi);
  }
  __device__ static void team_sync(int team) {
    if constexpr (WH == 1) {
      __syncwarp();
    } else {
      asm volatile("bar.sync %0, %1;" ::"r"(team + 1), "n"(WH * 32) : "memory");
    }
  }

  // A team's place in its batches: block b, the batch's first row r and the block's end row `end` (past the
  // last block, b >= blocks and r = end: a batch of no rows). What each batch's copy, targets and sums need
  // comes from these with no multiplication; advance() multiplies only when it moves to the next block (the
  // cursor logic and the copies' bounds were a quarter of the loop's instructions at 32 hidden units, SASS
  // per-instruction counts under Nsight Compute).
  struct Cursor {
    std::int64_t b, r, end;
    __device__ int rows_left() const {  // rows of the batch, 0..RB
      const std::int64_t left = end - r;
      return left < RB ? static_cast<int>(left) : RB;
    }
    __device__ bool last_of_block() const { return r + RB >= end; }
  };
  __device__ Cursor cursor_at(std::int64_t b) const {
    if (b >= blocks) return Cursor{b, rows, rows};
    const std::int64_t r0 = b * block;
    return Cursor{b, r0, r0 + block < rows ? r0 + block : rows};
  }
  // The team's next batch: the block's next, else the first of its next block. nteams: teams in the grid.
  __device__ void advance(Cursor& c, std::int64_t nteams) const {
    c.r += RB;
    if (c.r >= c.end) c = cursor_at(c.b + nteams);
  }
  // Start the copy of the cursor's batch into xs (32 x LDX; zeros past the block's rows and the inputs, and
  // all zeros past the last block, where the pipelined forward still reads a batch), one cp.async group a call.
  __device__ void issue(const Cursor& cur, float* xs, int tl) const {
    const std::int64_t r0 = cur.r;
    const int n = cur.rows_left();
    if (vec16 && n == RB && n_in == NI) {
      issue_whole(r0, xs, tl);
    } else if (vec16) {
#pragma unroll
      for (int c0 = 0; c0 < RB * NI / 4; c0 += WH * 32) copy16(r0, n, xs, c0 + tl);
    } else {
      for (int e = tl; e < RB * NI; e += WH * 32) copy4(r0, n, xs, e);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  // The batch's copies one at a time, where it is not issue_whole's case: 16 bytes (copy c: row c / (NI / 4),
  // inputs 4 (c % (NI / 4)) on) or 4 bytes (element e: row e / NI, input e % NI), zeros past the batch's n rows
  // and the inputs.
  __device__ void copy16(std::int64_t r0, int n, float* xs, int c) const {
    const int r = c / (NI / 4), q = c % (NI / 4);
    int bytes = (n_in - 4 * q) * 4;
    bytes = r < n ? (bytes < 0 ? 0 : bytes > 16 ? 16 : bytes) : 0;
    const float* src = bytes > 0 ? x + (r0 + r) * n_in + 4 * q : x;
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(xs + r * LDX + 4 * q));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
  }
  __device__ void copy4(std::int64_t r0, int n, float* xs, int e) const {
    const int r = e / NI, i = e % NI;
    const bool ok = r < n && i < n_in;
    const float* src = ok ? x + (r0 + r) * n_in + i : x;
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(xs + r * LDX + i));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
  }

  // issue's common case: a whole batch of 32-float rows is one run of memory, so copy c of this thread is its
  // first plus constants on both sides (c0 is a multiple of NI / 4: the row offset and column of each are fixed).
  __device__ void issue_whole(std::int64_t r0, float* xs, int tl) const {
    const float* const src = x + r0 * NI + 4 * tl;
    const unsigned dst =
        static_cast<unsigned>(__cvta_generic_to_shared(xs + (tl / (NI / 4)) * LDX + 4 * (tl % (NI / 4))));
#pragma unroll
    for (int c0 = 0; c0 < RB * NI / 4; c0 += WH * 32) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + (c0 / (NI / 4)) * LDX * 4),
                   "l"(src + 4 * c0)
                   : "memory");
    }
  }

  __device__ void run(char* smem) const {
    switch (act) {
      case Activation::relu: return run_as<Activation::relu>(smem);
      case Activation::tanh: return run_as<Activation::tanh>(smem);
      default: return run_as<Activation::identity>(smem);
    }
  }

  // The activation is a template argument: a runtime switch per element costs more than the MMAs' issue.
  template <Activation A>
  __device__ void run_as(char* smem) const {
    const int t = static_cast<int>(threadIdx.x), warp = t / 32, lane = t % 32, g = lane / 4, tg = lane % 4;
    const int team = warp / WH, wh = warp % WH, tl = t - team * WH * 32;  // tl: thread in the team
    // Team-major: a step with fewer blocks than teams spreads them over the CTAs (one SM each) first. Grouped,
    // CTA-major: a group's WR blocks are its CTA's, taken at once by its teams.
    const std::int64_t nteams = std::int64_t(gridDim.x) * WR;
    // (group is the constant 1 where the kernel does not group, so the grouped paths compile away there.)
    std::int64_t first = std::int64_t(team) * gridDim.x + blockIdx.x;
    if (group > 1) first = std::int64_t(blockIdx.x) * WR + team;

    float* const base = align_shared_128(smem);
    float* const xbuf = base + team * ST * RB * LDX;
    float* const part = base + WR * ST * RB * LDX + team * WH * RB * NOC;  // [wh][row][o]
    // W0^T fragments: [wh][mt][kt][hi, lo][lane][4], so a lane reads its four with one 16-byte load.
    float* const w0f = base + WR * ST * RB * LDX + WR * WH * RB * NOC;
    // This thread's gW0^T accumulators between backward phases and the next batch's pre-activations between
    // its forward and its output phase: [chunk][thread][4] each, conflict-free.
    float* const gwp = w0f + HP * NI * 2 + 4 * t;
    float* const zp = gwp + MT * FT * T * 4;
#pragma unroll
    for (int c = 0; c < MT * FT; ++c) *reinterpret_cast<float4*>(gwp + c * T * 4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    // The parameters, zero-padded: W0^T as split A fragments into shared memory (the first team's warps),
    // b0 and W1 for the hidden units this thread holds, b1.
    if (team == 0) split_w0(w0f, wh, lane, g, tg);
    Step s;
    load_unit_params(s, wh, g);

    // Three cursors over the team's batches: the current one (q), the next (its forward runs during this
    // one's output phase) and the one being copied in.
    s.c = cursor_at(first);
    s.n = s.c;
    advance(s.n, nteams);
    s.p = s.n;
    advance(s.p, nteams);
    s.qc = 0, s.qn = 1, s.qp = 2;
    issue(s.c, xbuf, tl);
    issue(s.n, xbuf + RB * LDX, tl);
    load_y(s.c, lane, s.yc);

    __syncthreads();  // the W0^T fragments are in
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    team_sync(team);  // batch 0 is in
    {
      float z[MT][NB][4];
      forward(z, xbuf, w0f, s, wh, lane, g, tg);
      park(zp, z);
    }
    while (s.c.b < blocks) batch<A>(s, xbuf, part, w0f, gwp, zp, nteams, team, wh, lane, g, tg, tl);
    asm volatile("cp.async.wait_all;" ::: "memory");
  }

  // A team's running state: its cursors, the parameters it keeps in registers, this thread's sums for the
  // current block (b0 and W1 for its hidden units over its rows, b1 and the loss over the rows it is lane of;
  // its gW0^T tiles wait in shared memory between batches, so the two batches' pre-activations and the
  // pipelined forward fit in the registers) and the targets of the current and next batch (lane = row).
  struct Step {
    Cursor c, n, p;
    int qc, qn, qp;  // their x buffers
    // b0 for each row tile's units {g, g, g + 8, g + 8}; with BIAS_QUAD a register quad kept for the kernel.
    float b0q[MT][4], w1r[MT][2][NOC], b1r[NOC];
    float gb0[MT][2], gw1[MT][2][NOC], gl[NOC], lsum;
    float yc[NOC], yn[NOC];
    __device__ void clear() {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int hb = 0; hb < 2; ++hb) {
          gb0[mt][hb] = 0.0f;
#pragma unroll
          for (int o = 0; o < NOC; ++o) gw1[mt][hb][o] = 0.0f;
        }
      }
#pragma unroll
      for (int o = 0; o < NOC; ++o) gl[o] = 0.0f;
      lsum = 0.0f;
    }
  };

  // W0^T, zero-padded, as split A fragments into shared memory, [wh][mt][kt][hi, lo][lane][4] (a lane reads its
  // four with one 16-byte load): fragment (wh, mt, kt), of the units of warp wh of a team.
  __device__ void split_w0_fragment(float* w0f, int wh, int mt, int kt, int lane, int g, int tg) const {
    std::uint32_t hi[4], lo[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = kt * 8 + tg + 4 * (e / 2), j = wh * 32 + mt * 16 + g + 8 * (e % 2);
      split((i < n_in && j < H) ? params[w0off + i * H + j] : 0.0f, hi[e], lo[e]);
    }
    uint4* const dst = reinterpret_cast<uint4*>(w0f) + ((wh * MT + mt) * KT + kt) * 64 + lane;
    dst[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    dst[32] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }

  // Every fragment of warp wh's units.
  __device__ void split_w0(float* w0f, int wh, int lane, int g, int tg) const {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) split_w0_fragment(w0f, wh, mt, kt, lane, g, tg);
    }
  }

  // The fragments (wh, mt, kt) numbered part, part + parts, ... of WH * MT * KT: a share for each of `parts`
  // warps (the paired kernel's B warps).
  __device__ void split_w0_share(float* w0f, int part, int parts, int lane, int g, int tg) const {
#pragma unroll 1
    for (int f = part; f < WH * MT * KT; f += parts) {
      split_w0_fragment(w0f, f / (MT * KT), (f / KT) % MT, f % KT, lane, g, tg);
    }
  }

  // b0 and W1 for the hidden units this thread holds (j = wh*32 + mt*16 + hb*8 + g), b1, zero-padded; the sums
  // cleared.
  __device__ void load_unit_params(Step& s, int wh, int g) const {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hb = 0; hb < 2; ++hb) {
        const int j = wh * 32 + mt * 16 + hb * 8 + g;
        // Two copies the compiler cannot tell are equal (the second a volatile load), or it keeps one register
        // and builds the quad with moves before every use (ptxas propagates a plain or volatile move).
        float v = 0.0f, w = 0.0f;
        if (j < H) {
          v = params[b0off + j];
          if constexpr (BIAS_QUAD) {
            asm volatile("ld.volatile.global.f32 %0, [%1];" : "=f"(w) : "l"(params + b0off + j));
          } else {
            w = v;
          }
        }
        s.b0q[mt][2 * hb] = v;
        s.b0q[mt][2 * hb + 1] = w;
#pragma unroll
        for (int o = 0; o < NOC; ++o) s.w1r[mt][hb][o] = (j < H && o < NO) ? params[w1off + j * NO + o] : 0.0f;
      }
    }
#pragma unroll
    for (int o = 0; o < NOC; ++o) s.b1r[o] = o < NO ? params[b1off + o] : 0.0f;
    s.clear();
  }

  // Activations in place; p: the warp's output sums for rows nt*8 + 2*tg + bit, over its hidden units.
  template <Activation A>
  __device__ static void activate_outputs(float (&zc)[MT][NB][4], const Step& s, float (&p)[NB][2][NOC]) {
#pragma unroll
    for (int nt = 0; nt < NB; ++nt) {
#pragma unroll
      for (int bit = 0; bit < 2; ++bit) {
#pragma unroll
        for (int o = 0; o < NOC; ++o) p[nt][bit][o] = 0.0f;
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NB; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float h = activate(A, zc[mt][nt][e]);
          zc[mt][nt][e] = h;
#pragma unroll
          for (int o = 0; o < NOC; ++o) p[nt][e % 2][o] += h * s.w1r[mt][e / 2][o];
        }
      }
    }
  }

  // One output and one warp a team (32 hidden units): the sums over g (lane bits 2..4) as a reduce-scatter,
  // each step sending half of the values still held (7 shuffles and adds instead of 24), which leaves lane
  // (g, t) the sum for row (i / 2) * 8 + 2t + i % 2, i = 4 (g & 1) + 2 (g >> 1 & 1) + (g >> 2); no shared
  // memory. The additions pair as in the butterfly (lanes l and l ^ 4, then ^ 8, then ^ 16), and a + b is
  // b + a, so these are the butterfly's bits. (Engine at 1M x 32 95.0 -> 91.1 us, one H200; with several warps
  // a team, each writing its row sums for the others, 1M x 256 0.5% faster and 1M x 128 1.7% slower: not
  // there.) row_of_lane() fetches the sum of the row a lane stands for.
  __device__ static float reduce_scatter(const float (&p)[NB][2][NOC], int lane) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = p[i / 2][i % 2][0];
#pragma unroll
    for (int step = 0, half = 4; step < 3; ++step, half /= 2) {
      const bool up = (lane >> (2 + step)) & 1;  // keeps the upper half of what it holds
#pragma unroll
      for (int k = 0; k < half; ++k) {
        const float send = up ? v[k] : v[k + half], keep = up ? v[k + half] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 4 << step);
      }
    }
    return v[0];
  }
  // The row sum (of reduce_scatter's rs) for the row this lane stands for (row r: i = 2 (r / 8) + r % 2).
  __device__ static float row_of_lane(float rs, int lane) {
    const int i = 2 * (lane / 8) + lane % 2, gi = 4 * (i & 1) + 2 * ((i >> 1) & 1) + (i >> 2);
    return __shfl_sync(0xffffffffu, rs, 4 * gi + (lane % 8) / 2);
  }

  // The block's sums over t (lane bits 0..1: the thread's rows of the same unit) for b0 and W1, over the lanes
  // (rows) for b1 and the loss, by butterflies (every lane then holds the same bits of the latter).
  __device__ static void sum_block_lanes(Step& s) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hb = 0; hb < 2; ++hb) {
        s.gb0[mt][hb] += __shfl_xor_sync(0xffffffffu, s.gb0[mt][hb], 1);
        s.gb0[mt][hb] += __shfl_xor_sync(0xffffffffu, s.gb0[mt][hb], 2);
#pragma unroll
        for (int o = 0; o < NOC; ++o) {
          s.gw1[mt][hb][o] += __shfl_xor_sync(0xffffffffu, s.gw1[mt][hb][o], 1);
          s.gw1[mt][hb][o] += __shfl_xor_sync(0xffffffffu, s.gw1[mt][hb][o], 2);
        }
      }
    }
#pragma unroll
    for (int o = 0; o <= NOC; ++o) {
      float& v = o < NOC ? s.gl[o] : s.lsum;
#pragma unroll
      for (int m = 16; m >= 1; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
    }
  }

  // The output deltas of this thread's rows (nt * 8 + 2 * tg + bit), from the lanes that hold them (lane = row).
  __device__ static void row_deltas(const float (&d)[NOC], int tg, float (&dr)[NB][2][NOC]) {
#pragma unroll
    for (int nt = 0; nt < NB; ++nt) {
#pragma unroll
      for (int bit = 0; bit < 2; ++bit) {
#pragma unroll
        for (int o = 0; o < NOC; ++o) dr[nt][bit][o] = __shfl_sync(0xffffffffu, d[o], nt * 8 + 2 * tg + bit);
      }
    }
  }
  // The mask form's hidden-delta phase (masked_grad), one piece for both schedules so that they sum in one
  // order: each value's derivative m (0.0f or 1.0f), and this thread's b0 (without w1; finish_block applies
  // it) and W1 sums; use(mt, nt, e, m) takes each m (the unpaired kernel in place of h, the paired one into
  // its handoff).
  template <Activation A, class Use>
  __device__ static void mask_sums(const float (&zc)[MT][NB][4], const float (&dr)[NB][2][NOC], Step& s, Use&& use) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NB; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float h = zc[mt][nt][e], m = activate_grad_from_output(A, h);
          s.gw1[mt][e / 2][0] += h * dr[nt][e % 2][0];
          s.gb0[mt][e / 2] += m * dr[nt][e % 2][0];
          use(mt, nt, e, m);
        }
      }
    }
  }

  // The targets of the cursor's batch for the row this lane stands for (0 past the rows).
  __device__ void load_y(const Cursor& cur, int lane, float (&v)[NOC]) const {
    const std::int64_t row = cur.r + lane;
    const bool ok = row < cur.end;
#pragma unroll
    for (int o = 0; o < NOC; ++o) v[o] = ok && o < NO ? y[row * NO + o] : 0.0f;
  }

  // z = W0^T x + b0 for the batch in xs: small terms first in each k step; with BIAS_QUAD the first MMA of each
  // accumulator adds b0 as its C operand, else the accumulators start as b0.
  __device__ static void forward(float (&z)[MT][NB][4], const float* xs, const float* w0f, const Step& s, int wh,
                                 int lane, int g, int tg) {
    if constexpr (!BIAS_QUAD) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NB; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) z[mt][nt][e] = s.b0q[mt][e];
        }
      }
    }
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
      std::uint32_t whi[MT][4], wlo[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint4* const src = reinterpret_cast<const uint4*>(w0f) + ((wh * MT + mt) * KT + kt) * 64 + lane;
        const uint4 h4 = src[0], l4 = src[32];
        whi[mt][0] = h4.x, whi[mt][1] = h4.y, whi[mt][2] = h4.z, whi[mt][3] = h4.w;
        wlo[mt][0] = l4.x, wlo[mt][1] = l4.y, wlo[mt][2] = l4.z, wlo[mt][3] = l4.w;
      }
      std::uint32_t bh[NB][2], bl[NB][2];
#pragma unroll
      for (int nt = 0; nt < NB; ++nt) {
        split(xs[(nt * 8 + g) * LDX + kt * 8 + tg], bh[nt][0], bl[nt][0]);
        split(xs[(nt * 8 + g) * LDX + kt * 8 + tg + 4], bh[nt][1], bl[nt][1]);
      }
      if (kt == 0 && BIAS_QUAD) {
        mma3<MT, NB, true>(z, whi, wlo, bh, bl, s.b0q);
      } else {
        mma3(z, whi, wlo, bh, bl);
      }
    }
  }

  // A thread's 32 values to / from its slots in shared memory (p: [chunk][thread][4], this thread's first).
  template <int M, int N>
  __device__ static void park(float* p, const float (&v)[M][N][4]) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        *reinterpret_cast<float4*>(p + (m * N + n) * T * 4) = make_float4(v[m][n][0], v[m][n][1], v[m][n][2], v[m][n][3]);
      }
    }
  }
  template <int M, int N>
  __device__ static void unpark(const float* p, float (&v)[M][N][4]) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const float4 f = *reinterpret_cast<const float4*>(p + (m * N + n) * T * 4);
        v[m][n][0] = f.x, v[m][n][1] = f.y, v[m][n][2] = f.z, v[m][n][3] = f.w;
      }
    }
  }

  // One batch, software-pipelined by one: while this batch's outputs are formed (SIMT), the next batch's
  // forward MMAs (independent of them) run; then this batch's deltas and backward MMAs. This batch's
  // pre-activations come from zp (the previous call's forward), the next batch's go there.
  template <Activation A>
  __device__ void batch(Step& s, float* xbuf, float* part, const float* w0f, float* gwp, float* zp,
                        std::int64_t nteams, int team, int wh, int lane, int g, int tg, int tl) const {
    const int n = s.c.rows_left();
    const std::int64_t r0 = s.c.r;
    const float* const xs = xbuf + s.qc * RB * LDX;
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    team_sync(team);  // the next batch is in; every warp of the team is done with the previous batch
    issue(s.p, xbuf + s.qp * RB * LDX, tl);
    load_y(s.n, lane, s.yn);

    float zc[MT][NB][4];
    unpark(zp, zc);
    // The next batch's forward (past the last batch it reads zeros and is discarded).
    {
      float zn[MT][NB][4];
      forward(zn, xbuf + s.qn * RB * LDX, w0f, s, wh, lane, g, tg);
      park(zp, zn);
    }

    float p[NB][2][NOC];
    activate_outputs<A>(zc, s, p);
    // Over g (lane bits 2..4). One output and one warp a team (32 hidden units): reduce_scatter. Otherwise the
    // butterfly, every lane of a row then holding the same bits.
    float rs = 0.0f;  // one output, one warp: this lane's row sum
    if constexpr (NOC == 1 && WH == 1) {
      rs = reduce_scatter(p, lane);
    } else {
#pragma unroll
      for (int nt = 0; nt < NB; ++nt) {
#pragma unroll
        for (int bit = 0; bit < 2; ++bit) {
#pragma unroll
          for (int o = 0; o < NOC; ++o) {
            float v = p[nt][bit][o];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            if (g == 0) part[(wh * RB + nt * 8 + 2 * tg + bit) * NOC + o] = v;
          }
        }
      }
    }
    if constexpr (!(NOC == 1 && WH == 1)) team_sync(team);

    // Lane = row of the batch: the full output (the team's warps in order), residual and output delta. One
    // output and one warp: the row's sum comes from the lane that holds it (row r: i = 2 (r / 8) + r % 2).
    float d[NOC];
    {
      const std::int64_t row = r0 + lane;
      const bool learn = lane < n && window.contains(row);
      float own = 0.0f;
      if constexpr (NOC == 1 && WH == 1) own = row_of_lane(rs, lane);
#pragma unroll
      for (int o = 0; o < NOC; ++o) {
        float out = 0.0f;
        if constexpr (NOC == 1 && WH == 1) {
          out += own;
        } else {
#pragma unroll
          for (int w = 0; w < WH; ++w) out += part[(w * RB + lane) * NOC + o];
        }
        d[o] = 0.0f;
        if (learn && o < NO) {
          const float res = out + s.b1r[o] - s.yc[o];
          d[o] = 2.0f * scale * res;
          s.lsum += res * res;
          s.gl[o] += d[o];
        }
      }
    }
    // Hidden deltas in place, and this thread's b0 and W1 sums.
    float dr[NB][2][NOC];
    row_deltas(d, tg, dr);
    if constexpr (masked_grad(A)) {
      // The mask in place of h.
      mask_sums<A>(zc, dr, s, [&](int mt, int nt, int e, float m) { zc[mt][nt][e] = m; });
      float gw[MT][FT][4];
      unpark(gwp, gw);
      // Backward, gW0^T / w1 += M^T (d x): A is the mask straight from the registers (0 or 1, exact in TF32),
      // B the batch's rows times their output deltas, split; the k steps as below.
#pragma unroll
      for (int nt = 0; nt < NB; ++nt) {
        std::uint32_t am[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          am[mt][0] = __float_as_uint(zc[mt][nt][0]);  // unit g,     row 2t
          am[mt][1] = __float_as_uint(zc[mt][nt][2]);  // unit g + 8, row 2t
          am[mt][2] = __float_as_uint(zc[mt][nt][1]);  // unit g,     row 2t + 1
          am[mt][3] = __float_as_uint(zc[mt][nt][3]);  // unit g + 8, row 2t + 1
        }
        std::uint32_t bh[FT][2], bl[FT][2];
#pragma unroll
        for (int ft = 0; ft < FT; ++ft) {
          split(dr[nt][0][0] * xs[(nt * 8 + 2 * tg) * LDX + ft * 8 + g], bh[ft][0], bl[ft][0]);
          split(dr[nt][1][0] * xs[(nt * 8 + 2 * tg + 1) * LDX + ft * 8 + g], bh[ft][1], bl[ft][1]);
        }
        mma2(gw, am, bh, bl);
      }
      end_batch<true>(s, gw, gwp, zp, nteams, wh, lane, g, tg);
    } else {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NB; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float h = zc[mt][nt][e];
            float da = 0.0f;
#pragma unroll
            for (int o = 0; o < NOC; ++o) {
              da += dr[nt][e % 2][o] * s.w1r[mt][e / 2][o];
              s.gw1[mt][e / 2][o] += h * dr[nt][e % 2][o];
            }
            const float dz = da * activate_grad_from_output(A, h);
            s.gb0[mt][e / 2] += dz;
            zc[mt][nt][e] = dz;
          }
        }
      }

      // Backward, gW0^T += dZ^T X, an 8-row k step per row tile (k = t: row 2t, k = t + 4: row 2t + 1).
      float gw[MT][FT][4];
      unpark(gwp, gw);
#pragma unroll
      for (int nt = 0; nt < NB; ++nt) {
        std::uint32_t ah[MT][4], al[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          split(zc[mt][nt][0], ah[mt][0], al[mt][0]);  // unit g,     row 2t
          split(zc[mt][nt][2], ah[mt][1], al[mt][1]);  // unit g + 8, row 2t
          split(zc[mt][nt][1], ah[mt][2], al[mt][2]);  // unit g,     row 2t + 1
          split(zc[mt][nt][3], ah[mt][3], al[mt][3]);  // unit g + 8, row 2t + 1
        }
        std::uint32_t bh[FT][2], bl[FT][2];
#pragma unroll
        for (int ft = 0; ft < FT; ++ft) {
          split(xs[(nt * 8 + 2 * tg) * LDX + ft * 8 + g], bh[ft][0], bl[ft][0]);
          split(xs[(nt * 8 + 2 * tg + 1) * LDX + ft * 8 + g], bh[ft][1], bl[ft][1]);
        }
        mma3(gw, ah, al, bh, bl);
      }
      end_batch<false>(s, gw, gwp, zp, nteams, wh, lane, g, tg);
    }
  }

  // A batch's end: the block's sums where it was the block's last batch, the gW0^T accumulators parked, the
  // cursors on to the next batch. Masked: gw and the b0 sums are without w1 (masked_grad).
  template <bool Masked>
  __device__ void end_batch(Step& s, float (&gw)[MT][FT][4], float* gwp, float* zp, std::int64_t nteams, int wh,
                            int lane, int g, int tg) const {
    if (s.c.last_of_block()) {
      if (group > 1) {
        // Grouped: the block's sums go to the team's row of the stage (after the parked arrays; zp is this
        // thread's slot of the second), then the group adds them up. The thread index through a volatile
        // asm: with threadIdx.x the compiler hoisted these addresses out of the batch loop, registers live
        // across it, and ptxas spilled (136 bytes at 32 hidden units; none this way, sm_90 -Xptxas -v).
        unsigned tid;
        asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
        float* const stage = zp + MT * NB * T * 4 - 4 * static_cast<int>(tid);
        finish_block<Masked, true>(s, gw, wh, lane, g, tg,
                                   stage + (static_cast<int>(tid) / (32 * WH)) * static_cast<int>(ld));
        combine_group(s.c.b, stage);
      } else {
        finish_block<Masked>(s, gw, wh, lane, g, tg);
      }
    }
    park(gwp, gw);
    // On to the next batch.
    s.c = s.n;
    s.n = s.p;
    advance(s.p, nteams);
    const int q = s.qc;
    s.qc = s.qn, s.qn = s.qp, s.qp = q;
#pragma unroll
    for (int o = 0; o < NOC; ++o) s.yc[o] = s.yn[o];
  }

  // The block's end: the b0 and W1 sums over t (lane bits 0..1: the thread's rows of the same unit), b1 and
  // the loss over the lanes (rows), by butterflies; each warp writes its slice of the block's sums (to the
  // block's row of partials, or Staged to its team's row of the stage, srow), which are then cleared for the
  // team's next block. Masked: the gW0 and b0 sums are multiplied by their hidden unit's w1 here, once a block.
  template <bool Masked, bool Staged = false>
  __device__ void finish_block(Step& s, float (&gw)[MT][FT][4], int wh, int lane, int g, int tg,
                               float* srow = nullptr) const {
    sum_block_lanes(s);
    float* out;
    if constexpr (Staged) {
      out = srow;
    } else {
      (void)srow;
      out = partials + s.c.b * ld;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int ft = 0; ft < FT; ++ft) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = wh * 32 + mt * 16 + g + 8 * (e / 2), i = ft * 8 + 2 * tg + e % 2;
          const float v = Masked ? s.w1r[mt][e / 2][0] * gw[mt][ft][e] : gw[mt][ft][e];
          if (i < n_in && j < H) out[w0off + i * H + j] = v;
          gw[mt][ft][e] = 0.0f;
        }
      }
#pragma unroll
      for (int hb = 0; hb < 2; ++hb) {
        const int j = wh * 32 + mt * 16 + hb * 8 + g;
        if (tg == 0 && j < H) {
          out[b0off + j] = Masked ? s.w1r[mt][hb][0] * s.gb0[mt][hb] : s.gb0[mt][hb];
#pragma unroll
          for (int o = 0; o < NOC; ++o) {
            if (o < NO) out[w1off + j * NO + o] = s.gw1[mt][hb][o];
          }
        }
      }
    }
    if (wh == 0 && lane == 0) {
#pragma unroll
      for (int o = 0; o < NOC; ++o) {
        if (o < NO) out[b1off + o] = s.gl[o];
      }
      out[ld - 1] = s.lsum;
    }
    s.clear();
  }

  // Grouped (group == WR: a CTA's teams are one group): the CTA's teams hold blocks WR * (b / WR) + k, k < m,
  // in the stage; they meet at a named barrier, and their threads sum each column over the group's blocks in
  // the block tree's shape (level by level, a node the sum of its two halves, or its left half alone where
  // the right lies past the last block: BlockTreeReducer's pairs in its order, so the same bits as a row a
  // block) into row b / WR of partials. A second meeting keeps the stage until every thread has read it.
  // (Tried instead: the last team to arrive sums alone while the others go on, counters in shared memory:
  // the engine 14% slower at 1M x 32, one H200.)
  __device__ void combine_group(std::int64_t b, const float* stage) const {
    const std::int64_t sb = b / WR, left = blocks - sb * WR;
    const int m = left < WR ? static_cast<int>(left) : WR;  // the group's blocks (fewer only at the end)
    unsigned tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    const int count = m * WH * 32;
    // Barrier ids: 0 is __syncthreads, 1..WR the teams' (team_sync, WH > 1: WR <= 4), 15 the group's.
    asm volatile("bar.sync 15, %0;" ::"r"(count) : "memory");
    float* const out = partials + sb * ld;
    // A whole group (all but perhaps the last) without the bounds.
    if (m == WR) {
      sum_group<true>(out, stage, static_cast<int>(tid), count, m);
    } else {
      sum_group<false>(out, stage, static_cast<int>(tid), count, m);
    }
    asm volatile("bar.sync 15, %0;" ::"r"(count) : "memory");
  }
  // The group's m staged rows summed column by column into out, in the block tree's pairs (Whole: m == WR).
  template <bool Whole>
  __device__ void sum_group(float* out, const float* stage, int tid, int count, int m) const {
    const int L = static_cast<int>(ld);
    for (int p = tid; p < L; p += count) {
      float v[WR];
#pragma unroll
      for (int k = 0; k < WR; ++k) v[k] = (Whole || k < m) ? stage[k * L + p] : 0.0f;
#pragma unroll
      for (int stride = 1; stride < WR; stride *= 2) {
#pragma unroll
        for (int k = 0; k + stride < WR; k += 2 * stride) {
          if (Whole || k + stride < m) v[k] += v[k + stride];
        }
      }
      out[p] = v[0];
    }
  }

#endif  // __CUDACC__
};

#if defined(__CUDACC__)
// A register-resident kernel's body (either schedule): its run() over the dynamic shared memory.
template <class Kernel>
__device__ inline void run_register_resident(const Kernel& k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ char dpmlp_tensor_smem[];
  k.run(dpmlp_tensor_smem);
#else
  (void)k;
  __trap();  // tensor_unsupported refuses devices below compute capability 8.0
#endif
}

template <int HP, int NOC>
__global__ void __launch_bounds__(256, TensorMmaKernel<HP, NOC>::MIN_BLOCKS)
    fused_tensor_mma(const TensorMmaKernel<HP, NOC> k) {
  run_register_resident(k);
}
#endif

// ---------------------------------------------------------------------------------------------------------
// The register-resident kernel's paired schedule (one output, relu or identity; mma_pair_runs says where):
// each warp of a team becomes a pair, a forward warp F and a backward warp B, instead of one warp doing both.
//
// Why: with one warp doing a batch's whole chain (forward MMAs, bias and activation, the output sums, the
// deltas, the backward MMAs) the warp holds the pre-activations and the gW0 accumulators at once, 240-255
// registers, so an SM holds 8 warps, two a scheduler, and Nsight Compute found the kernel bound by the
// latency of that chain (an instruction every ~5 warp cycles, the tensor pipe ~40% busy; docs/benchmarks.md).
// Split in two, the state splits too: F keeps the pre-activations and the b0 / W1 / b1 / loss sums, B the
// gW0 accumulators, each under 128 registers with nothing parked in shared memory, so a CTA of 16 warps (8 F,
// 8 B) fits an SM, and each warp's chain is about half as long. A team is WH = HP / 32 pairs (F warp w and B
// warp w take hidden units 32w..32w+31). F hands its B, per batch, what the mask-form backward needs
// (TensorMmaKernel::masked_grad): the 0/1 mask of each of its lane's 32 values (as bits or as words:
// mma_pair_mask_words) and each row's output delta; at a block's last batch F's
// finished b0 / W1 / b1 / loss sums too. B writes the block's sums (or stages them and, grouped, adds the group
// up with the other teams' B warps: combine_group).
// Same arithmetic in the same order as TensorMmaKernel<HP, 1> (the forward, the output sums, the deltas, the
// mask-form MMAs over the same operands, the same finish), so the same bits: test_mlp compares the two bit
// for bit. The handoff is a ring of R slots a team (the batch's x and targets, and each pair's words), with
// two mbarriers a slot: `full` (every F lane of the team arrives when the slot's words are written) and
// `x in` (B's copy of the batch has landed: B copies batch i + R into slot i % R once done with batch i, see
// feed and the ring's comment below); F runs up to R - 1 batches ahead of B.
// How F hands B a batch's 0/1 mask. As bits (one word a lane, bit k for the lane's value k: B's A-operand
// fragment wants exactly the values F's lane held), packing takes an FMA a value (forward_warp) and unpacking
// a shift, an arithmetic shift and a mask. As words, where the shared memory allows (from 64 padded
// hidden units): two values a word, w = m_a + (m_b >> 19) with m = 0x3f800000 (1.0f) or 0, so w itself is the
// A operand for a (m_b's 0x7f0 sits in the low 13 bits, which the tensor cores ignore in a .tf32 operand: see
// split) and w << 19 is exactly m_b: two integer instructions a pair in F, a shift a pair in B, 16 words a
// lane, each loaded by B straight into its fragment's register. One H200, ms per 100 steps, bits -> words:
// 1M x 256 66.6 -> 65.2, 4M x 256 249.7 -> 244.1, 1M x 64 24.8 -> 23.8, 1M x 128 36.2 -> 35.2 (docs/
// benchmarks.md, 2026-12-02 06:38 UTC). At 32 units (eight teams of one pair, each with its x batches) the
// words leave room for three slots only, and that was slower (1M x 32 9.29 -> 9.46).
inline constexpr bool mma_pair_mask_words(int hp) { return hp != 32; }
// The ring. Who copies each batch's x (and targets) into it: B (TensorPairKernel::feed). F's chain bounds the
// pair (B waits for F's handoff about half its time, Nsight Compute), so the copies' address arithmetic, issue
// and waits moved off it, and B copies batch i + R into slot i % R as soon as it is done with batch i, R - 1
// batches earlier than F did when it copied. One H200, ms per 100 steps, F copies -> B copies (docs/
// benchmarks.md): from 64 units (2026-12-02 16:22-17:03 UTC, two calls) 1M x 256 64.3 / 64.8 -> 62.2 / 62.6,
// 4M x 256 240.9 / 241.9 -> 231.6 / 232.3, small steps 0-3% slower (2000 x 256 1.82 -> 1.87), and with it the
// paired teams pay at 64 and 128 units too (mma_pair_runs); at 32 units, with the cursor R batches on carried
// (recomputed each batch it was 2% slower) and the rare copies in loops (unrolled, B spilled), 20:01 UTC, two
// rounds: 1M x 32 8.77; 8.79 -> 8.60; 8.62, 10000 x 32 (a GPU's share of the seed) 1.65; 1.68 -> 1.62; 1.60,
// 20000 x 32 1.84; 1.83 -> 1.77; 1.83, 524288 x 32 with 512-row blocks 5.15; 5.19 -> 5.13; 5.22, 262144 x 32
// 3.50; 3.48 -> 3.55; 3.50.
// Slots a team's ring holds: F runs up to that less one batches ahead of B.
inline constexpr int mma_pair_slots = 4;
// Words a pair's handoff slot holds: each row's delta (32), the mask (32 bit words, or 16 words a lane), and at
// a block's last batch F's finished sums (b0 and W1 for its 32 units, b1, the loss: 66), padded to a multiple
// of 4.
inline constexpr int mma_pair_mask_size(int hp) { return mma_pair_mask_words(hp) ? 16 * 32 : 32; }
inline constexpr int mma_pair_words(int hp) { return (32 + mma_pair_mask_size(hp) + 66 + 3) / 4 * 4; }

// Shared memory of the paired kernel, in bytes, at hp padded hidden units: the mbarriers (teams x R x 2), then
// per team R batches of x (32 x 36 floats), the split W0^T fragments (hp x 32 x 2), the 8 pairs' handoff slots
// (R x words each), the output exchange (32 rows x WH a team) and, grouped, each team's block sums (the
// register-resident kernel's stage).
inline std::size_t mma_pair_scratch_bytes(int hp, bool grouped) {
  const std::size_t wh = hp / 32, teams = 8 / wh, staged = grouped ? teams * (34 * 32 + 2) : 0;
  const std::size_t r = mma_pair_slots, hw = mma_pair_words(hp);
  return 128 + teams * r * 2 * sizeof(std::uint64_t) +
         (teams * r * mma_batch_rows * 36 + std::size_t(hp) * 32 * 2 + 8 * r * hw + 8 * mma_batch_rows + staged) *
             sizeof(float);
}

#if defined(__CUDACC__)
// A CTA-scope mbarrier in shared memory (sm_80 and newer): init by one thread before a __syncthreads; arrive;
// wait for the phase of the given parity to complete.
__device__ inline unsigned shared_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ inline void mbarrier_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ inline void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared.b64 st, [%0];\n}" ::"r"(shared_address(bar)) : "memory");
}
__device__ inline void mbarrier_wait(std::uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  do {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(shared_address(bar)), "r"(parity)
                 : "memory");
#else
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(shared_address(bar)), "r"(parity)
                 : "memory");
#endif
  } while (done == 0);
}
#endif

template <int HP>
struct TensorPairKernel : TensorMmaKernel<HP, 1> {
  using base = TensorMmaKernel<HP, 1>;
  using base::FT;
  using base::LDX;
  using base::MT;
  using base::NB;
  using base::NI;
  using base::RB;
  using base::WH;
  using base::WR;
  static constexpr int TP = 512, R = mma_pair_slots, HW = mma_pair_words(HP);
  static_assert(WR * WH * 64 == TP, "a CTA is WR teams of WH pairs (an F and a B warp)");
  static constexpr bool WORDS = mma_pair_mask_words(HP);
  static_assert(LDX > NI, "B's copies put a batch's targets in the x rows' padding column NI");
  // Handoff slot offsets, in words: each row's delta, the mask, F's finished sums.
  static constexpr int H_D = 0, H_MASK = 32, H_SUMS = 32 + mma_pair_mask_size(HP);
  static_assert(MT * NB * 4 == 32, "a lane's mask is 32 values");

  std::size_t scratch_bytes() const { return mma_pair_scratch_bytes(HP, this->group > 1); }

#if defined(__CUDACC__)
  using typename base::Cursor;
  using typename base::Step;

  __device__ void run(char* smem) const {
    if (this->act == Activation::relu) return run_as<Activation::relu>(smem);
    return run_as<Activation::identity>(smem);
  }

  template <Activation A>
  __device__ void run_as(char* smem) const {
    const int t = static_cast<int>(threadIdx.x), warp = t / 32, lane = t % 32, g = lane / 4, tg = lane % 4;
    // Warps 0-7: the B warps (threads 0-255, so combine_group's thread ids and counts hold as they are);
    // warps 8-15: the F warps. Warp r of a role: team r / WH, hidden units from (r % WH) * 32.
    const bool fwd = warp >= 8;
    const int rw = fwd ? warp - 8 : warp, team = rw / WH, wh = rw % WH;
    const std::int64_t nteams = std::int64_t(gridDim.x) * WR;
    std::int64_t first = std::int64_t(team) * gridDim.x + blockIdx.x;
    if (this->group > 1) first = std::int64_t(blockIdx.x) * WR + team;

    char* const top = reinterpret_cast<char*>(align_shared_128(smem));
    // [slot][full, x in].
    std::uint64_t* const bars = reinterpret_cast<std::uint64_t*>(top) + team * R * 2;
    float* const base_f = reinterpret_cast<float*>(top + WR * R * 2 * sizeof(std::uint64_t));
    float* const xbuf = base_f + team * R * RB * LDX;
    float* const w0f = base_f + WR * R * RB * LDX;
    float* const hand = w0f + HP * NI * 2 + rw * R * HW;
    float* const part = w0f + HP * NI * 2 + 8 * R * HW + team * WH * RB;
    float* const stage = w0f + HP * NI * 2 + 8 * R * HW + 8 * RB;

    // The team's mbarriers, by its first B warp: `full` counts the F lanes' arrivals (the handoff written),
    // `x in` the B lanes' copies landing (cp.async.mbarrier.arrive). (The W0^T fragments are split by every
    // B warp, a share each, after its first copies: backward_warp.)
    if (!fwd && wh == 0 && lane == 0) {
      for (int q = 0; q < R; ++q) {
        mbarrier_init(bars + 2 * q, WH * 32);
        mbarrier_init(bars + 2 * q + 1, WH * 32);
      }
    }
    // Each role meets the others at barrier 0 (after the W0^T split and the mbarriers' init) inside its own
    // function, after its prologue, so that the prologue's global loads (F: its parameters; B: the first R
    // batches and w1) overlap the split's.
    if (fwd) {
      forward_warp<A>(first, nteams, xbuf, w0f, hand, part, bars, team, wh, lane, g, tg);
    } else {
      backward_warp(first, nteams, xbuf, w0f, hand, bars, stage, team, wh, lane, g, tg);
    }
  }

  // The F warps of a team meet (WH > 1: the output sums cross them).
  __device__ static void f_sync(int team) {
    if constexpr (WH == 1) {
      __syncwarp();
    } else {
      asm volatile("bar.sync %0, %1;" ::"r"(team + 1), "n"(WH * 32) : "memory");
    }
  }

  // The B warps of a team meet (WH > 1: named barriers 9-12, after F's 1-8 and before combine_group's 15), so
  // that none of them copies a batch into a slot another still reads.
  __device__ static void b_sync(int team) {
    if constexpr (WH == 1) {
      __syncwarp();
    } else {
      asm volatile("bar.sync %0, %1;" ::"r"(team + 9), "n"(WH * 32) : "memory");
    }
  }

  // B feeds the ring (why B: the ring's comment, above mma_pair_slots): the copy of batch `cur` (x, and its
  // targets in the rows' padding column NI, which no fragment reads) into slot xs, and this lane's arrival on the
  // slot's `x in` barrier once its copies land (cp.async.mbarrier.arrive: .noinc, so the arrival is one of the WH x 32
  // the barrier was initialized for). Past the team's last batch it copies nothing: F never waits for it.
  // The rarer copies (a short batch, inputs fewer than NI or x not 16-byte aligned: zeros where no x is) are
  // TensorMmaKernel::issue's, in loops that are not unrolled as issue's are: unrolled here they took registers
  // the B warp has not got at 32 units (ptxas spilled 64-88 bytes a thread, loads from the stack every batch).
  __device__ void feed(const Cursor& cur, float* xs, std::uint64_t* xin, int wh, int lane) const {
    if (cur.b >= this->blocks) return;
    const int tl = wh * 32 + lane, n = cur.rows_left();
    const std::int64_t r0 = cur.r;
    if (this->vec16 && n == RB && this->n_in == NI) {
      this->issue_whole(r0, xs, tl);
    } else if (this->vec16) {
#pragma unroll 1
      for (int c = tl; c < RB * NI / 4; c += WH * 32) this->copy16(r0, n, xs, c);
    } else {
#pragma unroll 1
      for (int e = tl; e < RB * NI; e += WH * 32) this->copy4(r0, n, xs, e);
    }
    if (wh == 0) {
      const std::int64_t row = cur.r + lane;
      const bool ok = row < cur.end;
      const float* src = ok ? this->y + row : this->y;
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(shared_address(xs + lane * LDX + NI)),
                   "l"(src), "r"(ok ? 4 : 0)
                   : "memory");
    }
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(shared_address(xin)) : "memory");
  }

  // F: each batch's forward, outputs and deltas, handed to B (TensorMmaKernel::batch's arithmetic).
  template <Activation A>
  __device__ void forward_warp(std::int64_t first, std::int64_t nteams, float* xbuf, const float* w0f, float* hand,
                               float* part, std::uint64_t* bars, int team, int wh, int lane, int g, int tg) const {
    Step s;
    this->load_unit_params(s, wh, g);
    s.c = this->cursor_at(first);
    cta_barrier();  // the W0^T fragments are in, the mbarriers initialized
    for (int i = 0; s.c.b < this->blocks; ++i) {
      const int q = i % R;
      // The batch's x and targets are in (B copied them once it was done with the slot's last batch).
      mbarrier_wait(bars + 2 * q + 1, static_cast<unsigned>(i / R) & 1u);
      f_sync(team);  // every F warp of the team is done with the previous batch's exchange
      const float* const xs = xbuf + q * RB * LDX;
      s.yc[0] = xs[lane * LDX + NI];
      float* const slot = hand + q * HW;
      float zc[MT][NB][4];
      base::forward(zc, xs, w0f, s, wh, lane, g, tg);

      float p[NB][2][1];
      base::template activate_outputs<A>(zc, s, p);
      // Over g: one warp a team, the reduce-scatter (each lane a row's sum); else the butterfly and the
      // exchange between the team's F warps.
      float own = 0.0f;
      if constexpr (WH == 1) {
        own = base::row_of_lane(base::reduce_scatter(p, lane), lane);
      } else {
#pragma unroll
        for (int nt = 0; nt < NB; ++nt) {
#pragma unroll
          for (int bit = 0; bit < 2; ++bit) {
            float v = p[nt][bit][0];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            if (g == 0) part[wh * RB + nt * 8 + 2 * tg + bit] = v;
          }
        }
        f_sync(team);
      }
      // Lane = row: the output (the team's warps in order), residual and output delta.
      float d = 0.0f;
      {
        const std::int64_t row = s.c.r + lane;
        if (lane < s.c.rows_left() && this->window.contains(row)) {
          float out = 0.0f;
          if constexpr (WH == 1) {
            out += own;
          } else {
#pragma unroll
            for (int w = 0; w < WH; ++w) out += part[w * RB + lane];
          }
          const float res = out + s.b1r[0] - s.yc[0];
          d = 2.0f * this->scale * res;
          s.lsum += res * res;
          s.gl[0] += d;
        }
      }
      float dr[NB][2][1];
      base::row_deltas({d}, tg, dr);
      // The mask, and this thread's b0 (without w1) and W1 sums, in the unpaired kernel's order. As bits: bit
      // k = (mt * NB + nt) * 4 + e, summed in floats, exactly (m is 1.0f or 0.0f, the weights powers of two,
      // four sums of eight bits), an FMA a value where a compare and a predicated add were two. As words:
      // (mt, nt)'s values 0 and 2, then 1 and 3 (B's A fragment order).
      float mf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      std::uint32_t mb[4], mw[MT * NB * 2];
      base::template mask_sums<A>(zc, dr, s, [&](int mt, int nt, int e, float m) {
        if constexpr (WORDS) {
          mb[e] = __float_as_uint(m);  // 1.0f or 0.0f
          if (e == 3) {
            mw[(mt * NB + nt) * 2] = mb[0] + (mb[2] >> 19);
            mw[(mt * NB + nt) * 2 + 1] = mb[1] + (mb[3] >> 19);
          }
        } else {
          const int k = (mt * NB + nt) * 4 + e;
          mf[k / 8] = fmaf(m, static_cast<float>(1u << (k % 8)), mf[k / 8]);
        }
      });
      slot[H_D + lane] = d;
      if constexpr (WORDS) {
        // Word k of every lane together (no bank conflicts); one word at a time, so that B can load each
        // straight into its A fragment's register (16-byte loads cost it a move a fragment value).
        std::uint32_t* const mv = reinterpret_cast<std::uint32_t*>(slot + H_MASK);
#pragma unroll
        for (int k = 0; k < MT * NB * 2; ++k) mv[k * 32 + lane] = mw[k];
      } else {
        reinterpret_cast<unsigned*>(slot)[H_MASK + lane] = __float2uint_rz(mf[0]) | __float2uint_rz(mf[1]) << 8 |
                                                           __float2uint_rz(mf[2]) << 16 | __float2uint_rz(mf[3]) << 24;
      }
      if (s.c.last_of_block()) {
        // finish_block's sums over t and over the rows (the same butterflies), for B to write. The lane
        // through a volatile asm, so the compiler cannot hoist these addresses out of the batch loop (held in
        // registers across it, they spilled).
        const int ln = lane_volatile(), lg = ln / 4, lt = ln % 4;
        base::sum_block_lanes(s);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int hb = 0; hb < 2; ++hb) {
            if (lt == 0) {
              const int j = mt * 16 + hb * 8 + lg;  // of the warp's 32 units
              slot[H_SUMS + j] = s.gb0[mt][hb];
              slot[H_SUMS + 32 + j] = s.gw1[mt][hb][0];
            }
          }
        }
        if (ln == 0) {
          slot[H_SUMS + 64] = s.gl[0];
          slot[H_SUMS + 65] = s.lsum;
        }
        s.clear();
      }
      mbarrier_arrive(bars + 2 * q);  // the slot's words are written (and F is done with its x)
      this->advance(s.c, nteams);
    }
  }

  // B: each batch's backward MMAs from its F warp's handoff; the block's sums.
  __device__ void backward_warp(std::int64_t first, std::int64_t nteams, float* xbuf, float* w0f, const float* hand,
                                std::uint64_t* bars, float* stage, int team, int wh, int lane, int g, int tg) const {
    // c: the batch at hand; cn: the one R batches on, which goes into the slot once c is done with it. The
    // team's first R batches into the ring (the mbarriers' init seen first), then this warp's share of the W0^T
    // fragments, split.
    Cursor cn = this->cursor_at(first);
    b_sync(team);
    for (int q = 0; q < R; ++q) {
      feed(cn, xbuf + q * RB * LDX, bars + 2 * q + 1, wh, lane);
      this->advance(cn, nteams);
    }
    // The W0^T fragments, split, by every B warp of the CTA, a share each. Done by the first team's B warps
    // alone (as the unpaired kernel's team 0 does), one warp split all 8 fragments at 32 units (8 teams of one
    // pair) while the other seven waited at the CTA barrier below: the graph step at 10000 x 32 16.39 -> 14.72
    // us, 20000 x 32 1.876 -> 1.741 ms per 100 steps on one H200 (docs/benchmarks.md, 2026-12-03).
    this->split_w0_share(w0f, team * WH + wh, WR * WH, lane, g, tg);
    float w1r[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hb = 0; hb < 2; ++hb) {
        const int j = wh * 32 + mt * 16 + hb * 8 + g;
        w1r[mt][hb] = j < this->H ? this->params[this->w1off + j * this->NO] : 0.0f;
      }
    }
    float gw[MT][FT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int ft = 0; ft < FT; ++ft) {
#pragma unroll
        for (int e = 0; e < 4; ++e) gw[mt][ft][e] = 0.0f;
      }
    }
    Cursor c = this->cursor_at(first);
    cta_barrier();  // (run_as)
    for (int i = 0; c.b < this->blocks; ++i) {
      const int q = i % R;
      mbarrier_wait(bars + 2 * q, static_cast<unsigned>(i / R) & 1u);
      float* const xs = xbuf + q * RB * LDX;
      const float* const slot = hand + q * HW;
      const float d = slot[H_D + lane];
      unsigned mask = 0;              // as bits
      const std::uint32_t* const mv = reinterpret_cast<const std::uint32_t*>(slot + H_MASK);  // as words
      if constexpr (!WORDS) mask = mv[lane];
      // gW0^T / w1 += M^T (d x), as the unpaired kernel: A the mask (back to 0.0f / 1.0f in the bits the tensor
      // cores read), B the rows times their deltas, split.
#pragma unroll
      for (int nt = 0; nt < NB; ++nt) {
        const float dr0 = __shfl_sync(0xffffffffu, d, nt * 8 + 2 * tg);
        const float dr1 = __shfl_sync(0xffffffffu, d, nt * 8 + 2 * tg + 1);
        std::uint32_t am[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (WORDS) {
            const std::uint32_t w02 = mv[(mt * NB + nt) * 64 + lane], w13 = mv[(mt * NB + nt) * 64 + 32 + lane];
            am[mt][0] = w02;        // unit g,     row 2t      (value 0; value 2 in the ignored low bits)
            am[mt][1] = w02 << 19;  // unit g + 8, row 2t      (value 2, exactly 0x3f800000 or 0)
            am[mt][2] = w13;        // unit g,     row 2t + 1
            am[mt][3] = w13 << 19;  // unit g + 8, row 2t + 1
          } else {
            const int bit = (mt * NB + nt) * 4;
            am[mt][0] = (mask >> (bit + 0)) & 1u ? 0x3f800000u : 0u;  // unit g,     row 2t
            am[mt][1] = (mask >> (bit + 2)) & 1u ? 0x3f800000u : 0u;  // unit g + 8, row 2t
            am[mt][2] = (mask >> (bit + 1)) & 1u ? 0x3f800000u : 0u;  // unit g,     row 2t + 1
            am[mt][3] = (mask >> (bit + 3)) & 1u ? 0x3f800000u : 0u;  // unit g + 8, row 2t + 1
          }
        }
        std::uint32_t bh[FT][2], bl[FT][2];
#pragma unroll
        for (int ft = 0; ft < FT; ++ft) {
          base::split(dr0 * xs[(nt * 8 + 2 * tg) * LDX + ft * 8 + g], bh[ft][0], bl[ft][0]);
          base::split(dr1 * xs[(nt * 8 + 2 * tg + 1) * LDX + ft * 8 + g], bh[ft][1], bl[ft][1]);
        }
        base::mma2(gw, am, bh, bl);
      }
      if (c.last_of_block()) {
        // finish_block<Masked>'s writes: gW0 and b0 times w1, W1, b1 and the loss as F summed them (the lane as
        // in forward_warp's finish).
        const int ln = lane_volatile(), lg = ln / 4, lt = ln % 4;
        float* out = this->partials + c.b * this->ld;
        if (this->group > 1) out = stage + team * this->ld;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int ft = 0; ft < FT; ++ft) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int j = wh * 32 + mt * 16 + lg + 8 * (e / 2), ii = ft * 8 + 2 * lt + e % 2;
              if (ii < this->n_in && j < this->H) out[this->w0off + ii * this->H + j] = w1r[mt][e / 2] * gw[mt][ft][e];
              gw[mt][ft][e] = 0.0f;
            }
          }
#pragma unroll
          for (int hb = 0; hb < 2; ++hb) {
            const int jw = mt * 16 + hb * 8 + lg, j = wh * 32 + jw;
            if (lt == 0 && j < this->H) {
              out[this->b0off + j] = w1r[mt][hb] * slot[H_SUMS + jw];
              out[this->w1off + j * this->NO] = slot[H_SUMS + 32 + jw];
            }
          }
        }
        if (wh == 0 && ln == 0) {
          out[this->b1off] = slot[H_SUMS + 64];
          out[this->ld - 1] = slot[H_SUMS + 65];
        }
        if (this->group > 1) this->combine_group(c.b, stage);
      }
      // Done with the slot (every B warp of the team): batch i + R into it.
      b_sync(team);
      feed(cn, xs, bars + 2 * q + 1, wh, lane);
      this->advance(cn, nteams);
      this->advance(c, nteams);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
  }

  // Barrier 0 for the whole CTA, reached from the two roles' own code: the non-.aligned form, which PTX allows
  // where the threads of a CTA do not all execute the same barrier instruction (bar.sync, what __syncthreads
  // emits, is .aligned).
  __device__ static void cta_barrier() { asm volatile("barrier.sync 0;" ::: "memory"); }

  __device__ static int lane_volatile() {
    unsigned l;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
    return static_cast<int>(l);
  }
#endif  // __CUDACC__
};

#if defined(__CUDACC__)
template <int HP>
__global__ void __launch_bounds__(512, 1) fused_tensor_pair(const TensorPairKernel<HP> k) {
  run_register_resident(k);
}
#endif

// The current device's multiprocessors, opt-in shared memory a block and shared memory a multiprocessor
// (read once a process; the peer exchange, backend/cuda_peer.hpp, sizes its grid from them too).
struct TensorDevice {
  int sms = 0, smem_optin = 0, smem_sm = 0;
};
inline const TensorDevice& tensor_device() {
  static const TensorDevice d = [] {
    TensorDevice r;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&r.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaDeviceGetAttribute(&r.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    return r;
  }();
  return d;
}

#if defined(__CUDACC__)
// A register-resident kernel's setup, once a process (either schedule): the opt-in to its dynamic shared
// memory (above 48 KB), covering the grouped layout (`grouped` bytes) where it fits (mma_group and
// mma_pair_runs ask for it only then), else `bytes`; the shared-memory carveout that lets CTAs share an SM;
// and how many CTAs of `threads` threads and `bytes` bytes an SM then holds (at least 1).
template <class Fn>
inline int register_resident_setup(Fn* fn, int threads, std::size_t grouped, std::size_t bytes) {
  const std::size_t most = grouped <= static_cast<std::size_t>(tensor_device().smem_optin) ? grouped : bytes;
  cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most));
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  int n = 0;
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, bytes);
  if (e != cudaSuccess) throw Error(std::string("dpmlp: tensor kernel setup: ") + cudaGetErrorString(e));
  return n > 0 ? n : 1;
}
#endif

// A register-resident kernel's persistent grid: as many CTAs as the SMs hold at once (`resident` an SM), each
// team looping over blocks; with fewer blocks than teams, enough CTAs for the blocks, but at least one an SM
// while there are blocks for them (the team-major order then gives each SM a block before any SM a second).
// Grouped (CTA-major), a CTA a `teams` blocks.
inline unsigned register_resident_grid(std::int64_t blocks, int teams, int group, int resident) {
  const std::int64_t sms = tensor_device().sms > 0 ? tensor_device().sms : 1, slots = sms * resident;
  std::int64_t grid = (blocks + teams - 1) / teams;
  if (grid < sms && group == 1) grid = blocks < sms ? blocks : sms;
  return static_cast<unsigned>(grid < slots ? grid : slots);
}

template <int HP, int NOC>
inline void launch_tensor_mma(const Kokkos::Cuda& space, const TensorProblem& p, int group) {
  using kernel_t = TensorMmaKernel<HP, NOC>;
  kernel_t k{p};
  if constexpr (kernel_t::GROUPS) k.group = group;
  k.vec16 = p.n_in % 4 == 0 && reinterpret_cast<std::uintptr_t>(p.x) % 16 == 0;
#if defined(__CUDACC__)
  static const int resident = register_resident_setup(fused_tensor_mma<HP, NOC>, kernel_t::T,
                                                      mma_scratch_bytes(HP, NOC, kernel_t::GROUPS), k.scratch_bytes());
  const unsigned grid = register_resident_grid(p.blocks, kernel_t::WR, group, resident);
  fused_tensor_mma<HP, NOC><<<grid, kernel_t::T, k.scratch_bytes(), space.cuda_stream()>>>(k);
  check_tensor_launch();
#else
  (void)space, (void)k;
  throw Error("dpmlp: the tensor engine must be compiled by a CUDA compiler");
#endif
}

// Whether the paired schedule (TensorPairKernel) runs instead of TensorMmaKernel<HP, 1> (the same bits): one
// output, relu or identity (the mask-form backward) and its shared memory fitting, at every padded width. First
// it paired at 32 and 256 units only, where it was faster on an H200 (ms per 100 steps, one GPU, unpaired ->
// paired, docs/benchmarks.md, 2026-12-02 03:52-04:14 UTC): 1M x 32 10.14 -> 9.37, 1M x 256 68.37 -> 66.23;
// not then at 64 (23.7 -> 25.3) or 128 (36.5 -> 36.7). Since B feeds the ring (TensorPairKernel::feed) it is
// faster at those too, at every size measured (two rounds, same call): 1M x 64 18.83 -> 17.43, 262144 x 64
// 7.96 -> 7.19, 2000 x 64 1.52 -> 1.34, 1M x 128 35.49 -> 33.26, 262144 x 128 14.51 -> 13.07, 2000 x 128 1.61
// -> 1.47 (docs/benchmarks.md, 2026-12-02 17:21 UTC).
// DPMLP_MMA_PAIR=0 keeps the unpaired teams (read at every step: tests compare the two bit for bit).
inline bool mma_pair_runs(const TensorProblem& p, int group) {
  const char* v = std::getenv("DPMLP_MMA_PAIR");
  if (v != nullptr && std::string(v) == "0") return false;
  const int hp = tensor_hp(p.H);
  return mask_form(p.NO, p.act) &&
         mma_pair_scratch_bytes(hp, group > 1) <= static_cast<std::size_t>(tensor_device().smem_optin);
}

template <int HP>
inline void launch_tensor_pair(const Kokkos::Cuda& space, const TensorProblem& p, int group) {
  using kernel_t = TensorPairKernel<HP>;
  kernel_t k{TensorMmaKernel<HP, 1>{p}};
  if constexpr (kernel_t::GROUPS) k.group = group;
  k.vec16 = p.n_in % 4 == 0 && reinterpret_cast<std::uintptr_t>(p.x) % 16 == 0;
#if defined(__CUDACC__)
  // One CTA an SM (its 512 threads take every register).
  static const int resident = register_resident_setup(fused_tensor_pair<HP>, kernel_t::TP,
                                                      mma_pair_scratch_bytes(HP, kernel_t::GROUPS), k.scratch_bytes());
  const unsigned grid = register_resident_grid(p.blocks, kernel_t::WR, group, resident);
  fused_tensor_pair<HP><<<grid, kernel_t::TP, k.scratch_bytes(), space.cuda_stream()>>>(k);
  check_tensor_launch();
#else
  (void)space, (void)k;
  throw Error("dpmlp: the tensor engine must be compiled by a CUDA compiler");
#endif
}

// Whether the register-resident kernel can run a model of this shape here: 32 or fewer inputs, its shared
// memory fitting.
inline bool mma_fits(int inputs, int hidden, int outputs) {
  return tensor_ni(inputs) == 32 && mma_scratch_bytes(tensor_hp(hidden), outputs == 1 ? 1 : 4) <=
                                        static_cast<std::size_t>(tensor_device().smem_optin);
}
// Whether the register-resident kernel runs this model at every block count (tensor_kernel_for, below, unless
// DPMLP_TENSOR_KERNEL says otherwise), whatever the environment: the default block size depends on it
// (BlockEngine::default_most_blocks in mlp.hpp), and every rank must take the same.
inline bool mma_at_every_count(int inputs, int hidden, int outputs, Activation act) {
  return mask_form(outputs, act) && mma_fits(inputs, hidden, outputs);
}

// Which tensor kernel runs a model of this shape whose steps have `global_blocks` reduction blocks in all
// (over every rank). The two kernels' sums have different shapes, so the choice must not depend on a rank's
// share, or the trained bits would depend on the rank count: it depends on the model, the global block count
// and the device's shared memory only. The register-resident kernel (32 or fewer inputs, its shared memory
// fitting):
// - at every block count for a model with one output and relu or identity (its mask-form backward; paired
//   teams at 32 and 256 padded units). On one H200 (2026-12-02 10:37 UTC, docs/benchmarks.md; ms per 100 steps,
//   64-row blocks, 2000-60000 rows, 32-938 blocks) it was as fast as the warp-matrix kernel at 32 blocks of
//   32 units (1.45 against 1.43) and faster everywhere else: the seed's share of a GPU (157 blocks of 32
//   units) 1.67 against 1.84, the seed on one GPU (313) 1.80 against 2.67, 5000 x 64 1.68 against 1.85,
//   2000 x 128 1.55 against 2.27, 2000 x 256 1.80 against 3.54. (Before the paired teams and the roles'
//   overlapped prologues it was slower at the seed's 157 and 313 blocks: 2.27 against 1.91 ms.)
// - else (several outputs, tanh: not measured there) from 128 * 8 / (hp / 32) blocks on, enough to fill half
//   of its teams (8 / (hp / 32) an SM, a team a block) on a 128-SM GPU split over two ranks, or from 128 rows
//   a block on, whatever the block count: the warp-matrix kernel takes a block's rows 64 at a time in one
//   CTA, so its time grows with the block (engine us a step, one H200, warp-matrix against register-resident:
//   924 blocks of 1024 rows 462 against 84, 782 of 256 96 against 27, 782 of 128 51 against 19;
//   docs/benchmarks.md, 02:33 UTC). The unpaired register-resident kernel at 32 units was slower than the
//   warp-matrix one at the seed's share (10000 rows: 2.23 against 1.87 ms, 10:26 UTC).
// Else the warp-matrix kernel, where it fits; else none. DPMLP_TENSOR_KERNEL=mma or wmma picks one where it
// fits (tests, measurements).
inline TensorKernel tensor_kernel_for(int inputs, int hidden, int outputs, Activation act, std::int64_t global_blocks,
                                      std::int64_t block_rows = 0) {
  static const std::string forced = [] {
    const char* v = std::getenv("DPMLP_TENSOR_KERNEL");
    return std::string(v != nullptr ? v : "");
  }();
  const auto most = static_cast<std::size_t>(tensor_device().smem_optin);
  const int ni = tensor_ni(inputs), hp = tensor_hp(hidden);
  const bool mma = mma_fits(inputs, hidden, outputs);
  const bool wmma = tensor_scratch_bytes(ni, hp, outputs) <= most;
  const bool prefer_mma =
      forced == "mma" || (forced != "wmma" && (mask_form(outputs, act) || global_blocks >= 128 * (8 / (hp / 32)) ||
                                               block_rows >= 128));
  if (mma && (prefer_mma || !wmma)) return TensorKernel::mma;
  if (wmma) return TensorKernel::wmma;
  return TensorKernel::none;
}

// How many blocks a row of the register-resident kernel's partial sums holds, for a model of this shape whose steps
// have `global_blocks` blocks over `ranks` ranks: at 32 hidden units its CTA's eight teams take eight consecutive
// blocks at once and sum them in the block tree's shape before writing (the tree's first three levels, in shared
// memory), so the partial sums and the tree over them are eight times smaller. The sums are the same bits either way
// (a group is a subtree); what changes is the layout: ranks then own whole groups (the trainer's plan has blocks of
// block_rows x group rows), so the value must be the same on every rank (the trainer takes the smallest). Only where
// at least 7/8 of the teams of every SM would have a block (with fewer, the team-major order, spreading them over
// more SMs, keeps more SMs busy than the grouped CTAs would) and the staged sums fit the shared memory. (From 7/8
// rather than all: at 1M x 32 with 1024-row blocks, 1024 blocks for 1056 teams, grouping made the step 9.99 -> 9.33
// ms per 100 steps on one H200, the engine's time the same and the partial sums 8 times fewer; docs/benchmarks.md,
// 02:25 UTC.) Only at 32 hidden units (teams of one warp) and one output: at 64 hidden units (teams of two warps)
// compute-sanitizer's racecheck reported shared-memory hazards between the staging and the sum for some shapes with a
// short last group (7 inputs, 50 hidden units): combine_group's read of the stage against finish_block's staged
// stores (compute-sanitizer with -lineinfo), also when no warp of the CTA exits early (so not the teams without a
// block), still unexplained, although every grouped row was bitwise right; at four outputs too. Those models keep a
// row a block. DPMLP_MMA_GROUP=1 turns it off, DPMLP_MMA_GROUP=8 on wherever it can run (measurements).
inline int mma_group(int hidden, int outputs, std::int64_t global_blocks, int ranks) {
  static const std::string forced = [] {
    const char* v = std::getenv("DPMLP_MMA_GROUP");
    return std::string(v != nullptr ? v : "");
  }();
  constexpr int teams = 8;  // a CTA's one-warp teams at 32 hidden units: the group
  if (forced == "1" || tensor_hp(hidden) != 32 || outputs != 1 ||
      mma_scratch_bytes(32, 1, true) > static_cast<std::size_t>(tensor_device().smem_optin)) {
    return 1;
  }
  if (forced == "8") return teams;
  const std::int64_t sms = tensor_device().sms > 0 ? tensor_device().sms : 1;
  return global_blocks * 8 >= std::int64_t(ranks > 0 ? ranks : 1) * sms * teams * 7 ? teams : 1;
}

// The reason the tensor engine cannot run this one-hidden-layer model here, or "".
inline std::string tensor_unsupported(int inputs, int hidden, int outputs) {
  const std::string why = tensor_cores_unavailable();
  if (!why.empty()) return why;
  if (tensor_kernel_for(inputs, hidden, outputs, Activation::relu, 0) == TensorKernel::none) {
    return "the tensor engine's shared memory (" +
           std::to_string(tensor_scratch_bytes(tensor_ni(inputs), tensor_hp(hidden), outputs)) +
           " bytes a block) does not fit the device's " + std::to_string(tensor_device().smem_optin);
  }
  return {};
}

// One step's per-block partial sums on tensor cores: the kernel instantiated for the model's padded shape.
// group: blocks a row of partials sums (1, or mma_group's value for the register-resident kernel).
inline void compute_tensor(const Kokkos::Cuda& space, const TensorProblem& p, int group = 1) {
  if (p.rows == 0 || p.blocks == 0) return;
  const TensorKernel kernel =
      p.kernel != TensorKernel::none ? p.kernel : tensor_kernel_for(p.n_in, p.H, p.NO, p.act, p.blocks, p.block);
  if (group != 1 && (kernel != TensorKernel::mma || group != 8 || tensor_hp(p.H) != 32 || p.NO != 1)) {
    throw Error("dpmlp: tensor engine: a group of " + std::to_string(group) + " blocks a partial-sum row, which " +
                "only the register-resident kernel takes, as 8, at 32 or fewer hidden units and one output");
  }
  const bool narrow = tensor_ni(p.n_in) == 32;
  const auto launch = [&](auto hp) {
    constexpr int HP = decltype(hp)::value;
    if (kernel == TensorKernel::mma) {
      if (mma_pair_runs(p, group)) return launch_tensor_pair<HP>(space, p, group);
      if (p.NO == 1) return launch_tensor_mma<HP, 1>(space, p, group);
      return launch_tensor_mma<HP, 4>(space, p, group);
    }
    if (narrow) return launch_tensor<32, HP>(space, p);
    return launch_tensor<64, HP>(space, p);
  };
  switch (tensor_hp(p.H)) {
    case 32: return launch(std::integral_constant<int, 32>());
    case 64: return launch(std::integral_constant<int, 64>());
    case 128: return launch(std::integral_constant<int, 128>());
    default: return launch(std::integral_constant<int, 256>());
  }
}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
