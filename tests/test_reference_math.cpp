// SPDX-License-Identifier: BSD-3-Clause
// The maths against independent references, not the library against itself:
// - the optimizers' updates against PyTorch's torch.optim (tests/data/optim_reference.json, made by
//   tests/data/optim_reference.py in float64 from fixed parameters and gradients);
// - a block's partial sums (the loss and the output layer's bias gradient) against a host sum over the block's
//   rows in the order the engine documents: increasing row order on host spaces; on device spaces 256 lanes
//   (lane w: rows w, w + 256, ... in order) combined by a fixed pairwise tree (block_engine.hpp).
#include <catch2/catch.hpp>

#include <dpmlp/dpmlp.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "json_lite.hpp"

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;

// Runs `opt` over the reference's gradients in Scalar; the largest difference to PyTorch's parameters over
// every step and entry, relative to max(1, |parameter|) (the parameters are of order 1; a float parameter
// carries its rounding of about 6e-8 from step to step).
// clip > 0: each step's gradient is first scaled as TrainerOptions::clip_grad_norm documents (torch's
// clip_grad_norm_: by min(1, clip / (||g|| + 1e-6))).
template <class Scalar, class Optimizer>
double worst_against_torch(const Optimizer& opt, const json_lite::Value& ref, const json_lite::Value& after,
                           double clip = 0) {
  const std::size_t n = ref["initial"].size();
  std::vector<Scalar> p(n), state(opt.state_size(n), Scalar(0));
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<Scalar>(ref["initial"][i].as_double());
  double worst = 0;
  double scalars[dpmlp::step_scalars] = {};
  for (std::size_t t = 0; t < ref["grads"].size(); ++t) {
    if (opt.per_step()) opt.prepare(static_cast<std::int64_t>(t + 1), scalars);
    const auto update = opt.template step<Scalar>(scalars);
    Scalar coefficient = 1;
    if (clip > 0) {
      double sq = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double g = static_cast<Scalar>(ref["grads"][t][i].as_double());
        sq += g * g;
      }
      coefficient = static_cast<Scalar>(std::min(1.0, clip / (std::sqrt(sq) + 1e-6)));
    }
    for (std::size_t i = 0; i < n; ++i) {
      update(static_cast<std::int64_t>(i), static_cast<std::int64_t>(n), p.data(),
             static_cast<Scalar>(ref["grads"][t][i].as_double()) * coefficient, state.data());
    }
    for (std::size_t i = 0; i < n; ++i) {
      const double want = after[t][i].as_double();
      const double rel = std::fabs(static_cast<double>(p[i]) - want) / std::max(1.0, std::fabs(want));
      worst = std::isnan(rel) ? 1e300 : std::max(worst, rel);
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("optimizers: the parameters PyTorch's torch.optim gives, step by step", "[reference][optim]") {
  const auto ref = json_lite::parse_file(DPMLP_REFERENCE_DIR "/optim_reference.json");
  int checked = 0;
  for (std::size_t c = 0; c < ref["cases"].size(); ++c) {
    const auto& cs = ref["cases"][c];
    const std::string name = cs["name"].as_string();
    const auto& s = cs["settings"];
    INFO("case " << name);
    const double clip = cs.contains("clip_grad_norm") ? cs["clip_grad_norm"].as_double() : 0.0;
    dpmlp::LrSchedule schedule;
    if (cs.contains("schedule")) {
      const auto& sc = cs["schedule"];
      const std::string kind = sc["kind"].as_string();
      if (kind == "step_decay") {
        schedule = dpmlp::LrSchedule::step_decay(static_cast<std::int64_t>(sc["step_size"].as_double()),
                                                 sc["gamma"].as_double());
      } else if (kind == "exponential") {
        schedule = dpmlp::LrSchedule::exponential(sc["gamma"].as_double());
      } else {
        REQUIRE(kind == "cosine");
        schedule = dpmlp::LrSchedule::cosine(static_cast<std::int64_t>(sc["t_max"].as_double()),
                                             sc["min_factor"].as_double());
      }
      if (sc.contains("warmup")) {
        schedule = schedule.with_warmup(static_cast<std::int64_t>(sc["warmup"].as_double()),
                                        sc["warmup_start"].as_double());
      }
      REQUIRE_NOTHROW(schedule.validate("test"));
    }
    if (name.rfind("sgd", 0) == 0) {
      const dpmlp::Sgd opt(s["lr"].as_double(), s.contains("momentum") ? s["momentum"].as_double() : 0.0, schedule);
      CHECK(opt.per_step() == !schedule.is_constant());
      CHECK(worst_against_torch<double>(opt, ref, cs["after"], clip) < 1e-12);
      CHECK(worst_against_torch<float>(opt, ref, cs["after"], clip) < 1e-6);
    } else {
      dpmlp::Adam opt(s["lr"].as_double(), schedule);
      opt.beta1 = s["betas"][0].as_double();
      opt.beta2 = s["betas"][1].as_double();
      opt.epsilon = s["eps"].as_double();
      if (name.rfind("adamw", 0) == 0) opt.weight_decay = s["weight_decay"].as_double();
      CHECK(worst_against_torch<double>(opt, ref, cs["after"], clip) < 1e-12);
      CHECK(worst_against_torch<float>(opt, ref, cs["after"], clip) < 1e-6);
    }
    ++checked;
  }
  CHECK(checked == 11);
}

namespace {

// The engine's documented order for a block's sum of one column: row order on host spaces; on device spaces
// 256 lanes, lane w over rows w, w + 256, ... in order, then s[w] += s[w + h] for h = 128, 64, ..., 1.
float documented_block_sum(const std::vector<float>& v, std::int64_t begin, std::int64_t end) {
  if (dpmlp::is_host_space<Space>()) {
    float sum = 0;
    for (std::int64_t r = begin; r < end; ++r) sum += v[r];
    return sum;
  }
  constexpr int lanes = 256;
  float s[lanes];
  for (int w = 0; w < lanes; ++w) {
    float sum = 0;
    for (std::int64_t r = begin + w; r < end; r += lanes) sum += v[r];
    s[w] = sum;
  }
  for (int h = lanes / 2; h >= 1; h /= 2) {
    for (int w = 0; w < h; ++w) s[w] += s[w + h];
  }
  return s[0];
}

}  // namespace

TEST_CASE("block sums: the loss and the output bias gradient in the documented row order", "[reference][mlp]") {
  // The layered engine (any depth, any space), a short last block; one output, so the output layer's delta is
  // (2 * scale) * (prediction - y), which the host recomputes from the engine's own predictions.
  const std::vector<int> widths = {6, 9, 7, 1};
  const std::int64_t rows = 1000, block = 96;
  dpmlp::Mlp<float, Memory> model(widths, dpmlp::Activation::tanh);
  model.init_jax(dpmlp::random::PRNGKey(4), 0.5f);
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> x("x", rows, widths.front()), y("y", rows, 1);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  std::mt19937 gen(3);
  std::normal_distribution<float> nd;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < widths.front(); ++c) hx(r, c) = nd(gen);
    hy(r, 0) = nd(gen);
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  dpmlp::EngineOptions o;
  o.engine = dpmlp::Engine::layered;
  o.block_rows = block;
  const auto plan = dpmlp::detail::BlockEngine<Space, float>::plan(model, o, true, rows, 1);
  dpmlp::detail::BlockEngine<Space, float> engine(model, rows, plan);
  const float scale = 1.0f / rows;
  engine.compute(Space(), x, y, scale);
  Space().fence();
  auto pred = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), engine.output());
  auto part = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), engine.partials());
  std::vector<float> sq(rows), delta(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float res = pred(r, 0) - hy(r, 0);
    sq[r] = res * res;
    delta[r] = 2.0f * scale * res;
  }
  const std::int64_t width = engine.width();
  const std::size_t bias = model.bias_offset(model.layers() - 1);
  const std::int64_t blocks = (rows + block - 1) / block;
  REQUIRE(engine.blocks() == blocks);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t begin = b * block, end = std::min(rows, begin + block);
    const float loss = documented_block_sum(sq, begin, end), db = documented_block_sum(delta, begin, end);
    INFO("block " << b);
    CHECK(std::memcmp(&part(b, width - 1), &loss, sizeof(float)) == 0);
    CHECK(std::memcmp(&part(b, bias), &db, sizeof(float)) == 0);
  }
}
