// SPDX-License-Identifier: BSD-3-Clause
// The engine plan (engine/plan.hpp), the one place that decides which engine and kernel compute a step, with
// which block size and leaf group: every rule checked here for an H200-like GPU, on any build (the planner is
// a pure function of the model, the device's capabilities, the options and the step's size), and the plan
// the trainer and value_and_grad use here.
#include <catch2/catch.hpp>

#include <dpmlp/dpmlp.hpp>

#include <cstdint>
#include <vector>

namespace {

using dpmlp::Activation;
using dpmlp::Engine;
using dpmlp::Kernel;
using dpmlp::TensorKernel;
using dpmlp::Toggle;

// An H200 as the planner sees it: 132 SMs, 227 KB of opt-in shared memory a CTA, tensor cores.
dpmlp::EngineCaps h200() {
  dpmlp::EngineCaps c;
  c.host_space = false;
  c.tensor_unavailable = "";
  c.multiprocessors = 132;
  c.shared_memory_optin = 232448;
  c.shared_memory_sm = 233472;
  c.team_scratch = 49152;
  c.fused_team_size = 256;
  c.gemm_reproducible = dpmlp::linalg::Backend::portable;
  c.gemm_fast = dpmlp::linalg::Backend::cublas;
  return c;
}

// A CPU (Serial or OpenMP).
dpmlp::EngineCaps cpu() {
  dpmlp::EngineCaps c;
  c.host_space = true;
  c.tensor_unavailable = "the tensor engine runs on CUDA execution spaces in float only";
  c.team_scratch = std::size_t(1) << 30;
  c.gemm_reproducible = c.gemm_fast = dpmlp::linalg::Backend::eigen;
  return c;
}

dpmlp::ModelShape shape(std::vector<int> widths, Activation act = Activation::relu) {
  return dpmlp::ModelShape{std::move(widths), act, sizeof(float)};
}

dpmlp::EnginePlan plan(const dpmlp::ModelShape& m, std::int64_t rows, dpmlp::EngineOptions o = {}, int ranks = 1,
                       const dpmlp::EngineCaps& caps = h200()) {
  return dpmlp::plan_engine(m, caps, o, true, rows, ranks);
}

// The plan for `blocks` global blocks of `block` rows each.
dpmlp::EnginePlan plan_blocks(const dpmlp::ModelShape& m, std::int64_t blocks, std::int64_t block) {
  dpmlp::EngineOptions o;
  o.block_rows = block;
  return plan(m, blocks * block, o);
}

}  // namespace

