// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/engine/fused_simt.hpp: the fused engine: forward and backward of a one-hidden-layer MLP in one SIMT
// kernel, on any space.
//
// Why: the layered engine (engine/block_engine.hpp) runs a dozen kernels a step (GEMMs, bias and activation,
// residual, gradient GEMMs, bias sums) and round-trips the hidden activations and deltas through global memory.
// On a GPU at the seed's size (10k rows a rank) a step is then launch-latency bound, and at 256 hidden units
// it is memory bound. Here one team owns one reduction block: it keeps W0, the block's rows (a chunk at a
// time), their hidden activations and deltas, and the block's gradient accumulators in team scratch
// (shared memory on a GPU), and writes only the block's partial sums. The next kernels (the block tree,
// reduction.hpp) are unchanged.
//
// Reproducibility: every sum has a fixed shape that depends only on the block's rows and the model's widths
// (each weight-gradient accumulator runs over the block's rows in row order; the output unit sums fixed
// segments of hidden units, then the segments in order). Nothing depends on the team size, the team's
// place on the device, or the rank count. "Logical threads" (256 a team) do the work; a team of fewer
// threads (1 on a host space) loops over them, so the same kernel runs, and is tested, on Serial.
//
// Limits (else the layered engine runs): one hidden layer, at most 64 inputs, 256 hidden units, 4 outputs,
// and the team scratch must fit (about 105 KB in float at 32 x 256 x 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dpmlp/activation.hpp"
#include "dpmlp/engine/row_window.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

// Fully unrolled loops keep the per-thread tiles (small arrays) in registers on a GPU: an array indexed by a
// loop the compiler did not unroll lives in local memory, and every FMA on it becomes a memory access.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define DPMLP_UNROLL _Pragma("unroll")
#else
#define DPMLP_UNROLL
#endif

namespace dpmlp {

namespace detail {

// Team scratch, in elements, in the order the kernel carves it (sqs: the predictions' loss terms):
//   [w0s NI*HP] b0s HP | w1s HP*NO | b1s 4 | xs C*NI | ys, ds, sqs 3*C*NO | hs, dhs 2*C*HP |
//   [accumulators w0 NI*HP, b0 HP, w1 HP*NO] | b1 NO | loss 1
// w0s: W0 zero-padded, when it fits (else W0 is read from global memory). The bracketed accumulators live
// in scratch only on host spaces, where one thread runs all 256 logical threads in turn; on a GPU each
// thread is one logical thread and keeps its accumulators in registers for the whole block.
KOKKOS_INLINE_FUNCTION std::size_t fused_scratch_elems(int ni, int hp, int chunk, int no, bool w0_shared,
                                                       bool acc_shared) {
  const std::size_t NI = ni, HP = hp, C = chunk, NO = no;
  return (w0_shared ? NI * HP : 0) + HP + HP * NO + 4 + C * NI + 3 * C * NO + 2 * C * HP +
         (acc_shared ? NI * HP + HP + HP * NO : 0) + NO + 1;
}

// The kernel's shape for a model: tiers, chunk and what lives in scratch, chosen to fit `max_bytes`.
struct FusedLayout {
  static constexpr int T = 256;  // logical threads a team
  int ni = 32;                   // padded inputs (the kernel's compile-time tier: 32 or 64)
  int hp = 32;                   // padded hidden units: a power of two in [32, 256]
  int chunk = 32;                // rows a team holds at once
  bool w0_shared = true, acc_shared = true, fits = false;
  std::size_t scratch_elems = 0;

