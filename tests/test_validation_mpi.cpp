// SPDX-License-Identifier: BSD-3-Clause
// Validation during training (dpmlp::Validation), at 1, 2 and 3 ranks: the loss equals an independent
// evaluation and is bitwise the same on every rank and at any rank count; it reaches the other callbacks
// (StepInfo / EpochInfo::val_loss, ProgressBar) every N steps or every N epochs; EarlyStopping watches it and
// restores the parameters of the best evaluation; bad inputs are refused on every rank.
#include <catch2/catch.hpp>

#include <dpmlp/callbacks.hpp>
#include <dpmlp/checkpoint.hpp>
#include <dpmlp/eigen_interop.hpp>
#include <dpmlp/validation.hpp>

#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "trainer_test_util.hpp"

using namespace dpmlp_test;

namespace {

using Trainer = dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator, dpmlp::Adam>;

dpmlp::Mlp<float, Memory> initial_model() {
  dpmlp::Mlp<float, Memory> m({8, 16, 1});
  m.init_jax(dpmlp::random::PRNGKey(1), 0.3f);
  return m;
}

// Training rows: problem seed 0 (x and y independent normals: there is nothing to learn, so a model
// overfits and its validation loss rises after a while). Validation rows: problem seed 5.
struct Run {
  Problem train_p, val_p;
  dpmlp::Mlp<float, Memory> model;
  Trainer trainer;
  dpmlp::Validation<Trainer> val;
  Matrix x, y, vx, vy;
  Run(MPI_Comm comm, dpmlp::ValidationFrequency every, double rate = 0.01, std::int64_t val_rows = 150)
      : model(initial_model()),
        trainer(comm, model, 600, dpmlp::Adam(rate)),
        val(trainer, val_rows, every) {
    train_p.rows = 600;
    val_p.rows = val_rows;
    val_p.seed = 5;
    draw_rows(train_p, trainer.shard().first_row, trainer.shard().rows(), x, y);
    trainer.set_data(x, y);
    draw_rows(val_p, val.shard().first_row, val.shard().rows(), vx, vy);
    val.set_data(vx, vy);
  }
};

// Records what end_step and end_epoch see.
struct Seen {
  std::vector<std::int64_t> step_val_steps, epochs_with_val;
  std::vector<double> step_vals, epoch_vals;
  std::int64_t last_step = 0;
  void end_step(const dpmlp::StepInfo& s) {
    last_step = s.step;
    if (s.val_loss) {
      step_val_steps.push_back(s.step);
      step_vals.push_back(*s.val_loss);
    }
  }
  void end_epoch(const dpmlp::EpochInfo& e) {
    if (e.val_loss) {
      epochs_with_val.push_back(e.epoch);
      epoch_vals.push_back(*e.val_loss);
    }
  }
};

// The parameters' digest after every step.
template <class T>
struct Digests {
  const T* trainer;
  std::vector<std::uint64_t> after;  // after[s - 1]: after step s
  void end_step(const dpmlp::StepInfo& s) {
    if (static_cast<std::int64_t>(after.size()) < s.step) after.resize(static_cast<std::size_t>(s.step));
    after[static_cast<std::size_t>(s.step - 1)] = dpmlp::params_digest(*trainer);
  }
};

bool same_on_every_rank(double v) {
  double root = v;
  MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return dpmlp_test::all(std::memcmp(&root, &v, sizeof v) == 0);
}

std::vector<std::uint64_t> bits(const std::vector<double>& v) {
  std::vector<std::uint64_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) std::memcpy(&b[i], &v[i], sizeof(double));
  return b;
}

// Runs f; true when it threw dpmlp::InputError whose message contains `text`.
template <class F>
bool refuses(F&& f, const std::string& text) {
  try {
    f();
  } catch (const dpmlp::InputError& e) {
    const bool ok = std::string(e.what()).find(text) != std::string::npos;
    if (!ok) WARN("message: " << e.what());
    return ok;
  }
  return false;
}

}  // namespace