TEST_CASE("the plan resolves the engine from the model and the space", "[plan]") {
  // A GPU with tensor cores: the tensor engine for one-hidden-layer models and for two to four hidden layers
  // of at most 64 units where an SM holds 16 warps of its deep kernel, the layered one for other deeper ones.
  CHECK(plan(shape({32, 32, 1}), 20000).engine == Engine::tensor);
  CHECK(plan(shape({64, 256, 4}, Activation::tanh), 20000).engine == Engine::tensor);
  CHECK(plan(shape({32, 64, 64, 1}), 20000).kernel == Kernel::tensor_deep);
  CHECK(plan(shape({32, 64, 64, 64, 1}), 20000).kernel == Kernel::tensor_deep);
  CHECK(plan(shape({64, 20, 30, 4}, Activation::tanh), 20000).kernel == Kernel::tensor_deep);
  // Two groups of eight warps a CTA where two CTAs of one do not fit an SM (228 KB on an H200): three hidden
  // layers past 32 inputs, four at 32 or fewer; not four past 32, nor five.
  CHECK(dpmlp::backend::deep_groups(64, 3) == 2);
  CHECK(dpmlp::backend::deep_groups(32, 4) == 2);
  CHECK(dpmlp::backend::deep_groups(32, 3) == 1);
  CHECK(plan(shape({33, 20, 30, 40, 4}), 20000).kernel == Kernel::tensor_deep);
  CHECK(plan(shape({32, 64, 64, 64, 64, 1}), 20000).kernel == Kernel::tensor_deep);
  CHECK(plan(shape({33, 64, 64, 64, 64, 1}), 20000).engine == Engine::layered);
  CHECK(plan(shape({32, 64, 64, 64, 64, 64, 1}), 20000).engine == Engine::layered);
  CHECK(plan(shape({32, 65, 64, 1}), 20000).engine == Engine::layered);          // 65 units
  CHECK(plan(shape({32, 64, 64, 5}), 20000).engine == Engine::layered);          // 5 outputs
  CHECK(plan(shape({65, 64, 64, 1}), 20000).engine == Engine::layered);          // 65 inputs
  {
    dpmlp::EngineOptions cutlass;  // a GEMM asked for: the layered engine, whose GEMMs they are
    cutlass.gemm = dpmlp::linalg::Backend::cutlass;
    CHECK(plan(shape({32, 64, 64, 1}), 20000, cutlass).engine == Engine::layered);
    // On a Hopper GPU the cutlass GEMMs run on the wgmma kernels, which sum otherwise: part of the plan's key.
    dpmlp::EngineCaps hopper = h200();
    hopper.cutlass_on_wgmma = true;
    const dpmlp::EnginePlan on_wgmma = plan(shape({32, 256, 256, 1}), 20000, cutlass, 1, hopper);
    CHECK(on_wgmma.gemm_wgmma);
    CHECK(!plan(shape({32, 256, 256, 1}), 20000, cutlass).gemm_wgmma);
    CHECK(on_wgmma.sums_key() != plan(shape({32, 256, 256, 1}), 20000, cutlass).sums_key());
    CHECK(on_wgmma.describe().find("cutlass on wgmma") != std::string::npos);
    dpmlp::EngineOptions portable;  // other backends do not run on wgmma, wherever they run
    portable.gemm = dpmlp::linalg::Backend::portable;
    CHECK(!plan(shape({32, 256, 256, 1}), 20000, portable, 1, hopper).gemm_wgmma);
    CHECK(plan(shape({32, 256, 256, 1}), 20000, portable, 1, hopper).sums_key() ==
          plan(shape({32, 256, 256, 1}), 20000, portable).sums_key());
    // The 3xFP16 GEMMs (experimental) run where asked for and they can: they sum otherwise again.
    dpmlp::EngineCaps f16 = h200();
    f16.cutlass_on_f16x3 = true;
    dpmlp::EngineOptions f16_on = cutlass;
    f16_on.gemm_3xfp16 = dpmlp::Toggle::on;
    const dpmlp::EnginePlan on_f16x3 = plan(shape({32, 256, 256, 1}), 20000, f16_on, 1, f16);
    CHECK(on_f16x3.gemm_f16x3);
    CHECK(!on_f16x3.gemm_wgmma);
    CHECK(!plan(shape({32, 256, 256, 1}), 20000, cutlass, 1, f16).gemm_f16x3);  // automatic: off
    CHECK(on_f16x3.sums_key() != plan(shape({32, 256, 256, 1}), 20000, cutlass, 1, f16).sums_key());
    CHECK(on_f16x3.sums_key() != on_wgmma.sums_key());
    CHECK(on_f16x3.describe().find("cutlass, 3xFP16") != std::string::npos);
    // On a Hopper GPU that runs the wgmma kernels they take precedence, their rows x weights GEMMs in their
    // wgmma form: a key of its own (a Hopper rank and an Ampere rank need not sum alike).
    hopper.cutlass_on_f16x3 = true;
    hopper.f16x3_on_wgmma = true;
    const dpmlp::EnginePlan f16_wgmma = plan(shape({32, 256, 256, 1}), 20000, f16_on, 1, hopper);
    CHECK(f16_wgmma.gemm_f16x3);
    CHECK(f16_wgmma.gemm_wgmma);
    CHECK(f16_wgmma.describe().find("cutlass, 3xFP16 on wgmma") != std::string::npos);
    CHECK(f16_wgmma.sums_key() != on_f16x3.sums_key());
    CHECK(f16_wgmma.sums_key() != on_wgmma.sums_key());
    CHECK(!plan(shape({32, 256, 256, 1}), 20000, cutlass, 1, hopper).gemm_f16x3);  // automatic: off
    // automatic: on from 2^16 global rows a step where they can run, whatever the rank count (the bits must
    // not depend on it), and off wherever they cannot (not refused).
    constexpr std::int64_t many = dpmlp::detail::f16x3_rows;
    dpmlp::EngineCaps f16_cutlass = f16;  // the CUDA build's default GEMMs
    f16_cutlass.gemm_reproducible = dpmlp::linalg::Backend::cutlass;
    for (int ranks : {1, 2, 3, 16}) {
      INFO("ranks " << ranks);
      CHECK(plan(shape({32, 256, 256, 1}), many, {}, ranks, f16_cutlass).gemm_f16x3);
      CHECK(!plan(shape({32, 256, 256, 1}), many - 1, {}, ranks, f16_cutlass).gemm_f16x3);
      CHECK(plan(shape({32, 256, 256, 1}), many, cutlass, ranks, hopper).gemm_f16x3);
      CHECK(!plan(shape({32, 256, 256, 1}), many - 1, cutlass, ranks, hopper).gemm_f16x3);
    }
    CHECK(plan(shape({32, 256, 256, 1}), many, {}, 1, f16_cutlass).describe().find("cutlass, 3xFP16") !=
          std::string::npos);
    dpmlp::EngineOptions f16_off;
    f16_off.gemm_3xfp16 = dpmlp::Toggle::off;
    CHECK(!plan(shape({32, 256, 256, 1}), many, f16_off, 1, f16_cutlass).gemm_f16x3);
    CHECK(!plan(shape({32, 256, 256, 1}), many, cutlass).gemm_f16x3);          // a device that cannot
    CHECK(!plan(shape({32, 256, 256, 1}), many, portable, 1, f16).gemm_f16x3);  // another GEMM backend
    CHECK(!plan(shape({32, 256, 256, 1}), many, {}, 1, f16).gemm_f16x3);        // (the caps' default)
    CHECK(!plan(shape({32, 64, 64, 1}), many, {}, 1, f16_cutlass).gemm_f16x3);  // the tensor engine's
    const dpmlp::ModelShape f64{{32, 256, 256, 1}, Activation::relu, sizeof(double)};
    CHECK(!plan(f64, many, {}, 1, f16_cutlass).gemm_f16x3);  // double
    dpmlp::EngineCaps split_f16 = f16_cutlass;                // split operands take the forward and delta GEMMs
    split_f16.split_operands = true;
    CHECK(!plan(shape({32, 256, 256, 1}), many, {}, 1, split_f16).gemm_f16x3);
    // A default CUDA build for Hopper: the 3xFP16 GEMMs' wgmma form, not the wgmma 3xTF32 kernels. Its steps
    // with the 3xFP16 GEMMs run that form; the others CUTLASS's kernels, not wgmma ones.
    dpmlp::EngineCaps hopper_default = f16_cutlass;
    hopper_default.f16x3_on_wgmma = true;
    CHECK(plan(shape({32, 256, 256, 1}), many, {}, 1, hopper_default).gemm_f16x3);
    CHECK(plan(shape({32, 256, 256, 1}), many, {}, 1, hopper_default).gemm_wgmma);
    CHECK(plan(shape({32, 256, 256, 1}), many, {}, 1, hopper_default).describe().find("3xFP16 on wgmma") !=
          std::string::npos);
    CHECK(!plan(shape({32, 256, 256, 1}), many - 1, {}, 1, hopper_default).gemm_wgmma);
    CHECK(plan(shape({32, 256, 256, 1}), many - 1, {}, 1, hopper_default).sums_key() ==
          plan(shape({32, 256, 256, 1}), many - 1, cutlass, 1, f16).sums_key());
    // Refused, with the reason, where they cannot run.
    CHECK_THROWS_WITH(plan(shape({32, 256, 256, 1}), 20000, f16_on), Catch::Contains("compute capability 8.0"));
    dpmlp::EngineOptions f16_portable = portable;
    f16_portable.gemm_3xfp16 = dpmlp::Toggle::on;
    CHECK_THROWS_WITH(plan(shape({32, 256, 256, 1}), 20000, f16_portable, 1, f16), Catch::Contains("not cutlass"));
    dpmlp::EngineOptions f16_split = f16_on;  // the split operands would take the forward and delta GEMMs
    f16_split.split_operands = dpmlp::Toggle::on;
    CHECK_THROWS_WITH(plan(shape({32, 256, 256, 1}), 20000, f16_split, 1, f16), Catch::Contains("split operands"));
    // Where the split-operand kernels run, the layered engine's float GEMMs take them (other sums again);
    // asked off, or with other GEMMs, not; asked on, anywhere, and refused for double and other engines.
    dpmlp::EngineCaps unsplit_caps = h200();
    unsplit_caps.gemm_reproducible = dpmlp::linalg::Backend::cutlass;
    dpmlp::EngineCaps split_caps = unsplit_caps;
    split_caps.split_operands = true;
    const dpmlp::EnginePlan split = plan(shape({32, 256, 256, 1}), 20000, {}, 1, split_caps);
    CHECK(split.engine == Engine::layered);
    CHECK(split.gemm_split);
    CHECK(split.sums_key() != plan(shape({32, 256, 256, 1}), 20000, {}, 1, unsplit_caps).sums_key());
    CHECK(split.describe().find("split operands") != std::string::npos);
    CHECK(!plan(shape({32, 256, 256, 1}), 20000, {}, 1, unsplit_caps).gemm_split);
    CHECK(!plan(shape({32, 256, 256, 1}), 20000, portable, 1, split_caps).gemm_split);
    CHECK(!plan(shape({32, 64, 64, 1}), 20000, {}, 1, split_caps).gemm_split);  // the tensor engine's
    dpmlp::EngineOptions split_off, split_on;
    split_off.split_operands = dpmlp::Toggle::off;
    split_on.split_operands = dpmlp::Toggle::on;
    CHECK(!plan(shape({32, 256, 256, 1}), 20000, split_off, 1, split_caps).gemm_split);
    CHECK(plan(shape({32, 256, 256, 1}), 20000, split_on).gemm_split);
    // The portable form and Hopper's kernels sum alike only up to their last bits: part of the key.
    CHECK(!plan(shape({32, 256, 256, 1}), 20000, split_on).split_hopper);
    CHECK(plan(shape({32, 256, 256, 1}), 20000, split_on, 1, split_caps).split_hopper);
    CHECK(plan(shape({32, 256, 256, 1}), 20000, split_on).sums_key() !=
          plan(shape({32, 256, 256, 1}), 20000, split_on, 1, split_caps).sums_key());
    CHECK(plan(shape({32, 256, 256, 1}), 20000, split_on, 1, cpu()).engine == Engine::layered);
    CHECK(plan(shape({32, 256, 256, 1}), 20000, split_on, 1, cpu()).gemm_split);
    // Asked on, it asks for the layered engine where the automatic one would have no GEMMs (as a backend does).
    CHECK(plan(shape({32, 64, 64, 1}), 20000, split_on).engine == Engine::layered);
    CHECK(plan(shape({32, 32, 1}), 20000, split_on).engine == Engine::layered);  // not the tensor engine's
    dpmlp::EngineOptions split_tensor = split_on;
    split_tensor.engine = Engine::tensor;
    CHECK_THROWS_WITH(plan(shape({32, 64, 64, 1}), 20000, split_tensor), Catch::Contains("split operands"));
    CHECK_THROWS_WITH(plan(dpmlp::ModelShape{{32, 256, 256, 1}, Activation::relu, sizeof(double)}, 20000, split_on),
                      Catch::Contains("double"));
    CHECK(!plan(dpmlp::ModelShape{{32, 256, 256, 1}, Activation::relu, sizeof(double)}, 20000, {}, 1, split_caps)
               .gemm_split);
    dpmlp::EngineOptions tensor;
    tensor.engine = Engine::tensor;
    CHECK_THROWS_WITH(plan(shape({32, 128, 128, 1}), 20000, tensor), Catch::Contains("at most 64 units"));
    tensor.tensor_kernel = dpmlp::TensorKernel::register_resident;
    CHECK_THROWS_WITH(plan(shape({32, 64, 64, 1}), 20000, tensor), Catch::Contains("deep kernel"));
    dpmlp::EngineCaps small = h200();
    small.shared_memory_optin = 48 * 1024;
    CHECK(plan(shape({32, 64, 64, 1}), 20000, {}, 1, small).engine == Engine::layered);
    small.shared_memory_optin = small.shared_memory_sm = 164 * 1024;  // an A100's: two hidden layers, not three
    CHECK(plan(shape({32, 64, 64, 1}), 20000, {}, 1, small).kernel == Kernel::tensor_deep);
    CHECK(plan(shape({32, 64, 64, 64, 1}), 20000, {}, 1, small).engine == Engine::layered);
  }
  CHECK(plan(shape({65, 32, 1}), 20000).engine == Engine::layered);  // the fused engines take 64 inputs at most
  // No tensor cores (or double): the fused SIMT kernel on a device; the host engine on a CPU, at any depth,
  // unless a GEMM backend is asked for (the layered engine's).
  dpmlp::EngineCaps no_tc = h200();
  no_tc.tensor_unavailable = "the tensor engine needs compute capability 8.0 or newer (this device: 7.0)";
  CHECK(plan(shape({32, 32, 1}), 20000, {}, 1, no_tc).engine == Engine::fused);
  CHECK(plan(shape({32, 32, 1}), 20000, {}, 1, cpu()).engine == Engine::host);
  CHECK(plan(shape({32, 32, 1}), 20000, {}, 1, cpu()).kernel == Kernel::host);
  CHECK(plan(shape({32, 256, 256, 256, 1}), 20000, {}, 1, cpu()).engine == Engine::host);
  dpmlp::EngineOptions eigen;
  eigen.gemm = dpmlp::linalg::Backend::eigen;
  CHECK(plan(shape({32, 32, 1}), 20000, eigen, 1, cpu()).engine == Engine::layered);
  dpmlp::EngineOptions host;
  host.engine = Engine::host;
  CHECK_THROWS_WITH(plan(shape({32, 32, 1}), 100, host, 1, no_tc), Catch::Contains("host execution spaces"));
  CHECK(plan(shape({32, 32, 1}), 100, host, 1, cpu()).sums_key() != plan(shape({32, 32, 1}), 100, eigen, 1, cpu()).sums_key());
  // Asked for, but not possible: refused with the reason.
  dpmlp::EngineOptions tensor;
  tensor.engine = Engine::tensor;
  CHECK_THROWS_WITH(plan(shape({32, 32, 1}), 100, tensor, 1, no_tc), Catch::Contains("compute capability 8.0"));
  CHECK_THROWS_WITH(plan(shape({32, 32, 1}), 100, tensor, 1, cpu()), Catch::Contains("CUDA execution spaces"));
  dpmlp::EngineOptions fused;
  fused.engine = Engine::fused;
  CHECK(plan(shape({32, 32, 1}), 100, fused, 1, cpu()).kernel == Kernel::fused);
  CHECK_THROWS_WITH(plan(shape({32, 16, 16, 1}), 100, fused), Catch::Contains("exactly one hidden layer"));
  dpmlp::EngineCaps small_teams = no_tc;
  small_teams.fused_team_size = 128;
  CHECK_THROWS_WITH(plan(shape({32, 32, 1}), 100, fused, 1, small_teams), Catch::Contains("teams of 256"));
  CHECK(plan(shape({32, 32, 1}), 100, {}, 1, small_teams).engine == Engine::layered);
  // The layered engine's GEMMs: the reproducible default, or the fast one with Reduction::fast.
  dpmlp::EngineOptions layered;
  layered.engine = Engine::layered;
  CHECK(dpmlp::plan_engine(shape({8, 8, 1}), h200(), layered, true, 100, 1).gemm == dpmlp::linalg::Backend::portable);
  CHECK(dpmlp::plan_engine(shape({8, 8, 1}), h200(), layered, false, 100, 1).gemm == dpmlp::linalg::Backend::cublas);
}

