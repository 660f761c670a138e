// SPDX-License-Identifier: BSD-3-Clause
// Mlp: the value and gradient against an fp64 Eigen reference and against finite differences, for depth
// 1-3 and every activation; the JAX initialization against the reference parameters; the GEMM backends
// against each other.
#include <catch2/catch.hpp>

#include <dpmlp/dpmlp.hpp>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "json_lite.hpp"
#include "check_util.hpp"
#include "gemm_reference.hpp"
#include "mlp_reference.hpp"

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;
using dpmlp_test::MatD;

template <class Scalar>
std::vector<double> host_vector(const Kokkos::View<Scalar*, Memory>& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

// The fp64 reference: loss = mean((f(x) - y)^2) and its gradient in dpmlp's parameter layout.
double reference_value_and_grad(const std::vector<int>& widths, dpmlp::Activation act,
                                const std::vector<double>& p, const MatD& x, const MatD& y,
                                std::vector<double>& grad) {
  const dpmlp_test::Net net = dpmlp_test::unpack(widths, p);
  const std::vector<MatD> A = dpmlp_test::forward(net, act, x);
  const MatD r = A.back() - y;
  const double n = static_cast<double>(r.size());
  dpmlp_test::backprop(widths, net, act, A, r * (2.0 / n), grad);
  return r.squaredNorm() / n;
}

struct Problem {
  std::vector<int> widths;
  dpmlp::Activation act;
  int rows;
};

}  // namespace

namespace {

// value_and_grad with `options` against the fp64 reference, on random data; CHECKs inside.
// Redraws the rows of x (drawn by `draw`) whose fp64 hidden pre-activations come within `margin` of 0, for a
// ReLU model: ReLU has no derivative at 0, and a pre-activation within rounding of it may fall on either side in
// fp32 and in fp64, which flips that unit's gradient term for the row (a relative error of ~1e-4 from a single
// row at these sizes, whatever the engine). Away from 0 both sides agree, and the comparison is well defined.
template <class Draw>
void clear_relu_kinks(const std::vector<int>& widths, const std::vector<double>& p, MatD& x, const Draw& draw) {
  const int L = static_cast<int>(widths.size()) - 1;
  const double margin = 1e-4;
  for (int attempt = 0; attempt < 20; ++attempt) {
    int redrawn = 0;
    for (int r = 0; r < x.rows(); ++r) {
      Eigen::RowVectorXd a = x.row(r);
      bool kink = false;
      std::size_t off = 0;
      for (int l = 0; l + 1 < L && !kink; ++l) {
        const Eigen::Map<const MatD> W(p.data() + off, widths[l], widths[l + 1]);
        off += std::size_t(widths[l]) * widths[l + 1];
        const Eigen::Map<const Eigen::RowVectorXd> b(p.data() + off, widths[l + 1]);
        off += widths[l + 1];
        const Eigen::RowVectorXd z = a * W + b;
        kink = (z.array().abs() < margin).any();
        a = z.cwiseMax(0.0);
      }
      if (kink) {
        for (int c = 0; c < x.cols(); ++c) x(r, c) = draw();
        ++redrawn;
      }
    }
    if (redrawn == 0) return;
  }
}

void check_against_reference(const Problem& pr, const dpmlp::EngineOptions& options, std::mt19937& gen) {
  std::normal_distribution<double> normal;
  dpmlp::Mlp<float, Memory> model(pr.widths, pr.act);
  model.init_jax(dpmlp::random::PRNGKey(3), 0.5f);
  const int in = pr.widths.front(), out = pr.widths.back();
  MatD x(pr.rows, in), y(pr.rows, out);
  for (int i = 0; i < x.size(); ++i) x.data()[i] = float(normal(gen));
  for (int i = 0; i < y.size(); ++i) y.data()[i] = float(normal(gen));
  if (pr.act == dpmlp::Activation::relu) {
    clear_relu_kinks(pr.widths, host_vector(model.params()), x, [&] { return double(float(normal(gen))); });
  }
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> xv("x", pr.rows, in), yv("y", pr.rows, out);
  auto hx = Kokkos::create_mirror_view(xv);
  auto hy = Kokkos::create_mirror_view(yv);
  for (int r = 0; r < pr.rows; ++r) {
    for (int c = 0; c < in; ++c) hx(r, c) = static_cast<float>(x(r, c));
    for (int c = 0; c < out; ++c) hy(r, c) = static_cast<float>(y(r, c));
  }
  Kokkos::deep_copy(xv, hx);
  Kokkos::deep_copy(yv, hy);
  Kokkos::View<float*, Memory> grad("grad", model.num_params());
  const float loss = dpmlp::value_and_grad(Space(), model, xv, yv, grad, options);
  const auto p = host_vector(model.params());
  std::vector<double> gref;
  const double lref = reference_value_and_grad(pr.widths, pr.act, p, x, y, gref);
  const auto g = host_vector(grad);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    num += (g[i] - gref[i]) * (g[i] - gref[i]);
    den += gref[i] * gref[i];
  }
  INFO("widths " << pr.widths.size() << " layers (" << pr.widths.front() << " -> ... -> " << pr.widths.back()
                 << "), act " << dpmlp::activation_name(pr.act) << ", rows " << pr.rows << ", block "
                 << options.block_rows << ", engine " << dpmlp::engine_name(options.engine) << ", tensor kernel "
                 << dpmlp::tensor_kernel_name(options.tensor_kernel));
  CHECK(std::fabs(loss - lref) <= 1e-5 * std::max(1.0, lref));
  CHECK(std::sqrt(num / den) < 1e-5);
}

void check_against_reference(const Problem& pr, std::int64_t block, dpmlp::Engine engine, std::mt19937& gen) {
  dpmlp::EngineOptions options;
  options.block_rows = block;
  options.engine = engine;
  check_against_reference(pr, options, gen);
}

using BlockEngine = dpmlp::detail::BlockEngine<Space, float>;

// The reason this space cannot run the tensor engine for `model`, or "".
std::string tensor_unsupported(const dpmlp::Mlp<float, Memory>& model) {
  return dpmlp::detail::tensor_unsupported(dpmlp::model_shape(model), BlockEngine::caps(model));
}

// The plan for `model` over `rows` rows of `block` rows each on one rank, or nullopt where the options cannot
// run here.
std::optional<dpmlp::EnginePlan> plan_or_none(const dpmlp::Mlp<float, Memory>& model, std::int64_t rows,
                                              dpmlp::EngineOptions o) {
  try {
    return BlockEngine::plan(model, o, true, rows, 1);
  } catch (const dpmlp::InputError&) {
    return std::nullopt;
  }
}

// Random x (rows x inputs) and y (rows x outputs) on the device.
void device_normal_data(std::int64_t rows, int in, int out, std::mt19937& gen,
                 Kokkos::View<float**, Kokkos::LayoutRight, Memory>& x,
                 Kokkos::View<float**, Kokkos::LayoutRight, Memory>& y) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  x = Kokkos::View<float**, Kokkos::LayoutRight, Memory>("x", rows, in);
  y = Kokkos::View<float**, Kokkos::LayoutRight, Memory>("y", rows, out);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < in; ++i) hx(r, i) = nd(gen);
    for (int o = 0; o < out; ++o) hy(r, o) = nd(gen);
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
}

}  // namespace

TEST_CASE("value_and_grad matches an fp64 Eigen reference, depth 1-3", "[mlp]") {
  const std::vector<Problem> problems = {
      {{5, 1}, dpmlp::Activation::identity, 37},       {{32, 32, 1}, dpmlp::Activation::relu, 1000},
      {{6, 9, 2}, dpmlp::Activation::tanh, 123},       {{4, 8, 7, 3}, dpmlp::Activation::relu, 300},
      {{4, 8, 7, 3}, dpmlp::Activation::tanh, 300},    {{3, 5, 5, 2}, dpmlp::Activation::identity, 64},
  };
  std::mt19937 gen(7);
  for (const auto& pr : problems) {
    for (std::int64_t block : {std::int64_t(0), std::int64_t(16)}) {
      check_against_reference(pr, block, dpmlp::Engine::automatic, gen);
    }
  }
}

TEST_CASE("host engine: value_and_grad matches an fp64 Eigen reference, deep and wide models", "[mlp][host]") {
  if (!dpmlp::is_host_space<Space>()) return;  // the host engine runs on host spaces only
  // Widths that are and are not whole vectors (16 floats), several outputs, blocks that are not whole chunks
  // (32 rows) and a short last block.
  const std::vector<Problem> problems = {
      {{32, 64, 64, 64, 1}, dpmlp::Activation::relu, 1000},   {{32, 256, 256, 256, 1}, dpmlp::Activation::relu, 300},
      {{7, 40, 17, 33, 3}, dpmlp::Activation::tanh, 523},      {{3, 5, 5, 2}, dpmlp::Activation::identity, 64},
      {{16, 128, 128, 128, 128, 4}, dpmlp::Activation::tanh, 200}, {{5, 1}, dpmlp::Activation::identity, 37},
  };
  std::mt19937 gen(11);
  for (const auto& pr : problems) {
    for (std::int64_t block : {std::int64_t(0), std::int64_t(100)}) {
      check_against_reference(pr, block, dpmlp::Engine::host, gen);
    }
  }
}