TEST_CASE("the validation loss equals an independent evaluation, on every rank", "[validation][mpi]") {
  Run r(MPI_COMM_WORLD, dpmlp::every_steps(1));
  r.trainer.train(7);
  const double v = r.val.evaluate();
  CHECK(same_on_every_rank(v));
  // Eigen on the host, over the whole validation set drawn on this rank.
  Matrix vx, vy;
  draw_rows(r.val_p, 0, r.val_p.rows, vx, vy);
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), vx);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), vy);
  Eigen::MatrixXf X(r.val_p.rows, 8);
  for (int i = 0; i < r.val_p.rows; ++i) {
    for (int j = 0; j < 8; ++j) X(i, j) = hx(i, j);
  }
  const Eigen::MatrixXf pred = dpmlp::eigen::predict(r.model, X);
  double sum = 0;
  for (int i = 0; i < r.val_p.rows; ++i) {
    const double d = static_cast<double>(pred(i, 0)) - hy(i, 0);
    sum += d * d;
  }
  CHECK(v == Approx(sum / r.val_p.rows).epsilon(1e-5));
  CHECK(v > 0.5);  // targets are standard normals: about 1 and more
}

TEST_CASE("on the training rows, the validation loss is the next step's training loss", "[validation][mpi]") {
  // Full batch: step s + 1's loss is computed on the parameters after step s, as the validation loss is.
  dpmlp::Mlp<float, Memory> model = initial_model();
  Trainer trainer(MPI_COMM_WORLD, model, 600, dpmlp::Adam(0.01));
  Problem p;
  p.rows = 600;
  Matrix x, y;
  draw_rows(p, trainer.shard().first_row, trainer.shard().rows(), x, y);
  trainer.set_data(x, y);
  dpmlp::Validation<Trainer> val(trainer, 600, dpmlp::every_steps(1));
  // The same global rows: the validation shard is the training shard here (both whole blocks of 600 rows).
  REQUIRE(dpmlp_test::all(val.shard().first_row == trainer.shard().first_row && val.shard().rows() == trainer.shard().rows()));
  val.set_data(x, y);
  dpmlp::LossHistory history;
  trainer.train(6, val, history);
  REQUIRE(val.losses().size() == 6);
  for (int s = 0; s + 1 < 6; ++s) CHECK(val.losses()[s] == Approx(history.losses()[s + 1]).epsilon(1e-5));
}

TEST_CASE("the validation loss has the same bits at any rank count", "[validation][mpi]") {
  // This rank count against one rank (MPI_COMM_SELF: every rank runs the one-rank case itself).
  Run world(MPI_COMM_WORLD, dpmlp::every_steps(3));
  Run alone(MPI_COMM_SELF, dpmlp::every_steps(3));
  world.trainer.train(12, world.val);
  alone.trainer.train(12, alone.val);
  REQUIRE(world.val.losses().size() == 4);
  CHECK(bits(world.val.losses()) == bits(alone.val.losses()));
  for (double v : world.val.losses()) CHECK(same_on_every_rank(v));
  // Mini-batches, evaluated every epoch.
  Run world_e(MPI_COMM_WORLD, dpmlp::every_epochs());
  Run alone_e(MPI_COMM_SELF, dpmlp::every_epochs());
  world_e.trainer.train_epochs(3, 128, 9, world_e.val);
  alone_e.trainer.train_epochs(3, 128, 9, alone_e.val);
  REQUIRE(world_e.val.losses().size() == 3);
  CHECK(bits(world_e.val.losses()) == bits(alone_e.val.losses()));
  // A validation set smaller than a block a rank: some ranks hold no validation rows.
  Run world_s(MPI_COMM_WORLD, dpmlp::every_steps(2), 0.01, 70);
  Run alone_s(MPI_COMM_SELF, dpmlp::every_steps(2), 0.01, 70);
  world_s.trainer.train(4, world_s.val);
  alone_s.trainer.train(4, alone_s.val);
  CHECK(bits(world_s.val.losses()) == bits(alone_s.val.losses()));
}

TEST_CASE("every N steps: val_loss reaches end_step after steps N, 2N, ...", "[validation][mpi]") {
  Run r(MPI_COMM_WORLD, dpmlp::every_steps(4));
  Seen seen;
  r.trainer.train(10, r.val, seen);
  CHECK(seen.step_val_steps == std::vector<std::int64_t>{4, 8});
  CHECK(r.val.steps() == std::vector<std::int64_t>{4, 8});
  CHECK(bits(seen.step_vals) == bits(r.val.losses()));
  // Counted over all train calls: the next run goes on from step 10.
  r.trainer.train(6, r.val, seen);
  CHECK(seen.step_val_steps == std::vector<std::int64_t>{4, 8, 12, 16});
  // Mini-batches: still by step (600 rows in batches of 128: 5 steps an epoch), never in EpochInfo.
  r.trainer.train_epochs(2, 128, 1, r.val, seen);
  CHECK(seen.step_val_steps == std::vector<std::int64_t>{4, 8, 12, 16, 20, 24});
  CHECK(seen.epochs_with_val.empty());
}

