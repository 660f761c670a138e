// SPDX-License-Identifier: BSD-3-Clause
// Callbacks inside a real DataParallelTrainer at 1, 2 and 3 ranks: early stopping stops early and every rank
// stops after the same step; a custom callback with only some hooks compiles and is called; the ProgressBar
// writes its lines on rank 0 only; the losses a LossHistory records are the run's losses.
#include <catch2/catch.hpp>

#include <dpmlp/callbacks.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "trainer_test_util.hpp"

using namespace dpmlp_test;

namespace {

using Trainer = dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator, dpmlp::Sgd>;

struct Setup {
  Problem p;
  dpmlp::Mlp<float, Memory> model;
  Matrix x, y;
  explicit Setup(std::int64_t rows = 600) : model({8, 16, 1}) {
    p.rows = rows;
    model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
  }
  // Draws this rank's rows for the trainer and hands them over.
  void feed(Trainer& t) {
    draw_rows(p, t.shard().first_row, t.shard().rows(), x, y);
    t.set_data(x, y);
  }
};

// Every rank's value, gathered on every rank.
std::vector<long long> gather(long long mine) {
  std::vector<long long> all(static_cast<std::size_t>(size()));
  MPI_Allgather(&mine, 1, MPI_LONG_LONG, all.data(), 1, MPI_LONG_LONG, MPI_COMM_WORLD);
  return all;
}

// Only end_step, returning void: never stops; counts calls.
struct CountSteps {
  int calls = 0;
  void end_step(const dpmlp::StepInfo&) { ++calls; }
};
// Only begin_training and end_training.
struct Bookends {
  int begins = 0, ends = 0, asked = -1, result_steps = -1;
  void begin_training(const dpmlp::TrainInfo& info) {
    ++begins;
    asked = info.steps;
  }
  void end_training(const dpmlp::TrainResult& r) {
    ++ends;
    result_steps = r.steps;
  }
};
// Every hook, recorded in order: "b" begin_training, "s<N>" begin_step, "e<N>" end_step, "E<N>" begin_epoch,
// "X<N>" end_epoch, "t" end_training.
struct Journal {
  std::vector<std::string> events;
  void begin_training(const dpmlp::TrainInfo&) { events.push_back("b"); }
  void begin_step(std::int64_t step) { events.push_back("s" + std::to_string(step)); }
  void end_step(const dpmlp::StepInfo& s) { events.push_back("e" + std::to_string(s.step)); }
  void begin_epoch(std::int64_t epoch) { events.push_back("E" + std::to_string(epoch)); }
  void end_epoch(const dpmlp::EpochInfo& e) { events.push_back("X" + std::to_string(e.epoch)); }
  void end_training(const dpmlp::TrainResult&) { events.push_back("t"); }
};
// Stops after a fixed step (bool end_step only).
struct StopAt {
  std::int64_t at;
  bool end_step(const dpmlp::StepInfo& s) { return s.step >= at; }
};

}  // namespace

TEST_CASE("EarlyStopping stops early, and every rank after the same step", "[callbacks][mpi]") {
  Setup s;
  // A large rate: the loss falls fast, then crawls; with min_delta it soon counts as no improvement (about
  // 50 steps at 1-3 ranks).
  Trainer trainer(MPI_COMM_WORLD, s.model, s.p.rows, dpmlp::Sgd(0.2));
  s.feed(trainer);
  dpmlp::EarlyStopping stop(3, 5e-3);
  dpmlp::LossHistory history;
  const dpmlp::TrainResult r = trainer.train(500, stop, history);
  CHECK(stop.stopped());
  CHECK(r.steps < 500);
  CHECK(r.steps == stop.stopped_step());
  CHECK(trainer.steps_done() == r.steps);
  CHECK(history.size() == static_cast<std::size_t>(r.steps));
  CHECK(history.losses().back() == Approx(r.last_loss).epsilon(1e-6));
  CHECK(history.losses().front() == Approx(r.first_loss).epsilon(1e-6));
  const auto steps = gather(r.steps);
  for (long long v : steps) CHECK(v == steps[0]);
  // The same on every rank, bit for bit: the loss history.
  const double sum = [&] {
    double t = 0;
    for (double l : history.losses()) t += l;
    return t;
  }();
  double root = sum;
  MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  CHECK(sum == root);
  // The next train() call starts where this one stopped.
  const auto again = trainer.train(3, history);
  CHECK(again.steps == 3);
  CHECK(trainer.steps_done() == r.steps + 3);
  CHECK(history.steps().back() == r.steps + 3);
}