namespace {
// The host engine's gradient and loss (value_and_grad) with its kernels limited to `isa`.
template <class Scalar>
std::vector<Scalar> host_grad(const dpmlp::Mlp<Scalar, Memory>& model, const Kokkos::View<Scalar**, Kokkos::LayoutRight, Memory>& x,
                              const Kokkos::View<Scalar**, Kokkos::LayoutRight, Memory>& y, dpmlp::detail::HostIsa isa,
                              std::int64_t block, dpmlp::Toggle groups = dpmlp::Toggle::off) {
  const dpmlp::detail::HostIsa before = dpmlp::detail::host_isa_limit();
  dpmlp::detail::host_isa_limit() = isa;
  Kokkos::View<Scalar*, Memory> grad("grad", model.num_params());
  dpmlp::EngineOptions o;
  o.engine = dpmlp::Engine::host;
  o.block_rows = block;
  o.leaf_groups = groups;
  const Scalar loss = dpmlp::value_and_grad(Space(), model, x, y, grad, o);
  dpmlp::detail::host_isa_limit() = before;
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad);
  std::vector<Scalar> out(h.data(), h.data() + h.extent(0));
  out.push_back(loss);
  return out;
}

template <class Scalar>
void check_host_kernels_agree(const std::vector<int>& widths, dpmlp::Activation act, std::int64_t rows,
                              std::int64_t block, std::mt19937& gen) {
  dpmlp::Mlp<Scalar, Memory> model(widths, act);
  model.init_jax(dpmlp::random::PRNGKey(5), Scalar(0.4));
  std::normal_distribution<Scalar> nd;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Memory> x("x", rows, widths.front()), y("y", rows, widths.back());
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < hx.span(); ++i) hx.data()[i] = nd(gen);
  for (std::size_t i = 0; i < hy.span(); ++i) hy.data()[i] = nd(gen);
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  using dpmlp::detail::HostIsa;
  const auto portable = host_grad(model, x, y, HostIsa::portable, block);
  {
    // Groups of 8 blocks summed by the engine in the tree's shape (the last group short): the same bits.
    const auto grouped = host_grad(model, x, y, dpmlp::detail::host_isa_available(), block, dpmlp::Toggle::on);
    INFO("leaf groups of 8 against none, rows " << rows << ", block " << block);
    REQUIRE(grouped.size() == portable.size());
    CHECK(std::memcmp(grouped.data(), portable.data(), grouped.size() * sizeof(Scalar)) == 0);
  }
  for (HostIsa isa : {HostIsa::avx2, HostIsa::avx512}) {
    if (static_cast<int>(dpmlp::detail::host_isa_available()) < static_cast<int>(isa)) {
      WARN("this CPU has no " << dpmlp::detail::host_isa_name(isa) << " kernel to compare");
      continue;
    }
    const auto v = host_grad(model, x, y, isa, block);
    INFO(dpmlp::detail::host_isa_name(isa) << " against portable, " << widths.size() - 1 << " layers, first hidden "
                                           << widths[1] << ", " << dpmlp::activation_name(act) << ", "
                                           << sizeof(Scalar) * 8 << "-bit, rows " << rows);
    REQUIRE(v.size() == portable.size());
    CHECK(std::memcmp(v.data(), portable.data(), v.size() * sizeof(Scalar)) == 0);
  }
}
}  // namespace

TEST_CASE("host engine: its AVX-512, AVX2 and portable kernels give the same bits", "[mlp][host]") {
  if (!dpmlp::is_host_space<Space>()) return;
  std::mt19937 gen(13);
  for (auto act : {dpmlp::Activation::relu, dpmlp::Activation::tanh, dpmlp::Activation::identity}) {
    check_host_kernels_agree<float>({32, 64, 64, 64, 1}, act, 333, 64, gen);
    check_host_kernels_agree<float>({7, 40, 17, 33, 3}, act, 200, 48, gen);
    check_host_kernels_agree<float>({8, 16, 1}, act, 1500, 16, gen);  // 94 blocks: 11 groups of 8 and one of 6
    check_host_kernels_agree<float>({32, 256, 256, 1}, act, 100, 0, gen);
    check_host_kernels_agree<double>({32, 64, 64, 64, 1}, act, 333, 64, gen);
    check_host_kernels_agree<double>({9, 24, 5, 2}, act, 150, 32, gen);
  }
}

// The fused one-hidden-layer kernel (engine/fused_simt.hpp) runs here with teams of one thread
// looping over its 256 logical threads: the same code and the same summation shapes as on a GPU. The
// shapes cover both input tiers (32, 64), every hidden padding (32 .. 256, both chunk sizes), 1-4 outputs,
// blocks shorter and longer than a chunk and not a multiple of it, and a short last block.
TEST_CASE("the fused engine matches the fp64 reference", "[mlp][fused]") {
  const std::vector<Problem> problems = {
      {{32, 32, 1}, dpmlp::Activation::relu, 1000}, {{3, 5, 2}, dpmlp::Activation::tanh, 123},
      {{40, 100, 4}, dpmlp::Activation::identity, 77}, {{16, 256, 1}, dpmlp::Activation::relu, 300},
      {{64, 200, 3}, dpmlp::Activation::tanh, 150},  {{1, 1, 1}, dpmlp::Activation::relu, 9},
      {{33, 64, 1}, dpmlp::Activation::relu, 260},
  };
  std::mt19937 gen(11);
  for (const auto& pr : problems) {
    for (std::int64_t block : {std::int64_t(0), std::int64_t(16), std::int64_t(100)}) {
      check_against_reference(pr, block, dpmlp::Engine::fused, gen);
    }
  }
}

// The tensor engine (backend/cuda/, 3xTF32 on tensor cores) on the same shapes, by every one of its kernels that
// runs the shape (a CUDA space with compute capability >= 8.0: the hardware validation); elsewhere asking for
// it must be refused with the reason.
TEST_CASE("the tensor engine matches the fp64 reference where it runs, and is refused elsewhere", "[mlp][tensor]") {
  const std::vector<Problem> problems = {
      {{32, 32, 1}, dpmlp::Activation::relu, 1000}, {{3, 5, 2}, dpmlp::Activation::tanh, 123},
      {{40, 100, 4}, dpmlp::Activation::identity, 77}, {{16, 256, 1}, dpmlp::Activation::relu, 300},
      {{64, 200, 3}, dpmlp::Activation::tanh, 150},  {{1, 1, 1}, dpmlp::Activation::relu, 9},
      {{33, 64, 1}, dpmlp::Activation::relu, 260},   {{32, 256, 1}, dpmlp::Activation::relu, 3000},
      // 32 or fewer inputs at 128 and 256 padded hidden units, one and several outputs: the register-resident
      // kernel's instantiations there.
      {{20, 128, 1}, dpmlp::Activation::tanh, 700},  {{9, 150, 2}, dpmlp::Activation::relu, 500},
      {{32, 120, 3}, dpmlp::Activation::identity, 400},
      // One output with relu or identity: the register-resident kernel's mask form of the backward
      // (TensorMmaKernel::masked_grad) at each hidden padding, and its paired schedule; tanh keeps the
      // three-MMA form.
      {{32, 64, 1}, dpmlp::Activation::identity, 400}, {{30, 128, 1}, dpmlp::Activation::relu, 600},
      {{12, 32, 1}, dpmlp::Activation::identity, 300}, {{32, 256, 1}, dpmlp::Activation::identity, 200},
  };
  const std::string why = tensor_unsupported(dpmlp::Mlp<float, Memory>({32, 32, 1}));
  if (!why.empty()) {
    WARN("the tensor engine does not run here: " << why);
    Kokkos::View<float**, Kokkos::LayoutRight, Memory> x("x", 10, 32), y("y", 10, 1);
    dpmlp::Mlp<float, Memory> model({32, 32, 1});
    Kokkos::View<float*, Memory> grad("grad", model.num_params());
    CHECK_THROWS_WITH(dpmlp::value_and_grad(Space(), model, x, y, grad, 0, dpmlp::Engine::tensor),
                      Catch::Contains(why));
    return;
  }
  std::mt19937 gen(13);
  int runs[4] = {0, 0, 0, 0};
  for (const auto& pr : problems) {
    const dpmlp::Mlp<float, Memory> model(pr.widths, pr.act);
    for (const auto kernel : {dpmlp::TensorKernel::automatic, dpmlp::TensorKernel::warp_matrix,
                              dpmlp::TensorKernel::register_resident, dpmlp::TensorKernel::register_resident_paired}) {
      for (std::int64_t block : {std::int64_t(0), std::int64_t(16), std::int64_t(100), std::int64_t(1024)}) {
        dpmlp::EngineOptions o;
        o.engine = dpmlp::Engine::tensor;
        o.tensor_kernel = kernel;
        o.block_rows = block;
        if (!plan_or_none(model, pr.rows, o)) continue;  // this kernel does not take the shape
        check_against_reference(pr, o, gen);
        ++runs[static_cast<int>(kernel)];
      }
    }
  }
  // Every kernel ran some of the shapes.
  for (int k = 0; k < 4; ++k) CHECK(runs[k] > 0);
}