  FusedLayout() = default;
  FusedLayout(int inputs, int hidden, int outputs, bool accumulators_in_scratch, std::size_t max_bytes,
              std::size_t scalar_bytes)
      : acc_shared(accumulators_in_scratch) {
    ni = inputs <= 32 ? 32 : 64;
    while (hp < hidden) hp *= 2;
    // A chunk must give every logical thread 1 to 4 rows in the forward mapping: T/(hp/4) <= chunk <= 4T/(hp/4).
    for (int c : {64, 32, 16, 8}) {
      if (c * hp < 4 * T || c * hp > 16 * T) continue;
      for (bool w0 : {true, false}) {
        const std::size_t elems = fused_scratch_elems(ni, hp, c, outputs, w0, acc_shared);
        if (elems * scalar_bytes <= max_bytes) {
          chunk = c;
          w0_shared = w0;
          scratch_elems = elems;
          fits = true;
          return;
        }
      }
    }
  }
};

// The reason the fused kernel cannot run this model, or "" if it can.
inline std::string fused_one_hidden_unsupported(const std::vector<int>& widths) {
  if (widths.size() != 3) return "the fused engine needs exactly one hidden layer";
  if (widths[0] > 64) return "the fused engine takes at most 64 inputs";
  if (widths[1] > 256) return "the fused engine takes at most 256 hidden units";
  if (widths[2] > 4) return "the fused engine takes at most 4 outputs";
  return {};
}

// AccShared: the weight-gradient accumulators live in team scratch (host spaces) or in registers (device
// spaces, where the team has exactly T threads). LossTerm: the loss's device functor (loss.hpp), which gives
// each prediction's output delta and loss term.
template <class ExecSpace, class Scalar, int NI, bool AccShared, class LossTerm>
struct FusedOneHiddenKernel {
  static constexpr int T = FusedLayout::T;
  static constexpr int TJ = 4;  // hidden units a logical thread owns
  static constexpr int MaxTR = 4;
  static constexpr int MaxIPT = NI / 4;  // inputs a logical thread owns in the weight-gradient phase
  static constexpr int MaxOut = 4;
  // At least two teams an SM: registers capped at 128 a thread, so a team's barriers overlap another's work.
  using policy = Kokkos::TeamPolicy<ExecSpace, Kokkos::LaunchBounds<T, 2>>;
  using member = typename policy::member_type;

  const Scalar* x;  // rows x n_in, row-major
  const Scalar* y;  // rows x NO, row-major
  const Scalar* params;
  Scalar* partials;  // blocks x ld
  std::int64_t ld, rows, block;
  int n_in, H, NO, HP, NJ, C, TR, IPT;
  int level;       // team scratch level
  bool w0_shared;  // W0 in scratch (else read from global memory)
  std::int64_t w0off, b0off, w1off, b1off, loss_col;
  Scalar scale;
  LossTerm loss;
  Activation act;
  RowWindow window;

  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION static void each(const member& team, int n, const F& f) {
    for (int t = team.team_rank(); t < n; t += team.team_size()) f(t);
  }

  KOKKOS_INLINE_FUNCTION std::size_t scratch_bytes() const {
    return sizeof(Scalar) * fused_scratch_elems(NI, HP, C, NO, w0_shared, AccShared);
  }

  // Logical thread t's share of one chunk's weight gradients: (input group ig, hidden tile jt) owns
  // IPT x 4 entries of dW0 and adds the chunk's rows in order; groups 0 and 1 also own db0 and dW1 for
  // their 4 units.
  KOKKOS_FORCEINLINE_FUNCTION void accumulate(int t, int n, const Scalar* xs, const Scalar* hs, const Scalar* dhs,
                                              const Scalar* ds, Scalar (&acc)[MaxIPT][TJ], Scalar (&ab0)[TJ],
                                              Scalar (&aw1)[TJ][MaxOut]) const {
    // IPT as a compile-time constant: a loop to MaxIPT with a guard would issue every guarded-off FMA too.
    switch (IPT) {
      case 1: accumulate_k<1>(t, n, xs, hs, dhs, ds, acc, ab0, aw1); break;
      case 2: accumulate_k<2>(t, n, xs, hs, dhs, ds, acc, ab0, aw1); break;
      case 4: accumulate_k<4>(t, n, xs, hs, dhs, ds, acc, ab0, aw1); break;
      case 8: accumulate_k<8>(t, n, xs, hs, dhs, ds, acc, ab0, aw1); break;
      default:
        if constexpr (MaxIPT >= 16) accumulate_k<16>(t, n, xs, hs, dhs, ds, acc, ab0, aw1);
        break;
    }
  }

