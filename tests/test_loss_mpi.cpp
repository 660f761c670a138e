// SPDX-License-Identifier: BSD-3-Clause
// The trainer with each loss (loss.hpp) at 1, 2 and 3 ranks: the one-device bits on every engine, full batch
// and mini-batches; the loss it reports is the loss's value; bad or mismatched losses are refused on every rank.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "check_util.hpp"
#include "mpi_test_util.hpp"
#include "trainer_test_util.hpp"

#include <dpmlp/validation.hpp>

using namespace dpmlp_test;

namespace {

template <class Loss>
using LossTrainer = dpmlp::DataParallelTrainer<Space, dpmlp::MpiCommunicator, dpmlp::Sgd, float, Loss>;

struct Run {
  std::vector<float> params;
  dpmlp::TrainResult result;
  float initial_loss = 0;  // value_and_grad's loss of the initial model over every row (one device)
};

// `steps` full-batch steps, or with batch > 0 two epochs of `batch` rows, of `loss` over `comm`.
template <class Loss>
Run train_loss(MPI_Comm comm, const Problem& p, const Loss& loss, const dpmlp::TrainerOptions& opt, int steps,
               std::int64_t batch = 0) {
  dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
  model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
  Run run;
  {
    // The loss of the initial model on one device, over all rows.
    Matrix x, y;
    draw_rows(p, 0, p.rows, x, y);
    Kokkos::View<float*, Memory> grad("grad", model.num_params());
    run.initial_loss = dpmlp::value_and_grad(Space(), model, x, y, grad, loss, opt);
  }
  LossTrainer<Loss> trainer(comm, model, p.rows, dpmlp::Sgd(0.05), loss, opt);
  Matrix x, y;
  draw_rows(p, trainer.shard().first_row, trainer.shard().rows(), x, y);
  trainer.set_data(x, y);
  run.result = batch > 0 ? trainer.train_epochs(2, batch, 11) : trainer.train(steps);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  run.params.assign(h.data(), h.data() + h.extent(0));
  return run;
}

// Whether `opt`'s engine runs `loss` for model `widths` here (the tensor engine computes Mse alone).
template <class Loss>
bool runs(const std::vector<int>& widths, const Loss&, const dpmlp::TrainerOptions& opt) {
  const dpmlp::Mlp<float, Memory> model(widths);
  return refusal([&] { dpmlp::detail::BlockEngine<Space, float, Loss>::plan(model, opt, true, 1000, 1); }).empty();
}

template <class Loss>
void check_same_bits(const Problem& p, const Loss& loss, const dpmlp::TrainerOptions& opt, const std::string& what,
                     std::int64_t batch = 0) {
  if (!runs(p.widths, loss, opt)) return;
  const Run multi = train_loss(MPI_COMM_WORLD, p, loss, opt, 6, batch);
  const Run single = train_loss(MPI_COMM_SELF, p, loss, opt, 6, batch);
  INFO(loss.describe() << ", " << what << ", " << p.widths.size() << " layers, rows " << p.rows << ", batch " << batch
                       << ", ranks " << size());
  REQUIRE(multi.params.size() == single.params.size());
  CHECK(std::memcmp(multi.params.data(), single.params.data(), multi.params.size() * sizeof(float)) == 0);
  CHECK(multi.result.first_loss == single.result.first_loss);
  CHECK(multi.result.last_loss == single.result.last_loss);
  // Full batch: the first step's loss is the loss of the initial model, as value_and_grad computes it, and
  // the steps lower it.
  if (batch == 0) {
    CHECK(multi.result.first_loss == multi.initial_loss);
    CHECK(multi.result.last_loss < multi.result.first_loss);
  }
}

}  // namespace

TEST_CASE("every loss gives the one-device bits at any rank count, every engine", "[loss][trainer]") {
  Problem one_hidden;
  one_hidden.rows = 1001;
  one_hidden.widths = {8, 16, 2};
  Problem deep;
  deep.rows = 523;
  deep.widths = {5, 12, 9, 3};
  deep.activation = dpmlp::Activation::tanh;

  std::vector<EngineChoice> engines = fused_engines(one_hidden.widths);
  engines.push_back({dpmlp::Engine::layered});
  if (dpmlp::is_host_space<Space>()) engines.push_back({dpmlp::Engine::host});
  for (const auto& e : engines) {
    for (std::int64_t block : {std::int64_t(0), std::int64_t(16)}) {
      dpmlp::TrainerOptions opt;
      e.apply(opt);
      opt.block_rows = block;
      const std::string what = e.name() + ", block " + std::to_string(block);
      check_same_bits(one_hidden, dpmlp::L1(), opt, what);
      check_same_bits(one_hidden, dpmlp::L1({2.0, 0.5}), opt, what);
      check_same_bits(one_hidden, dpmlp::Huber(), opt, what);
      check_same_bits(one_hidden, dpmlp::Huber(0.3, {0.25, 3.0}), opt, what);
      check_same_bits(one_hidden, dpmlp::Mse({1.5, 0.0}), opt, what);
    }
  }
  dpmlp::TrainerOptions opt;
  opt.block_rows = 32;
  check_same_bits(deep, dpmlp::L1({1.0, 2.0, 0.5}), opt, "automatic (host or layered)");
  check_same_bits(deep, dpmlp::Huber(0.2), opt, "automatic (host or layered)");
  check_same_bits(deep, dpmlp::Mse({0.5, 1.0, 4.0}), opt, "automatic (host or layered)");
}