// The tensor kernel a step runs, as the engine plan chose it for this device (test_engine_plan_mpi checks the
// rules themselves on any build).
TEST_CASE("the tensor engine runs the kernel its plan names", "[mlp][tensor]") {
  const dpmlp::Mlp<float, Memory> relu1({32, 32, 1}, dpmlp::Activation::relu);
  const dpmlp::Mlp<float, Memory> tanh1({32, 32, 1}, dpmlp::Activation::tanh);
  if (!tensor_unsupported(relu1).empty()) {
    CHECK(BlockEngine::plan(relu1, {}, true, 20000, 1).engine != dpmlp::Engine::tensor);
    return;
  }
  const auto seed = BlockEngine::plan(relu1, {}, true, 20000, 1);
  CHECK(seed.engine == dpmlp::Engine::tensor);
  CHECK(seed.block_rows == 64);
  if (seed.kernel != dpmlp::Kernel::tensor_register_resident_paired) {
    WARN("the paired register-resident kernel does not run the seed's shape here (its shared memory): "
         << seed.describe());
  }
  dpmlp::EngineOptions big;
  big.block_rows = 1024;
  CHECK(BlockEngine(tanh1, 3000, BlockEngine::plan(tanh1, big, true, 3000, 1)).engine_plan().register_resident());
  CHECK(BlockEngine(tanh1, 3000, BlockEngine::plan(tanh1, {}, true, 3000, 1)).engine_plan().kernel ==
        dpmlp::Kernel::tensor_warp_matrix);
}

// The register-resident tensor kernel, grouped (the plan's leaf groups): its CTA's teams take consecutive blocks
// and sum each group of them in the block tree's shape before writing. Each grouped row must be, bit for bit,
// the tree's node over the ungrouped rows of its blocks (a node the sum of its two halves, the left alone
// where the right lies past the last block), with a short last block and a short last group, at 32 hidden
// units and one output, where it groups, for both schedules; elsewhere the plan refuses to group.
TEST_CASE("the grouped tensor kernel writes the block tree's nodes, bitwise", "[mlp][tensor]") {
  struct Shape {
    std::vector<int> widths;
    dpmlp::Activation act;
  };
  const std::vector<Shape> shapes = {{{32, 32, 1}, dpmlp::Activation::relu}, {{7, 20, 1}, dpmlp::Activation::tanh},
                                     {{20, 64, 1}, dpmlp::Activation::tanh}, {{32, 128, 1}, dpmlp::Activation::identity},
                                     {{32, 32, 4}, dpmlp::Activation::relu}, {{32, 128, 3}, dpmlp::Activation::tanh}};
  if (!tensor_unsupported(dpmlp::Mlp<float, Memory>({32, 32, 1})).empty()) return;  // test_engine_plan_mpi: refused
  std::mt19937 gen(17);
  int compared = 0;
  for (const auto& sh : shapes) {
    dpmlp::Mlp<float, Memory> model(sh.widths, sh.act);
    model.init_jax(dpmlp::random::PRNGKey(5), 0.3f);
    int hp = 32;
    while (hp < sh.widths[1]) hp *= 2;
    for (const auto kernel : {dpmlp::TensorKernel::register_resident, dpmlp::TensorKernel::register_resident_paired}) {
      dpmlp::EngineOptions one, grouped;
      one.engine = grouped.engine = dpmlp::Engine::tensor;
      one.tensor_kernel = grouped.tensor_kernel = kernel;
      one.leaf_groups = dpmlp::Toggle::off;
      grouped.leaf_groups = dpmlp::Toggle::on;
      INFO("widths " << sh.widths[0] << "-" << sh.widths[1] << "-" << sh.widths[2] << ", "
                     << dpmlp::tensor_kernel_name(kernel));
      if (!plan_or_none(model, 1000, one)) continue;  // this schedule does not take the shape
      if (sh.widths[2] > 1 || hp != 32) {
        CHECK_THROWS_WITH(BlockEngine::plan(model, grouped, true, 1000, 1), Catch::Contains("leaf groups"));
        continue;
      }
      if (!plan_or_none(model, 1000, grouped)) {
        WARN("the register-resident kernel does not run grouped here (its shared memory)");
        continue;
      }
      for (const std::int64_t block : {std::int64_t(64), std::int64_t(40)}) {
        // 5 whole groups and 3 more blocks, the last short (17 rows of the block).
        const int group = 8;
        const std::int64_t rows = block * (5 * group + 2) + 17;
        one.block_rows = grouped.block_rows = block;
        Kokkos::View<float**, Kokkos::LayoutRight, Memory> x, y;
        device_normal_data(rows, sh.widths[0], sh.widths[2], gen, x, y);
        BlockEngine e1(model, rows, BlockEngine::plan(model, one, true, rows, 1));
        BlockEngine eg(model, rows, BlockEngine::plan(model, grouped, true, rows, 1));
        REQUIRE(e1.group() == 1);
        REQUIRE(eg.group() == group);
        e1.compute(Space(), x, y, 0.25f);
        eg.compute(Space(), x, y, 0.25f);
        auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), e1.partials());
        auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), eg.partials());
        const std::int64_t blocks = e1.blocks(), W = e1.width();
        REQUIRE(static_cast<std::int64_t>(b.extent(0)) == (blocks + group - 1) / group);
        std::int64_t mismatches = 0;
        for (std::int64_t sb = 0; sb < static_cast<std::int64_t>(b.extent(0)); ++sb) {
          const std::int64_t m = std::min<std::int64_t>(group, blocks - sb * group);
          for (std::int64_t c = 0; c < W; ++c) {
            std::vector<float> v(group, 0.0f);
            for (std::int64_t k = 0; k < m; ++k) v[k] = a(sb * group + k, c);
            for (std::int64_t stride = 1; stride < group; stride *= 2) {
              for (std::int64_t k = 0; k + stride < m; k += 2 * stride) v[k] += v[k + stride];
            }
            if (std::memcmp(&v[0], &b(sb, c), sizeof(float)) != 0) ++mismatches;
          }
        }
        INFO("block " << block << ", rows " << rows);
        CHECK(mismatches == 0);
        ++compared;
      }
    }
  }
  if (compared == 0) WARN("nothing compared here");
}

// The register-resident kernel's paired schedule (backend/cuda/tensor_pair.hpp: each warp of a team split into a
// forward warp and a backward warp) runs at one output, relu or identity, wherever its shared memory fits, in
// place of the unpaired teams. It must give their sums bit for bit, at every width (teams of 1, 2, 4 and 8
// pairs), grouped or not, with short last blocks and groups, fewer inputs or hidden units than the padded
// shape, and a window of rows (a mini-batch).
TEST_CASE("the paired register-resident schedule gives the unpaired teams' bits", "[mlp][tensor]") {
  struct Shape {
    std::vector<int> widths;
    dpmlp::Activation act;
  };
  const std::vector<Shape> shapes = {{{32, 32, 1}, dpmlp::Activation::relu},
                                     {{32, 32, 1}, dpmlp::Activation::identity},
                                     {{20, 17, 1}, dpmlp::Activation::relu},
                                     {{31, 32, 1}, dpmlp::Activation::relu},
                                     {{32, 64, 1}, dpmlp::Activation::relu},
                                     {{24, 100, 1}, dpmlp::Activation::identity},
                                     {{32, 256, 1}, dpmlp::Activation::relu},
                                     {{13, 200, 1}, dpmlp::Activation::relu}};
  if (!tensor_unsupported(dpmlp::Mlp<float, Memory>({32, 32, 1})).empty()) return;  // CPU: no tensor engine
  std::mt19937 gen(23);
  int compared = 0;
  for (const auto& sh : shapes) {
    dpmlp::Mlp<float, Memory> model(sh.widths, sh.act);
    model.init_jax(dpmlp::random::PRNGKey(9), 0.3f);
    for (const auto groups : {dpmlp::Toggle::off, dpmlp::Toggle::on}) {
      dpmlp::EngineOptions unpaired, paired;
      unpaired.engine = paired.engine = dpmlp::Engine::tensor;
      unpaired.tensor_kernel = dpmlp::TensorKernel::register_resident;
      paired.tensor_kernel = dpmlp::TensorKernel::register_resident_paired;
      unpaired.leaf_groups = paired.leaf_groups = groups;
      if (!plan_or_none(model, 1000, unpaired) || !plan_or_none(model, 1000, paired)) {
        if (groups == dpmlp::Toggle::off) WARN("the paired schedule does not run here (its shared memory)");
        continue;  // grouped: only at 32 hidden units
      }
      // Automatic pairs wherever the paired schedule runs.
      dpmlp::EngineOptions automatic;
      automatic.leaf_groups = groups;
      CHECK(BlockEngine::plan(model, automatic, true, 1000, 1).kernel == dpmlp::Kernel::tensor_register_resident_paired);
      for (const std::int64_t block : {std::int64_t(64), std::int64_t(40), std::int64_t(300)}) {
        const std::int64_t rows = block * (3 * 8 + 2) + 17;
        unpaired.block_rows = paired.block_rows = block;
        Kokkos::View<float**, Kokkos::LayoutRight, Memory> x, y;
        device_normal_data(rows, sh.widths[0], 1, gen, x, y);
        Kokkos::View<std::int64_t*, Memory> position("position", rows);
        auto hp = Kokkos::create_mirror_view(position);
        for (std::int64_t r = 0; r < rows; ++r) hp(r) = (r * 7919) % rows;
        Kokkos::deep_copy(position, hp);
        BlockEngine eu(model, rows, BlockEngine::plan(model, unpaired, true, rows, 1));
        BlockEngine ep(model, rows, BlockEngine::plan(model, paired, true, rows, 1));
        REQUIRE(eu.engine_plan().kernel == dpmlp::Kernel::tensor_register_resident);
        REQUIRE(ep.engine_plan().kernel == dpmlp::Kernel::tensor_register_resident_paired);
        REQUIRE(eu.group() == ep.group());
        for (const bool windowed : {false, true}) {
          dpmlp::detail::RowWindow window;
          if (windowed) window = dpmlp::detail::RowWindow{position.data(), rows / 3, rows / 3 + rows / 4};
          eu.compute(Space(), x, y, 0.25f, window);
          ep.compute(Space(), x, y, 0.25f, window);
          auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), eu.partials());
          auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ep.partials());
          INFO("widths " << sh.widths[0] << "-" << sh.widths[1] << "-1, " << dpmlp::activation_name(sh.act)
                         << ", group " << eu.group() << ", block " << block << ", rows " << rows << ", window "
                         << windowed);
          REQUIRE(a.extent(0) == b.extent(0));
          CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
          ++compared;
        }
      }
    }
  }
  if (compared == 0) WARN("nothing compared here");
}

