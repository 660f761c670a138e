// SPDX-License-Identifier: BSD-3-Clause
// DataParallelTrainer at 1, 2 and 3 ranks against a one-device run: the reproducible reduction gives the
// same bits (uneven shards and short last blocks included), the fast one agrees to float precision.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "mpi_test_util.hpp"
#include "trainer_test_util.hpp"
#include "check_util.hpp"

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

namespace {
// Two hidden layers, tanh, uneven shards: the layered engine.
Problem deeper_problem() {
  Problem p;
  p.rows = 523;
  p.widths = {5, 12, 9, 2};
  p.activation = dpmlp::Activation::tanh;
  return p;
}
}  // namespace

TEST_CASE("reproducible: deeper models, tanh, momentum and Adam, same bits", "[trainer]") {
  const Problem p = deeper_problem();
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

TEST_CASE("schedules and AdamW: same bits at any rank count; the update count carries across train() calls",
          "[trainer][optim]") {
  const Problem p = deeper_problem();
  dpmlp::TrainerOptions opt;
  opt.block_rows = 32;
  dpmlp::AdamW adamw(0.01, 0.1, dpmlp::LrSchedule::cosine(10, 0.1).with_warmup(3, 0.2));
  {
    const auto multi = train<dpmlp::MpiCommunicator, dpmlp::AdamW>(MPI_COMM_WORLD, p, 8, opt, adamw);
    const auto single = train_alone<dpmlp::MpiCommunicator, dpmlp::AdamW>(p, 8, opt, adamw);
    CHECK(max_abs_diff(multi.params, single.params) == 0.0);
    CHECK(multi.result.last_loss < multi.result.first_loss);
    // The schedule and the decay change the run.
    const auto plain = train<dpmlp::MpiCommunicator, dpmlp::Adam>(MPI_COMM_WORLD, p, 8, opt, dpmlp::Adam(0.01));
    CHECK(max_abs_diff(multi.params, plain.params) > 0.0);
  }
  // 8 updates in one call against 3 + 5 in two calls of the same trainer (the count restarts from steps_done()).
  const auto whole = train<dpmlp::MpiCommunicator, dpmlp::AdamW>(MPI_COMM_WORLD, p, 8, opt, adamw);
  {
    dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
    model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
    dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator, dpmlp::AdamW> trainer(MPI_COMM_WORLD, model, p.rows,
                                                                                   adamw, opt);
    Matrix x, y;
    draw_rows(p, trainer.shard().first_row, trainer.shard().rows(), x, y);
    trainer.set_data(x, y);
    trainer.train(3);
    trainer.train(5);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
    CHECK(std::memcmp(whole.params.data(), h.data(), whole.params.size() * sizeof(float)) == 0);
  }
  // SGD's second update under exponential(gamma) is a constant-rate step at rate * gamma: the count reached
  // the device's update (1 step at rate, then 1 at rate * gamma, against two runs of one step).
  {
    const double rate = 0.05, gamma = 0.5;
    const auto two = train(MPI_COMM_WORLD, p, 2, opt, dpmlp::Sgd(rate, 0.0, dpmlp::LrSchedule::exponential(gamma)));
    dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
    model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
    Matrix x, y;
    {
      dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> first(MPI_COMM_WORLD, model, p.rows, dpmlp::Sgd(rate),
                                                                      opt);
      draw_rows(p, first.shard().first_row, first.shard().rows(), x, y);
      first.set_data(x, y);
      first.train(1);
    }
    dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> second(MPI_COMM_WORLD, model, p.rows,
                                                                     dpmlp::Sgd(rate * gamma), opt);
    second.set_data(x, y);
    second.train(1);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
    CHECK(std::memcmp(two.params.data(), h.data(), two.params.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("gradient clipping: same bits at any rank count; a large bound changes nothing; a small one bounds the step",
          "[trainer][optim]") {
  const Problem p = deeper_problem();
  dpmlp::TrainerOptions opt;
  opt.block_rows = 32;
  dpmlp::TrainerOptions clipped = opt;
  clipped.clip_grad_norm = 0.05;
  {
    const auto multi = train(MPI_COMM_WORLD, p, 6, clipped, dpmlp::Sgd(0.05, 0.9));
    const auto single = train_alone(p, 6, clipped, dpmlp::Sgd(0.05, 0.9));
    CHECK(max_abs_diff(multi.params, single.params) == 0.0);
    const auto plain = train(MPI_COMM_WORLD, p, 6, opt, dpmlp::Sgd(0.05, 0.9));
    CHECK(max_abs_diff(multi.params, plain.params) > 0.0);
  }
  {
    dpmlp::TrainerOptions loose = opt;
    loose.clip_grad_norm = 1e30;  // the coefficient is exactly 1
    const auto a = train(MPI_COMM_WORLD, p, 4, loose, dpmlp::Adam(0.01));
    const auto b = train(MPI_COMM_WORLD, p, 4, opt, dpmlp::Adam(0.01));
    CHECK(max_abs_diff(a.params, b.params) == 0.0);
  }
  {
    // One SGD step at rate r moves the parameters by r * (clipped gradient), whose norm is the bound.
    dpmlp::Mlp<float, Memory> init(p.widths, p.activation);
    init.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
    auto h0 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), init.params());
    const double rate = 0.5;
    const auto one = train(MPI_COMM_WORLD, p, 1, clipped, dpmlp::Sgd(rate));
    double sq = 0;
    for (std::size_t i = 0; i < one.params.size(); ++i) {
      const double d = (static_cast<double>(one.params[i]) - h0(i)) / rate;
      sq += d * d;
    }
    CHECK(std::sqrt(sq) == Approx(clipped.clip_grad_norm).epsilon(1e-3));
  }
  // A negative or non-finite bound is refused on every rank.
  for (double bad : {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    dpmlp::TrainerOptions o = opt;
    o.clip_grad_norm = bad;
    dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
    CHECK_THROWS_WITH((dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator>(MPI_COMM_WORLD, model, p.rows,
                                                                                 dpmlp::Sgd(0.05), o)),
                      Catch::Contains("clip_grad_norm must be >= 0 and finite"));
  }
}

TEST_CASE("fused and tensor engines: bitwise the one-device parameters", "[trainer][fused]") {
  struct Case {
    std::vector<int> widths;
    dpmlp::Activation act;
    std::int64_t rows, block;
  };
  const std::vector<Case> cases = {
      {{8, 16, 1}, dpmlp::Activation::relu, 1000, 7},   {{8, 16, 1}, dpmlp::Activation::relu, 997, 64},
      {{8, 16, 1}, dpmlp::Activation::relu, 1001, 100}, {{40, 100, 3}, dpmlp::Activation::tanh, 523, 48},
      // 1024 blocks: on CUDA the tensor engine's register-resident kernel, at every rank count (one output and
      // relu: at every block count; tanh: chosen from the global block count, from 1024 blocks; chosen from a
      // rank's share, 2 ranks ran the other kernel).
      {{8, 16, 1}, dpmlp::Activation::relu, 16384, 16},  {{8, 16, 1}, dpmlp::Activation::tanh, 16384, 16},
      // On a GPU of 132 SMs the register-resident kernel groups its blocks (the plan's leaf groups) from 924
      // blocks a rank (7/8 of its 1056 teams): 1500 blocks group at 1 rank and not at 2 (the same bits either
      // way), 2500 at 1 and 2 ranks (ranks own whole groups; the last group is short) and not at 3.
      {{8, 16, 1}, dpmlp::Activation::relu, 24000, 16},  {{8, 16, 1}, dpmlp::Activation::tanh, 40000 - 7, 16},
  };
  for (const auto& c : cases) {
    for (const auto& engine : fused_engines(c.widths, c.act)) {  // tensor: CUDA only
      Problem p;
      p.rows = c.rows;
      p.widths = c.widths;
      p.activation = c.act;
      dpmlp::TrainerOptions opt;
      opt.block_rows = c.block;
      engine.apply(opt);
      const Trained multi = train(MPI_COMM_WORLD, p, 6, opt);
      const Trained single = train_alone(p, 6, opt);
      INFO("engine " << engine.name() << ", rows " << c.rows << ", block " << c.block << ", hidden "
                     << c.widths[1] << ", ranks " << size());
      CHECK(std::memcmp(multi.params.data(), single.params.data(), multi.params.size() * sizeof(float)) == 0);
      CHECK(multi.result.last_loss == single.result.last_loss);
      CHECK(multi.result.last_loss < multi.result.first_loss);
      // The layered engine computes the same function; its sums have other shapes, so only near.
      EngineChoice{dpmlp::Engine::layered}.apply(opt);
      const Trained layered = train_alone(p, 6, opt);
      CHECK(max_abs_diff(layered.params, single.params) < 1e-5);
    }
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
  CHECK(trainer.global_blocks() == 11);  // 1001 rows in blocks of 100, the last of one row, at any rank count
}

namespace {

// train_epochs on `comm` for the problem; the final parameters.
std::vector<float> train_minibatch(MPI_Comm comm, const Problem& p, int epochs, std::int64_t batch,
                                   std::uint64_t seed, const dpmlp::TrainerOptions& opt, double rate = 0.05) {
  dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
  model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
  dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> trainer(comm, model, p.rows, dpmlp::Sgd(rate), opt);
  Matrix x, y;
  draw_rows(p, trainer.shard().first_row, trainer.shard().rows(), x, y);
  trainer.set_data(x, y);
  trainer.train_epochs(epochs, batch, seed);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

struct StopAfterFirstStep {
  bool end_step(const dpmlp::StepInfo&) { return true; }
};

struct EpochLog {
  std::vector<dpmlp::EpochInfo> epochs;
  void end_epoch(const dpmlp::EpochInfo& e) { epochs.push_back(e); }
};

}  // namespace

TEST_CASE("EpochOrder: a permutation drawn from the seed and the epoch, and its inverse", "[trainer][minibatch]") {
  for (std::int64_t rows : {std::int64_t(1), std::int64_t(2), std::int64_t(3), std::int64_t(1000), std::int64_t(4096),
                            std::int64_t(4097), std::int64_t(65537)}) {
    INFO("rows " << rows);
    const dpmlp::EpochOrder order(7, 0, rows);
    std::vector<char> seen(static_cast<std::size_t>(rows), 0);
    std::int64_t fixed = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t p = order.position(r);
      REQUIRE(p >= 0);
      REQUIRE(p < rows);
      REQUIRE(!seen[p]);
      seen[p] = 1;
      REQUIRE(order.row(p) == r);
      fixed += p == r;
    }
    if (rows >= 1000) CHECK(fixed < 20);  // a shuffle, not the identity
  }
  const auto a = dpmlp::epoch_positions(7, 0, 1000), b = dpmlp::epoch_positions(7, 1, 1000),
             c = dpmlp::epoch_positions(8, 0, 1000);
  CHECK(a == dpmlp::epoch_positions(7, 0, 1000));
  CHECK(a != b);
  CHECK(a != c);
  // Uniform enough for SGD: the mean position of the first tenth of the rows is near the middle.
  const auto big = dpmlp::epoch_positions(3, 5, 100000);
  double mean = 0;
  for (int r = 0; r < 10000; ++r) mean += static_cast<double>(big[r]) / 10000;
  CHECK(std::fabs(mean - 50000) < 1500);
}

TEST_CASE("mini-batches: the same bits at any rank count, every engine", "[trainer][minibatch]") {
  Problem p;
  p.rows = 1001;
  std::vector<EngineChoice> engines = fused_engines(p.widths, p.activation);
  engines.insert(engines.begin(), EngineChoice{dpmlp::Engine::layered});
  if (dpmlp::is_host_space<Space>()) engines.insert(engines.begin(), EngineChoice{dpmlp::Engine::host});
  for (const auto& engine : engines) {
    for (std::int64_t batch : {std::int64_t(128), std::int64_t(1001)}) {
      dpmlp::TrainerOptions opt;
      opt.block_rows = 32;
      engine.apply(opt);
      const auto multi = train_minibatch(MPI_COMM_WORLD, p, 2, batch, 42, opt);
      const auto single = train_minibatch(MPI_COMM_SELF, p, 2, batch, 42, opt);
      INFO("engine " << engine.name() << ", batch " << batch << ", ranks " << size());
      CHECK(std::memcmp(multi.data(), single.data(), multi.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("mini-batches: one batch of all rows is a full-batch step over the rows in epoch order",
          "[trainer][minibatch]") {
  // A batch is summed in its epoch order, so one epoch of one batch is bitwise a full-batch step on the rows
  // put in that order.
  Problem p;
  p.rows = 777;
  const std::uint64_t seed = 5;
  const auto batched = train_minibatch(MPI_COMM_WORLD, p, 1, p.rows, seed, dpmlp::TrainerOptions());
  dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
  model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
  dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> trainer(MPI_COMM_SELF, model, p.rows, dpmlp::Sgd(0.05));
  Matrix x, y;
  draw_rows(p, 0, p.rows, x, y);
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  Matrix xs("xs", p.rows, x.extent(1)), ys("ys", p.rows, 1);
  auto hxs = Kokkos::create_mirror_view(xs);
  auto hys = Kokkos::create_mirror_view(ys);
  const dpmlp::EpochOrder order(seed, 0, p.rows);
  for (std::int64_t pos = 0; pos < p.rows; ++pos) {
    for (std::size_t c = 0; c < x.extent(1); ++c) hxs(pos, c) = hx(order.row(pos), c);
    hys(pos, 0) = hy(order.row(pos), 0);
  }
  Kokkos::deep_copy(xs, hxs);
  Kokkos::deep_copy(ys, hys);
  trainer.set_data(xs, ys);
  trainer.train(1);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  CHECK(std::memcmp(batched.data(), h.data(), batched.size() * sizeof(float)) == 0);
}

namespace {
struct StopAt {
  std::int64_t at;
  bool end_step(const dpmlp::StepInfo& s) { return s.step == at; }
};
}  // namespace

TEST_CASE("mini-batches: a run stopped anywhere resumes exactly", "[trainer][minibatch]") {
  // Two epochs of 4 steps (64, 64, 64, 8 rows) in one call, against a run stopped after 5 steps (inside the
  // second epoch) and resumed on a fresh trainer from its parameters and step count, as from a checkpoint.
  Problem p;
  p.rows = 200;
  dpmlp::TrainerOptions opt;
  opt.block_rows = 16;
  const auto whole = train_minibatch(MPI_COMM_WORLD, p, 2, 64, 11, opt);
  dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
  model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
  Matrix x, y;
  {
    dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> first(MPI_COMM_WORLD, model, p.rows, dpmlp::Sgd(0.05),
                                                                    opt);
    draw_rows(p, first.shard().first_row, first.shard().rows(), x, y);
    first.set_data(x, y);
    CHECK(first.train_epochs(2, 64, 11, StopAt{5}).steps == 5);
    CHECK(first.steps_done() == 5);
  }
  dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> second(MPI_COMM_WORLD, model, p.rows, dpmlp::Sgd(0.05),
                                                                   opt);
  second.set_data(x, y);
  second.set_steps_done(5);
  CHECK(second.train_epochs(1, 64, 11).steps == 3);  // the rest of the second epoch
  CHECK(second.steps_done() == 8);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  CHECK(std::memcmp(whole.data(), h.data(), whole.size() * sizeof(float)) == 0);
}

TEST_CASE("mini-batches: whole epochs replayed as a CUDA graph give the plain run's bits", "[trainer][minibatch]") {
  using Comm = dpmlp::default_communicator_t<Space>;
  if (!dpmlp::backend::StepGraph<Space>::supported || !Comm::stream_ordered) {
    WARN("not run here: epoch graphs need Kokkos::Cuda and a stream-ordered communicator (NCCL)");
    return;
  }
  // Three epochs of each: the first runs plain, the second is captured, the third replayed; a short last batch.
  struct Case {
    std::vector<int> widths;
    std::int64_t rows, batch;
  };
  for (const Case& c : {Case{{8, 16, 1}, 1000, 128}, Case{{32, 64, 64, 2}, 3000, 512}}) {
    std::vector<std::vector<float>> params;
    std::vector<dpmlp::TrainResult> results;
    for (const bool graph : {false, true}) {
      Problem p;
      p.rows = c.rows;
      p.widths = c.widths;
      dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
      model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
      dpmlp::TrainerOptions opt;
      opt.cuda_graph = graph;
      dpmlp::DataParallelTrainer<Space, Comm> trainer(MPI_COMM_SELF, model, p.rows, dpmlp::Sgd(0.05), opt);
      Matrix x, y;
      draw_rows(p, 0, p.rows, x, y);
      trainer.set_data(x, y);
      results.push_back(trainer.train_epochs(3, c.batch, 4));
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
      params.emplace_back(h.data(), h.data() + h.extent(0));
    }
    INFO("widths " << c.widths.size() << " layers, rows " << c.rows << ", batch " << c.batch);
    CHECK(std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float)) == 0);
    CHECK(results[0].first_loss == results[1].first_loss);
    CHECK(results[0].last_loss == results[1].last_loss);
  }
}

TEST_CASE("mini-batches: a step is SGD on the mean loss of exactly its batch's rows", "[trainer][minibatch]") {
  // On this rank alone: the first step of an epoch against value_and_grad over the gathered batch rows.
  Problem p;
  p.rows = 300;
  const std::int64_t batch = 64;
  const std::uint64_t seed = 9;
  dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
  model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
  const auto initial = model.clone();
  dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> trainer(MPI_COMM_SELF, model, p.rows, dpmlp::Sgd(0.05));
  Matrix x, y;
  draw_rows(p, 0, p.rows, x, y);
  trainer.set_data(x, y);
  EpochLog log;
  const auto r = trainer.train_epochs(1, batch, seed, StopAfterFirstStep{}, log);
  CHECK(r.steps == 1);
  CHECK(log.epochs.empty());  // stopped inside the epoch
  // The batch: rows whose epoch-0 position is below 64.
  const auto pos = dpmlp::epoch_positions(seed, 0, p.rows);
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  Matrix xb("xb", batch, x.extent(1)), yb("yb", batch, 1);
  auto hxb = Kokkos::create_mirror_view(xb);
  auto hyb = Kokkos::create_mirror_view(yb);
  for (std::int64_t row = 0; row < p.rows; ++row) {
    if (pos[row] >= batch) continue;
    for (std::size_t c = 0; c < x.extent(1); ++c) hxb(pos[row], c) = hx(row, c);
    hyb(pos[row], 0) = hy(row, 0);
  }
  Kokkos::deep_copy(xb, hxb);
  Kokkos::deep_copy(yb, hyb);
  Kokkos::View<float*, Memory> grad("grad", initial.num_params());
  const float loss = dpmlp::value_and_grad(Space(), initial, xb, yb, grad);
  CHECK(r.first_loss == Approx(loss).epsilon(1e-5));
  auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad);
  auto p0 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), initial.params());
  auto p1 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  double worst = 0;
  for (std::size_t i = 0; i < g.extent(0); ++i) worst = dpmlp_test::nan_max(worst, std::fabs(double(p0(i) - 0.05f * g(i)) - p1(i)));
  CHECK(worst < 1e-6);
}

TEST_CASE("mini-batches: epochs are reported, and bad arguments are refused on every rank", "[trainer][minibatch]") {
  Problem p;
  p.rows = 200;
  dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
  model.init_jax(dpmlp::random::PRNGKey(1), 0.3f);
  dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> trainer(MPI_COMM_WORLD, model, p.rows, dpmlp::Sgd(0.05));
  Matrix x, y;
  draw_rows(p, trainer.shard().first_row, trainer.shard().rows(), x, y);
  trainer.set_data(x, y);
  EpochLog log;
  const auto r = trainer.train_epochs(3, 64, 1, log);  // 4 steps an epoch (64, 64, 64, 8 rows)
  CHECK(r.steps == 12);
  REQUIRE(log.epochs.size() == 3);
  CHECK(log.epochs[2].epoch == 3);
  CHECK(log.epochs[0].steps == 4);
  CHECK(trainer.steps_done() == 12);
  CHECK_THROWS_WITH(trainer.train_epochs(1, 0, 1), Catch::Contains("batch_rows must be in [1, 200], got 0"));
  CHECK_THROWS_WITH(trainer.train_epochs(0, 10, 1), Catch::Contains("epochs must be positive"));
}

// TrainerOptions::peer_exchange (CUDA, two or more ranks): the subtree sums go straight into the other GPUs'
// memory, in one kernel with the tree, the combine and the update. The same bits as the one-device run, for
// every engine, with and without a CUDA graph; on one rank the option is ignored. Without Kokkos::Cuda it
// is refused at two or more ranks (test_faults_mpi).
namespace {
// Whether the peer exchange runs at this rank count here (on one rank it is ignored, so it "runs"): CUDA,
// one GPU per rank. Elsewhere it is refused (test_faults_mpi).
bool peer_runs() {
  if (size() == 1) return true;
  if (!dpmlp::backend::peer_exchange_unsupported<Space, float>().empty()) return false;
  return dpmlp::count_physical_devices<Space>(MPI_COMM_WORLD, false) == size();
}
}  // namespace

TEST_CASE("peer exchange: bitwise the one-device parameters", "[trainer][peer]") {
  if (!peer_runs()) {
    WARN("not run here: the peer exchange needs a CUDA build and a GPU a rank");
    return;
  }
  struct Case {
    std::vector<int> widths;
    std::int64_t rows, block;
  };
  // Uneven shards, short last blocks, a tree of many levels (1024 blocks of 16), a wide model, and 2500
  // blocks, grouped by the register-resident kernel on a GPU of 132 SMs (the exchange over groups).
  const std::vector<Case> cases = {{{8, 16, 1}, 1000, 7}, {{8, 16, 1}, 1001, 100}, {{8, 16, 1}, 16384, 16},
                                   {{40, 100, 3}, 523, 48}, {{8, 16, 1}, 40000 - 7, 16}};
  for (const auto& c : cases) {
    std::vector<EngineChoice> engines = fused_engines(c.widths);
    engines.push_back(EngineChoice{dpmlp::Engine::layered});
    for (const auto& engine : engines) {
      for (const bool graph : {false, true}) {
        Problem p;
        p.rows = c.rows;
        p.widths = c.widths;
        dpmlp::TrainerOptions opt;
        opt.block_rows = c.block;
        engine.apply(opt);
        const Trained single = train_alone(p, 6, opt);
        opt.peer_exchange = true;
        opt.cuda_graph = graph;
        const Trained multi = train(MPI_COMM_WORLD, p, 6, opt);
        INFO("engine " << engine.name() << ", rows " << c.rows << ", block " << c.block << ", graph "
                       << graph << ", ranks " << size());
        CHECK(std::memcmp(multi.params.data(), single.params.data(), multi.params.size() * sizeof(float)) == 0);
        CHECK(multi.result.first_loss == single.result.first_loss);
        CHECK(multi.result.last_loss == single.result.last_loss);
      }
    }
  }
}

TEST_CASE("peer exchange: momentum and Adam, and runs that continue, same bits", "[trainer][peer]") {
  if (!peer_runs()) {
    WARN("not run here: the peer exchange needs a CUDA build and a GPU a rank");
    return;
  }
  const Problem p = deeper_problem();
  dpmlp::TrainerOptions opt;
  opt.block_rows = 32;
  const auto single = train_alone<dpmlp::MpiCommunicator, dpmlp::Adam>(p, 8, opt, dpmlp::Adam(0.01));
  opt.peer_exchange = true;
  const auto multi = train<dpmlp::MpiCommunicator, dpmlp::Adam>(MPI_COMM_WORLD, p, 8, opt, dpmlp::Adam(0.01));
  CHECK(max_abs_diff(multi.params, single.params) == 0.0);
  // Three train() calls of one trainer (the exchange's step counters carry over) against one call of 9 steps.
  dpmlp::Mlp<float, Memory> a(p.widths, p.activation), b(p.widths, p.activation);
  a.init_jax(dpmlp::random::PRNGKey(5), 0.3f);
  b.init_jax(dpmlp::random::PRNGKey(5), 0.3f);
  opt.peer_exchange = false;
  dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> ref(MPI_COMM_SELF, a, p.rows, dpmlp::Sgd(0.05, 0.9), opt);
  opt.peer_exchange = true;
  dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> t(MPI_COMM_WORLD, b, p.rows, dpmlp::Sgd(0.05, 0.9), opt);
  Matrix xa, ya, xb, yb;
  draw_rows(p, 0, p.rows, xa, ya);
  draw_rows(p, t.shard().first_row, t.shard().rows(), xb, yb);
  ref.set_data(xa, ya);
  t.set_data(xb, yb);
  ref.train(9);
  for (int k = 0; k < 3; ++k) t.train(3);
  CHECK(dpmlp::digest(a.params()) == dpmlp::digest(b.params()));
}

#if defined(KOKKOS_ENABLE_CUDA)
// A rank whose GPU falls behind by more than TrainerOptions::peer_timeout_s: the other rank's wait gives up, skips its
// later steps (so the late rank's next wait gives up too), and every rank throws CommError when the run ends.
TEST_CASE("peer exchange: a rank that falls behind makes every rank throw CommError, no hang", "[trainer][peer]") {
  if (size() < 2 || !peer_runs()) return;
  Problem p;
  p.rows = 1000;
  dpmlp::Mlp<float, Memory> model(p.widths);
  model.init_jax(dpmlp::random::PRNGKey(1), 0.3f);
  dpmlp::TrainerOptions opt;
  opt.block_rows = 16;
  opt.peer_exchange = true;
  opt.peer_timeout_s = 1;
  dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator> t(MPI_COMM_WORLD, model, p.rows, dpmlp::Sgd(0.05), opt);
  Matrix x, y;
  draw_rows(p, t.shard().first_row, t.shard().rows(), x, y);
  t.set_data(x, y);
  t.train(2);
  if (rank() == 1) {  // 3 s of GPU work ahead of this rank's next steps
    Kokkos::parallel_for(
        "dpmlp_test::delay", Kokkos::RangePolicy<Space>(t.space(), 0, 1), KOKKOS_LAMBDA(int) {
          const long long start = dpmlp::backend::peer_clock_ns();
          while (dpmlp::backend::peer_clock_ns() - start < 3000000000LL) {
          }
        });
  }
  std::string kind, message;
  try {
    t.train(5);
  } catch (const dpmlp::CommError& e) {
    kind = "CommError";
    message = e.what();
  } catch (const std::exception& e) {
    kind = "other";
    message = e.what();
  }
  INFO("rank " << rank() << ": " << kind << ": " << message);
  CHECK(dpmlp_test::all(kind == "CommError"));
  CHECK_THAT(message, Catch::Contains("peer exchange") && Catch::Contains("waited more than 1 s"));
}
#endif

namespace {

// A deep or wide model for the same-bits checks of an engine.
struct DeepCase {
  std::vector<int> widths;
  dpmlp::Activation act;
  std::int64_t rows, block;
  Problem problem() const {
    Problem p;
    p.rows = rows;
    p.widths = widths;
    p.activation = act;
    return p;
  }
};

// Trains c with `opt` (its engine) over all ranks and on one, 6 full-batch steps and then two epochs at each
// of two batch sizes, and checks that both give the same bits; returns the one-rank full-batch run.
Trained check_same_bits_any_rank(const DeepCase& c, dpmlp::TrainerOptions opt) {
  const Problem p = c.problem();
  opt.block_rows = c.block;
  INFO("widths " << c.widths.size() - 1 << " layers, " << c.widths[1] << " wide, rows " << c.rows << ", block "
                 << c.block << ", ranks " << size());
  const Trained multi = train(MPI_COMM_WORLD, p, 6, opt, dpmlp::Sgd(1e-4, 0.9));
  const Trained single = train_alone(p, 6, opt, dpmlp::Sgd(1e-4, 0.9));
  CHECK(std::memcmp(multi.params.data(), single.params.data(), multi.params.size() * sizeof(float)) == 0);
  CHECK(multi.result.last_loss == single.result.last_loss);
  CHECK(multi.result.last_loss < multi.result.first_loss);
  for (std::int64_t batch : {std::int64_t(96), std::int64_t(250)}) {
    const auto mb_multi = train_minibatch(MPI_COMM_WORLD, p, 2, batch, 7, opt, 1e-4);
    const auto mb_single = train_minibatch(MPI_COMM_SELF, p, 2, batch, 7, opt, 1e-4);
    INFO("batch " << batch);
    CHECK(std::memcmp(mb_multi.data(), mb_single.data(), mb_multi.size() * sizeof(float)) == 0);
  }
  return single;
}

}  // namespace

TEST_CASE("host engine: deep and wide models, full batch and mini-batches, the same bits at any rank count",
          "[trainer][host]") {
  if (!dpmlp::is_host_space<Space>()) return;  // the host engine runs on host spaces only
  // Depth 3-4, widths that are and are not whole vectors, several outputs, short last blocks and chunks
  // (blocks of 100 rows: three chunks of 32 and one of 4), and the default block.
  const std::vector<DeepCase> cases = {{{32, 64, 64, 64, 1}, dpmlp::Activation::relu, 1001, 100},
                                       {{7, 40, 17, 33, 3}, dpmlp::Activation::tanh, 523, 48},
                                       {{32, 256, 256, 1}, dpmlp::Activation::relu, 700, 0},
                                       {{5, 12, 9, 2}, dpmlp::Activation::identity, 300, 16},
                                       // 313 blocks: leaf groups of 8 at 1 and 2 ranks, 4 at 3 (the same bits)
                                       {{8, 16, 1}, dpmlp::Activation::relu, 5000, 16}};
  for (const auto& c : cases) {
    dpmlp::TrainerOptions opt;
    opt.engine = dpmlp::Engine::host;
    const Trained single = check_same_bits_any_rank(c, opt);
    // The layered engine computes the same function with other sums: near, not equal.
    opt.engine = dpmlp::Engine::layered;
    opt.block_rows = c.block;
    INFO("widths " << c.widths.size() - 1 << " layers, " << c.widths[1] << " wide, rows " << c.rows << ", block "
                   << c.block);
    const Trained layered = train_alone(c.problem(), 6, opt, dpmlp::Sgd(1e-4, 0.9));
    CHECK(max_abs_diff(layered.params, single.params) < 1e-5);
    CHECK(max_abs_diff(layered.params, single.params) > 0.0);  // really another engine
  }
}

TEST_CASE("layered engine: deep and wide models, full batch and mini-batches, the same bits at any rank count",
          "[trainer][deep]") {
  // 64- to 256-wide layers (the GEMM tiles follow the width), one to four outputs (on device spaces, the
  // engine's own output-layer kernels), short last blocks; a narrow hidden layer (its backward, on the main
  // stream, rewrites the deltas whose gradients run beside it on a GPU). On CUDA, eager and as graphs.
  const std::vector<DeepCase> cases = {{{32, 64, 64, 64, 1}, dpmlp::Activation::relu, 1001, 100},
                                       {{32, 256, 256, 1}, dpmlp::Activation::relu, 700, 0},
                                       {{16, 128, 128, 4}, dpmlp::Activation::tanh, 523, 64},
                                       {{16, 64, 3, 64, 2}, dpmlp::Activation::tanh, 523, 64}};
  for (const bool graph : {false, true}) {
    if (graph && !dpmlp::backend::StepGraph<Space>::supported) continue;
    dpmlp::TrainerOptions opt;
    opt.engine = dpmlp::Engine::layered;
    opt.cuda_graph = graph;
    INFO("CUDA graph " << graph);
    for (const auto& c : cases) check_same_bits_any_rank(c, opt);
  }
}

TEST_CASE("split operands: full batch and mini-batches, the same bits at any rank count", "[trainer][deep][split]") {
  // Split and unsplit GEMMs mixed (k = 48 is not whole tiles of 32), one and two outputs; on CUDA, eager and
  // as graphs (the weights' split is part of the step).
  const std::vector<DeepCase> cases = {{{32, 64, 64, 64, 1}, dpmlp::Activation::relu, 1001, 100},
                                       {{32, 48, 64, 32, 2}, dpmlp::Activation::tanh, 523, 64}};
  for (const bool graph : {false, true}) {
    if (graph && !dpmlp::backend::StepGraph<Space>::supported) continue;
    dpmlp::TrainerOptions opt;
    opt.engine = dpmlp::Engine::layered;
    opt.split_operands = dpmlp::Toggle::on;
    opt.cuda_graph = graph;
    INFO("CUDA graph " << graph);
    for (const auto& c : cases) {
      const Trained split = check_same_bits_any_rank(c, opt);
      // Against the GEMMs that split in registers: the same function, other sums.
      dpmlp::TrainerOptions plain = opt;
      plain.split_operands = dpmlp::Toggle::off;
      plain.block_rows = c.block;
      const Trained unsplit = train_alone(c.problem(), 6, plain, dpmlp::Sgd(1e-4, 0.9));
      CHECK(max_abs_diff(split.params, unsplit.params) < 1e-5);
      CHECK(max_abs_diff(split.params, unsplit.params) > 0.0);
    }
  }
}

TEST_CASE("tensor engine, deep kernel: full batch and mini-batches, the same bits at any rank count",
          "[trainer][deep][tensor]") {
  // Two to four hidden layers (one and two groups of warps a CTA), 32 and 64 padded inputs, one to four outputs, short last blocks and tiles
  // (blocks of 100 rows: a tile of 64 and one of 36), and the default block.
  const std::vector<DeepCase> cases = {{{32, 64, 64, 64, 1}, dpmlp::Activation::relu, 1001, 100},
                                       {{7, 40, 17, 33, 3}, dpmlp::Activation::tanh, 523, 48},
                                       {{40, 64, 64, 4}, dpmlp::Activation::identity, 700, 0},
                                       {{16, 48, 64, 32, 64, 1}, dpmlp::Activation::tanh, 700, 100},
                                       {{40, 64, 64, 64, 2}, dpmlp::Activation::relu, 601, 0}};
  dpmlp::TrainerOptions opt;
  opt.engine = dpmlp::Engine::tensor;
  for (const auto& c : cases) {
    dpmlp::EngineOptions o;
    o.engine = dpmlp::Engine::tensor;
    const dpmlp::Mlp<float, Memory> model(c.widths, c.act);
    using Engine = dpmlp::detail::BlockEngine<Space, float>;
    const std::string why = dpmlp::detail::tensor_unsupported(dpmlp::model_shape(model), Engine::caps(model));
    if (!why.empty()) {
      WARN("the tensor engine does not run here: " << why);
      return;
    }
    CHECK(Engine::plan(model, o, true, c.rows, 1).kernel == dpmlp::Kernel::tensor_deep);
    const Trained single = check_same_bits_any_rank(c, opt);
    // The layered engine computes the same function with other sums: near, not equal.
    dpmlp::TrainerOptions lopt;
    lopt.engine = dpmlp::Engine::layered;
    lopt.block_rows = c.block;
    const Trained layered = train_alone(c.problem(), 6, lopt, dpmlp::Sgd(1e-4, 0.9));
    CHECK(max_abs_diff(layered.params, single.params) < 1e-5);
    CHECK(max_abs_diff(layered.params, single.params) > 0.0);
  }
}
