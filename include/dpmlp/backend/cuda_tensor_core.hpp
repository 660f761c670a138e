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
// This is the only file that uses CUDA's warp matrix API (nvcuda::wmma). It launches its kernel itself, on
// the Kokkos::Cuda instance's stream (so CUDA-graph capture and stream order are kept): Kokkos caps team
// scratch at 48 KB, and at 256 hidden units the kernel needs about 110 KB of shared memory (two blocks an
// SM still fit). It computes exactly what the SIMT kernel computes (the same per-block partial sums, in
// the parameter layout, for the same block tree), with a different but equally fixed summation shape, so
// it is reproducible across rank counts the same way: every sum depends only on the block's rows and the
// model's widths.
//
// Layout of the work, one CUDA block (8 warps) per reduction block, rows in chunks of C = 64:
//   forward   Hpre[C x HP] = X[C x NI] W0[NI x HP]    warps own 16x16 output tiles (MMA)
//   outputs   h = act(Hpre + b0), the outputs, residuals, output deltas d, the b1 and loss sums: one warp
//             a row, lanes over hidden units, a fixed butterfly for the output sums (SIMT)
//   deltas    dZ = (d W1^T) * act'(h) in place of h, the b0 and W1 sums: a thread a hidden unit (SIMT)
//   backward  gW0[NI x HP] += X^T[NI x C] dZ[C x HP]   warps own 16x16 tiles, accumulators in registers for
//             the whole block (MMA)
// The next chunk's rows are loaded into registers while the backward MMAs run.
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

// What the tensor engine needs to run a step: the model's shape and parameter offsets, the data, where the
// partial sums go (one row of `ld` a block).
struct TensorProblem {
  const float* x = nullptr;  // rows x n_in, row-major
  const float* y = nullptr;  // rows x NO, row-major
  const float* params = nullptr;
  float* partials = nullptr;  // blocks x ld; the last column takes the sum of squared residuals
  std::int64_t ld = 0, rows = 0, block = 0, blocks = 0;
  int n_in = 0, H = 0, NO = 1;
  std::int64_t w0off = 0, b0off = 0, w1off = 0, b1off = 0;
  float scale = 1;
  Activation act = Activation::relu;
  RowWindow window;
};

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
    float* const w0s = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(smem) + 127) & ~std::uintptr_t(127));
    float* const b0s = w0s + NI * LDW;
    float* const w1s = b0s + HP;
    float* const xs = w1s + HP * NO;
    float* const hs = xs + C * LDX;
    float* const ds = hs + C * LDH;  // the chunk's output deltas, C x NO

    // The parameters, zero-padded (padded hidden units then contribute exact zeros everywhere).
    for (int e = t; e < NI * HP; e += T) {
      const int i = e / HP, j = e % HP;
      w0s[i * LDW + j] = (i < n_in && j < H) ? params[w0off + i * H + j] : 0.0f;
    }
    for (int j = t; j < HP; j += T) b0s[j] = j < H ? params[b0off + j] : 0.0f;
    for (int e = t; e < HP * NO; e += T) w1s[e] = e / NO < H ? params[w1off + e] : 0.0f;
    float b1[MaxOut];
#pragma unroll
    for (int o = 0; o < MaxOut; ++o) b1[o] = o < NO ? params[b1off + o] : 0.0f;

    // This thread's sums for the whole block: its warp's gW0 tiles (MMA accumulators); its hidden unit's b0
    // and W1 sums over its rows; its warp's b1 and loss sums (the same in every lane).
    frag_c gw0[BTPW];
#pragma unroll
    for (int k = 0; k < BTPW; ++k) wmma::fill_fragment(gw0[k], 0.0f);
    float gb0 = 0.0f, gw1[MaxOut] = {}, gb1[MaxOut] = {}, gloss = 0.0f;

    float xv[XPT];
    load_x(r_begin, r_end - r_begin < C ? static_cast<int>(r_end - r_begin) : C, t, xv);
    store_x(xs, t, xv);

    for (std::int64_t c0 = r_begin; c0 < r_end; c0 += C) {
      const int n = r_end - c0 < C ? static_cast<int>(r_end - c0) : C;
      __syncthreads();  // xs holds this chunk; hs is free

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

      // Outputs: warp w takes rows w, w + 8, ...; lane l adds hidden units l, l + 32, ... of h = act(Hpre +
      // b0) (stored back), then a butterfly gives every lane the same bits of the sum. Output deltas to ds.
      for (int r = warp; r < C; r += W) {
        float p[MaxOut] = {};
#pragma unroll
        for (int q = 0; q < JL; ++q) {
          const int j = lane + 32 * q;
          const float h = activate(act, hs[r * LDH + j] + b0s[j]);
          hs[r * LDH + j] = h;
#pragma unroll
          for (int o = 0; o < MaxOut; ++o) {
            if (o < NO) p[o] += h * w1s[j * NO + o];
          }
        }
#pragma unroll
        for (int o = 0; o < MaxOut; ++o) {
          if (o >= NO) continue;
#pragma unroll
          for (int m = 16; m >= 1; m /= 2) p[o] += __shfl_xor_sync(0xffffffffu, p[o], m);
        }
        const bool learn = r < n && window.contains(c0 + r);
#pragma unroll
        for (int o = 0; o < MaxOut; ++o) {
          if (o >= NO) continue;
          float d = 0.0f;
          if (learn) {
            const float res = p[o] + b1[o] - y[(c0 + r) * NO + o];
            d = 2.0f * scale * res;
            gloss += res * res;
            gb1[o] += d;
          }
          if (lane == o) ds[r * NO + o] = d;
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
        for (int r = t / HP; r < C; r += G) {
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
  const cudaError_t launched = cudaPeekAtLastError();
  if (launched != cudaSuccess) {
    throw Error(std::string("dpmlp: tensor kernel launch: ") + cudaGetErrorString(launched));
  }
#else
  (void)space, (void)k;
  throw Error("dpmlp: the tensor engine must be compiled by a CUDA compiler");
#endif
}

// The reason the tensor engine cannot run this one-hidden-layer model here, or "".
inline std::string tensor_unsupported(int inputs, int hidden, int outputs) {
  const std::string why = tensor_cores_unavailable();
  if (!why.empty()) return why;
  int dev = 0, most = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  const std::size_t need = tensor_scratch_bytes(tensor_ni(inputs), tensor_hp(hidden), outputs);
  if (need > static_cast<std::size_t>(most)) {
    return "the tensor engine's shared memory (" + std::to_string(need) + " bytes a block) does not fit the device's " +
           std::to_string(most);
  }
  return {};
}

// One step's per-block partial sums on tensor cores: the kernel instantiated for the model's padded shape.
inline void compute_tensor(const Kokkos::Cuda& space, const TensorProblem& p) {
  const int ni = tensor_ni(p.n_in), hp = tensor_hp(p.H);
  if (ni == 32) {
    switch (hp) {
      case 32: return launch_tensor<32, 32>(space, p);
      case 64: return launch_tensor<32, 64>(space, p);
      case 128: return launch_tensor<32, 128>(space, p);
      default: return launch_tensor<32, 256>(space, p);
    }
  }
  switch (hp) {
    case 32: return launch_tensor<64, 32>(space, p);
    case 64: return launch_tensor<64, 64>(space, p);
    case 128: return launch_tensor<64, 128>(space, p);
    default: return launch_tensor<64, 256>(space, p);
  }
}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