TEST_CASE("the plan's default block size depends on the model and the global rows only", "[plan]") {
  // At most 2048 blocks where the register-resident kernel runs at every block count (one output, relu or
  // identity, 32 or fewer inputs), else 4096; 64 rows at least.
  CHECK(plan(shape({32, 32, 1}), 1048576).block_rows == 512);
  CHECK(plan(shape({32, 32, 1}, Activation::identity), 1048576).block_rows == 512);
  CHECK(plan(shape({32, 32, 1}), 20000).block_rows == 64);
  CHECK(plan(shape({32, 32, 1}, Activation::tanh), 1048576).block_rows == 256);
  CHECK(plan(shape({32, 32, 4}), 1048576).block_rows == 256);
  CHECK(plan(shape({33, 32, 1}), 1048576).block_rows == 256);
  CHECK(plan(shape({32, 32, 1}), 1048576, {}, 1, cpu()).block_rows == 256);
  // At most 2^24 partial sums: 32 x 256 x 1 (8706 sums a block) at 1M rows takes 1024 blocks.
  CHECK(plan(shape({32, 256, 1}), 1048576).block_rows == 1024);
  // The layered engine on a GPU: blocks of 256 rows where at least 16 remain, else 16 blocks (64 rows at
  // least); on a CPU the common rule.
  CHECK(plan(shape({32, 256, 256, 256, 1}), 4096).block_rows == 256);
  CHECK(plan(shape({32, 256, 256, 256, 1}), 4096).engine == Engine::layered);
  CHECK(plan(shape({32, 256, 256, 256, 1}), 8192).block_rows == 256);     // the common rule: 128
  CHECK(plan(shape({32, 256, 256, 256, 1}), 100000).block_rows == 1024);  // the common rule's, past 256
  CHECK(plan(shape({32, 256, 256, 256, 1}), 2048).block_rows == 128);
  CHECK(plan(shape({32, 256, 256, 256, 1}), 2047).block_rows == 64);
  CHECK(plan(shape({32, 256, 256, 256, 1}), 1000).block_rows == 64);
  CHECK(plan(shape({32, 256, 256, 256, 1}), 1048576).block_rows == 16384);
  CHECK(plan(shape({32, 256, 256, 256, 1}), 4096, {}, 1, cpu()).block_rows == 64);
  // Whatever the rank count.
  for (int ranks : {1, 2, 3, 8}) {
    CHECK(plan(shape({32, 32, 1}), 1048576, {}, ranks).block_rows == 512);
    CHECK(plan(shape({32, 32, 1}), 1048576, {}, ranks).kernel == Kernel::tensor_register_resident_paired);
  }
  dpmlp::EngineOptions o;
  o.block_rows = 100;
  CHECK(plan(shape({32, 32, 1}), 1048576, o).block_rows == 100);
  o.block_rows = -1;
  CHECK_THROWS_WITH(plan(shape({32, 32, 1}), 1048576, o), Catch::Contains("block_rows"));
}