  template <int K>
  KOKKOS_FORCEINLINE_FUNCTION void accumulate_k(int t, int n, const Scalar* xs, const Scalar* hs, const Scalar* dhs,
                                                const Scalar* ds, Scalar (&acc)[MaxIPT][TJ], Scalar (&ab0)[TJ],
                                                Scalar (&aw1)[TJ][MaxOut]) const {
    const int jt = t % NJ, ig = t / NJ, j0 = jt * TJ, i0 = ig * K;
    for (int r = 0; r < n; ++r) {
      Scalar d[TJ];
      DPMLP_UNROLL
      for (int q = 0; q < TJ; ++q) d[q] = dhs[r * HP + j0 + q];
      DPMLP_UNROLL
      for (int a = 0; a < K; ++a) {
        const Scalar xv = xs[r * NI + i0 + a];
        DPMLP_UNROLL
        for (int q = 0; q < TJ; ++q) acc[a][q] += xv * d[q];
      }
      if (ig == 0) {
        DPMLP_UNROLL
        for (int q = 0; q < TJ; ++q) ab0[q] += d[q];
      } else if (ig == 1) {
        if (NO == 1) {
          const Scalar dv = ds[r];
          DPMLP_UNROLL
          for (int q = 0; q < TJ; ++q) aw1[q][0] += hs[r * HP + j0 + q] * dv;
        } else {
          DPMLP_UNROLL
          for (int o = 0; o < MaxOut; ++o) {
            if (o < NO) {
              const Scalar dv = ds[r * NO + o];
              DPMLP_UNROLL
              for (int q = 0; q < TJ; ++q) aw1[q][o] += hs[r * HP + j0 + q] * dv;
            }
          }
        }
      }
    }
  }

  // Forward for logical thread t: R rows x 4 hidden units (R = TR, a compile-time constant here), their
  // activations into hs, and its segment of each output into seg.
  template <int R>
  KOKKOS_FORCEINLINE_FUNCTION void forward_tile(int t, const Scalar* xs, const Scalar* w0s, const Scalar* b0s,
                                                const Scalar* w1s, Scalar* hs, Scalar* seg) const {
    const int jt = t % NJ, rt = t / NJ, j0 = jt * TJ;
    Scalar h[R][TJ] = {};
    auto add_row = [&](int i, const Scalar (&w)[TJ]) {
      DPMLP_UNROLL
      for (int a = 0; a < R; ++a) {
        const Scalar xv = xs[(rt * R + a) * NI + i];
        DPMLP_UNROLL
        for (int q = 0; q < TJ; ++q) h[a][q] += xv * w[q];
      }
    };
    if (w0_shared) {  // W0 from scratch, zero-padded to NI rows
      DPMLP_UNROLL
      for (int i = 0; i < NI; ++i) {
        Scalar w[TJ];
        DPMLP_UNROLL
        for (int q = 0; q < TJ; ++q) w[q] = w0s[i * HP + j0 + q];
        add_row(i, w);
      }
    } else {  // W0 from global memory
      for (int i = 0; i < n_in; ++i) {
        Scalar w[TJ];
        DPMLP_UNROLL
        for (int q = 0; q < TJ; ++q) w[q] = j0 + q < H ? params[w0off + i * H + j0 + q] : Scalar(0);
        add_row(i, w);
      }
    }
    DPMLP_UNROLL
    for (int a = 0; a < R; ++a) {
      const int r = rt * R + a;
      DPMLP_UNROLL
      for (int q = 0; q < TJ; ++q) {
        h[a][q] = activate(act, h[a][q] + b0s[j0 + q]);
        hs[r * HP + j0 + q] = h[a][q];
      }
      DPMLP_UNROLL
      for (int o = 0; o < MaxOut; ++o) {
        if (o >= NO) continue;
        Scalar p = Scalar(0);
        DPMLP_UNROLL
        for (int q = 0; q < TJ; ++q) p += h[a][q] * w1s[(j0 + q) * NO + o];
        seg[(r * NO + o) * NJ + jt] = p;
      }
    }
  }

  // Logical thread t's accumulators from team scratch (AccShared).
  KOKKOS_FORCEINLINE_FUNCTION void load_shared(int t, const Scalar* acc_w0, const Scalar* acc_b0, const Scalar* acc_w1,
                                          Scalar (&acc)[MaxIPT][TJ], Scalar (&ab0)[TJ],
                                          Scalar (&aw1)[TJ][MaxOut]) const {
    const int jt = t % NJ, ig = t / NJ, j0 = jt * TJ, i0 = ig * IPT;
    for (int a = 0; a < MaxIPT; ++a) {
      if (a >= IPT) break;
      for (int q = 0; q < TJ; ++q) acc[a][q] = acc_w0[(i0 + a) * HP + j0 + q];
    }
    for (int q = 0; q < TJ; ++q) {
      ab0[q] = acc_b0[j0 + q];
      for (int o = 0; o < MaxOut; ++o) {
        if (o < NO) aw1[q][o] = acc_w1[(j0 + q) * NO + o];
      }
    }
  }

