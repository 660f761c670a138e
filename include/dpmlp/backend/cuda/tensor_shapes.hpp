// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/tensor_shapes.hpp: the tensor engine's kernels as the planner sees them: their padded
// shapes, the shared memory each takes, and the problem a launch is given. Plain C++ with no CUDA in it, so
// engine/plan.hpp can decide which kernel runs (and tests can check that decision) on any build; the kernels
// (tensor_wmma.hpp, tensor_mma.hpp, tensor_pair.hpp) carve their shared memory by these same formulas.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dpmlp/activation.hpp"
#include "dpmlp/engine/row_window.hpp"
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {
namespace backend {

// The padded shape for a model: inputs to 32 or 64, hidden units to a power of two in [32, 256].
inline int tensor_ni(int inputs) { return inputs <= 32 ? 32 : 64; }
inline int tensor_hp(int hidden) {
  int hp = 32;
  while (hp < hidden) hp *= 2;
  return hp;
}

// ---- the warp-matrix kernel (tensor_wmma.hpp)
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

// ---- the register-resident kernel (tensor_mma.hpp), 32 or fewer inputs

// Whether a model takes the register-resident kernel's mask form of the backward: one output and an
// activation whose derivative is 0 or 1 (relu, identity); TensorMmaKernel::masked_grad says what it is. The
// paired schedule needs it too.
KOKKOS_INLINE_FUNCTION constexpr bool mask_form(int outputs, Activation a) {
  return outputs == 1 && (a == Activation::relu || a == Activation::identity);
}

inline constexpr int mma_batch_rows = 32;  // rows a team takes at once
inline constexpr int mma_stages = 3;       // x batches a team keeps in flight
inline constexpr int mma_group_blocks = 8;  // blocks a grouped CTA sums (its eight one-warp teams at 32 units)

// Shared memory of the register-resident kernel, in bytes: per team, mma_stages x batches (32 x 36 floats:
// rows padded by 4 make both fragment reads conflict-free) and the output exchange (WH x 32 x no); the split
// W0^T fragments (hp x 32 x 2); per thread of the 256, two parked arrays of 32 floats (the gW0^T
// accumulators and the next batch's pre-activations, between their uses); and, when grouped, each team's
// block sums (32 hp + hp + hp no + no + 1 floats), which the group's teams add up.
inline std::size_t mma_scratch_bytes(int hp, int no, bool grouped = false) {
  const std::size_t wh = hp / 32, teams = 8 / wh, parked = 2 * 256 * 32;
  const std::size_t staged = grouped ? teams * (std::size_t(33 + no) * hp + no + 1) : 0;
  return (teams * mma_stages * mma_batch_rows * 36 + teams * wh * mma_batch_rows * no + std::size_t(hp) * 32 * 2 +
          parked + staged) *
             sizeof(float) +
         128;
}

// ---- the paired schedule (tensor_pair.hpp)

// How F hands B a batch's 0/1 mask: as bits (one word a lane) at 32 padded hidden units, where the words would
// leave room for three ring slots only, which was slower; as words (two values a word) from 64, where the
// shared memory allows and unpacking costs B a shift a pair instead of three instructions a value.
inline constexpr bool mma_pair_mask_words(int hp) { return hp != 32; }
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

// ---- the deep kernel (tensor_deep.hpp): two to four hidden layers of at most 64 units, at most 64 inputs,
// at most 4 outputs, where an SM holds 16 warps of it (deep_fits)

inline constexpr int deep_units = 64;        // every hidden layer padded to 64 units
inline constexpr int deep_rows = 64;         // rows a CTA takes at once (a tile)
inline constexpr int deep_max_outputs = 4;
inline constexpr int deep_min_layers = 2, deep_max_layers = 4;  // hidden layers

// The deep kernel's shared matrices hold each value as two fp16 parts (hi and lo, two planes of rows x C
// halves, C = 32 or 64 columns) with a power-of-two scale for every 16 rows x 32 columns (f16x3 in mma_ops.hpp).
// A row's 16-byte chunks are permuted (deep_swizzle), so the eight rows an ldmatrix reads at one logical chunk,
// and the eight rows of an MMA accumulator's stores, fall in eight distinct 16-byte bank groups.
KOKKOS_INLINE_FUNCTION constexpr int deep_swizzle(int r, int columns) {
  return columns == 64 ? (r & 7) : ((r >> 1) & 3);
}
// Where element (r, c) of such a plane lives, in halves from its start.
KOKKOS_INLINE_FUNCTION constexpr int deep_at(int r, int c, int columns) {
  return r * columns + ((((c >> 3) ^ deep_swizzle(r, columns))) << 3) + (c & 7);
}

// Shared memory of the deep kernel, in bytes, that each group of eight warps takes for its own tiles, for ni
// padded inputs (32 or 64) and `layers` hidden layers: the tile's x (64 x ni), each hidden layer's outputs
// (64 x 64: the activations in the forward, then, in place, the deltas), each in two fp16 planes; the scales
// of x and of every hidden layer's matrix (4 x 2 each); the tile's output deltas (64 x 4), loss terms (64) and
// output-layer sums over each half of the last hidden layer (2 x 64 x 4); the block's sums by row group (bias
// gradients 4 x 64 a layer, output-layer weight gradients 4 x 64 x 4, output-layer biases and loss 2 x 5);
// rounded up to 128, so every group's planes start at a multiple of 128 bytes (the swizzle's bank groups).
inline constexpr std::size_t deep_group_bytes(int ni, int layers) {
  const std::size_t R = deep_rows, U = deep_units;
  const std::size_t planes = 4 * (R * ni + layers * R * U);  // two halves a value
  const std::size_t floats = 8 * (1 + std::size_t(layers)) + 3 * R * deep_max_outputs + R +
                             4 * U * (layers + deep_max_outputs) + 2 * (deep_max_outputs + 1);
  const std::size_t b = planes + 4 * floats;
  return (b + 127) / 128 * 128;
}

// Shared memory of the deep kernel, in bytes, with `groups` groups a CTA: the weights the groups share (every
// hidden layer's, ni x 64 then 64 x 64 each, in two fp16 planes; their biases, 64 each; the output layer's
// weights and biases, 64 x 4 + 4; each layer's weight scale and largest magnitude), rounded up to 128, then
// each group's tiles.
inline constexpr std::size_t deep_weight_bytes(int ni, int layers) {
  const std::size_t U = deep_units;
  const std::size_t b =
      4 * (std::size_t(ni) + (layers - 1) * U) * U + 4 * (layers * U + U * deep_max_outputs + deep_max_outputs) +
      8 * std::size_t(layers);
  return (b + 127) / 128 * 128;
}
inline constexpr std::size_t deep_scratch_bytes(int ni, int layers, int groups = 1) {
  return deep_weight_bytes(ni, layers) + groups * deep_group_bytes(ni, layers) + 128;
}

// Whether two CTAs of the deep kernel (one group each) fit `per_sm` bytes of shared memory (each CTA also
// takes 1 KB the system reserves).
inline constexpr bool deep_two_fit(int ni, int layers, std::size_t per_sm) {
  return 2 * (deep_scratch_bytes(ni, layers) + 1024) <= per_sm;
}

// The groups of eight warps a CTA of the deep kernel has: one where two such CTAs fit an SM of 228 KB (the
// most any GPU has), else two sharing one copy of the weights. Either way an SM runs 16 warps: with 8 (one
// CTA of one group) the kernel waits on its MMAs' and its barriers' latency, and was no faster than the
// layered engine (four hidden layers on an H200). The planner runs it where the device holds 16 warps of it.
inline constexpr int deep_groups(int ni, int layers) { return deep_two_fit(ni, layers, 228 * 1024) ? 1 : 2; }

// Whether an SM of `per_sm` bytes (a CTA opting in to at most `optin`) runs 16 warps of the deep kernel.
inline constexpr bool deep_fits(int ni, int layers, std::size_t optin, std::size_t per_sm) {
  return deep_groups(ni, layers) == 1 ? deep_two_fit(ni, layers, per_sm) && deep_scratch_bytes(ni, layers) <= optin
                                      : deep_scratch_bytes(ni, layers, 2) <= optin &&
                                            deep_scratch_bytes(ni, layers, 2) + 1024 <= per_sm;
}

// What the deep kernel needs to run a step (the widths and parameter offsets of every layer, the output layer
// last).
struct DeepProblem {
  const float* x = nullptr;  // rows x widths[0], row-major
  const float* y = nullptr;  // rows x widths[layers + 1], row-major
  const float* params = nullptr;
  float* partials = nullptr;  // blocks x ld; the last column: the sum of the loss terms
  std::int64_t ld = 0, rows = 0, block = 0, blocks = 0;
  int layers = 0;  // hidden layers
  int widths[deep_max_layers + 2] = {};
  std::int64_t woff[deep_max_layers + 1] = {}, boff[deep_max_layers + 1] = {};
  float scale = 1;
  float loss_weights[4] = {1, 1, 1, 1};  // the MSE's output weights (loss.hpp), 1 past the outputs
  Activation act = Activation::relu;
  detail::RowWindow window;
};

// ---- a launch

// Which kernel a launch runs (the plan's choice).
enum class TensorLaunch { warp_matrix, register_resident, register_resident_paired };

// What the tensor engine needs to run a step: the model's shape and parameter offsets, the data, where the
// partial sums go (one row of `ld` a block, or a group of blocks: compute_tensor's group), and which kernel.
// The kernels take it as their base, so its layout is part of theirs.
struct TensorProblem {
  const float* x = nullptr;  // rows x n_in, row-major
  const float* y = nullptr;  // rows x NO, row-major
  const float* params = nullptr;
  float* partials = nullptr;  // ceil(blocks / group) x ld; the last column: the sum of the loss terms
  std::int64_t ld = 0, rows = 0, block = 0, blocks = 0;
  int n_in = 0, H = 0, NO = 1;
  std::int64_t w0off = 0, b0off = 0, w1off = 0, b1off = 0;
  float scale = 1;
  float loss_weights[4] = {1, 1, 1, 1};  // the MSE's output weights (loss.hpp), 1 past the outputs
  Activation act = Activation::relu;
  detail::RowWindow window;
  TensorLaunch kernel = TensorLaunch::warp_matrix;
};

}  // namespace backend
}  // namespace dpmlp
