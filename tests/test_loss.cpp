// SPDX-License-Identifier: BSD-3-Clause
// The losses (loss.hpp): their terms against PyTorch's (tests/data/loss_reference.json, made by
// tests/data/loss_reference.py), and value_and_grad of each, with and without output weights, against an fp64
// Eigen reference on every engine that runs here (layered with each GEMM, fused, and on tensor-core GPUs each
// tensor kernel), on deep models and on the one-hidden-layer shapes the fused engines take. Unit weights give
// the unweighted bits; bad settings are refused.
#include <catch2/catch.hpp>

#include <dpmlp/dpmlp.hpp>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "check_util.hpp"
#include "mlp_reference.hpp"
#include "json_lite.hpp"

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;
using dpmlp_test::MatD;
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Memory>;

// A loss as data: the test's fp64 reference reads it, with_loss() makes the dpmlp type.
struct LossSpec {
  std::string kind;  // "mse", "l1", "huber"
  double delta = 1.0;
  std::vector<double> weights;
  std::string name() const {
    std::string s = kind;
    if (kind == "huber") s += "(" + std::to_string(delta) + ")";
    if (!weights.empty()) s += " weighted";
    return s;
  }
};

template <class F>
auto with_loss(const LossSpec& s, F&& f) {
  if (s.kind == "mse") return f(dpmlp::Mse(s.weights));
  if (s.kind == "l1") return f(dpmlp::L1(s.weights));
  return f(dpmlp::Huber(s.delta, s.weights));
}

// The fp64 loss l(d) and its derivative l'(d), as loss.hpp defines them.
double ref_l(const LossSpec& s, double d) {
  if (s.kind == "mse") return d * d;
  if (s.kind == "l1") return std::fabs(d);
  const double a = std::fabs(d);
  return a <= s.delta ? 0.5 * d * d : s.delta * (a - 0.5 * s.delta);
}
double ref_dl(const LossSpec& s, double d) {
  if (s.kind == "mse") return 2 * d;
  if (s.kind == "l1") return d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
  return std::max(-s.delta, std::min(s.delta, d));
}

using dpmlp_test::backprop;
using dpmlp_test::forward;
using dpmlp_test::Net;
using dpmlp_test::unpack;

// The fp64 reference: loss = sum_rj w_j l(d_rj) / (rows * outputs) and its gradient in dpmlp's parameter layout.
// regimes[0], [1]: the predictions with |d| <= delta and > delta (Huber's two branches).
double reference(const std::vector<int>& widths, dpmlp::Activation act, const LossSpec& s, const std::vector<double>& p,
                 const MatD& x, const MatD& y, std::vector<double>& grad, int (&regimes)[2]) {
  const Net n = unpack(widths, p);
  const std::vector<MatD> A = forward(n, act, x);
  const int L = static_cast<int>(n.W.size());
  const MatD r = A[L] - y;
  const double count = static_cast<double>(r.size());
  MatD delta(r.rows(), r.cols());
  double loss = 0;
  regimes[0] = regimes[1] = 0;
  for (int i = 0; i < r.rows(); ++i) {
    for (int j = 0; j < r.cols(); ++j) {
      const double w = s.weights.empty() ? 1.0 : s.weights[j];
      loss += w * ref_l(s, r(i, j));
      delta(i, j) = w * ref_dl(s, r(i, j)) / count;
      ++regimes[std::fabs(r(i, j)) <= s.delta ? 0 : 1];
    }
  }
  backprop(widths, n, act, A, delta, grad);
  return loss / count;
}

