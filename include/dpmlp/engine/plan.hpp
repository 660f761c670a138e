// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/engine/plan.hpp: the one place that decides how a step's per-block gradient sums are computed.
//
// plan_engine() takes the model's shape, what the execution space and its device offer (EngineCaps), the
// caller's EngineOptions, the global row count and the rank count, and returns an EnginePlan: the engine, the
// kernel, the rows a reduction block, the blocks a leaf of the block tree and the layered engine's GEMMs. The
// trainer, value_and_grad and the ranks' agreement all use that plan. It is a pure function of its arguments
// (no device, no environment), so a CPU-only build can test every decision it makes for any device.
//
// Reproducibility rests on two rules here. The block shape (block_rows, and which kernel family sums a block)
// is a function of global values only, never of a rank's share, so every rank count sums the same blocks in
// the same shapes. And the ranks must agree on the plan (the trainer checks; EnginePlan::sums_key is what
// must match): ranks on different devices could otherwise plan differently and silently break the bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/tensor_shapes.hpp"
#include "dpmlp/engine/fused_simt.hpp"
#include "dpmlp/engine/options.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/linalg/gemm.hpp"
#include "dpmlp/reduction.hpp"

namespace dpmlp {

// The model as the planner sees it.
struct ModelShape {
  std::vector<int> widths;  // {inputs, hidden..., outputs}
  Activation activation = Activation::relu;
  std::size_t scalar_bytes = sizeof(float);
  int inputs() const { return widths.front(); }
  int outputs() const { return widths.back(); }
  int hidden() const { return widths.size() > 2 ? widths[1] : 0; }  // the first hidden layer's units
  std::int64_t num_params() const {
    std::int64_t n = 0;
    for (std::size_t l = 0; l + 1 < widths.size(); ++l) n += std::int64_t(widths[l]) * widths[l + 1] + widths[l + 1];
    return n;
  }
  // The sums a block produces: every parameter's gradient and the sum of squared residuals.
  std::int64_t sums_per_block() const { return num_params() + 1; }
};

// What an execution space (and, for a GPU, its device) offers the engines. engine/block_engine.hpp reads it
// for a space; tests write it by hand.
struct EngineCaps {
  bool host_space = true;         // Serial, OpenMP: the fused kernel runs teams of one thread
  std::string tensor_unavailable;  // "" where the tensor engine's kernels can run (CUDA, float, sm_80+), else why
  int multiprocessors = 0;         // the GPU's SMs; on host spaces, the threads a rank runs
  std::size_t shared_memory_optin = 0;  // shared memory a CTA may opt in to, bytes
  std::size_t shared_memory_sm = 0;     // shared memory an SM has, bytes
  std::size_t team_scratch = 0;         // team scratch a fused team may take, bytes
  int fused_team_size = 0;              // device spaces: the most threads a fused team can have
  linalg::Backend gemm_reproducible = linalg::Backend::portable;  // the layered engine's default GEMMs
  linalg::Backend gemm_fast = linalg::Backend::portable;
  bool cutlass_on_wgmma = false;  // the cutlass backend runs Hopper's wgmma 3xTF32 kernels here (float; other bits)
  bool cutlass_on_f16x3 = false;  // dpmlp's block-scaled 3xFP16 kernels can run here (float; other bits)
  bool f16x3_on_wgmma = false;    // ... and their wgmma form, which takes the GEMMs whose planes wgmma reads
  bool split_operands = false;    // the split-operand GEMMs run on Hopper's kernels here (linalg/split_gemm.hpp)
};

// Which kernel computes a step's block sums.
enum class Kernel {
  layered,
  fused,
  tensor_warp_matrix,
  tensor_register_resident,
  tensor_register_resident_paired,
  host,
  tensor_deep
};

inline const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::layered: return "layered";
    case Kernel::fused: return "fused";
    case Kernel::tensor_warp_matrix: return "tensor warp-matrix";
    case Kernel::tensor_register_resident: return "tensor register-resident";
    case Kernel::tensor_register_resident_paired: return "tensor register-resident paired";
    case Kernel::host: return "host";
    case Kernel::tensor_deep: return "tensor deep";
  }
  return "?";
}