TEST_CASE("Engine::fused refuses a model it cannot run, saying why", "[mlp][fused]") {
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> x("x", 10, 4), y("y", 10, 1);
  const auto refuse = [&](std::vector<int> widths, const char* why) {
    dpmlp::Mlp<float, Memory> model(widths);
    Kokkos::View<float*, Memory> grad("grad", model.num_params());
    Kokkos::View<float**, Kokkos::LayoutRight, Memory> xi("x", 10, widths.front()), yo("y", 10, widths.back());
    CHECK_THROWS_WITH(dpmlp::value_and_grad(Space(), model, xi, yo, grad, 0, dpmlp::Engine::fused),
                      Catch::Contains(why));
  };
  refuse({4, 8, 8, 1}, "exactly one hidden layer");
  refuse({4, 1}, "exactly one hidden layer");
  refuse({65, 8, 1}, "at most 64 inputs");
  refuse({4, 257, 1}, "at most 256 hidden units");
  refuse({4, 8, 5}, "at most 4 outputs");
}

TEST_CASE("value_and_grad matches central finite differences in double", "[mlp]") {
  const std::vector<int> widths = {3, 4, 2};
  for (auto act : {dpmlp::Activation::tanh, dpmlp::Activation::relu}) {
    dpmlp::Mlp<double, Memory> model(widths, act);
    model.init_jax(dpmlp::random::PRNGKey(11), 0.7);
    const int rows = 23;
    Kokkos::View<double**, Kokkos::LayoutRight, Memory> x("x", rows, 3), y("y", rows, 2);
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < 3; ++c) hx(r, c) = std::sin(1.7 * r + c) + 0.1 * c;
      for (int c = 0; c < 2; ++c) hy(r, c) = std::cos(0.9 * r - c);
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);
    Kokkos::View<double*, Memory> grad("grad", model.num_params()), scratch("scratch", model.num_params());
    dpmlp::value_and_grad(Space(), model, x, y, grad, 5);
    const auto g = host_vector(grad);
    // A separate copy of the parameters (a host mirror of host memory would alias them).
    Kokkos::View<double*, Kokkos::HostSpace> params("params", model.num_params());
    Kokkos::deep_copy(params, model.params());
    const double h = 1e-6;
    for (std::size_t i = 0; i < model.num_params(); ++i) {
      auto shifted = [&](double delta) {
        Kokkos::View<double*, Kokkos::HostSpace> q("q", model.num_params());
        Kokkos::deep_copy(q, params);
        q(i) += delta;
        Kokkos::deep_copy(model.params(), q);
        return dpmlp::value_and_grad(Space(), model, x, y, scratch, 5);
      };
      const double fd = (shifted(h) - shifted(-h)) / (2 * h);
      INFO("param " << i << " act " << dpmlp::activation_name(act));
      CHECK(g[i] == Approx(fd).margin(1e-6).epsilon(1e-5));
    }
    Kokkos::deep_copy(model.params(), params);
  }
}

TEST_CASE("init_jax draws the JAX original's initial parameters", "[mlp][random]") {
  const auto ref = json_lite::parse_file(DPMLP_REFERENCE_DIR "/seed_reference.json");
  const auto& init = ref["init_params"];
  dpmlp::Mlp<float, Memory> model;  // the seed's 32 -> 32 -> 1
  model.init_jax(dpmlp::random::PRNGKey(1), 0.1f);
  const auto p = host_vector(model.params());
  const auto& w1 = init["w1"];
  const auto& w2 = init["w2"];
  REQUIRE(w1.size() == 32 * 32);
  REQUIRE(w2.size() == 32);
  double worst = 0;
  for (std::size_t i = 0; i < 32 * 32; ++i) worst = dpmlp_test::nan_max(worst, std::fabs(p[model.weight_offset(0) + i] - w1[i].as_double()));
  for (std::size_t i = 0; i < 32; ++i) worst = dpmlp_test::nan_max(worst, std::fabs(p[model.weight_offset(1) + i] - w2[i].as_double()));
  for (std::size_t i = 0; i < 32; ++i) CHECK(p[model.bias_offset(0) + i] == 0.0);
  CHECK(p[model.bias_offset(1)] == 0.0);
  CHECK(worst <= 1e-7);
}

TEST_CASE("the GEMM backends agree with an fp64 host product", "[mlp][linalg]") {
  using dpmlp::linalg::Op;
  const int m = 13, n = 7, k = 29, batch = 3;
  Kokkos::View<float*, Memory> a("a", batch * m * k), b("b", batch * k * n), c1("c1", batch * m * n),
      c2("c2", batch * m * n);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(5), a, 0);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(6), b, 0);
  for (Op oa : {Op::N, Op::T}) {
    for (Op ob : {Op::N, Op::T}) {
      dpmlp::linalg::BatchedGemm<float> g;
      g.op_a = oa;
      g.op_b = ob;
      g.m = m;
      g.n = n;
      g.k = k;
      g.a = a.data();
      g.lda = oa == Op::N ? k : m;
      g.stride_a = m * k;
      g.b = b.data();
      g.ldb = ob == Op::N ? n : k;
      g.stride_b = k * n;
      g.ldc = n;
      g.stride_c = m * n;
      g.batch = batch;
      g.c = c1.data();
      dpmlp::linalg::gemm(Space(), dpmlp::linalg::Backend::portable, g);
      g.c = c2.data();
      // The space's default (Eigen on host spaces, cuBLAS on CUDA; the portable kernel again elsewhere, which
      // the fp64 product below still checks).
      dpmlp::linalg::gemm(Space(), dpmlp::linalg::default_backend<Space>(false), g);
      auto h1 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c1);
      auto h2 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c2);
      auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
      auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
      double worst = 0;
      for (int e = 0; e < batch; ++e) {
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < n; ++j) {
            double want = 0;
            for (int p = 0; p < k; ++p) {
              const double av = oa == Op::N ? ha(e * m * k + i * k + p) : ha(e * m * k + p * m + i);
              const double bv = ob == Op::N ? hb(e * k * n + p * n + j) : hb(e * k * n + j * k + p);
              want += av * bv;
            }
            const std::size_t at = std::size_t(e) * m * n + i * n + j;
            worst = dpmlp_test::nan_max(worst, std::fabs(double(h1(at)) - want));
            worst = dpmlp_test::nan_max(worst, std::fabs(double(h2(at)) - want));
          }
        }
      }
      CHECK(worst < 1e-4);  // |entries| ~ sqrt(29) ~ 5: fp32 accumulation error is ~1e-6
    }
  }
}

TEST_CASE("deep models: value_and_grad matches the fp64 reference, every GEMM path", "[mlp][deep]") {
  // On CUDA, widths of multiples of 4 take cuBLASLt's 16-byte-aligned kernels, the others (the one-output
  // last layers, 5 -> 7 -> ...) its element-aligned ones. Blocks: the default, and one that leaves a short
  // last block. Then the same with the portable GEMM.
  const std::vector<Problem> problems = {
      {{32, 64, 64, 64, 1}, dpmlp::Activation::relu, 1500},
      {{32, 128, 128, 128, 128, 4}, dpmlp::Activation::tanh, 400},
      {{16, 256, 256, 256, 1}, dpmlp::Activation::relu, 300},
      {{12, 20, 20, 16, 2}, dpmlp::Activation::identity, 333},
      {{32, 64, 64, 2}, dpmlp::Activation::relu, 500},
      {{5, 7, 9, 3}, dpmlp::Activation::relu, 250},
  };
  std::mt19937 gen(11);
  for (const auto& pr : problems) {
    for (std::int64_t block : {std::int64_t(0), std::int64_t(96)}) {
      dpmlp::EngineOptions o;
      o.engine = dpmlp::Engine::layered;
      o.block_rows = block;
      check_against_reference(pr, o, gen);
      o.gemm = dpmlp::linalg::Backend::portable;
      check_against_reference(pr, o, gen);
    }
  }
  // Enough rows that the output layer's forward stages many rows a team (on an H200, 64 of them) and its last
  // team is short (one row).
  dpmlp::EngineOptions o;
  o.engine = dpmlp::Engine::layered;
  check_against_reference({{8, 16, 16, 1}, dpmlp::Activation::tanh, 67585}, o, gen);
}