std::vector<double> host_vector(const Kokkos::View<float*, Memory>& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

Matrix to_device(const MatD& m) {
  Matrix v("m", m.rows(), m.cols());
  auto h = Kokkos::create_mirror_view(v);
  for (int i = 0; i < m.rows(); ++i) {
    for (int j = 0; j < m.cols(); ++j) h(i, j) = static_cast<float>(m(i, j));
  }
  Kokkos::deep_copy(v, h);
  return v;
}

struct Problem {
  std::vector<int> widths;
  dpmlp::Activation act;
  int rows;
};

// A problem's data, in float (held as doubles for the reference): x and y standard normal, targets 0.5 apart
// from the fp64 predictions at least 1e-3 (L1's derivative jumps at d = 0: a difference within float rounding of
// 0 could take either sign), and for relu no hidden pre-activation within 1e-4 of the kink.
struct Data {
  MatD x, y;
};
Data make_data(const Problem& pr, const std::vector<double>& p, std::mt19937& gen) {
  std::normal_distribution<double> normal;
  auto draw = [&] { return double(float(normal(gen))); };
  const int in = pr.widths.front(), out = pr.widths.back();
  Data d{MatD(pr.rows, in), MatD(pr.rows, out)};
  for (int i = 0; i < d.x.size(); ++i) d.x.data()[i] = draw();
  for (int i = 0; i < d.y.size(); ++i) d.y.data()[i] = draw();
  const Net n = unpack(pr.widths, p);
  if (pr.act == dpmlp::Activation::relu) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      int redrawn = 0;
      for (int r = 0; r < d.x.rows(); ++r) {
        Eigen::RowVectorXd a = d.x.row(r);
        bool kink = false;
        for (std::size_t l = 0; l + 1 < n.W.size() && !kink; ++l) {
          const Eigen::RowVectorXd z = a * n.W[l] + n.b[l];
          kink = (z.array().abs() < 1e-4).any();
          a = z.cwiseMax(0.0);
        }
        if (kink) {
          for (int c = 0; c < in; ++c) d.x(r, c) = draw();
          ++redrawn;
        }
      }
      if (redrawn == 0) break;
    }
  }
  const MatD pred = forward(n, pr.act, d.x).back();
  for (int i = 0; i < d.y.size(); ++i) {
    if (std::fabs(pred.data()[i] - d.y.data()[i]) < 1e-3) d.y.data()[i] = double(float(d.y.data()[i] + 0.01));
  }
  return d;
}

// Per-output weights for `outputs` outputs: varied, one of them 0 from three outputs on (an output that is not
// learned), more than LossWeights::inline_count of them for wide outputs (the layered engine's path through
// device memory).
std::vector<double> some_weights(int outputs) {
  const double pattern[] = {2.5, 0.5, 0.0, 1.75, 3.0, 0.25, 1.5, 0.75};
  std::vector<double> w(static_cast<std::size_t>(outputs));
  for (int j = 0; j < outputs; ++j) w[j] = pattern[j % 8];
  return w;
}

std::vector<LossSpec> losses_for(int outputs) {
  const std::vector<double> w = some_weights(outputs);
  return {{"mse", 1.0, {}},  {"mse", 1.0, w},  {"l1", 1.0, {}},
          {"l1", 1.0, w},    {"huber", 0.5, {}}, {"huber", 1.0, w}};
}

// The plan for `loss` (its type), or nullopt where the options cannot run here.
template <class Loss = dpmlp::Mse>
std::optional<dpmlp::EnginePlan> plan_or_none(const dpmlp::Mlp<float, Memory>& model, std::int64_t rows,
                                              const dpmlp::EngineOptions& o, const Loss& = Loss()) {
  try {
    return dpmlp::detail::BlockEngine<Space, float, Loss>::plan(model, o, true, rows, 1);
  } catch (const dpmlp::InputError&) {
    return std::nullopt;
  }
}

std::string describe(const dpmlp::EngineOptions& o) {
  return std::string(dpmlp::engine_name(o.engine)) + " " + dpmlp::tensor_kernel_name(o.tensor_kernel) + ", gemm " +
         (o.gemm ? dpmlp::linalg::backend_name(*o.gemm) : "the plan's") + ", block " + std::to_string(o.block_rows);
}

