// SPDX-License-Identifier: BSD-3-Clause
// A small synthetic problem for trainer tests: data drawn per shard with dpmlp's JAX PRNG (so every rank
// count sees the same global rows), and a helper that trains it over a communicator.
#pragma once

#include <dpmlp/dpmlp.hpp>

#include <string>
#include <vector>

#include "check_util.hpp"

namespace dpmlp_test {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Memory>;

struct Problem {
  std::int64_t rows = 1000;
  std::vector<int> widths = {8, 16, 1};
  dpmlp::Activation activation = dpmlp::Activation::relu;
  std::uint64_t seed = 0;
};

// Rows [first, first + n) of the problem's x (n x inputs) and y (n x outputs).
inline void draw_rows(const Problem& p, std::int64_t first, std::int64_t n, Matrix& x, Matrix& y) {
  const int in = p.widths.front(), out = p.widths.back();
  const auto keys = dpmlp::random::split(dpmlp::random::PRNGKey(p.seed), 2);
  x = Matrix("x", n, in);
  y = Matrix("y", n, out);
  Kokkos::View<float*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> xf(x.data(), n * in), yf(y.data(), n * out);
  dpmlp::random::normal(Space(), keys[0], xf, static_cast<std::uint64_t>(first * in));
  dpmlp::random::normal(Space(), keys[1], yf, static_cast<std::uint64_t>(first * out));
  Space().fence();
}

struct Trained {
  std::vector<float> params;
  dpmlp::TrainResult result;
};

template <class Comm = dpmlp::MpiCommunicator, class Optimizer = dpmlp::Sgd>
Trained train(MPI_Comm comm, const Problem& p, int steps, const dpmlp::TrainerOptions& opt,
              const Optimizer& optimizer = Optimizer(0.05)) {
  dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
  model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
  dpmlp::DataParallelTrainer<Space, Comm, Optimizer> trainer(comm, model, p.rows, optimizer, opt);
  Matrix x, y;
  draw_rows(p, trainer.shard().first_row, trainer.shard().rows(), x, y);
  trainer.set_data(x, y);
  Trained t;
  t.result = trainer.train(steps);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  t.params.assign(h.data(), h.data() + h.extent(0));
  return t;
}

// The one-device reference: the same training on this rank alone.
template <class Comm = dpmlp::MpiCommunicator, class Optimizer = dpmlp::Sgd>
Trained train_alone(const Problem& p, int steps, const dpmlp::TrainerOptions& opt,
                    const Optimizer& optimizer = Optimizer(0.05)) {
  return train<Comm, Optimizer>(MPI_COMM_SELF, p, steps, opt, optimizer);
}

// An engine, and for the tensor engine one of its kernels.
struct EngineChoice {
  dpmlp::Engine engine = dpmlp::Engine::automatic;
  dpmlp::TensorKernel kernel = dpmlp::TensorKernel::automatic;
  void apply(dpmlp::EngineOptions& o) const {
    o.engine = engine;
    o.tensor_kernel = kernel;
  }
  std::string name() const {
    return std::string(dpmlp::engine_name(engine)) +
           (kernel == dpmlp::TensorKernel::automatic ? "" : std::string(" ") + dpmlp::tensor_kernel_name(kernel));
  }
};

// The one-kernel engines that can run `widths` on Space here: fused always; on CUDA with tensor cores the
// tensor engine, with each of its kernels that takes the model.
inline std::vector<EngineChoice> fused_engines(const std::vector<int>& widths,
                                               dpmlp::Activation act = dpmlp::Activation::relu) {
  std::vector<EngineChoice> engines{{dpmlp::Engine::fused}};
  dpmlp::Mlp<float, Memory> model(widths, act);
  for (const auto kernel : {dpmlp::TensorKernel::automatic, dpmlp::TensorKernel::warp_matrix,
                            dpmlp::TensorKernel::register_resident, dpmlp::TensorKernel::register_resident_paired}) {
    dpmlp::EngineOptions o;
    o.engine = dpmlp::Engine::tensor;
    o.tensor_kernel = kernel;
    try {
      (void)dpmlp::detail::BlockEngine<Space, float>::plan(model, o, true, 1000, 1);
      engines.push_back({dpmlp::Engine::tensor, kernel});
    } catch (const dpmlp::InputError&) {
    }
  }
  return engines;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = a.size() == b.size() ? 0.0 : 1e300;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = dpmlp_test::nan_max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return worst;
}

}  // namespace dpmlp_test
