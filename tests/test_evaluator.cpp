// SPDX-License-Identifier: BSD-3-Clause
// Device-callable inference: a model's evaluator called per row inside a user's own parallel_for, on the
// default execution space (the GPU in a CUDA build), against the library's own forward pass.
#include <catch2/catch.hpp>

#include <dpmlp/dpmlp.hpp>

#include <cmath>

#include "check_util.hpp"

namespace {
using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;
}  // namespace

TEST_CASE("an evaluator inside a user kernel matches the forward pass", "[evaluator]") {
  for (auto act : {dpmlp::Activation::relu, dpmlp::Activation::tanh, dpmlp::Activation::identity}) {
    for (const auto& widths : {std::vector<int>{32, 32, 1}, std::vector<int>{5, 1}, std::vector<int>{6, 17, 9, 3}}) {
      dpmlp::Mlp<float, Memory> model(widths, act);
      model.init_jax(dpmlp::random::PRNGKey(4), 0.4f);
      const int rows = 333, in = widths.front(), out = widths.back();
      Kokkos::View<float**, Kokkos::LayoutRight, Memory> x("x", rows, in), y("y", rows, out), got("got", rows, out);
      Kokkos::View<float*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> xf(x.data(), rows * in);
      dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(9), xf, 0);
      // The library's forward pass (the training engine's), as the reference.
      dpmlp::EngineOptions layered;
      layered.engine = dpmlp::Engine::layered;
      layered.block_rows = 64;
      using Engine = dpmlp::detail::BlockEngine<Space, float>;
      Engine engine(model, rows, Engine::plan(model, layered, true, rows, 1));
      engine.forward(Space(), x);
      // The user's kernel.
      const auto eval = model.evaluator();
      Kokkos::parallel_for(
          "user_kernel", Kokkos::RangePolicy<Space>(0, rows), KOKKOS_LAMBDA(const int r) {
            eval(Kokkos::subview(x, r, Kokkos::ALL), Kokkos::subview(got, r, Kokkos::ALL));
          });
      auto want = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), engine.output());
      auto have = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got);
      double worst = 0;
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < out; ++j) worst = dpmlp_test::nan_max(worst, double(std::fabs(want(r, j) - have(r, j))));
      INFO(widths.size() - 1 << " layers, " << dpmlp::activation_name(act));
      CHECK(worst < 1e-5);
    }
  }
}

TEST_CASE("an evaluator refuses a model wider than its stack buffers", "[evaluator]") {
  dpmlp::Mlp<float, Memory> wide({4, 300, 1});
  CHECK_THROWS_AS(wide.evaluator(), dpmlp::InputError);
  CHECK_NOTHROW(wide.evaluator<512>());
}