// value_and_grad of every loss, on every engine configuration of `configs` that runs the problem here, against
// the fp64 reference: the loss within 1e-5 relative and the gradient's relative error (2-norm) below 1e-5.
// Returns the number of (loss, configuration) pairs checked; huber_regimes counts Huber's predictions in each
// branch over them.
int check_problem(const Problem& pr, const std::vector<dpmlp::EngineOptions>& configs, std::mt19937& gen,
                  int (&huber_regimes)[2]) {
  dpmlp::Mlp<float, Memory> model(pr.widths, pr.act);
  model.init_jax(dpmlp::random::PRNGKey(3), 0.5f);
  const std::vector<double> p = host_vector(model.params());
  const Data data = make_data(pr, p, gen);
  const Matrix x = to_device(data.x), y = to_device(data.y);
  Kokkos::View<float*, Memory> grad("grad", model.num_params());
  int checked = 0;
  for (const LossSpec& s : losses_for(pr.widths.back())) {
    std::vector<double> gref;
    int regimes[2];
    const double lref = reference(pr.widths, pr.act, s, p, data.x, data.y, gref, regimes);
    if (s.kind == "huber") {
      huber_regimes[0] += regimes[0];
      huber_regimes[1] += regimes[1];
    }
    for (const auto& o : configs) {
      if (!with_loss(s, [&](const auto& l) { return plan_or_none(model, pr.rows, o, l).has_value(); })) continue;
      const float loss =
          with_loss(s, [&](const auto& l) { return dpmlp::value_and_grad(Space(), model, x, y, grad, l, o); });
      const auto g = host_vector(grad);
      double num = 0, den = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        num += (g[i] - gref[i]) * (g[i] - gref[i]);
        den += gref[i] * gref[i];
      }
      INFO("loss " << s.name() << ", widths " << pr.widths.size() << " layers (" << pr.widths.front() << " -> ... -> "
                   << pr.widths.back() << "), act " << dpmlp::activation_name(pr.act) << ", rows " << pr.rows
                   << ", " << describe(o) << ": loss " << loss << " vs " << lref << ", gradient error "
                   << std::sqrt(num / den));
      CHECK(std::fabs(loss - lref) <= 1e-5 * std::max(1.0, lref));
      CHECK(std::sqrt(num / den) < 1e-5);
      ++checked;
    }
  }
  return checked;
}

std::vector<dpmlp::EngineOptions> one_hidden_configs() {
  std::vector<dpmlp::EngineOptions> configs;
  for (std::int64_t block : {std::int64_t(0), std::int64_t(16), std::int64_t(100)}) {
    dpmlp::EngineOptions o;
    o.block_rows = block;
    configs.push_back(o);  // automatic: tensor on tensor-core GPUs, else fused on devices, else layered
    o.engine = dpmlp::Engine::layered;
    configs.push_back(o);
    o.engine = dpmlp::Engine::fused;
    configs.push_back(o);
    o.engine = dpmlp::Engine::tensor;
    for (const auto kernel : {dpmlp::TensorKernel::warp_matrix, dpmlp::TensorKernel::register_resident,
                              dpmlp::TensorKernel::register_resident_paired}) {
      o.tensor_kernel = kernel;
      configs.push_back(o);
    }
  }
  return configs;
}

std::vector<dpmlp::EngineOptions> deep_configs() {
  std::vector<dpmlp::EngineOptions> configs;
  for (std::int64_t block : {std::int64_t(0), std::int64_t(96)}) {
    dpmlp::EngineOptions o;
    o.block_rows = block;
    configs.push_back(o);  // the space's GEMMs (Eigen on hosts; CUTLASS or cuBLASLt on CUDA)
    o.gemm = dpmlp::linalg::Backend::portable;
    configs.push_back(o);
  }
  return configs;
}

}  // namespace

