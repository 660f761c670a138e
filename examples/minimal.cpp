// SPDX-License-Identifier: BSD-3-Clause
// examples/minimal.cpp: the smallest complete dpmlp program. Every MPI rank holds a shard of a synthetic
// regression data set; all ranks train one MLP together (each step's gradient is summed over the ranks).
//   mpirun -np 2 ./minimal
// The losses it prints are the same, bit for bit, at any number of ranks.
#include <dpmlp/dpmlp.hpp>

#include <cstdint>
#include <cstdio>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  // Kokkos after MPI; on a GPU build each rank takes its node-local rank's GPU.
  dpmlp::initialize_kokkos_for_rank(MPI_COMM_WORLD);
  int status = 0;
  {  // Every Kokkos View (model, trainer, data) lives in this scope, so all are freed before Kokkos::finalize.
    using Space = Kokkos::DefaultExecutionSpace;
    using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Space::memory_space>;
    const std::int64_t rows = 4096;  // the whole data set, over all ranks
    const int inputs = 8;

    dpmlp::Mlp<float, Space::memory_space> model({inputs, 32, 1});  // 8 inputs, 32 hidden ReLU units, 1 output
    model.init_jax(dpmlp::random::PRNGKey(1), 0.1f);               // normal * 0.1 as JAX draws it, zero biases
    dpmlp::DataParallelTrainer<Space> trainer(MPI_COMM_WORLD, model, rows, dpmlp::Sgd(0.05));

    // This rank's rows are [shard.first_row, shard.end_row) of the data set. Each value depends on its global
    // row alone, so together the ranks hold the same data whatever their number.
    const dpmlp::Shard shard = trainer.shard();
    Matrix x("x", shard.rows(), inputs), y("y", shard.rows(), 1);
    const auto key = dpmlp::random::PRNGKey(0);
    const std::int64_t first = shard.first_row;
    Kokkos::parallel_for(
        "make data", Kokkos::RangePolicy<Space>(0, shard.rows()), KOKKOS_LAMBDA(const std::int64_t i) {
          for (int j = 0; j < inputs; ++j) {  // features: standard normal draws
            x(i, j) = dpmlp::random::normal(key, static_cast<std::uint64_t>((first + i) * inputs + j));
          }
          y(i, 0) = x(i, 0) * x(i, 1) + 0.5f * x(i, 2);  // the target the MLP learns
        });

    trainer.set_data(x, y);  // no copy: the trainer keeps these Views
    const dpmlp::TrainResult result = trainer.train(200);

    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0) {
      std::printf("%d rank(s), %lld rows, %d steps: loss %.6f -> %.6f\n", size, static_cast<long long>(rows),
                  result.steps, result.first_loss, result.last_loss);
    }
    status = result.last_loss < result.first_loss ? 0 : 1;  // the loss must fall
  }
  Kokkos::finalize();
  MPI_Finalize();
  return status;
}
