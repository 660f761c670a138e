// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/tensor_mma.hpp: the tensor engine's register-resident kernel (32 or fewer inputs): raw
// `mma.sync` (3xTF32, backend/cuda/mma_ops.hpp) instead of the warp-matrix API (tensor_wmma.hpp).
//
// Why a second kernel: the warp-matrix one goes through shared memory between its phases (wmma fragments have no
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
// reproducible), and teams never wait for each other. Grouped (the plan's leaf group: enough blocks to fill every team),
// a CTA's teams take WR consecutive blocks instead, stage their sums in shared memory and meet to add them up
// in the block tree's shape, one row of partials a CTA's round (combine_group).
// Pipelining: the warps of a team meet at a barrier twice a batch (the output sums cross warps), so without
// it every warp of an SM would run its MMAs at the same time and its SIMT phases at the same time. Instead a
// batch's output phase (SIMT) runs alongside the next batch's forward MMAs, which do not depend on it; the
// next batch's pre-activations and the gW0 accumulators wait in shared memory while not in use, which keeps
// the registers under 255 without spills. x rows arrive by cp.async a batch ahead of that forward (three
// buffers: the batch in its backward, the next in its forward, the one after in flight).
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/device.hpp"
#include "dpmlp/backend/cuda/mma_ops.hpp"
#include "dpmlp/backend/cuda/tensor_shapes.hpp"
#include "dpmlp/detail/tree_order.hpp"
#include "dpmlp/errors.hpp"

namespace dpmlp {
namespace backend {

using detail::activate;
using detail::activate_grad_from_output;

template <bool On>
struct MmaGroupField {
  int group = 1;
};
template <>
struct MmaGroupField<false> {
  static constexpr int group = 1;
};

// LossTerm: the loss's device functor (loss.hpp).
template <int HP, int NOC, class LossTerm>
struct TensorMmaKernel : TensorProblem, MmaGroupField<HP == 32> {
  using MmaGroupField<HP == 32>::group;
  static constexpr int NI = 32, T = 256, RB = mma_batch_rows, NB = RB / 8, KT = NI / 8, FT = NI / 8, MT = 2;
  static constexpr int WH = HP / 32, WR = 8 / WH, LDX = NI + 4, ST = mma_stages;
  // One CTA an SM (255 registers a thread). Two, where their shared memory fits, would cap the registers at
  // 128, and the spills cost more than the second CTA's warps gain.
  static constexpr int MIN_BLOCKS = 1;
  static_assert(HP == 32 || HP == 64 || HP == 128 || HP == 256, "HP: 32, 64, 128 or 256");
  static_assert(NOC == 1 || NOC == 4, "NOC: 1 or 4");
  // Whether this instantiation has the grouped path (leaf groups): 32 hidden units, eight one-warp teams a CTA.
  static constexpr bool GROUPS = HP == 32;
  // Whether b0 stays in a register quad per row tile, the C operand of the forward's first MMAs, instead of
  // being copied into the accumulators every batch (32 moves a batch; ptxas keeps one register per value and
  // builds the quad with moves unless the two copies are distinct loads). Only at 256 units: it was faster
  // there, no faster at 128, and slower at 32, whose registers are at the 255 cap already.
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
  LossTerm loss{};  // set by the launch

  std::size_t scratch_bytes() const { return mma_scratch_bytes(HP, NOC, group > 1); }

#if defined(__CUDACC__)
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
      tf32::split((i < n_in && j < H) ? params[w0off + i * H + j] : 0.0f, hi[e], lo[e]);
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
  // b + a, so these are the butterfly's bits. (With several warps a team, each writing its row sums for the
  // others, it gained nothing, so the butterfly stays there.) row_of_lane() fetches the sum of the row a lane
  // stands for.
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
        tf32::split(xs[(nt * 8 + g) * LDX + kt * 8 + tg], bh[nt][0], bl[nt][0]);
        tf32::split(xs[(nt * 8 + g) * LDX + kt * 8 + tg + 4], bh[nt][1], bl[nt][1]);
      }
      if (kt == 0 && BIAS_QUAD) {
        tf32::mma3<MT, NB, true>(z, whi, wlo, bh, bl, s.b0q);
      } else {
        tf32::mma3(z, whi, wlo, bh, bl);
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
          d[o] = loss.grad(res, o, scale);
          s.lsum += loss.value(res, o);
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
          tf32::split(dr[nt][0][0] * xs[(nt * 8 + 2 * tg) * LDX + ft * 8 + g], bh[ft][0], bl[ft][0]);
          tf32::split(dr[nt][1][0] * xs[(nt * 8 + 2 * tg + 1) * LDX + ft * 8 + g], bh[ft][1], bl[ft][1]);
        }
        tf32::mma2(gw, am, bh, bl);
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
          tf32::split(zc[mt][nt][0], ah[mt][0], al[mt][0]);  // unit g,     row 2t
          tf32::split(zc[mt][nt][2], ah[mt][1], al[mt][1]);  // unit g + 8, row 2t
          tf32::split(zc[mt][nt][1], ah[mt][2], al[mt][2]);  // unit g,     row 2t + 1
          tf32::split(zc[mt][nt][3], ah[mt][3], al[mt][3]);  // unit g + 8, row 2t + 1
        }
        std::uint32_t bh[FT][2], bl[FT][2];
#pragma unroll
        for (int ft = 0; ft < FT; ++ft) {
          tf32::split(xs[(nt * 8 + 2 * tg) * LDX + ft * 8 + g], bh[ft][0], bl[ft][0]);
          tf32::split(xs[(nt * 8 + 2 * tg + 1) * LDX + ft * 8 + g], bh[ft][1], bl[ft][1]);
        }
        tf32::mma3(gw, ah, al, bh, bl);
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
  // (The last team to arrive summing alone while the others go on, counters in shared memory, was slower.)
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
      detail::tree::sum_held<Whole>(v, m);
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
  __trap();  // the engine plan refuses devices below compute capability 8.0
#endif
}

template <int HP, int NOC, class LossTerm>
__global__ void __launch_bounds__(256, TensorMmaKernel<HP, NOC, LossTerm>::MIN_BLOCKS)
    fused_tensor_mma(const TensorMmaKernel<HP, NOC, LossTerm> k) {
  run_register_resident(k);
}
#endif

template <int HP, int NOC, class LossTerm>
inline void launch_tensor_mma(const Kokkos::Cuda& space, const TensorProblem& p, const LossTerm& loss, int group) {
  using kernel_t = TensorMmaKernel<HP, NOC, LossTerm>;
  kernel_t k{p, {}};
  k.loss = loss;
  if constexpr (kernel_t::GROUPS) k.group = group;
  k.vec16 = p.n_in % 4 == 0 && reinterpret_cast<std::uintptr_t>(p.x) % 16 == 0;
#if defined(__CUDACC__)
  static const int resident = register_resident_setup(fused_tensor_mma<HP, NOC, LossTerm>, kernel_t::T,
                                                      mma_scratch_bytes(HP, NOC, kernel_t::GROUPS), k.scratch_bytes());
  const unsigned grid = register_resident_grid(p.blocks, kernel_t::WR, group, resident);
  fused_tensor_mma<HP, NOC, LossTerm><<<grid, kernel_t::T, k.scratch_bytes(), space.cuda_stream()>>>(k);
  check_tensor_launch();
#else
  (void)space, (void)k;
  throw Error("dpmlp: the tensor engine must be compiled by a CUDA compiler");
#endif
}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