TEST_CASE("split operands: value_and_grad matches the fp64 reference, split and unsplit GEMMs mixed", "[mlp][deep][split]") {
  // Split GEMMs need k in whole tiles of 32 (linalg/split_gemm.hpp); the others run the plan's GEMM and write
  // the lo parts a split GEMM after them reads in a pass of their own. [32,48,64,32,2]: layer 0 split with no
  // lo out, layer 1 unsplit writing lo for layer 2; the output delta's GEMM unsplit writing lo for the split
  // delta GEMMs below. [32,64,32]: the loss's output deltas read by a split GEMM. Where the lo parts a GEMM
  // reads were stale or missing, its products would be TF32's (relative error ~1e-4), not fp32's.
  const std::vector<Problem> problems = {
      {{32, 64, 64, 64, 1}, dpmlp::Activation::relu, 700},
      {{32, 48, 64, 32, 2}, dpmlp::Activation::tanh, 333},
      {{32, 64, 32}, dpmlp::Activation::relu, 200},
      {{16, 96, 96, 4}, dpmlp::Activation::identity, 250},
  };
  std::mt19937 gen(13);
  for (const auto& pr : problems) {
    for (std::int64_t block : {std::int64_t(0), std::int64_t(64)}) {
      dpmlp::EngineOptions o;
      o.split_operands = dpmlp::Toggle::on;
      o.block_rows = block;
      const auto plan = plan_or_none(dpmlp::Mlp<float, Memory>(pr.widths, pr.act), pr.rows, o);
      REQUIRE(plan);
      CHECK(plan->gemm_split);
      CHECK(plan->engine == dpmlp::Engine::layered);
      check_against_reference(pr, o, gen);
    }
  }
  dpmlp::EngineOptions tensor;
  tensor.engine = dpmlp::Engine::fused;
  tensor.split_operands = dpmlp::Toggle::on;
  CHECK_THAT(dpmlp_test::refusal([&] { BlockEngine::plan(dpmlp::Mlp<float, Memory>({8, 16, 1}), tensor, true, 100, 1); }),
             Catch::Matchers::Contains("split operands are the layered engine's float GEMMs"));
}

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
namespace {
// Whether the cutlass backend's GEMMs of n >= 64 run on the 3xFP16 kernels here when asked to (not where the
// wgmma kernels take them, nor on a device that cannot run them): the f16x3 passes below test nothing else.
bool f16x3_runs_here() {
  dpmlp::linalg::BatchedGemm<float> g;
  g.f16x3 = true;
  g.n = 64;
  return dpmlp::linalg::cutlass_3xtf32::runs_on_f16x3(g);
}
}  // namespace
#endif

TEST_CASE("3xFP16 GEMMs: value_and_grad matches the fp64 reference with the layered engine's GEMMs on them",
          "[mlp][deep][f16x3]") {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if (std::is_same<Space, Kokkos::Cuda>::value && f16x3_runs_here()) {
    // Forward, delta and per-block weight-gradient GEMMs of n >= 64 on the 3xFP16 kernels (the plan's flag
    // reaching each), the narrower ones on CUTLASS's; blocks of the default size and short ones. Rows enough
    // for the large tile (16384 and more): on Hopper the forward and delta GEMMs run warp-specialized (the
    // 132- and 320-wide shapes with a partial column tile).
    const std::vector<Problem> problems = {
        {{32, 128, 128, 128, 128, 4}, dpmlp::Activation::tanh, 400},
        {{16, 256, 256, 256, 1}, dpmlp::Activation::relu, 300},
        {{32, 64, 96, 2}, dpmlp::Activation::identity, 333},
        {{16, 256, 256, 1}, dpmlp::Activation::relu, 20000},
        {{16, 132, 132, 3}, dpmlp::Activation::tanh, 17000},
        {{16, 320, 320, 1}, dpmlp::Activation::relu, 17000},  // three column tiles, the last partial
    };
    std::mt19937 gen(19);
    for (const auto& pr : problems) {
      for (std::int64_t block : {std::int64_t(0), std::int64_t(96)}) {
        dpmlp::EngineOptions o;
        o.engine = dpmlp::Engine::layered;
        o.gemm = dpmlp::linalg::Backend::cutlass;
        o.gemm_3xfp16 = dpmlp::Toggle::on;
        o.block_rows = block;
        const auto plan = plan_or_none(dpmlp::Mlp<float, Memory>(pr.widths, pr.act), pr.rows, o);
        REQUIRE(plan);
        CHECK(plan->gemm_f16x3);
        check_against_reference(pr, o, gen);
      }
    }
    return;
  }
#endif
  // Elsewhere, asking for them is refused with the reason.
  dpmlp::EngineOptions o;
  o.engine = dpmlp::Engine::layered;
  o.gemm_3xfp16 = dpmlp::Toggle::on;
  CHECK_THAT(dpmlp_test::refusal([&] { BlockEngine::plan(dpmlp::Mlp<float, Memory>({16, 64, 1}), o, true, 100, 1); }),
             Catch::Matchers::Contains("the 3xFP16 GEMMs cannot run"));
}