struct EnginePlan {
  Engine engine = Engine::layered;  // never automatic
  Kernel kernel = Kernel::layered;
  std::int64_t block_rows = 64;
  int leaf_group = 1;  // blocks a row of the engine's partial sums (and a leaf of the block tree) holds
  linalg::Backend gemm = linalg::Backend::portable;
  bool gemm_wgmma = false;  // the layered engine's cutlass GEMMs run on Hopper's wgmma kernels (EngineCaps):
                            // with gemm_f16x3 the 3xFP16 GEMMs' wgmma form, else the wgmma 3xTF32 kernels
  bool gemm_f16x3 = false;  // ... those of n >= 64 on the block-scaled 3xFP16 kernels (EngineOptions::gemm_3xfp16),
                            // whose rows x weights GEMMs then run in their wgmma form where gemm_wgmma
  bool gemm_split = false;  // its forward and delta GEMMs run over split operands (EngineOptions::split_operands)
  bool split_hopper = false;  // ... on Hopper's kernels (EngineCaps::split_operands), not the portable form

  bool register_resident() const {
    return kernel == Kernel::tensor_register_resident || kernel == Kernel::tensor_register_resident_paired;
  }
  // What fixes a step's bits, so every rank must plan alike: the engine, the kernel family (the two
  // register-resident schedules sum alike), the block, the leaf group and the layered engine's GEMMs (and
  // whether those run on wgmma or in 3xFP16, or over split operands on Hopper's kernels or in the portable
  // form: a Hopper rank and an Ampere rank would not sum alike).
  std::int64_t sums_key() const {
    const int split = gemm_split ? (split_hopper ? 2 : 1) : 0;
    const int kernels = gemm_f16x3 ? (gemm_wgmma ? 3 : 2) : gemm_wgmma ? 1 : 0;
    const int gemm_key = engine == Engine::layered ? (static_cast<int>(gemm) * 4 + kernels) * 3 + split : 0;
    const int family = register_resident() ? 3 : static_cast<int>(kernel);
    // leaf_group <= 8; gemm_key < 64 (backend < 5)
    return (((block_rows * 16 + leaf_group) * 8 + family) * 8 + static_cast<int>(engine)) * 64 + gemm_key;
  }
  std::string describe() const {
    return std::string(kernel_name(kernel)) + (engine == Engine::layered ? std::string(" (") + linalg::backend_name(gemm) + (gemm_f16x3 ? (gemm_wgmma ? ", 3xFP16 on wgmma" : ", 3xFP16") : gemm_wgmma ? " on wgmma" : "") + (gemm_split ? (split_hopper ? ", split operands" : ", split operands (portable)") : "") + ")" : std::string()) + ", " + std::to_string(block_rows) + "-row blocks" +
           (leaf_group > 1 ? ", leaves of " + std::to_string(leaf_group) + " blocks" : "");
  }
};