TEST_CASE("every N epochs: val_loss reaches end_epoch; in train(), every N-th step", "[validation][mpi]") {
  Run r(MPI_COMM_WORLD, dpmlp::every_epochs());
  Seen seen;
  // 5 steps an epoch, 3 epochs: after steps 5, 10, 15, in EpochInfo only.
  r.trainer.train_epochs(3, 128, 1, r.val, seen);
  CHECK(seen.epochs_with_val == std::vector<std::int64_t>{1, 2, 3});
  CHECK(seen.step_val_steps.empty());
  CHECK(r.val.steps() == std::vector<std::int64_t>{5, 10, 15});
  CHECK(bits(seen.epoch_vals) == bits(r.val.losses()));
  Run r2(MPI_COMM_WORLD, dpmlp::every_epochs(2));
  Seen seen2;
  r2.trainer.train_epochs(5, 128, 1, r2.val, seen2);
  CHECK(seen2.epochs_with_val == std::vector<std::int64_t>{2, 4});
  // Full batch: a step is an epoch.
  Seen seen3;
  r2.trainer.train(5, r2.val, seen3);
  CHECK(seen3.step_val_steps == std::vector<std::int64_t>{26, 28, 30});
}

TEST_CASE("EarlyStopping on val_loss restores the parameters of the best evaluation", "[validation][mpi]") {
  Run r(MPI_COMM_WORLD, dpmlp::every_steps(5), 0.03);
  dpmlp::EarlyStopping stop(4);
  stop.restore_best(r.trainer);
  Digests<Trainer> digests{&r.trainer, {}};
  const dpmlp::TrainResult res = r.trainer.train(3000, r.val, stop, digests);
  INFO("stopped after step " << res.steps << ", best step " << stop.best_step());
  CHECK(stop.watches_val_loss());
  REQUIRE(stop.stopped());
  CHECK(res.steps == stop.stopped_step());
  CHECK(res.steps < 3000);
  // Patience counts evaluations: 4 evaluations (20 steps) after the best.
  CHECK(stop.stopped_step() == stop.best_step() + 20);
  // The best is the smallest validation loss (min_delta 0: the first of equal ones).
  const auto& losses = r.val.losses();
  std::size_t best = 0;
  for (std::size_t i = 1; i < losses.size(); ++i) {
    if (losses[i] < losses[best]) best = i;
  }
  CHECK(r.val.steps()[best] == stop.best_step());
  CHECK(stop.best_loss() == losses[best]);
  // The parameters now are those after the best step, bit for bit; not those after the last.
  CHECK(stop.restored());
  const std::uint64_t now = dpmlp::params_digest(r.trainer);
  CHECK(now == digests.after[static_cast<std::size_t>(stop.best_step() - 1)]);
  CHECK(now != digests.after.back());
  // And they evaluate to the best loss again.
  CHECK(r.val.evaluate() == stop.best_loss());
  // The same on every rank.
  CHECK(same_on_every_rank(static_cast<double>(stop.best_step())));
}

TEST_CASE("EarlyStopping on val_loss per epoch; Monitor::loss ignores val_loss", "[validation][mpi]") {
  Run r(MPI_COMM_WORLD, dpmlp::every_epochs(), 0.03);
  dpmlp::EarlyStopping stop(3);
  stop.restore_best(r.trainer);
  Digests<Trainer> digests{&r.trainer, {}};
  const auto res = r.trainer.train_epochs(400, 128, 2, r.val, stop, digests);
  REQUIRE(stop.stopped());
  CHECK(res.steps < 2000);
  CHECK(stop.best_step() % 5 == 0);  // an epoch's last step
  CHECK(stop.stopped_step() == stop.best_step() + 15);
  CHECK(dpmlp::params_digest(r.trainer) == digests.after[static_cast<std::size_t>(stop.best_step() - 1)]);
  // Monitor::loss: the training loss every step, as without validation.
  Run r2(MPI_COMM_WORLD, dpmlp::every_steps(1));
  dpmlp::EarlyStopping on_loss(5);
  on_loss.monitor(dpmlp::EarlyStopping::Monitor::loss);
  dpmlp::LossHistory history;
  r2.trainer.train(40, r2.val, on_loss, history);
  CHECK_FALSE(on_loss.watches_val_loss());
  double best = 1e300;
  for (double l : history.losses()) best = l < best ? l : best;
  CHECK(on_loss.best_loss() == best);
}