TEST_CASE("EarlyStopping with an agreeing communicator stops at the same step", "[callbacks][mpi]") {
  Setup s;
  Trainer a(MPI_COMM_WORLD, s.model, s.p.rows, dpmlp::Sgd(0.2));
  s.feed(a);
  dpmlp::EarlyStopping plain(3, 5e-3);
  const int plain_steps = a.train(500, plain).steps;
  Setup s2;
  Trainer b(MPI_COMM_WORLD, s2.model, s2.p.rows, dpmlp::Sgd(0.2));
  s2.feed(b);
  dpmlp::EarlyStopping agreeing(3, 5e-3, MPI_COMM_WORLD);
  const int agreeing_steps = b.train(500, agreeing).steps;
  CHECK(plain_steps == agreeing_steps);
  CHECK(plain_steps < 500);
}

// In training every rank sees the same loss, so the case above cannot tell whether the agreement does
// anything. Here the losses differ by rank: rank 0's is flat, so alone it stops after step 3 (patience 2);
// the others' falls, so alone they never stop. Agreeing, every rank stops after step 3. Every rank calls
// end_step equally often (it is collective when agreeing): the agreed decision is the same everywhere.
TEST_CASE("EarlyStopping's agreement stops every rank when one rank's rule says stop", "[callbacks][mpi]") {
  const int rank = dpmlp_test::rank(), size = dpmlp_test::size();
  dpmlp::EarlyStopping agreeing(2, 0.0, MPI_COMM_WORLD), alone(2, 0.0);
  const dpmlp::TrainInfo info{6, 0, rank, size};
  agreeing.begin_training(info);
  alone.begin_training(info);
  std::int64_t agreed_at = 0, alone_at = 0;
  for (int step = 1; step <= 6; ++step) {
    const dpmlp::StepInfo si{step, step, rank == 0 ? 1.0 : 1.0 / step, 0.0};
    if (agreed_at == 0 && agreeing.end_step(si)) agreed_at = step;
    if (alone_at == 0 && alone.end_step(si)) alone_at = step;
  }
  CHECK(dpmlp_test::all(agreed_at == 3 && agreeing.stopped_step() == 3));
  CHECK(alone_at == (rank == 0 ? 3 : 0));
}

TEST_CASE("custom callbacks with only some hooks compile and are called", "[callbacks][mpi]") {
  Setup s;
  Trainer trainer(MPI_COMM_WORLD, s.model, s.p.rows, dpmlp::Sgd(0.05));
  s.feed(trainer);
  CountSteps count;
  Bookends ends;
  StopAt at{7};
  const auto r = trainer.train(20, count, ends, at);
  CHECK(r.steps == 7);
  CHECK(count.calls == 7);
  CHECK(ends.begins == 1);
  CHECK(ends.ends == 1);
  CHECK(ends.asked == 20);
  CHECK(ends.result_steps == 7);
  // A temporary works too (callbacks are taken by forwarding reference).
  CHECK(trainer.train(4, CountSteps{}).steps == 4);
}

TEST_CASE("every hook is called in order, in train and in train_epochs", "[callbacks][mpi]") {
  Setup s;
  Trainer trainer(MPI_COMM_WORLD, s.model, s.p.rows, dpmlp::Sgd(0.05));
  s.feed(trainer);
  Journal j;
  trainer.train(2, j);
  CHECK(j.events == std::vector<std::string>{"b", "s1", "e1", "s2", "e2", "t"});
  j.events.clear();
  // 2 steps an epoch (batches of s.p.rows / 2, rounded up), 2 epochs, after the 2 steps above.
  trainer.train_epochs(2, (s.p.rows + 1) / 2, 3, j);
  CHECK(j.events == std::vector<std::string>{"b", "E2", "s3", "e3", "s4", "e4", "X2", "E3", "s5", "e5", "s6", "e6",
                                             "X3", "t"});
}

TEST_CASE("ProgressBar inside a trainer: lines on rank 0, nothing elsewhere", "[callbacks][mpi]") {
  Setup s;
  Trainer trainer(MPI_COMM_WORLD, s.model, s.p.rows, dpmlp::Sgd(0.05));
  s.feed(trainer);
  std::FILE* f = std::tmpfile();
  REQUIRE(dpmlp_test::all(f != nullptr));  // qualified: CUDA declares a device all(int)
  dpmlp::ProgressBar bar(f, 5);
  dpmlp::LossHistory history;
  const auto r = trainer.train(12, bar, history);
  const std::string text = dpmlp_test::file_text(f);
  std::fclose(f);
  if (rank() == 0) {
    CHECK(text.find("step 5/12 loss ") == 0);
    CHECK(text.find("\nstep 10/12 loss ") != std::string::npos);
    CHECK(text.find("\nstep 12/12 loss ") != std::string::npos);
    char last[64];
    std::snprintf(last, sizeof last, "loss %.6g ", history.losses().back());
    CHECK(text.find(std::string("\nstep 12/12 ") + last) != std::string::npos);
    CHECK(text.find("\ndone 12 steps loss ") != std::string::npos);
    CHECK(r.steps == 12);
  } else {
    CHECK(text.empty());
  }
}