TEST_CASE("the losses' terms give PyTorch's loss and gradient", "[loss][reference]") {
  const auto ref = json_lite::parse_file(DPMLP_REFERENCE_DIR "/loss_reference.json");
  const int rows = static_cast<int>(ref["rows"].as_double()), outputs = static_cast<int>(ref["outputs"].as_double());
  const double scale = 1.0 / (double(rows) * outputs);
  int checked = 0;
  for (std::size_t c = 0; c < ref["cases"].size(); ++c) {
    const auto& cs = ref["cases"][c];
    LossSpec s;
    s.kind = cs["kind"].as_string();
    if (cs.contains("delta")) s.delta = cs["delta"].as_double();
    for (std::size_t j = 0; j < cs["weights"].size(); ++j) s.weights.push_back(cs["weights"][j].as_double());
    INFO("case " << cs["name"].as_string());
    // In double, with the weights as dpmlp's engines hold them (LossWeights), and in float.
    auto run = [&](auto zero) {
      using Scalar = decltype(zero);
      return with_loss(s, [&](const auto& loss) {
        loss.validate(outputs);
        dpmlp::LossWeights<Scalar> w;
        for (int j = 0; j < outputs && !s.weights.empty(); ++j) w.first[j] = static_cast<Scalar>(s.weights[j]);
        const auto term = loss.template term<Scalar>(w);
        double worst_grad = 0, sum = 0;
        for (int i = 0; i < rows * outputs; ++i) {
          const int j = i % outputs;
          const Scalar d = static_cast<Scalar>(ref["pred"][i].as_double()) - static_cast<Scalar>(ref["y"][i].as_double());
          sum += static_cast<double>(term.value(d, j));
          const double g = static_cast<double>(term.grad(d, j, static_cast<Scalar>(scale)));
          worst_grad = dpmlp_test::nan_max(worst_grad, std::fabs(g - cs["grad"][i].as_double()));
        }
        const double want = cs["loss"].as_double();
        return std::pair<double, double>(std::fabs(sum * scale - want) / std::max(1.0, std::fabs(want)), worst_grad);
      });
    };
    const auto d = run(0.0);
    const auto f = run(0.0f);
    CHECK(d.first <= 1e-14);
    CHECK(d.second <= 1e-15);  // gradients of order scale (0.05)
    CHECK(f.first <= 1e-6);
    CHECK(f.second <= 1e-7);
    ++checked;
  }
  CHECK(checked == 8);
}

TEST_CASE("L1's gradient at d = 0 is 0, Huber's terms meet at |d| = delta", "[loss]") {
  const dpmlp::L1::Term<float> l1{};
  CHECK(l1.grad(0.0f, 0, 1.0f) == 0.0f);
  CHECK(l1.grad(-0.0f, 0, 1.0f) == 0.0f);
  CHECK(l1.grad(1e-30f, 0, 1.0f) == 1.0f);
  CHECK(l1.grad(-1e-30f, 0, 1.0f) == -1.0f);
  CHECK(l1.value(-3.0f, 0) == 3.0f);
  const auto huber = dpmlp::Huber(0.5).term<double>(dpmlp::LossWeights<double>());
  CHECK(huber.value(0.5, 0) == 0.125);   // 0.5 d^2
  CHECK(huber.value(-0.5, 0) == 0.125);  // delta (|d| - 0.5 delta): the same at the boundary
  CHECK(huber.value(2.0, 0) == 0.5 * (2.0 - 0.25));
  CHECK(huber.grad(0.25, 0, 1.0) == 0.25);
  CHECK(huber.grad(3.0, 0, 1.0) == 0.5);
  CHECK(huber.grad(-3.0, 0, 1.0) == -0.5);
  CHECK(dpmlp::Huber().delta == 1.0);  // torch.nn.HuberLoss's default
  for (float d : {0.0f, -0.0f}) {
    for (const auto value : {dpmlp::Mse().term<float>({}).value(d, 0), dpmlp::L1().term<float>({}).value(d, 0),
                             dpmlp::Huber(0.3).term<float>({}).value(d, 0)}) {
      CHECK(value == 0.0f);  // the layered engine gives rows outside a mini-batch d = 0
    }
  }
}

TEST_CASE("each loss on one-hidden-layer models matches the fp64 reference, every engine", "[loss][fused]") {
  // Both input tiers of the fused engines (32, 64), several hidden paddings, 1-4 outputs; one output with relu
  // or identity is the register-resident tensor kernel's mask form.
  const std::vector<Problem> problems = {
      {{32, 32, 1}, dpmlp::Activation::relu, 1000}, {{3, 5, 2}, dpmlp::Activation::tanh, 123},
      {{40, 100, 4}, dpmlp::Activation::identity, 77}, {{12, 64, 1}, dpmlp::Activation::identity, 300},
      {{20, 128, 3}, dpmlp::Activation::tanh, 400},
  };
  std::mt19937 gen(17);
  int regimes[2] = {0, 0}, checked = 0;
  for (const auto& pr : problems) checked += check_problem(pr, one_hidden_configs(), gen, regimes);
  // 6 losses x 5 problems x (automatic, layered, fused) x 3 blocks at least; more with the tensor kernels.
  CHECK(checked >= 6 * 5 * 3 * 3);
  INFO("Huber: " << regimes[0] << " predictions with |d| <= delta, " << regimes[1] << " beyond");
  CHECK(regimes[0] > 100);
  CHECK(regimes[1] > 100);
}