TEST_CASE("tensor engine, deep kernel: value_and_grad matches the fp64 reference", "[mlp][deep][tensor]") {
  // Two to four hidden layers at 32 padded inputs, two and three at 64 (its five instantiations); hidden
  // layers narrower than 64 units; one to four outputs; every activation; blocks of the default size, of fewer
  // rows than a tile (16), of a tile and a short one (96), and of many tiles (1000).
  const std::vector<Problem> problems = {
      {{32, 64, 64, 64, 1}, dpmlp::Activation::relu, 1500},  {{12, 20, 20, 16, 2}, dpmlp::Activation::identity, 333},
      {{32, 64, 64, 2}, dpmlp::Activation::relu, 500},       {{5, 7, 9, 3}, dpmlp::Activation::tanh, 250},
      {{40, 50, 30, 3}, dpmlp::Activation::tanh, 300},       {{64, 64, 48, 4}, dpmlp::Activation::relu, 700},
      {{33, 64, 48, 1}, dpmlp::Activation::identity, 1200},
      // Two groups of eight warps a CTA: three hidden layers at 64 padded inputs, four at 32.
      {{64, 64, 64, 64, 4}, dpmlp::Activation::relu, 700},   {{33, 64, 48, 64, 1}, dpmlp::Activation::identity, 900},
      {{32, 64, 64, 64, 64, 1}, dpmlp::Activation::relu, 700}, {{20, 30, 40, 50, 60, 3}, dpmlp::Activation::tanh, 300},
  };
  const std::string why = tensor_unsupported(dpmlp::Mlp<float, Memory>({32, 64, 64, 1}));
  if (!why.empty()) {
    WARN("the tensor engine does not run here: " << why);
    return;
  }
  std::mt19937 gen(17);
  for (const auto& pr : problems) {
    const dpmlp::Mlp<float, Memory> model(pr.widths, pr.act);
    for (std::int64_t block : {std::int64_t(0), std::int64_t(16), std::int64_t(96), std::int64_t(1000)}) {
      dpmlp::EngineOptions o;
      o.block_rows = block;
      REQUIRE(BlockEngine::plan(model, o, true, pr.rows, 1).kernel == dpmlp::Kernel::tensor_deep);
      check_against_reference(pr, o, gen);
    }
  }
}

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
namespace {
// A row's bits do not depend on the rows in the GEMM, a block's on the blocks in the batch: the property the
// reproducible reduction needs from a GEMM backend, checked for `backend`.
// f16x3: the cutlass backend's GEMMs of n >= 64 on the 3xFP16 kernels (BatchedGemm::f16x3).
void check_rows_and_blocks_independent(dpmlp::linalg::Backend backend, bool f16x3 = false) {
  using dpmlp::linalg::Backend;
  using dpmlp::linalg::Op;
  // Enough rows that the whole GEMM and the longest span run other tiles than the short spans.
  const int rows = 20000, k = 256, n = 128;
  Kokkos::View<float*, Memory> a("a", rows * k), w("w", k * n), bias("bias", n), c1("c1", rows * n),
      c2("c2", rows * n);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(5), a, 0);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(6), w, 0);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(7), bias, 0);
  for (Op ob : {Op::N, Op::T}) {
    for (bool epilogue : {false, true}) {
      if (epilogue && ob == Op::T) continue;
      // Rows [0, rows) in one GEMM, then rows [1000, 1000 + span) alone, for spans of several sizes (and tiles).
      dpmlp::linalg::BatchedGemm<float> g;
      g.f16x3 = f16x3;
      g.op_b = ob;
      g.m = rows;
      g.n = n;
      g.k = k;
      g.a = a.data();
      g.lda = k;
      g.b = w.data();
      g.ldb = ob == Op::N ? n : k;
      g.c = c1.data();
      g.ldc = n;
      auto run = [&](const dpmlp::linalg::BatchedGemm<float>& gg) {
        if (epilogue) {
          CHECK(dpmlp::linalg::gemm_with_bias(Space(), backend, gg, bias.data(), true));
        } else {
          dpmlp::linalg::gemm(Space(), backend, gg);
        }
      };
      run(g);
      if (!epilogue) {
        // FP32 accuracy (a TF32 product would be off by ~1e-3): rows 0..63 against an fp64 product.
        auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
        auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w);
        auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c1);
        double worst = 0, scale = 0;
        for (int i = 0; i < 64; ++i) {
          for (int j = 0; j < n; ++j) {
            double ref = 0;
            for (int p = 0; p < k; ++p) ref += double(ha(i * k + p)) * double(ob == Op::N ? hw(p * n + j) : hw(j * k + p));
            worst = std::max(worst, std::abs(double(hc(i * n + j)) - ref));
            scale = std::max(scale, std::abs(ref));
          }
        }
        INFO("op_b " << (ob == Op::N ? "N" : "T") << ", 3xFP16 " << f16x3 << ": max error " << worst << " of max |C| " << scale);
        CHECK(worst <= 1e-6 * scale);
      }
      // The spans with a workspace where the backend takes one (the 3xFP16 kernels then split B once, not in
      // every CTA): the same bits as the whole GEMM without.
      const std::size_t ws_bytes = dpmlp::linalg::gemm_workspace_bytes(Space(), backend, g);
      if (f16x3) CHECK(ws_bytes > 0);
      Kokkos::View<unsigned char*, Memory> ws("ws", ws_bytes);
      for (int span : {1, 7, 64, 1000, 3999, 17000}) {
        Kokkos::deep_copy(c2, 0.0f);
        auto part = g;
        part.m = span;
        part.a = a.data() + 1000 * k;
        part.c = c2.data() + 1000 * n;
        part.workspace = ws.data();
        part.workspace_bytes = ws_bytes;
        run(part);
        auto h1 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c1);
        auto h2 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c2);
        INFO("op_b " << (ob == Op::N ? "N" : "T") << ", epilogue " << epilogue << ", span " << span);
        CHECK(std::memcmp(h1.data() + 1000 * n, h2.data() + 1000 * n, sizeof(float) * span * n) == 0);
      }
    }
  }
  // Weight gradients, block by block: A^T D over 512-row blocks, in a batch of 9 and one block alone.
  const int blocks = 9, block = 512, in = 64, out = 128;
  Kokkos::View<float*, Memory> x("x", blocks * block * in), d("d", blocks * block * out),
      g1("g1", blocks * (in * out + 3)), g2("g2", blocks * (in * out + 3));
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(8), x, 0);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(9), d, 0);
  dpmlp::linalg::BatchedGemm<float> g;
  g.f16x3 = f16x3;
  g.op_a = Op::T;
  g.m = in;
  g.n = out;
  g.k = block;
  g.a = x.data();
  g.lda = in;
  g.stride_a = std::int64_t(block) * in;
  g.b = d.data();
  g.ldb = out;
  g.stride_b = std::int64_t(block) * out;
  g.c = g1.data() + 1;  // rows of a partial-sums matrix whose width is not a multiple of 4
  g.ldc = out;
  g.stride_c = in * out + 3;
  g.batch = blocks;
  g.blocks = true;
  dpmlp::linalg::gemm(Space(), backend, g);
  for (int b : {0, 4, 8}) {
    auto one = g;
    one.batch = 1;
    one.a = x.data() + std::int64_t(b) * block * in;
    one.b = d.data() + std::int64_t(b) * block * out;
    one.c = g2.data() + 1 + std::int64_t(b) * (in * out + 3);
    dpmlp::linalg::gemm(Space(), backend, one);
    auto h1 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), g1);
    auto h2 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), g2);
    INFO("block " << b);
    const std::size_t at = 1 + std::size_t(b) * (in * out + 3);
    CHECK(std::memcmp(h1.data() + at, h2.data() + at, sizeof(float) * in * out) == 0);
  }
  // More blocks than one launch's grid takes (65535): the same bits as each block alone.
  const int many = 70000, rows8 = 8, w4 = 4;
  Kokkos::View<float*, Memory> xm("xm", many * rows8 * w4), dm("dm", many * rows8 * w4), gm("gm", many * w4 * w4),
      g1m("g1m", w4 * w4);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(10), xm, 0);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(11), dm, 0);
  dpmlp::linalg::BatchedGemm<float> gb;
  gb.op_a = Op::T;
  gb.m = w4, gb.n = w4, gb.k = rows8;
  gb.a = xm.data(), gb.lda = w4, gb.stride_a = rows8 * w4;
  gb.b = dm.data(), gb.ldb = w4, gb.stride_b = rows8 * w4;
  gb.c = gm.data(), gb.ldc = w4, gb.stride_c = w4 * w4;
  gb.batch = many;
  gb.blocks = true;
  dpmlp::linalg::gemm(Space(), backend, gb);
  auto hm = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gm);
  for (int b : {0, 65534, 65535, 69999}) {
    auto one = gb;
    one.batch = 1;
    one.a = xm.data() + std::int64_t(b) * rows8 * w4;
    one.b = dm.data() + std::int64_t(b) * rows8 * w4;
    one.c = g1m.data();
    dpmlp::linalg::gemm(Space(), backend, one);
    auto h1 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), g1m);
    INFO("block " << b << " of " << many);
    CHECK(std::memcmp(hm.data() + std::size_t(b) * w4 * w4, h1.data(), sizeof(float) * w4 * w4) == 0);
  }
}
}  // namespace
#endif

TEST_CASE("cublaslt: a row's bits do not depend on the rows in the GEMM, a block's on the blocks", "[mlp][linalg]") {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
  if (std::is_same<Space, Kokkos::Cuda>::value) {
    check_rows_and_blocks_independent(dpmlp::linalg::Backend::cublaslt);
    return;
  }
#endif
  WARN("the pinned cuBLASLt backend runs on CUDA builds with cuBLAS only; not run here");
}

