// SPDX-License-Identifier: BSD-3-Clause
// A good guest: 4 ranks split with MPI_Comm_split into two groups of 2, each training its own model at the
// same time on its own communicator; each matches its own one-device run bit for bit.
#include <catch2/catch.hpp>

#include "mpi_test_util.hpp"
#include "trainer_test_util.hpp"

using namespace dpmlp_test;

TEST_CASE("two models train at once on two sub-communicators", "[trainer][subcomm]") {
  const int world = size();
  if (world < 2) {
    WARN("needs >= 2 ranks; registered at 4");
    return;
  }
  const int color = rank() % 2;
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, color, rank(), &half);
  Problem p;
  p.rows = color == 0 ? 600 : 451;
  p.widths = color == 0 ? std::vector<int>{8, 16, 1} : std::vector<int>{6, 10, 7, 2};
  p.activation = color == 0 ? dpmlp::Activation::relu : dpmlp::Activation::tanh;
  p.seed = color == 0 ? 10 : 20;
  dpmlp::TrainerOptions opt;
  opt.block_rows = 16;
  const Trained group = train(half, p, 6, opt);
  const Trained single = train_alone(p, 6, opt);
  CHECK(max_abs_diff(group.params, single.params) == 0.0);
  CHECK(group.result.last_loss < group.result.first_loss);
  MPI_Comm_free(&half);
}