TEST_CASE("every loss gives the one-device bits with mini-batches", "[loss][trainer][minibatch]") {
  Problem p;
  p.rows = 700;
  p.widths = {6, 10, 2};
  for (const auto& e : fused_engines(p.widths)) {
    dpmlp::TrainerOptions opt;
    e.apply(opt);
    check_same_bits(p, dpmlp::Huber(0.4, {1.0, 0.5}), opt, e.name(), 96);
    check_same_bits(p, dpmlp::L1(), opt, e.name(), 96);
  }
  p.widths = {6, 10, 10, 2};
  dpmlp::TrainerOptions opt;
  check_same_bits(p, dpmlp::Huber(0.4), opt, "layered", 128);
  check_same_bits(p, dpmlp::L1({3.0, 1.0}), opt, "layered", 128);
}

TEST_CASE("bad or mismatched losses are refused on every rank", "[loss][trainer]") {
  dpmlp::Mlp<float, Memory> model({4, 8, 2});
  auto make = [&](const auto& loss) {
    return refusal([&] {
      LossTrainer<std::decay_t<decltype(loss)>> t(MPI_COMM_WORLD, model, 100, dpmlp::Sgd(0.1), loss);
    });
  };
  using Catch::Contains;
  // Bad on every rank.
  CHECK_THAT(make(dpmlp::Huber(-1.0)), Contains("dpmlp::Huber: delta must be positive and finite, got -1"));
  CHECK_THAT(make(dpmlp::Mse({1.0, 2.0, 3.0})), Contains("dpmlp::Mse: 3 output weights for a model of 2 outputs"));
  CHECK_THAT(make(dpmlp::L1({0.0, 0.0})), Contains("dpmlp::L1: every output weight is 0"));
  CHECK_THAT(make(dpmlp::L1({1.0, -1.0})), Contains("output weight 1 is -1"));
  if (size() == 1) return;
  // Bad on the last rank only: every rank throws its message.
  const int last = size() - 1;
  CHECK_THAT(make(dpmlp::Huber(rank() == last ? 0.0 : 1.0)),
             Contains("rank " + std::to_string(last) + ": dpmlp::DataParallelTrainer: dpmlp::Huber: delta must be"));
  // Valid but different: the replicas would part.
  CHECK_THAT(make(dpmlp::Huber(rank() == last ? 0.5 : 1.0)), Contains("the ranks were given different losses"));
  CHECK_THAT(make(dpmlp::Mse(rank() == 0 ? std::vector<double>{1.0, 2.0} : std::vector<double>{})),
             Contains("the ranks were given different losses"));
  // The same loss on every rank is fine.
  CHECK(make(dpmlp::Huber(0.5, {1.0, 2.0})).empty());
}

namespace {
// The validation loss of a fresh model under `loss` over `comm`: 300 held-out rows.
template <class Loss>
double validation_loss(MPI_Comm comm, const Problem& p, const Loss& loss) {
  dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
  model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
  LossTrainer<Loss> trainer(comm, model, p.rows, dpmlp::Sgd(0.05), loss);
  dpmlp::Validation<LossTrainer<Loss>> val(trainer, 300, dpmlp::every_steps(1));
  Problem held_out = p;
  held_out.seed = p.seed + 7;
  Matrix x, y;
  draw_rows(held_out, val.shard().first_row, val.shard().rows(), x, y);
  val.set_data(x, y);
  return val.evaluate();
}
}  // namespace

TEST_CASE("validation evaluates the trainer's loss", "[loss][validation]") {
  Problem p;
  p.widths = {5, 12, 3};
  const auto huber = dpmlp::Huber(0.4, {1.0, 3.0, 0.5});
  const double multi = validation_loss(MPI_COMM_WORLD, p, huber);
  const double single = validation_loss(MPI_COMM_SELF, p, huber);
  CHECK(std::memcmp(&multi, &single, sizeof multi) == 0);  // the same bits at any rank count
  // value_and_grad's Huber loss of the same rows (in float: within float rounding of the double sum).
  dpmlp::Mlp<float, Memory> model(p.widths, p.activation);
  model.init_jax(dpmlp::random::PRNGKey(p.seed + 1), 0.3f);
  Problem held_out = p;
  held_out.seed = p.seed + 7;
  Matrix x, y;
  draw_rows(held_out, 0, 300, x, y);
  Kokkos::View<float*, Memory> grad("grad", model.num_params());
  const double want = dpmlp::value_and_grad(Space(), model, x, y, grad, huber);
  const double mse = dpmlp::value_and_grad(Space(), model, x, y, grad, dpmlp::Mse());
  INFO("validation " << multi << ", value_and_grad " << want << ", mse " << mse);
  CHECK(std::fabs(multi - want) <= 1e-6 * want);
  CHECK(std::fabs(multi - mse) > 0.1 * mse);
}
