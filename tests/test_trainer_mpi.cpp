// SPDX-License-Identifier: BSD-3-Clause
// DataParallelTrainer at 1, 2 and 3 ranks against a one-device run: the reproducible reduction gives the
// same bits (uneven shards and short last blocks included), the fast one agrees to float precision.
#include <catch2/catch.hpp>

#include <cstring>

#include "mpi_test_util.hpp"
#include "trainer_test_util.hpp"

using namespace dpmlp_test;

TEST_CASE("reproducible: bitwise the one-device parameters, uneven shards included", "[trainer]") {
  for (std::int64_t rows : {1000, 1001, 997, 64}) {
    for (std::int64_t block : {7, 16, 256}) {
      Problem p;
      p.rows = rows;
      dpmlp::TrainerOptions opt;
      opt.block_rows = block;
      const Trained multi = train(MPI_COMM_WORLD, p, 10, opt);
      const Trained single = train_alone(p, 10, opt);
      INFO("rows " << rows << ", block " << block << ", ranks " << size());
      CHECK(multi.params.size() == single.params.size());
      CHECK(std::memcmp(multi.params.data(), single.params.data(), multi.params.size() * sizeof(float)) == 0);
      CHECK(multi.result.first_loss == single.result.first_loss);
      CHECK(multi.result.last_loss == single.result.last_loss);
      CHECK(multi.result.last_loss < multi.result.first_loss);
    }
  }
}

TEST_CASE("reproducible: deeper models, tanh, momentum and Adam, same bits", "[trainer]") {
  Problem p;
  p.rows = 523;
  p.widths = {5, 12, 9, 2};
  p.activation = dpmlp::Activation::tanh;
  dpmlp::TrainerOptions opt;
  opt.block_rows = 32;
  {
    const auto multi = train(MPI_COMM_WORLD, p, 8, opt, dpmlp::Sgd(0.05, 0.9));
    const auto single = train_alone(p, 8, opt, dpmlp::Sgd(0.05, 0.9));
    CHECK(max_abs_diff(multi.params, single.params) == 0.0);
  }
  {
    const auto multi = train<dpmlp::MpiCommunicator, dpmlp::Adam>(MPI_COMM_WORLD, p, 8, opt, dpmlp::Adam(0.01));
    const auto single = train_alone<dpmlp::MpiCommunicator, dpmlp::Adam>(p, 8, opt, dpmlp::Adam(0.01));
    CHECK(max_abs_diff(multi.params, single.params) == 0.0);
    CHECK(multi.result.last_loss < multi.result.first_loss);
  }
}

TEST_CASE("fused engine: bitwise the one-device parameters", "[trainer][fused]") {
  struct Case {
    std::vector<int> widths;
    dpmlp::Activation act;
    std::int64_t rows, block;
  };
  const std::vector<Case> cases = {
      {{8, 16, 1}, dpmlp::Activation::relu, 1000, 7},   {{8, 16, 1}, dpmlp::Activation::relu, 997, 64},
      {{8, 16, 1}, dpmlp::Activation::relu, 1001, 100}, {{40, 100, 3}, dpmlp::Activation::tanh, 523, 48},
  };
  for (const auto& c : cases) {
    Problem p;
    p.rows = c.rows;
    p.widths = c.widths;
    p.activation = c.act;
    dpmlp::TrainerOptions opt;
    opt.block_rows = c.block;
    opt.engine = dpmlp::Engine::fused;
    const Trained multi = train(MPI_COMM_WORLD, p, 6, opt);
    const Trained single = train_alone(p, 6, opt);
    INFO("rows " << c.rows << ", block " << c.block << ", hidden " << c.widths[1] << ", ranks " << size());
    CHECK(std::memcmp(multi.params.data(), single.params.data(), multi.params.size() * sizeof(float)) == 0);
    CHECK(multi.result.last_loss == single.result.last_loss);
    CHECK(multi.result.last_loss < multi.result.first_loss);
    // The layered engine computes the same function; its sums have other shapes, so only near.
    opt.engine = dpmlp::Engine::layered;
    const Trained layered = train_alone(p, 6, opt);
    CHECK(max_abs_diff(layered.params, single.params) < 1e-5);
  }
}

TEST_CASE("fast reduction: the one-device parameters within 1e-6", "[trainer]") {
  for (std::int64_t rows : {1000, 1001}) {
    Problem p;
    p.rows = rows;
    dpmlp::TrainerOptions opt;
    opt.reduction = dpmlp::Reduction::fast;
    opt.block_rows = 16;
    const Trained multi = train(MPI_COMM_WORLD, p, 10, opt);
    const Trained single = train_alone(p, 10, opt);
    INFO("rows " << rows << ", ranks " << size());
    CHECK(max_abs_diff(multi.params, single.params) < 1e-6);
  }
}

TEST_CASE("repeated runs give the same bits", "[trainer]") {
  Problem p;
  p.rows = 777;
  const Trained a = train(MPI_COMM_WORLD, p, 5, {});
  const Trained b = train(MPI_COMM_WORLD, p, 5, {});
  CHECK(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)) == 0);
}

TEST_CASE("every rank ends with the same parameters", "[trainer]") {
  Problem p;
  p.rows = 300;
  dpmlp::TrainerOptions opt;
  opt.block_rows = 8;
  const Trained t = train(MPI_COMM_WORLD, p, 4, opt);
  const std::uint64_t mine = dpmlp::fnv1a64(t.params.data(), t.params.size() * sizeof(float));
  std::uint64_t root = mine;
  MPI_Bcast(&root, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  CHECK(dpmlp_test::all(mine == root));
}

TEST_CASE("the trainer keeps the shard layout and the communicator it was given", "[trainer]") {
  Problem p;
  p.rows = 1001;
  dpmlp::Mlp<float, Memory> model(p.widths);
  dpmlp::TrainerOptions opt;
  opt.block_rows = 100;
  dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> trainer(MPI_COMM_WORLD, model, p.rows, dpmlp::Sgd(0.1),
                                                                    opt);
  int cmp = MPI_IDENT;
  MPI_Comm_compare(trainer.communicator().mpi_comm(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT);  // a duplicate, not the caller's communicator
  std::int64_t rows = trainer.shard().rows(), total = 0;
  MPI_Allreduce(&rows, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == 1001);
  CHECK(trainer.block_rows() == 100);
}