TEST_CASE("each loss on deep models matches the fp64 reference, every GEMM path", "[loss][deep]") {
  // Seven outputs: more weights than LossWeights holds inline (the layered engine reads the rest from memory).
  const std::vector<Problem> problems = {
      {{32, 64, 64, 1}, dpmlp::Activation::relu, 500},
      {{6, 24, 24, 3}, dpmlp::Activation::tanh, 333},
      {{5, 9, 9, 7}, dpmlp::Activation::tanh, 250},
  };
  std::mt19937 gen(19);
  int regimes[2] = {0, 0}, checked = 0;
  for (const auto& pr : problems) checked += check_problem(pr, deep_configs(), gen, regimes);
  CHECK(checked == 6 * 3 * 4);
  CHECK(regimes[0] > 100);
  CHECK(regimes[1] > 100);
}

TEST_CASE("unit weights give the unweighted bits, weights of 2 exactly twice them", "[loss]") {
  const std::vector<Problem> problems = {{{3, 5, 2}, dpmlp::Activation::tanh, 123},
                                         {{5, 9, 9, 6}, dpmlp::Activation::relu, 200}};
  std::mt19937 gen(23);
  for (const auto& pr : problems) {
    dpmlp::Mlp<float, Memory> model(pr.widths, pr.act);
    model.init_jax(dpmlp::random::PRNGKey(3), 0.5f);
    const Data data = make_data(pr, host_vector(model.params()), gen);
    const Matrix x = to_device(data.x), y = to_device(data.y);
    const int outputs = pr.widths.back();
    Kokkos::View<float*, Memory> g("g", model.num_params()), g1("g1", model.num_params()), g2("g2", model.num_params());
    std::vector<dpmlp::EngineOptions> configs = deep_configs();
    for (auto o : deep_configs()) {
      o.engine = dpmlp::Engine::fused;
      configs.push_back(o);
    }
    for (const auto& o : configs) {
      for (LossSpec s : {LossSpec{"mse", 1.0, {}}, LossSpec{"l1", 1.0, {}}, LossSpec{"huber", 0.7, {}}}) {
        if (!with_loss(s, [&](const auto& l) { return plan_or_none(model, pr.rows, o, l).has_value(); })) continue;
        INFO("loss " << s.name() << ", " << pr.widths.size() << " layers, " << describe(o));
        auto vag = [&](const Kokkos::View<float*, Memory>& into) {
          return with_loss(s, [&](const auto& l) { return dpmlp::value_and_grad(Space(), model, x, y, into, l, o); });
        };
        const float plain = vag(g);
        s.weights.assign(outputs, 1.0);
        const float ones = vag(g1);
        s.weights.assign(outputs, 2.0);
        const float twos = vag(g2);
        const auto a = host_vector(g), b = host_vector(g1), c = host_vector(g2);
        CHECK(std::memcmp(&plain, &ones, sizeof(float)) == 0);
        CHECK(twos == 2 * plain);
        CHECK(a == b);
        bool doubled = true;
        for (std::size_t i = 0; i < a.size(); ++i) doubled = doubled && c[i] == 2 * a[i];
        CHECK(doubled);
      }
    }
  }
}

