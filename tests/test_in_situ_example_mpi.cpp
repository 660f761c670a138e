// SPDX-License-Identifier: BSD-3-Clause
// The in-situ example of docs/in-situ.md, compiled and run at 1, 2 and 3 ranks (1 and 2 on GPU builds:
// tests/CMakeLists.txt): a "simulation" that owns its rows of a global grid in device Views, trains a
// surrogate on them every step (no copy), and evaluates the surrogate from its own kernel. The surrogate's error must drop. The code between the markers is the
// code the guide quotes; the last test case checks that the two copies agree.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <dpmlp/dpmlp.hpp>

#include "mpi_test_util.hpp"

// [in-situ example]
using Space = Kokkos::DefaultExecutionSpace;
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Space::memory_space>;
using Trainer = dpmlp::DataParallelTrainer<Space, dpmlp::default_communicator_t<Space>, dpmlp::Adam>;

// Each rank owns the grid points [first, first + n) of `points`; at time t its state is the field
// f(u, t) = 4 (u - 0.3 - 0.1 t)^2 at u = point / points. It learns a surrogate of f(u, t) as it runs.
std::vector<double> simulate_and_learn(MPI_Comm comm, std::int64_t points, int steps, int train_steps) {
  dpmlp::Mlp<float, Space::memory_space> model({2, 32, 1}, dpmlp::Activation::tanh);
  model.init_jax(dpmlp::random::PRNGKey(0), 0.5f);
  Trainer trainer(comm, model, points, dpmlp::Adam(0.01));
  const std::int64_t first = trainer.shard().first_row, n = trainer.shard().rows();
  Matrix x("x", n, 2), f("f", n, 1), pred("pred", n, 1);  // the simulation's own device arrays
  const auto surrogate = model.evaluator();                // reads the parameters in place
  std::vector<double> rms_error;
  for (int step = 0; step < steps; ++step) {
    const float t = 0.25f * step;
    Kokkos::parallel_for("simulate", Kokkos::RangePolicy<Space>(0, n), KOKKOS_LAMBDA(const std::int64_t i) {
      const float u = float(first + i) / float(points), c = 0.3f + 0.1f * t;
      x(i, 0) = u;
      x(i, 1) = t;
      f(i, 0) = 4.0f * (u - c) * (u - c);
    });
    trainer.set_data(x, f);  // the trainer keeps these Views: no copy
    trainer.train(train_steps);
    double sq = 0;  // the surrogate, called from the simulation's kernel
    Kokkos::parallel_reduce("use_surrogate", Kokkos::RangePolicy<Space>(0, n),
        KOKKOS_LAMBDA(const std::int64_t i, double& s) {
          surrogate(Kokkos::subview(x, i, Kokkos::ALL), Kokkos::subview(pred, i, Kokkos::ALL));
          s += double(pred(i, 0) - f(i, 0)) * double(pred(i, 0) - f(i, 0));
        }, sq);
    MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, comm);
    rms_error.push_back(std::sqrt(sq / double(points)));
  }
  return rms_error;
}
// [in-situ example]

TEST_CASE("in-situ example: a simulation trains a surrogate on its own device data", "[in-situ][example]") {
  const std::vector<double> err = simulate_and_learn(MPI_COMM_WORLD, 2048, 6, 150);
  REQUIRE(err.size() == 6);
  std::ostringstream trace;
  for (double e : err) trace << e << ' ';
  INFO("rms error of the surrogate after each time step's training: " << trace.str());
  CHECK(err.back() < 0.25 * err.front());
  CHECK(err.back() < 0.05);
  // The same error on every rank (the model is replicated, the error is reduced).
  double mine = err.back(), root = mine;
  MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  CHECK(dpmlp_test::all(mine == root));
}

TEST_CASE("in-situ example: docs/in-situ.md quotes this file's code", "[in-situ][example]") {
  auto between_markers = [](const std::string& path) {
    std::ifstream in(path);
    std::string line, text;
    int markers = 0;
    while (std::getline(in, line)) {
      if (line.find("// [in-situ example]") != std::string::npos) {
        ++markers;
        continue;
      }
      if (markers == 1) text += line + "\n";
    }
    return markers >= 2 ? text : std::string();
  };
  const std::string self = __FILE__;
  const std::string doc = self.substr(0, self.rfind("/tests/") + 1) + "docs/in-situ.md";
  if (self.find("/tests/") == std::string::npos || !std::ifstream(doc).good()) {
    WARN("docs/in-situ.md not found next to " << self << "; not compared");
    return;
  }
  const std::string code = between_markers(self), quoted = between_markers(doc);
  CHECK(!code.empty());
  CHECK(quoted == code);
}