TEST_CASE("ProgressBar shows the latest val_loss", "[validation][mpi]") {
  Run r(MPI_COMM_WORLD, dpmlp::every_steps(5));
  std::FILE* f = std::tmpfile();
  REQUIRE(dpmlp_test::all(f != nullptr));
  dpmlp::ProgressBar bar(f, 2, dpmlp::ProgressBar::Mode::lines);
  r.trainer.train(10, r.val, bar);
  const std::string text = dpmlp_test::file_text(f);
  std::fclose(f);
  if (rank() == 0) {
    char v5[64], v10[64];
    std::snprintf(v5, sizeof v5, "val_loss %.6g ms/step", r.val.losses()[0]);
    std::snprintf(v10, sizeof v10, "val_loss %.6g (step 10) in ", r.val.losses()[1]);
    CHECK(text.find("step 4/10 loss ") != std::string::npos);
    CHECK(text.substr(0, text.find("\nstep 6/10")).find("val_loss") == std::string::npos);  // none before step 5
    CHECK(text.find(std::string("\nstep 6/10 loss ")) != std::string::npos);
    CHECK(text.find(v5) != std::string::npos);
    CHECK(text.find(v10) != std::string::npos);
  } else {
    CHECK(text.empty());
  }
}

TEST_CASE("bad validation inputs are refused on every rank", "[validation][mpi]") {
  dpmlp::Mlp<float, Memory> model = initial_model();
  Trainer trainer(MPI_COMM_WORLD, model, 600, dpmlp::Adam(0.01));
  using V = dpmlp::Validation<Trainer>;
  CHECK(dpmlp_test::all(refuses([&] { V(trainer, 0); }, "dpmlp::Validation: an empty validation set (0 rows)")));
  CHECK(dpmlp_test::all(refuses([&] { V(trainer, 100, dpmlp::every_steps(0)); }, "validate every 0 steps: it must be at least 1")));
  CHECK(dpmlp_test::all(refuses([&] { V(trainer, 100, dpmlp::every_epochs(-2)); }, "validate every -2 epochs")));
  if (size() > 1) {
    CHECK(dpmlp_test::all(refuses([&] { V(trainer, 100 + rank()); }, "the ranks passed different validation rows")));
  }
  V val(trainer, 100, dpmlp::every_steps(2));
  CHECK(dpmlp_test::all(refuses([&] { val.evaluate(); }, "set_data() first")));
  // Mismatched columns: 7 inputs for a model of 8.
  Matrix x7("x7", val.shard().rows(), 7), y("y", val.shard().rows(), 1), x("x", val.shard().rows(), 8);
  CHECK(dpmlp_test::all(refuses([&] { val.set_data(x7, y); }, "dpmlp::Validation::set_data: x is ")));
  Matrix y2("y2", val.shard().rows(), 2);
  CHECK(dpmlp_test::all(refuses([&] { val.set_data(x, y2); }, "dpmlp::Validation::set_data: y is ")));
  // A NaN on the last rank that holds validation rows only: every rank refuses.
  int last = val.shard().rows() > 0 ? rank() : -1;
  MPI_Allreduce(MPI_IN_PLACE, &last, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  Matrix xn("xn", val.shard().rows(), 8);
  if (rank() == last) {
    auto h = Kokkos::create_mirror_view(xn);
    Kokkos::deep_copy(h, 0.0f);
    h(0, 3) = std::nanf("");
    Kokkos::deep_copy(xn, h);
  }
  CHECK(dpmlp_test::all(refuses([&] { val.set_data(xn, y); }, "rank " + std::to_string(last) + ": dpmlp::Validation::set_data: x has a non-finite value")));
  // EarlyStopping that must watch val_loss, in a run without validation.
  Matrix tx, ty;
  Problem p;
  p.rows = 600;
  draw_rows(p, trainer.shard().first_row, trainer.shard().rows(), tx, ty);
  trainer.set_data(tx, ty);
  dpmlp::EarlyStopping stop(3);
  stop.monitor(dpmlp::EarlyStopping::Monitor::val_loss);
  CHECK(dpmlp_test::all(refuses([&] { trainer.train(5, stop); }, "it monitors val_loss, but no callback of this run reports one")));
  // The trainer is still usable afterwards.
  CHECK(trainer.train(2).steps == 2);
}