TEST_CASE("cutlass: a row's bits do not depend on the rows in the GEMM, a block's on the blocks", "[mlp][linalg]") {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if (std::is_same<Space, Kokkos::Cuda>::value) {
    check_rows_and_blocks_independent(dpmlp::linalg::Backend::cutlass);
    if (f16x3_runs_here()) {
      check_rows_and_blocks_independent(dpmlp::linalg::Backend::cutlass, true);
    } else {
      WARN("the 3xFP16 GEMMs do not run on this build or device; their pass is not run");
    }
    return;
  }
#endif
  WARN("the CUTLASS 3xTF32 backend runs on CUDA builds with CUTLASS only; not run here");
}

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
namespace {
// One GEMM of the cutlass backend against an fp64 product, every element: C = op(A) op(B) (alpha 1, or alpha
// and beta on the old C), with the bias-and-activation or activation-gradient epilogue or none. Shapes that
// are not multiples of any tile (m, n, k; batches of blocks whose C rows sit at odd offsets) reach every
// predicate of the kernels; n >= 64 runs the 3xFP16 kernels (the wgmma kernels instead on a Hopper GPU in a
// build with them), n < 64 CUTLASS's.
using OddGemm = dpmlp_test::EpilogueGemm;
void check_odd_gemm(const OddGemm& t, bool f16x3) {
  using dpmlp::linalg::Op;
  const bool at = t.op_a == Op::T, bt = t.op_b == Op::T;
  const std::int64_t sa = std::int64_t(t.m) * t.k, sb = std::int64_t(t.k) * t.n;
  const std::int64_t sc = std::int64_t(t.m) * t.n + (t.batch > 1 ? 3 : 0);  // blocks' C at odd offsets
  Kokkos::View<float*, Memory> a("a", sa * t.batch), b("b", sb * t.batch), bias("bias", t.n), y("y", sc * t.batch),
      c("c", sc * t.batch + 1);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(21), a, 0);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(22), b, 0);
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(23), bias, 0);
  dpmlp::random::uniform(Space(), dpmlp::random::PRNGKey(24), y, 0);  // activations in [0, 1)
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(25), c, 0);   // the old C, for beta
  auto c_old = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
  dpmlp::linalg::BatchedGemm<float> g;
  g.op_a = t.op_a, g.op_b = t.op_b, g.m = t.m, g.n = t.n, g.k = t.k;
  g.a = a.data(), g.lda = at ? t.m : t.k, g.stride_a = sa;
  g.b = b.data(), g.ldb = bt ? t.k : t.n, g.stride_b = sb;
  g.c = c.data() + (t.batch > 1 ? 1 : 0), g.ldc = t.n, g.stride_c = sc;
  g.alpha = t.alpha, g.beta = t.beta, g.batch = t.batch, g.blocks = t.batch > 1;
  g.f16x3 = f16x3;
  // T N: B's column sums too (a block's bias gradients), laid out as C's first rows; NaN elsewhere.
  Kokkos::View<float*, Memory> sums("sums", at ? sc * t.batch + 1 : 1);
  Kokkos::deep_copy(sums, std::numeric_limits<float>::quiet_NaN());
  if (at) g.column_sums = sums.data() + (t.batch > 1 ? 1 : 0);
  bool fused = true, summed = false;
  if (t.epilogue == 1) {
    fused = dpmlp::linalg::gemm_with_bias(Space(), dpmlp::linalg::Backend::cutlass, g, bias.data(), t.act);
  } else if (t.epilogue == 2) {
    fused = dpmlp::linalg::gemm_with_activation_grad(Space(), dpmlp::linalg::Backend::cutlass, g, y.data(), t.n, t.act);
  } else {
    summed = dpmlp::linalg::gemm(Space(), dpmlp::linalg::Backend::cutlass, g);
  }
  REQUIRE(fused);
  if (at) {
    // The 3xFP16 kernels sum B's columns in ColumnSums' order (bit for bit); CUTLASS's kernels do not sum them.
    INFO("T N, 3xFP16 " << f16x3 << ", " << t.m << " x " << t.n << " x " << t.k << ", batch " << t.batch);
    CHECK(summed == f16x3);
    auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sums);
    if (summed) {
      auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
      CHECK(dpmlp_test::column_sums_wrong(t, hb.data(), sb, hs.data(), sc, t.batch > 1 ? 1 : 0,
                                          static_cast<std::int64_t>(hs.extent(0))) == 0);
    } else {
      int stray = 0;
      for (std::size_t i = 0; i < hs.extent(0); ++i) stray += std::isnan(hs(i)) ? 0 : 1;
      CHECK(stray == 0);
    }
  }
  // With a workspace where the backend takes one (3xFP16, rows x weights: op(B) split once, not in every CTA):
  // the same bits.
  const std::size_t ws_bytes = dpmlp::linalg::gemm_workspace_bytes(Space(), dpmlp::linalg::Backend::cutlass, g);
  if (ws_bytes > 0) {
    auto first = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
    Kokkos::deep_copy(c, c_old);
    Kokkos::View<unsigned char*, Memory> ws("ws", ws_bytes);
    auto gw = g;
    gw.workspace = ws.data();
    gw.workspace_bytes = ws_bytes;
    if (t.epilogue == 1) {
      dpmlp::linalg::gemm_with_bias(Space(), dpmlp::linalg::Backend::cutlass, gw, bias.data(), t.act);
    } else if (t.epilogue == 2) {
      dpmlp::linalg::gemm_with_activation_grad(Space(), dpmlp::linalg::Backend::cutlass, gw, y.data(), t.n, t.act);
    } else {
      dpmlp::linalg::gemm(Space(), dpmlp::linalg::Backend::cutlass, gw);
    }
    auto second = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
    INFO("op " << (at ? 'T' : 'N') << (bt ? 'T' : 'N') << ", " << t.m << " x " << t.n << " x " << t.k
               << ": op(B) split once against in every CTA");
    CHECK(std::memcmp(first.data(), second.data(), sizeof(float) * first.extent(0)) == 0);
  }
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  auto hbias = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bias);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
  const std::int64_t off = t.batch > 1 ? 1 : 0;
  const double worst = dpmlp_test::epilogue_gemm_error(
      t, {ha.data(), hb.data(), hbias.data(), hy.data(), c_old.data(), hc.data(), sa, sb, sc, off});
  INFO("3xFP16 " << f16x3 << ", op " << (at ? 'T' : 'N') << (bt ? 'T' : 'N') << ", " << t.m << " x " << t.n << " x " << t.k << ", batch "
             << t.batch << ", epilogue " << t.epilogue << ": max error / sum |terms| " << worst);
  CHECK(worst <= 2e-6);
}
}  // namespace
#endif

namespace {
struct SplitCase {
  int m, n, k;
  bool transposed;  // B = W^T, W stored n x k (the delta's layout)
  dpmlp::linalg::SplitEpilogue epilogue;
  dpmlp::Activation act;
};

// The split GEMM of `t` (on this space's kernels: Hopper's on an H100/H200 built with them, else the portable
// form) against an fp64 product: each element within 2e-6 of the sum of its terms' magnitudes, C_lo the lo
// parts of C bitwise; its first rows alone (another kernel on a GPU, below 16384 rows) give those rows' bits,
// and so does each tile shape over all the rows.
void check_split_gemm(const SplitCase& t, std::mt19937& gen, int row_step = 1) {
  namespace la = dpmlp::linalg;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int m = t.m, n = t.n, k = t.k;
  const auto rand_view = [&](const char* label, std::int64_t count, float scale) {
    Kokkos::View<float*, Memory> v(std::string(label), static_cast<std::size_t>(count));
    auto h = Kokkos::create_mirror_view(v);
    for (std::int64_t i = 0; i < count; ++i) h(i) = scale * nd(gen);
    Kokkos::deep_copy(v, h);
    return v;
  };
  const auto a = rand_view("a", std::int64_t(m) * k, 1.0f);
  const auto w = rand_view("w", std::int64_t(k) * n, 1.0f / std::sqrt(float(k)));
  const auto src = rand_view("src", t.epilogue == la::SplitEpilogue::activation_grad ? std::int64_t(m) * n : n, 0.5f);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w);
  auto hsrc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), src);
  Kokkos::View<float*, Memory> a_lo("a_lo", a.extent(0)), bp("b_split", std::size_t(3) * k * n);
  {
    auto h = Kokkos::create_mirror_view(a_lo);
    for (std::size_t i = 0; i < h.extent(0); ++i) h(i) = la::tf32_lo(ha(i));
    Kokkos::deep_copy(a_lo, h);
  }
  la::SplitWeights sw;
  sw.w = w.data(), sw.k = k, sw.n = n, sw.transposed = t.transposed, sw.b_split = bp.data();
  Kokkos::parallel_for("split_weights", Kokkos::RangePolicy<Space>(0, sw.size()), sw);
  const auto run = [&](int rows, int tile_rows = 0) {
    Kokkos::View<float*, Memory> c("c", std::size_t(rows) * n), c_lo("c_lo", std::size_t(rows) * n);
    la::SplitGemm g;
    g.m = rows, g.n = n, g.k = k, g.a = a.data(), g.a_lo = a_lo.data(), g.lda = k, g.b_split = bp.data();
    g.c = c.data(), g.c_lo = c_lo.data(), g.ldc = n;
    g.epilogue = t.epilogue, g.src = src.data(), g.src_ld = n, g.act = t.act;
    g.tile_rows = tile_rows;
    REQUIRE(la::split_takes(k, g.a, g.a_lo, g.lda));
    la::split_gemm(Space(), g);
    return std::make_pair(Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c),
                          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c_lo));
  };
  const auto [hc, hc_lo] = run(m);
  double worst = 0;
  std::int64_t lo_wrong = 0;
  for (int r = 0; r < m; ++r) {
    for (int col = 0; col < n; ++col) {
      const std::size_t at = std::size_t(r) * n + col;
      const float lo = la::tf32_lo(hc(at));
      lo_wrong += std::memcmp(&lo, &hc_lo(at), sizeof lo) != 0;
      if (r % row_step != 0 && r != m - 1) continue;  // the fp64 reference on every row_step-th row
      double acc = 0, mag = 0;
      for (int j = 0; j < k; ++j) {
        const double b = t.transposed ? hw(std::size_t(col) * k + j) : hw(std::size_t(j) * n + col);
        acc += double(ha(std::size_t(r) * k + j)) * b;
        mag += std::fabs(double(ha(std::size_t(r) * k + j)) * b);
      }
      double ref = acc;
      if (t.epilogue == la::SplitEpilogue::bias_activation) {
        ref = t.act == dpmlp::Activation::relu ? std::max(0.0, acc + hsrc(col))
              : t.act == dpmlp::Activation::tanh ? std::tanh(acc + hsrc(col)) : acc + hsrc(col);
      } else if (t.epilogue == la::SplitEpilogue::activation_grad) {
        const double y = hsrc(std::size_t(r) * n + col);
        ref = acc * (t.act == dpmlp::Activation::relu ? (y > 0 ? 1.0 : 0.0)
                     : t.act == dpmlp::Activation::tanh ? 1.0 - y * y : 1.0);
      }
      worst = std::max(worst, std::fabs(hc(at) - ref) / std::max(mag, 1e-30));
    }
  }
  INFO(t.m << " x " << t.n << " x " << t.k << (t.transposed ? " (W^T)" : "") << ", epilogue "
           << static_cast<int>(t.epilogue) << ", " << dpmlp::activation_name(t.act) << ": max error / sum |terms| "
           << worst);
  CHECK(worst <= 2e-6);
  CHECK(lo_wrong == 0);
  const int few = std::min(m, 100);
  const auto [hf, hf_lo] = run(few);
  CHECK(std::memcmp(hf.data(), hc.data(), sizeof(float) * std::size_t(few) * n) == 0);
  CHECK(std::memcmp(hf_lo.data(), hc_lo.data(), sizeof(float) * std::size_t(few) * n) == 0);
  // Both tile shapes of the Hopper kernels over all the rows.
  for (const int tile : {64, 128}) {
    const auto [ht, ht_lo] = run(m, tile);
    INFO("tile rows " << tile);
    CHECK(std::memcmp(ht.data(), hc.data(), sizeof(float) * std::size_t(m) * n) == 0);
    CHECK(std::memcmp(ht_lo.data(), hc_lo.data(), sizeof(float) * std::size_t(m) * n) == 0);
  }
}
}  // namespace