// The tensor engine's kernels are compiled once, for Mse: L1 and Huber run on the fused engine where the tensor
// engine would run (Engine::automatic), and asking for the tensor engine with them is refused with the reason.
TEST_CASE("the tensor engine computes Mse; other losses are planned on the other engines", "[loss][tensor]") {
  using dpmlp::detail::BlockEngine;
  const dpmlp::Mlp<float, Memory> model({32, 32, 1});
  dpmlp::EngineOptions tensor;
  tensor.engine = dpmlp::Engine::tensor;
  const auto mse = BlockEngine<Space, float>::plan(model, {}, true, 20000, 1);
  const auto l1 = BlockEngine<Space, float, dpmlp::L1>::plan(model, {}, true, 20000, 1);
  const auto huber = BlockEngine<Space, float, dpmlp::Huber>::plan(model, {}, true, 20000, 1);
  CHECK(l1.engine != dpmlp::Engine::tensor);
  CHECK(huber.engine != dpmlp::Engine::tensor);
  const std::string why = dpmlp::detail::tensor_unsupported(dpmlp::model_shape(model), BlockEngine<Space, float>::caps(model));
  const std::string l1_why = dpmlp_test::refusal([&] { BlockEngine<Space, float, dpmlp::L1>::plan(model, tensor, true, 20000, 1); });
  if (why.empty()) {
    // Here the tensor engine runs the MSE: the other losses take the fused engine, which this space runs.
    CHECK(mse.engine == dpmlp::Engine::tensor);
    CHECK(l1.engine == dpmlp::Engine::fused);
    CHECK(huber.engine == dpmlp::Engine::fused);
    CHECK_THAT(l1_why, Catch::Contains("the tensor engine computes the mean squared error (dpmlp::Mse) only, not l1"));
  } else {
    CHECK(mse.engine != dpmlp::Engine::tensor);
    CHECK(l1.engine == mse.engine);
    CHECK_THAT(l1_why, Catch::Contains(why));  // the space's own reason comes first
  }
}

TEST_CASE("bad loss settings are refused with the reason", "[loss]") {
  dpmlp::Mlp<float, Memory> model({3, 4, 2});
  Matrix x("x", 10, 3), y("y", 10, 2);
  Kokkos::View<float*, Memory> grad("grad", model.num_params());
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  auto refusal = [&](const auto& loss) {
    return dpmlp_test::refusal([&] { dpmlp::value_and_grad(Space(), model, x, y, grad, loss); });
  };
  using Catch::Contains;
  CHECK_THAT(refusal(dpmlp::Huber(0.0)), Contains("dpmlp::Huber: delta must be positive and finite, got 0"));
  CHECK_THAT(refusal(dpmlp::Huber(-1.0)), Contains("delta must be positive and finite, got -1"));
  CHECK_THAT(refusal(dpmlp::Huber(nan)), Contains("delta must be positive and finite, got nan"));
  CHECK_THAT(refusal(dpmlp::Huber(inf)), Contains("delta must be positive and finite, got inf"));
  CHECK_THAT(refusal(dpmlp::Mse({1.0})), Contains("dpmlp::Mse: 1 output weights for a model of 2 outputs"));
  CHECK_THAT(refusal(dpmlp::L1({1.0, 2.0, 3.0})), Contains("dpmlp::L1: 3 output weights for a model of 2 outputs"));
  CHECK_THAT(refusal(dpmlp::Mse({1.0, -0.5})), Contains("output weight 1 is -0.5; weights must be finite and >= 0"));
  CHECK_THAT(refusal(dpmlp::L1({nan, 1.0})), Contains("output weight 0 is nan"));
  CHECK_THAT(refusal(dpmlp::Huber(1.0, {1.0, inf})), Contains("output weight 1 is inf"));
  CHECK_THAT(refusal(dpmlp::Mse({0.0, 0.0})), Contains("every output weight is 0"));
  // The engine itself refuses too (it is what the trainer's engines are made of).
  const auto plan = dpmlp::detail::BlockEngine<Space, float, dpmlp::Huber>::plan(model, {}, true, 10, 1);
  CHECK_THAT(dpmlp_test::refusal([&] { dpmlp::detail::BlockEngine<Space, float, dpmlp::Huber>(model, 10, plan, dpmlp::Huber(-2)); }),
             Contains("delta must be positive"));
  // And good ones pass: a zero weight among others, no weights, a tiny delta.
  CHECK(refusal(dpmlp::Mse({0.0, 1.0})).empty());
  CHECK(refusal(dpmlp::L1()).empty());
  CHECK(refusal(dpmlp::Huber(1e-6, {3.0, 0.5})).empty());
  CHECK(dpmlp::Huber(0.5, {1, 2}).describe() == "huber(delta=0.5), weights [1, 2]");
  CHECK(dpmlp::Mse().describe() == "mse");
}