TEST_CASE("the plan picks the tensor kernel from global values only", "[plan]") {
  // One output with relu or identity: the register-resident kernel, paired, at every block count.
  for (const Activation a : {Activation::relu, Activation::identity}) {
    for (const auto& [blocks, block] : std::vector<std::pair<int, int>>{{313, 64}, {16, 64}, {1023, 127}, {1 << 20, 64}}) {
      INFO(dpmlp::activation_name(a) << ", " << blocks << " blocks of " << block);
      CHECK(plan_blocks(shape({32, 32, 1}, a), blocks, block).kernel == Kernel::tensor_register_resident_paired);
    }
  }
  // Other models: the warp-matrix kernel for fewer blocks than fill the register-resident one (1024 at 32
  // hidden units) of fewer than 128 rows, the register-resident one (unpaired) from there.
  for (const auto& m : {shape({32, 32, 1}, Activation::tanh), shape({32, 32, 4})}) {
    CHECK(plan_blocks(m, 313, 64).kernel == Kernel::tensor_warp_matrix);
    CHECK(plan_blocks(m, 1023, 127).kernel == Kernel::tensor_warp_matrix);
    CHECK(plan_blocks(m, 313, 128).kernel == Kernel::tensor_register_resident);
    CHECK(plan_blocks(m, 3, 1024).kernel == Kernel::tensor_register_resident);
    CHECK(plan_blocks(m, 1024, 64).kernel == Kernel::tensor_register_resident);
  }
  // 256 padded hidden units (one team of eight warps a CTA): 128 blocks fill half the teams.
  CHECK(plan_blocks(shape({32, 200, 2}), 127, 64).kernel == Kernel::tensor_warp_matrix);
  CHECK(plan_blocks(shape({32, 200, 2}), 128, 64).kernel == Kernel::tensor_register_resident);
  // More than 32 inputs: the warp-matrix kernel only.
  CHECK(plan_blocks(shape({33, 32, 1}), 1 << 20, 64).kernel == Kernel::tensor_warp_matrix);
  // Where the shared memory does not fit the register-resident kernel (an A100's 163 KB), the warp-matrix one;
  // where it fits ungrouped but not grouped, the paired schedule ungrouped.
  dpmlp::EngineCaps a100 = h200();
  a100.multiprocessors = 108;
  a100.shared_memory_optin = 166912;
  CHECK(dpmlp::plan_engine(shape({32, 32, 1}), a100, {}, true, 1048576, 1).kernel == Kernel::tensor_warp_matrix);
  dpmlp::EngineCaps mid = h200();
  mid.shared_memory_optin = 200000;
  const auto p = dpmlp::plan_engine(shape({32, 32, 1}), mid, {}, true, 1048576, 1);
  CHECK(p.kernel == Kernel::tensor_register_resident_paired);
  CHECK(p.leaf_group == 1);
}