  // Writes logical thread t's accumulators into the block's row of partials.
  KOKKOS_FORCEINLINE_FUNCTION void write(int t, Scalar* out, const Scalar (&acc)[MaxIPT][TJ], const Scalar (&ab0)[TJ],
                                    const Scalar (&aw1)[TJ][MaxOut]) const {
    const int jt = t % NJ, ig = t / NJ, j0 = jt * TJ, i0 = ig * IPT;
    for (int a = 0; a < MaxIPT; ++a) {
      if (a >= IPT || i0 + a >= n_in) continue;
      for (int q = 0; q < TJ; ++q) {
        if (j0 + q < H) out[w0off + (i0 + a) * H + j0 + q] = acc[a][q];
      }
    }
    for (int q = 0; q < TJ; ++q) {
      if (j0 + q >= H) continue;
      if (ig == 0) out[b0off + j0 + q] = ab0[q];
      if (ig == 1) {
        for (int o = 0; o < MaxOut; ++o) {  // a constant trip count keeps aw1 in registers
          if (o < NO) out[w1off + (j0 + q) * NO + o] = aw1[q][o];
        }
      }
    }
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member& team) const {
    const std::int64_t b = team.league_rank();
    const std::int64_t r_begin = b * block;
    const std::int64_t r_end = r_begin + block < rows ? r_begin + block : rows;
    // On a device the level is 0 at compile time, so the compiler knows these are shared-memory addresses
    // (shared loads and stores, and no aliasing with the global x, y and partials).
    Scalar* s = nullptr;
    if constexpr (AccShared) {
      s = static_cast<Scalar*>(team.team_scratch(level).get_shmem(scratch_bytes()));
    } else {
      s = static_cast<Scalar*>(team.team_scratch(0).get_shmem(scratch_bytes()));
    }
    Scalar* const w0s = s;
    Scalar* const b0s = w0s + (w0_shared ? NI * HP : 0);
    Scalar* const w1s = b0s + HP;
    Scalar* const b1s = w1s + HP * NO;
    Scalar* const xs = b1s + 4;
    Scalar* const ys = xs + C * NI;
    Scalar* const ds = ys + C * NO;
    Scalar* const sqs = ds + C * NO;
    Scalar* const hs = sqs + C * NO;
    Scalar* const dhs = hs + C * HP;  // also the output unit's segment sums, before it holds the deltas
    Scalar* const acc_w0 = dhs + C * HP;  // AccShared only
    Scalar* const acc_b0 = acc_w0 + NI * HP;
    Scalar* const acc_w1 = acc_b0 + HP;
    Scalar* const acc_b1 = AccShared ? acc_w1 + HP * NO : acc_w0;
    Scalar* const acc_loss = acc_b1 + NO;
    // This thread's accumulators for the whole block (device spaces: one logical thread a thread).
    Scalar racc[MaxIPT][TJ] = {};
    Scalar rb0[TJ] = {};
    Scalar rw1[TJ][MaxOut] = {};

    // The parameters, zero-padded so the inner loops need no bounds; the accumulators, zeroed.
    if (w0_shared) {
      each(team, NI * HP, [&](int e) {
        const int i = e / HP, j = e % HP;
        w0s[e] = (i < n_in && j < H) ? params[w0off + i * H + j] : Scalar(0);
      });
    }
    if (AccShared) {
      each(team, NI * HP + HP + HP * NO, [&](int e) { acc_w0[e] = Scalar(0); });
    }
    each(team, HP, [&](int j) { b0s[j] = j < H ? params[b0off + j] : Scalar(0); });
    each(team, HP * NO, [&](int e) { w1s[e] = e / NO < H ? params[w1off + e] : Scalar(0); });
    each(team, NO + 1, [&](int o) {
      if (o < NO) {
        b1s[o] = params[b1off + o];
        acc_b1[o] = Scalar(0);
      } else {
        acc_loss[0] = Scalar(0);
      }
    });
    team.team_barrier();

    for (std::int64_t c0 = r_begin; c0 < r_end; c0 += C) {
      const int n = r_end - c0 < C ? static_cast<int>(r_end - c0) : C;
      each(team, C * NI, [&](int e) {
        const int r = e / NI, i = e % NI;
        xs[e] = (r < n && i < n_in) ? x[(c0 + r) * n_in + i] : Scalar(0);
      });
      each(team, C * NO, [&](int e) { ys[e] = e / NO < n ? y[c0 * NO + e] : Scalar(0); });
      team.team_barrier();

      // Forward: logical thread (row tile rt, hidden tile jt) computes TR rows x 4 hidden units, and its
      // share of each output: the sum over its 4 units, a segment of the output unit's sum.
      each(team, T, [&](int t) {
        switch (TR) {
          case 1: forward_tile<1>(t, xs, w0s, b0s, w1s, hs, dhs); break;
          case 2: forward_tile<2>(t, xs, w0s, b0s, w1s, hs, dhs); break;
          default: forward_tile<4>(t, xs, w0s, b0s, w1s, hs, dhs); break;
        }
      });
      team.team_barrier();

      // The outputs: the segments summed in order, plus the bias; residuals, the output deltas and the loss
      // terms.
      each(team, C * NO, [&](int t) {
        const int r = t / NO, o = t % NO;
        Scalar sum = Scalar(0);
        for (int jt = 0; jt < NJ; ++jt) sum += dhs[t * NJ + jt];
        const Scalar pred = sum + b1s[o];
        if (r < n && window.contains(c0 + r)) {
          const Scalar res = pred - ys[t];
          ds[t] = loss.grad(res, o, scale);
          sqs[t] = loss.value(res, o);
        } else {
          ds[t] = Scalar(0);
          sqs[t] = Scalar(0);
        }
      });
      team.team_barrier();

      // Hidden deltas (same mapping as the forward); the output bias and loss sums, in row order.
      each(team, T, [&](int t) {
        const int jt = t % NJ, rt = t / NJ, j0 = jt * TJ;
        for (int a = 0; a < TR; ++a) {
          const int r = rt * TR + a;
          for (int q = 0; q < TJ; ++q) {
            const int j = j0 + q;
            Scalar g = Scalar(0);
            for (int o = 0; o < NO; ++o) g += ds[r * NO + o] * w1s[j * NO + o];
            dhs[r * HP + j] = g * activate_grad_from_output(act, hs[r * HP + j]);
          }
        }
        if (t < NO) {
          Scalar acc = acc_b1[t];
          for (int r = 0; r < n; ++r) acc += ds[r * NO + t];
          acc_b1[t] = acc;
        } else if (t == TJ) {
          Scalar acc = acc_loss[0];
          for (int e = 0; e < n * NO; ++e) acc += sqs[e];
          acc_loss[0] = acc;
        }
      });
      team.team_barrier();

      // Weight gradients.
      if constexpr (AccShared) {
        each(team, T, [&](int t) {
          const int jt = t % NJ, ig = t / NJ, j0 = jt * TJ, i0 = ig * IPT;
          Scalar acc[MaxIPT][TJ] = {};
          Scalar ab0[TJ] = {};
          Scalar aw1[TJ][MaxOut] = {};
          load_shared(t, acc_w0, acc_b0, acc_w1, acc, ab0, aw1);
          accumulate(t, n, xs, hs, dhs, ds, acc, ab0, aw1);
          for (int a = 0; a < MaxIPT; ++a) {
            if (a >= IPT) break;
            for (int q = 0; q < TJ; ++q) acc_w0[(i0 + a) * HP + j0 + q] = acc[a][q];
          }
          for (int q = 0; q < TJ; ++q) {
            if (ig == 0) acc_b0[j0 + q] = ab0[q];
            if (ig == 1) {
              for (int o = 0; o < NO; ++o) acc_w1[(j0 + q) * NO + o] = aw1[q][o];
            }
          }
        });
      } else {
        accumulate(team.team_rank(), n, xs, hs, dhs, ds, racc, rb0, rw1);
      }
      team.team_barrier();
    }

    // The block's partial sums, in the parameter layout (plus the sum of the loss terms).
    Scalar* const out = partials + b * ld;
    if constexpr (AccShared) {
      each(team, T, [&](int t) {
        Scalar acc[MaxIPT][TJ] = {};
        Scalar ab0[TJ] = {};
        Scalar aw1[TJ][MaxOut] = {};
        load_shared(t, acc_w0, acc_b0, acc_w1, acc, ab0, aw1);
        write(t, out, acc, ab0, aw1);
      });
    } else {
      write(team.team_rank(), out, racc, rb0, rw1);
    }
    each(team, NO + 1, [&](int o) {
      if (o < NO) {
        out[b1off + o] = acc_b1[o];
      } else {
        out[loss_col] = acc_loss[0];
      }
    });
  }
};

}  // namespace detail
}  // namespace dpmlp