namespace detail {

// Whether the register-resident kernel can run a model of this shape on the device: 32 or fewer inputs, its
// shared memory fitting.
inline bool mma_fits(const ModelShape& m, const EngineCaps& caps) {
  return backend::tensor_ni(m.inputs()) == 32 &&
         backend::mma_scratch_bytes(backend::tensor_hp(m.hidden()), m.outputs() == 1 ? 1 : 4) <=
             caps.shared_memory_optin;
}
inline bool wmma_fits(const ModelShape& m, const EngineCaps& caps) {
  return backend::tensor_scratch_bytes(backend::tensor_ni(m.inputs()), backend::tensor_hp(m.hidden()),
                                       m.outputs()) <= caps.shared_memory_optin;
}
// Whether the register-resident kernel runs this model at every block count (tensor_family, below): one output,
// relu or identity, and it fits. The default block size depends on it.
inline bool mma_at_every_count(const ModelShape& m, const EngineCaps& caps) {
  return backend::mask_form(m.outputs(), m.activation) && mma_fits(m, caps);
}

// The reason the tensor engine's deep kernel (backend/cuda/tensor_deep.hpp) cannot run a model of this shape
// (two or more hidden layers) here, or "".
inline std::string deep_unsupported(const ModelShape& m, const EngineCaps& caps) {
  const int layers = static_cast<int>(m.widths.size()) - 2;
  if (layers < backend::deep_min_layers || layers > backend::deep_max_layers) {
    return "the tensor engine takes one hidden layer, or two to four of at most 64 units";
  }
  if (m.inputs() > 64) return "the tensor engine's deep kernel takes at most 64 inputs";
  for (int l = 1; l <= layers; ++l) {
    if (m.widths[static_cast<std::size_t>(l)] > backend::deep_units) {
      return "the tensor engine's deep kernel takes hidden layers of at most 64 units";
    }
  }
  if (m.outputs() > backend::deep_max_outputs) return "the tensor engine's deep kernel takes at most 4 outputs";
  const int ni = backend::tensor_ni(m.inputs());
  if (!backend::deep_fits(ni, layers, caps.shared_memory_optin, caps.shared_memory_sm)) {
    const int groups = backend::deep_groups(ni, layers);
    return "the tensor engine's deep kernel needs " + std::to_string(groups == 1 ? 2 : 1) + " blocks of " +
           std::to_string(backend::deep_scratch_bytes(ni, layers, groups)) +
           " bytes of shared memory an SM; the device has " + std::to_string(caps.shared_memory_sm) +
           " an SM, " + std::to_string(caps.shared_memory_optin) + " a block";
  }
  return {};
}

// The reason the tensor engine cannot run this model here, or "".
inline std::string tensor_unsupported(const ModelShape& m, const EngineCaps& caps) {
  if (!caps.tensor_unavailable.empty()) return caps.tensor_unavailable;
  if (m.widths.size() > 3) return deep_unsupported(m, caps);
  const std::string why = fused_one_hidden_unsupported(m.widths);
  if (!why.empty()) return why;
  if (!mma_fits(m, caps) && !wmma_fits(m, caps)) {
    return "the tensor engine's shared memory (" +
           std::to_string(backend::tensor_scratch_bytes(backend::tensor_ni(m.inputs()), backend::tensor_hp(m.hidden()),
                                                        m.outputs())) +
           " bytes a block) does not fit the device's " + std::to_string(caps.shared_memory_optin);
  }
  return {};
}

// The reason the fused engine cannot run this model here, or "".
inline std::string fused_unsupported(const ModelShape& m, const EngineCaps& caps) {
  std::string why = fused_one_hidden_unsupported(m.widths);
  if (!why.empty()) return why;
  const FusedLayout lay(m.inputs(), m.hidden(), m.outputs(), caps.host_space, caps.team_scratch, m.scalar_bytes);
  if (!lay.fits) {
    return "the fused engine's team scratch for " + std::to_string(m.hidden()) +
           " hidden units does not fit the space's " + std::to_string(caps.team_scratch) + " bytes";
  }
  // A device team must run all 256 logical threads at once (their accumulators are registers).
  if (!caps.host_space && caps.fused_team_size < FusedLayout::T) {
    return "the fused kernel needs teams of " + std::to_string(FusedLayout::T) + " threads, the space allows " +
           std::to_string(caps.fused_team_size);
  }
  return {};
}

// Engine::automatic -> tensor where it can run; else, on device spaces, fused when the model qualifies and its
// team scratch fits, else layered; on host spaces host. Engine::fused, tensor or host where it cannot run ->
// InputError saying why.
inline Engine resolve_engine(const ModelShape& m, const EngineCaps& caps, Engine requested) {
  if (requested == Engine::layered) return requested;
  if (requested == Engine::host) {
    if (!caps.host_space) throw InputError("dpmlp: the host engine runs on host execution spaces (Serial, OpenMP)");
    return requested;
  }
  if (requested == Engine::tensor || requested == Engine::automatic) {
    const std::string why = tensor_unsupported(m, caps);
    if (why.empty()) return Engine::tensor;
    if (requested == Engine::tensor) throw InputError("dpmlp: " + why);
  }
  const std::string why = fused_unsupported(m, caps);
  if (requested == Engine::fused) {
    if (!why.empty()) throw InputError("dpmlp: " + why);
    return Engine::fused;
  }
  if (caps.host_space) return Engine::host;
  return why.empty() ? Engine::fused : Engine::layered;
}

// Which tensor kernel family sums a step of `global_blocks` blocks of `block_rows` rows (over every rank). The
// two families sum in different shapes, so the choice depends on global values only, never on a rank's share.
// The register-resident kernel (32 or fewer inputs, its shared memory fitting):
// - at every block count for one output with relu or identity (its mask-form backward, paired): there it was
//   as fast as the warp-matrix kernel at the fewest blocks measured and faster everywhere else, the seed's
//   sizes included;
// - else (several outputs, tanh) from 128 * 8 / (hp / 32) blocks on, enough to fill half of its teams (8 / (hp
//   / 32) an SM, a team a block) on a 128-SM GPU split over two ranks, or from 128 rows a block on, whatever the
//   block count: the warp-matrix kernel takes a block's rows 64 at a time in one CTA, so its time grows with
//   the block, several times the register-resident kernel's at 256 rows and more.
// Else the warp-matrix kernel, where it fits. A forced kernel that does not fit is refused. Two to four hidden
// layers: the deep kernel, the one tensor kernel for them.
inline Kernel tensor_family(const ModelShape& m, const EngineCaps& caps, TensorKernel forced,
                            std::int64_t global_blocks, std::int64_t block_rows) {
  if (m.widths.size() > 3) {
    if (forced != TensorKernel::automatic) {
      throw InputError(std::string("dpmlp: tensor_kernel ") + tensor_kernel_name(forced) +
                       " runs one hidden layer; a deeper model runs the tensor engine's deep kernel");
    }
    return Kernel::tensor_deep;
  }
  const bool mma = mma_fits(m, caps), wmma = wmma_fits(m, caps);
  const int hp = backend::tensor_hp(m.hidden());
  if (forced == TensorKernel::warp_matrix) {
    if (!wmma) throw InputError("dpmlp: the warp-matrix tensor kernel's shared memory does not fit this device");
    return Kernel::tensor_warp_matrix;
  }
  if (forced == TensorKernel::register_resident || forced == TensorKernel::register_resident_paired) {
    if (!mma) {
      throw InputError(std::string("dpmlp: the register-resident tensor kernel needs 32 or fewer inputs and its "
                                   "shared memory to fit (") +
                       std::to_string(m.inputs()) + " inputs, " + std::to_string(m.hidden()) + " hidden units)");
    }
    return Kernel::tensor_register_resident;
  }
  const bool prefer_mma = backend::mask_form(m.outputs(), m.activation) || global_blocks >= 128 * (8 / (hp / 32)) ||
                          block_rows >= 128;
  return mma && (prefer_mma || !wmma) ? Kernel::tensor_register_resident : Kernel::tensor_warp_matrix;
}

// The register-resident kernel's leaf group at 32 hidden units and one output: its CTA's eight one-warp teams
// take eight consecutive blocks at once and sum them in the block tree's shape before writing (the tree's first
// three levels, in shared memory), so the partial sums and the tree over them are eight times smaller. The
// sums are the same bits either way (a group is a subtree); what changes is the layout: ranks then own whole
// groups, so the value must be the same on every rank (the trainer takes the smallest). Automatic: where at
// least 7/8 of the teams of every SM would have a block (with fewer, the team-major order, spreading the blocks
// over more SMs, keeps more SMs busy than the grouped CTAs would; from 7/8 rather than all, because the
// partial sums' eightfold cut pays for the few idle teams), and the staged sums fit the shared memory. Not at
// 64 hidden units (teams of two warps) or several outputs: there compute-sanitizer's racecheck reported
// shared-memory hazards between the staging and the sum for some shapes with a short last group, unexplained
// although every grouped row was bitwise right.
inline int leaf_group(const ModelShape& m, const EngineCaps& caps, Toggle asked, std::int64_t global_blocks,
                      int ranks) {
  constexpr int teams = backend::mma_group_blocks;
  const bool can = backend::tensor_hp(m.hidden()) == 32 && m.outputs() == 1 &&
                   backend::mma_scratch_bytes(32, 1, true) <= caps.shared_memory_optin;
  if (asked == Toggle::off) return 1;
  if (asked == Toggle::on) {
    if (!can) {
      throw InputError("dpmlp: leaf groups need the register-resident tensor kernel at 32 or fewer hidden units, "
                       "one output, and its grouped shared memory to fit");
    }
    return teams;
  }
  if (!can) return 1;
  const std::int64_t sms = caps.multiprocessors > 0 ? caps.multiprocessors : 1;
  return global_blocks * 8 >= std::int64_t(ranks > 0 ? ranks : 1) * sms * teams * 7 ? teams : 1;
}

// The host engine's leaf group: the most blocks (8, 4, 2 or 1) one of its threads sums into a row of partial
// sums itself, in the block tree's shape (the same bits as a row a block: a group is a subtree), so that a step
// writes and the tree reads that many times fewer rows. Ranks own whole groups and threads split them, so
// automatic takes the largest group that leaves at least 16 groups a thread over all ranks (ranks and threads
// then differ by at most 1/16 of a step's work). The bits do not depend on it.
inline int host_leaf_group(const EngineCaps& caps, Toggle asked, std::int64_t global_blocks, int ranks) {
  if (asked == Toggle::off) return 1;
  if (asked == Toggle::on) return 8;
  const std::int64_t workers = std::int64_t(ranks > 0 ? ranks : 1) * (caps.multiprocessors > 0 ? caps.multiprocessors : 1);
  for (int g = 8; g > 1; g /= 2) {
    if (global_blocks / g >= 16 * workers) return g;
  }
  return 1;
}

// The global rows a step from which the layered engine's cutlass GEMMs run on the block-scaled 3xFP16 kernels
// by default (EngineOptions::gemm_3xfp16 automatic): from there on they were the faster (docs/performance.md);
// with fewer, as in a mini-batch, CUTLASS's smaller CTAs fill the GPU better.
inline constexpr std::int64_t f16x3_rows = std::int64_t(1) << 16;

}  // namespace detail