TEST_CASE("the plan groups leaves where the register-resident kernel fills the GPU", "[plan]") {
  // 32 hidden units, one output: groups of 8 blocks from 7/8 of every SM's teams busy (132 SMs x 8 teams).
  CHECK(plan(shape({32, 32, 1}), 1048576).leaf_group == 8);           // 2048 blocks
  CHECK(plan(shape({32, 32, 1}), 1048576, {}, 2).leaf_group == 8);    // 1024 a rank
  CHECK(plan(shape({32, 32, 1}), 1048576, {}, 3).leaf_group == 1);    // 683 a rank: fewer than 7/8 of 1056
  CHECK(plan(shape({32, 32, 1}), 20000).leaf_group == 1);             // 313 blocks
  CHECK(plan_blocks(shape({32, 32, 1}), 923, 64).leaf_group == 1);
  CHECK(plan_blocks(shape({32, 32, 1}), 924, 64).leaf_group == 8);  // 924 x 8 >= 132 x 8 x 7
  CHECK(plan(shape({32, 32, 1}, Activation::tanh), 1048576).leaf_group == 8);  // unpaired, grouped
  CHECK(plan(shape({32, 32, 1}, Activation::tanh), 1048576).kernel == Kernel::tensor_register_resident);
  // Not at 64 hidden units and more, nor several outputs, nor other kernels.
  CHECK(plan(shape({32, 64, 1}), 4194304).leaf_group == 1);
  CHECK(plan(shape({32, 32, 4}), 4194304).leaf_group == 1);
  CHECK(plan(shape({33, 32, 1}), 4194304).leaf_group == 1);
  // Forced on, or off.
  dpmlp::EngineOptions on, off;
  on.leaf_groups = Toggle::on;
  off.leaf_groups = Toggle::off;
  CHECK(plan(shape({32, 32, 1}), 20000, on).leaf_group == 8);
  CHECK(plan(shape({32, 32, 1}), 1048576, off).leaf_group == 1);
  CHECK_THROWS_WITH(plan(shape({32, 64, 1}), 20000, on), Catch::Contains("leaf groups"));
  CHECK_THROWS_WITH(plan(shape({32, 32, 4}), 20000, on), Catch::Contains("leaf groups"));
  dpmlp::EngineOptions eigen_on = on;
  eigen_on.gemm = dpmlp::linalg::Backend::eigen;  // the layered engine
  CHECK_THROWS_WITH(plan(shape({32, 32, 1}), 20000, eigen_on, 1, cpu()), Catch::Contains("leaf groups"));
  // The host engine: the largest group (8, 4, 2, 1) leaving 16 groups a thread over all ranks; on: 8.
  CHECK(plan(shape({32, 32, 1}), 20000, on, 1, cpu()).leaf_group == 8);
  CHECK(plan(shape({32, 32, 1}), 20000, off, 1, cpu()).leaf_group == 1);
  CHECK(plan(shape({32, 32, 1}), 20000, {}, 1, cpu()).leaf_group == 8);  // 313 blocks: 39 groups
  CHECK(plan(shape({32, 32, 1}), 20000, {}, 2, cpu()).leaf_group == 8);
  CHECK(plan(shape({32, 32, 1}), 20000, {}, 3, cpu()).leaf_group == 4);
  dpmlp::EngineCaps many = cpu();
  many.multiprocessors = 64;  // threads a rank
  CHECK(plan(shape({32, 32, 1}), 20000, {}, 1, many).leaf_group == 1);
  CHECK(plan(shape({32, 32, 1}), 20000, {}, 1, many).block_rows == 64);  // the block does not depend on it
}