TEST_CASE("split GEMM: every epilogue at fp32 accuracy, exact lo parts, a row's bits whatever the rows",
          "[mlp][linalg][split]") {
  using dpmlp::Activation;
  using E = dpmlp::linalg::SplitEpilogue;
  // Rows no tile divides; one to 256 columns; from 16384 rows the Hopper kernels take 128-row tiles.
  const std::vector<SplitCase> cases = {
      {1000, 256, 256, false, E::bias_activation, Activation::relu},
      {997, 256, 256, true, E::activation_grad, Activation::tanh},
      {333, 200, 32, false, E::bias_activation, Activation::tanh},
      {300, 72, 64, true, E::activation_grad, Activation::relu},
      {1000, 1, 64, false, E::linear, Activation::identity},
      {16500, 64, 96, false, E::linear, Activation::identity},
  };
  std::mt19937 gen(23);
  for (const SplitCase& t : cases) check_split_gemm(t, gen);
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if constexpr (std::is_same<Space, Kokkos::Cuda>::value) {
    if (dpmlp::linalg::split_3xtf32::runs_here()) {
      // Many tiles a warpgroup (a persistent CTA takes a dozen in turn): no tile may start from another's
      // sums. The fp64 reference on every 97th row.
      check_split_gemm({100000, 256, 64, false, E::bias_activation, Activation::tanh}, gen, 97);
      check_split_gemm({100000, 256, 64, true, E::activation_grad, Activation::relu}, gen, 97);
    }
  }
#endif
  // TF32 keeps 10 mantissa bits: at 1 its ulp is 2^-10. Truncation drops the rest; the lo part is the rest
  // rounded to nearest, ties away from zero (PTX's cvt.rna.tf32.f32).
  namespace la = dpmlp::linalg;
  const float u = std::ldexp(1.0f, -10);
  CHECK(la::tf32_trunc(1.0f + u - std::ldexp(1.0f, -23)) == 1.0f);
  CHECK(la::tf32_rna(1.0f + u / 2) == 1.0f + u);
  CHECK(la::tf32_rna(-(1.0f + u / 2)) == -(1.0f + u));
  CHECK(la::tf32_rna(1.0f + u / 2 - std::ldexp(1.0f, -23)) == 1.0f);
  CHECK(la::tf32_lo(1.0f + u / 4) == u / 4);
  // 1 + 2^-12 + 2^-23: the rest, 2^-12 + 2^-23, lies halfway between TF32 neighbours 2^-22 apart: away from 0.
  CHECK(la::tf32_lo(1.0f + u / 4 + std::ldexp(1.0f, -23)) == u / 4 + std::ldexp(1.0f, -22));
  CHECK(std::isinf(la::tf32_rna(std::numeric_limits<float>::infinity())));
  CHECK(la::tf32_lo(-std::numeric_limits<float>::infinity()) == 0.0f);  // not inf - inf
}

TEST_CASE("cutlass: every layout and fused epilogue at fp32 accuracy, on shapes no tile divides", "[mlp][linalg]") {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if (std::is_same<Space, Kokkos::Cuda>::value) {
    using dpmlp::Activation;
    using dpmlp::linalg::Op;
    const std::vector<OddGemm> cases = {
        {Op::N, Op::N, 1000, 200, 36, 1, 1, Activation::relu, 1.0f, 0.0f},
        {Op::N, Op::N, 997, 64, 260, 1, 1, Activation::tanh, 1.0f, 0.0f},
        {Op::N, Op::N, 4096, 256, 256, 1, 0, Activation::identity, 0.5f, 2.0f},
        {Op::N, Op::T, 1000, 72, 200, 1, 2, Activation::tanh, 1.0f, 0.0f},
        {Op::N, Op::T, 777, 136, 36, 1, 2, Activation::relu, 1.0f, 0.0f},
        {Op::N, Op::T, 500, 40, 100, 1, 0, Activation::identity, 1.0f, 0.0f},  // n < 64: CUTLASS's kernels
        {Op::T, Op::N, 36, 200, 100, 3, 0, Activation::identity, 1.0f, 0.0f},
        {Op::T, Op::N, 256, 256, 1000, 2, 0, Activation::identity, 1.0f, 0.0f},
    };
    for (const bool f16x3 : {false, true}) {
      if (f16x3 && !f16x3_runs_here()) {
        WARN("the 3xFP16 GEMMs do not run on this build or device; their pass is not run");
        continue;
      }
      for (const OddGemm& t : cases) check_odd_gemm(t, f16x3);
    }
    return;
  }
#endif
  WARN("the CUTLASS 3xTF32 backend runs on CUDA builds with CUTLASS only; not run here");
}

TEST_CASE("cutlass: rows and columns of very different magnitudes keep fp32 accuracy", "[mlp][linalg]") {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if (std::is_same<Space, Kokkos::Cuda>::value) {
    // CUTLASS's 3xTF32 kernels, and the 3xFP16 ones, which scale each row of op(A) and each column of op(B)
    // over each 32 k (fp16's range is narrow): rows and columns
    // 2^-60 .. 2^60 apart (deltas beside activations), an all-zero row, a row with one value, and values
    // within a row 2^40 apart must each keep their own terms' fp32 accuracy, in every layout.
    using dpmlp::linalg::Op;
    const int m = 300, n = 96, k = 100;
    std::mt19937 gen(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> a(std::size_t(m) * k), b(std::size_t(k) * n);  // op(A) m x k and op(B) k x n, row-major
    for (int i = 0; i < m; ++i) {
      for (int p = 0; p < k; ++p) {
        float v = std::ldexp(nd(gen), -60 + 15 * (i % 9));
        if (i % 5 == 1 && p % 3 == 0) v = std::ldexp(v, -40);
        if (i == 7 || (i == 8 && p != 50)) v = 0.0f;
        a[std::size_t(i) * k + p] = v;
      }
    }
    for (int p = 0; p < k; ++p) {
      for (int j = 0; j < n; ++j) b[std::size_t(p) * n + j] = std::ldexp(nd(gen), -30 + 10 * (j % 7));
    }
    for (const bool f16x3 : {false, true}) {
      if (f16x3 && !f16x3_runs_here()) {
        WARN("the 3xFP16 GEMMs do not run on this build or device; their pass is not run");
        continue;
      }
      for (Op oa : {Op::N, Op::T}) {
        for (Op ob : {Op::N, Op::T}) {
          if (oa == Op::T && ob == Op::T) continue;
          Kokkos::View<float*, Memory> da("a", a.size()), db("b", b.size()), dc("c", std::size_t(m) * n);
          auto ha = Kokkos::create_mirror_view(da);
          auto hb = Kokkos::create_mirror_view(db);
          for (int i = 0; i < m; ++i) {
            for (int p = 0; p < k; ++p) {
              ha(oa == Op::N ? std::size_t(i) * k + p : std::size_t(p) * m + i) = a[std::size_t(i) * k + p];
            }
          }
          for (int p = 0; p < k; ++p) {
            for (int j = 0; j < n; ++j) {
              hb(ob == Op::N ? std::size_t(p) * n + j : std::size_t(j) * k + p) = b[std::size_t(p) * n + j];
            }
          }
          Kokkos::deep_copy(da, ha);
          Kokkos::deep_copy(db, hb);
          dpmlp::linalg::BatchedGemm<float> g;
          g.op_a = oa, g.op_b = ob, g.m = m, g.n = n, g.k = k;
          g.a = da.data(), g.lda = oa == Op::N ? k : m;
          g.b = db.data(), g.ldb = ob == Op::N ? n : k;
          g.c = dc.data(), g.ldc = n;
          g.blocks = oa == Op::T;
          g.f16x3 = f16x3;
          dpmlp::linalg::gemm(Space(), dpmlp::linalg::Backend::cutlass, g);
          auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dc);
          double worst = 0;
          for (int i = 0; i < m; ++i) {
            for (int j = 0; j < n; ++j) {
              double ref = 0, mag = 0;
              for (int p = 0; p < k; ++p) {
                const double t = double(a[std::size_t(i) * k + p]) * double(b[std::size_t(p) * n + j]);
                ref += t, mag += std::fabs(t);
              }
              const double err = std::fabs(double(hc(std::size_t(i) * n + j)) - ref);
              worst = dpmlp_test::nan_max(worst, mag > 0 ? err / mag : err);
            }
          }
          INFO("3xFP16 " << f16x3 << ", op " << (oa == Op::T ? 'T' : 'N') << (ob == Op::T ? 'T' : 'N')
               << ": max error / sum |terms| " << worst);
          CHECK(worst <= 2e-6);
        }
      }
    }
    return;
  }
#endif
  WARN("the CUTLASS 3xTF32 backend runs on CUDA builds with CUTLASS only; not run here");
}