// The plan for a model of shape `m` on a space offering `caps`, for steps over `global_rows` rows on `ranks`
// ranks (the default block size and the tensor kernel depend on global values only; the leaf group on the
// rank count too, and the trainer makes the ranks agree on it). `reproducible`: the reduction mode, which
// picks the layered engine's default GEMMs. Throws InputError when a forced choice cannot run, saying why.
inline EnginePlan plan_engine(const ModelShape& m, const EngineCaps& caps, const EngineOptions& o, bool reproducible,
                              std::int64_t global_rows, int ranks) {
  if (o.block_rows < 0) throw InputError("dpmlp: block_rows must be positive (or 0 for the default)");
  if (o.engine != Engine::tensor && o.engine != Engine::automatic && o.tensor_kernel != TensorKernel::automatic) {
    throw InputError(std::string("dpmlp: tensor_kernel ") + tensor_kernel_name(o.tensor_kernel) +
                     " asks for the tensor engine, but the engine asked for is " + engine_name(o.engine));
  }
  EnginePlan p;
  // A GEMM backend asked for with the automatic engine asks for the layered engine where the automatic choice
  // would have no GEMM calls: on a host space (the host engine), and for a model of two or more hidden layers
  // (the tensor engine's deep kernel). Split operands asked for ask for it wherever: they are its GEMMs' form.
  const bool gemm_asks_layered =
      o.engine == Engine::automatic &&
      ((o.gemm && (caps.host_space || m.widths.size() > 3)) || o.split_operands == Toggle::on);
  p.engine = detail::resolve_engine(m, caps, gemm_asks_layered ? Engine::layered : o.engine);
  if (p.engine != Engine::tensor && o.tensor_kernel != TensorKernel::automatic) {
    throw InputError(std::string("dpmlp: tensor_kernel ") + tensor_kernel_name(o.tensor_kernel) + ": " +
                     detail::tensor_unsupported(m, caps));
  }
  // At most 2048 blocks a step where the register-resident kernel runs at every block count (its partial sums
  // and their tree then halve, and it keeps its teams busy), else 4096.
  const std::int64_t most_blocks =
      p.engine == Engine::tensor && detail::mma_at_every_count(m, caps) ? 2048 : 4096;
  p.block_rows = o.block_rows > 0 ? o.block_rows : default_block_rows(global_rows, m.sums_per_block(), most_blocks);
  // The layered engine on a GPU: a block's weight gradients are GEMMs over its rows, and every block adds a row
  // of partial sums (all the parameters) for the tree to read. Short blocks of few rows, as in a mini-batch,
  // then cost the tree and those GEMMs' stores as much as the GEMMs' arithmetic: blocks grow to 256 rows while
  // at least 16 remain (16 ranks' worth of blocks).
  if (o.block_rows == 0 && p.engine == Engine::layered && !caps.host_space) {
    while (p.block_rows < 256 && global_rows >= 32 * p.block_rows) p.block_rows *= 2;
  }
  const std::int64_t global_blocks = global_rows > 0 ? (global_rows + p.block_rows - 1) / p.block_rows : 0;
  p.gemm = o.gemm ? *o.gemm : (reproducible ? caps.gemm_reproducible : caps.gemm_fast);
  if (o.split_operands == Toggle::on && (p.engine != Engine::layered || m.scalar_bytes != sizeof(float))) {
    throw InputError(std::string("dpmlp: split operands are the layered engine's float GEMMs (this plan: ") +
                     engine_name(p.engine) + (m.scalar_bytes != sizeof(float) ? ", double)" : ")"));
  }
  p.gemm_split = p.engine == Engine::layered && m.scalar_bytes == sizeof(float) &&
                 (o.split_operands == Toggle::on ||
                  (o.split_operands == Toggle::automatic && p.gemm == linalg::Backend::cutlass && caps.split_operands));
  p.split_hopper = p.gemm_split && caps.split_operands;
  {
    const char* why = p.engine != Engine::layered                ? "the plan's engine is not the layered one"
                      : m.scalar_bytes != sizeof(float)         ? "the model is double"
                      : p.gemm != linalg::Backend::cutlass      ? "the GEMM backend is not cutlass"
                      : !caps.cutlass_on_f16x3                  ? "no CUDA GPU of compute capability 8.0 or newer "
                                                                  "with 81 KB of shared memory a block"
                      : p.gemm_split                            ? "split operands run the forward and delta GEMMs"
                                                                : nullptr;
    if (o.gemm_3xfp16 == Toggle::on && why != nullptr) {
      throw InputError(std::string("dpmlp: gemm_3xfp16 on: the 3xFP16 GEMMs cannot run: ") + why);
    }
    // automatic: where they can, for steps of f16x3_rows global rows or more (a step's rows, not a rank's:
    // the bits must not depend on the rank count).
    p.gemm_f16x3 = why == nullptr && (o.gemm_3xfp16 == Toggle::on ||
                                      (o.gemm_3xfp16 == Toggle::automatic && global_rows >= detail::f16x3_rows));
  }
  // Hopper's wgmma kernels: the 3xFP16 GEMMs' wgmma form where those run, else the wgmma 3xTF32 kernels.
  p.gemm_wgmma = p.gemm == linalg::Backend::cutlass && (p.gemm_f16x3 ? caps.f16x3_on_wgmma : caps.cutlass_on_wgmma);
  switch (p.engine) {
    case Engine::fused: p.kernel = Kernel::fused; break;
    case Engine::host: p.kernel = Kernel::host; break;
    case Engine::tensor:
      p.kernel = detail::tensor_family(m, caps, o.tensor_kernel, global_blocks, p.block_rows);
      break;
    default: p.kernel = Kernel::layered; break;
  }
  if (p.register_resident()) {
    p.leaf_group = detail::leaf_group(m, caps, o.leaf_groups, global_blocks, ranks);
    // The paired schedule wherever it runs (the mask form, its shared memory fitting), unless told otherwise.
    const bool pairs = backend::mask_form(m.outputs(), m.activation) &&
                       backend::mma_pair_scratch_bytes(backend::tensor_hp(m.hidden()), p.leaf_group > 1) <=
                           caps.shared_memory_optin;
    if (o.tensor_kernel == TensorKernel::register_resident_paired && !pairs) {
      throw InputError("dpmlp: the paired register-resident schedule needs one output, relu or identity, and its "
                       "shared memory to fit");
    }
    if (pairs && o.tensor_kernel != TensorKernel::register_resident) p.kernel = Kernel::tensor_register_resident_paired;
  } else if (p.engine == Engine::host) {
    p.leaf_group = detail::host_leaf_group(caps, o.leaf_groups, global_blocks, ranks);
  } else if (o.leaf_groups == Toggle::on) {
    throw InputError(std::string("dpmlp: leaf groups need the register-resident tensor kernel (this plan: ") +
                     kernel_name(p.kernel) + ")");
  }
  return p;
}

}  // namespace dpmlp
