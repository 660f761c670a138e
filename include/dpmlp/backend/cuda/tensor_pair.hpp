// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/tensor_pair.hpp: the register-resident kernel's paired schedule (one output, relu or
// identity; the plan pairs wherever its shared memory fits): each warp of a team becomes a pair, a forward warp
// F and a backward warp B, instead of one warp doing both.
//
// Why: with one warp doing a batch's whole chain (forward MMAs, bias and activation, the output sums, the
// deltas, the backward MMAs) the warp holds the pre-activations and the gW0 accumulators at once, 240-255
// registers, so an SM holds 8 warps, two a scheduler, and the kernel is bound by the latency of that chain
// (a profile shows the tensor pipe idle most of the time).
// Split in two, the state splits too: F keeps the pre-activations and the b0 / W1 / b1 / loss sums, B the
// gW0 accumulators, each under 128 registers with nothing parked in shared memory, so a CTA of 16 warps (8 F,
// 8 B) fits an SM, and each warp's chain is about half as long. A team is WH = HP / 32 pairs (F warp w and B
// warp w take hidden units 32w..32w+31). F hands its B, per batch, what the mask-form backward needs
// (TensorMmaKernel::masked_grad): the 0/1 mask of each of its lane's 32 values (as bits or as words, below)
// and each row's output delta; at a block's last batch F's finished b0 / W1 / b1 / loss sums too. B writes
// the block's sums (or stages them and, grouped, adds the group up with the other teams' B warps:
// combine_group).
// Same arithmetic in the same order as TensorMmaKernel<HP, 1> (the forward, the output sums, the deltas, the
// mask-form MMAs over the same operands, the same finish), so the same bits: test_mlp compares the two bit
// for bit. The handoff is a ring of R slots a team (the batch's x and targets, and each pair's words), with
// two mbarriers a slot: `full` (every F lane of the team arrives when the slot's words are written) and
// `x in` (B's copy of the batch has landed: B copies batch i + R into slot i % R once done with batch i, see
// feed and the ring, below); F runs up to R - 1 batches ahead of B.
//
// How F hands B a batch's 0/1 mask (mma_pair_mask_words). As bits (one word a lane, bit k for the lane's value
// k: B's A-operand fragment wants exactly the values F's lane held), packing takes an FMA a value
// (forward_warp) and unpacking a shift, an arithmetic shift and a mask. As words, where the shared memory
// allows (from 64 padded hidden units): two values a word, w = m_a + (m_b >> 19) with m = 0x3f800000 (1.0f) or
// 0, so w itself is the A operand for a (m_b's 0x7f0 sits in the low 13 bits, which the tensor cores ignore in
// a .tf32 operand: see tf32::split) and w << 19 is exactly m_b: two integer instructions a pair in F, a shift a
// pair in B, 16 words a lane, each loaded by B straight into its fragment's register.
//
// The ring: B copies each batch's x (and targets) into it (feed). F's chain bounds the pair (B waits for F's
// handoff about half its time), so the copies' address arithmetic, issue and waits are kept off it: B copies
// batch i + R into slot i % R as soon as it is done with batch i. B carries the cursor R batches on (recomputing
// it each batch was slower), and its rarer copies run in loops (unrolled, they made B spill).
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/device.hpp"
#include "dpmlp/backend/cuda/mma_ops.hpp"
#include "dpmlp/backend/cuda/tensor_mma.hpp"
#include "dpmlp/backend/cuda/tensor_shapes.hpp"
#include "dpmlp/errors.hpp"

namespace dpmlp {
namespace backend {

template <int HP, class LossTerm>
struct TensorPairKernel : TensorMmaKernel<HP, 1, LossTerm> {
  using base = TensorMmaKernel<HP, 1, LossTerm>;
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

  // B feeds the ring (why B: this file's opening comment): the copy of batch `cur` (x, and its
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
          d = this->loss.grad(res, 0, this->scale);
          s.lsum += this->loss.value(res, 0);
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
    // The W0^T fragments, split, by every B warp of the CTA, a share each: done by the first team's B warps
    // alone (as the unpaired kernel's team 0 does), one warp would split all 8 fragments at 32 units (8 teams of
    // one pair) while the other seven waited at the CTA barrier below.
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
          tf32::split(dr0 * xs[(nt * 8 + 2 * tg) * LDX + ft * 8 + g], bh[ft][0], bl[ft][0]);
          tf32::split(dr1 * xs[(nt * 8 + 2 * tg + 1) * LDX + ft * 8 + g], bh[ft][1], bl[ft][1]);
        }
        tf32::mma2(gw, am, bh, bl);
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
template <int HP, class LossTerm>
__global__ void __launch_bounds__(512, 1) fused_tensor_pair(const TensorPairKernel<HP, LossTerm> k) {
  run_register_resident(k);
}
#endif

template <int HP, class LossTerm>
inline void launch_tensor_pair(const Kokkos::Cuda& space, const TensorProblem& p, const LossTerm& loss, int group) {
  using kernel_t = TensorPairKernel<HP, LossTerm>;
  kernel_t k{typename kernel_t::base{p, {}}};
  k.loss = loss;
  if constexpr (kernel_t::GROUPS) k.group = group;
  k.vec16 = p.n_in % 4 == 0 && reinterpret_cast<std::uintptr_t>(p.x) % 16 == 0;
#if defined(__CUDACC__)
  // One CTA an SM (its 512 threads take every register).
  static const int resident = register_resident_setup(fused_tensor_pair<HP, LossTerm>, kernel_t::TP,
                                                      mma_pair_scratch_bytes(HP, kernel_t::GROUPS), k.scratch_bytes());
  const unsigned grid = register_resident_grid(p.blocks, kernel_t::WR, group, resident);
  fused_tensor_pair<HP, LossTerm><<<grid, kernel_t::TP, k.scratch_bytes(), space.cuda_stream()>>>(k);
  check_tensor_launch();
#else
  (void)space, (void)k;
  throw Error("dpmlp: the tensor engine must be compiled by a CUDA compiler");
#endif
}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