TEST_CASE("a forced tensor kernel runs where it can and is refused elsewhere", "[plan]") {
  dpmlp::EngineOptions o;
  o.tensor_kernel = TensorKernel::warp_matrix;
  CHECK(plan(shape({32, 32, 1}), 1048576, o).kernel == Kernel::tensor_warp_matrix);
  CHECK(plan(shape({32, 32, 1}), 1048576, o).leaf_group == 1);
  CHECK(plan(shape({32, 32, 1}), 1048576, o).block_rows == 512);  // the block size does not depend on it
  o.tensor_kernel = TensorKernel::register_resident;
  CHECK(plan(shape({32, 32, 1}), 20000, o).kernel == Kernel::tensor_register_resident);
  CHECK(plan(shape({32, 32, 1}, Activation::tanh), 20000, o).kernel == Kernel::tensor_register_resident);
  CHECK_THROWS_WITH(plan(shape({33, 32, 1}), 20000, o), Catch::Contains("32 or fewer inputs"));
  o.tensor_kernel = TensorKernel::register_resident_paired;
  CHECK(plan(shape({20, 100, 1}, Activation::identity), 20000, o).kernel == Kernel::tensor_register_resident_paired);
  CHECK_THROWS_WITH(plan(shape({32, 32, 1}, Activation::tanh), 20000, o), Catch::Contains("paired"));
  CHECK_THROWS_WITH(plan(shape({32, 32, 2}), 20000, o), Catch::Contains("paired"));
  // A tensor kernel without the tensor engine.
  CHECK_THROWS_WITH(plan(shape({32, 32, 1}), 20000, o, 1, cpu()), Catch::Contains("CUDA execution spaces"));
  o.engine = Engine::layered;
  CHECK_THROWS_WITH(plan(shape({32, 32, 1}), 20000, o), Catch::Contains("asks for the tensor engine"));
}

TEST_CASE("the ranks' agreement key tells apart what changes the bits, and only that", "[plan]") {
  dpmlp::EngineOptions unpaired;
  unpaired.tensor_kernel = TensorKernel::register_resident;
  const auto paired = plan(shape({32, 32, 1}), 20000);
  CHECK(paired.sums_key() == plan(shape({32, 32, 1}), 20000, unpaired).sums_key());  // the same sums
  dpmlp::EngineOptions wmma;
  wmma.tensor_kernel = TensorKernel::warp_matrix;
  CHECK(paired.sums_key() != plan(shape({32, 32, 1}), 20000, wmma).sums_key());
  dpmlp::EngineOptions other_block;
  other_block.block_rows = 128;
  CHECK(paired.sums_key() != plan(shape({32, 32, 1}), 20000, other_block).sums_key());
  dpmlp::EngineOptions on;
  on.leaf_groups = Toggle::on;
  CHECK(paired.sums_key() != plan(shape({32, 32, 1}), 20000, on).sums_key());
  dpmlp::EngineOptions fused;
  fused.engine = Engine::fused;
  CHECK(paired.sums_key() != plan(shape({32, 32, 1}), 20000, fused).sums_key());
}

// On this build's default space: the plan the trainer takes is the planner's for this space's capabilities.
TEST_CASE("the trainer and value_and_grad run the space's plan", "[plan][mpi]") {
  using Space = Kokkos::DefaultExecutionSpace;
  using Memory = Space::memory_space;
  dpmlp::Mlp<float, Memory> model({32, 32, 1});
  model.init_jax(dpmlp::random::PRNGKey(1), 0.1f);
  const std::int64_t rows = 5000;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dpmlp::TrainerOptions options;
  dpmlp::DataParallelTrainer<Space> trainer(MPI_COMM_WORLD, model, rows, dpmlp::Sgd(0.02), options);
  const auto expected = dpmlp::detail::BlockEngine<Space, float>::plan(model, options, true, rows, size);
  CHECK(trainer.engine_plan().sums_key() == expected.sums_key());
  CHECK(trainer.engine_plan().kernel == expected.kernel);
  CHECK(trainer.block_rows() == expected.block_rows);
  CHECK(trainer.leaf_group() == expected.leaf_group);
  CHECK(trainer.engine() == expected.engine);
  // train_epochs plans its batches for a batch's rows (here fewer blocks, so leaves of fewer: another plan),
  // and says so.
  {
    const std::int64_t many = 100000, batch = 256;
    dpmlp::DataParallelTrainer<Space> t(MPI_COMM_WORLD, model, many, dpmlp::Sgd(0.02), options);
    CHECK(t.batch_plan() == nullptr);
    Kokkos::View<float**, Kokkos::LayoutRight, Memory> x("x", t.shard().rows(), 32), y("y", t.shard().rows(), 1);
    Kokkos::deep_copy(x, 0.5f);
    Kokkos::deep_copy(y, 1.0f);
    t.set_data(x, y);
    t.train_epochs(1, batch, 7);
    REQUIRE(t.batch_plan() != nullptr);
    const auto planned = dpmlp::detail::BlockEngine<Space, float>::plan(model, options, true, batch, size);
    CHECK(t.batch_plan()->sums_key() == planned.sums_key());
    CHECK(t.batch_plan()->leaf_group == planned.leaf_group);
    CHECK(t.batch_plan()->leaf_group != t.leaf_group());
  }
  // A forced choice the space cannot run is refused by the trainer too.
  const auto caps = dpmlp::detail::BlockEngine<Space, float>::caps(model);
  if (!caps.tensor_unavailable.empty()) {
    dpmlp::TrainerOptions tensor;
    tensor.engine = Engine::tensor;
    CHECK_THROWS_WITH(dpmlp::DataParallelTrainer<Space>(MPI_COMM_WORLD, model, rows, dpmlp::Sgd(0.02), tensor),
                      Catch::Contains(caps.tensor_unavailable));
  }
}
