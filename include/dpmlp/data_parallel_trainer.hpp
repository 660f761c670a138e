// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/data_parallel_trainer.hpp: data-parallel training, one MPI rank per device.
//
// The batch is sharded over the ranks of a communicator (whole row blocks per rank), the parameters are
// replicated, and each step the gradient of the global loss (Loss, loss.hpp: by default the mean squared
// error) is summed across ranks with one collective over one contiguous buffer (gradient + loss). Every kernel
// runs on the trainer's ExecSpace.
//
//   using Trainer = dpmlp::DataParallelTrainer<Kokkos::DefaultExecutionSpace>;
//   dpmlp::Mlp<float, Trainer::memory_space> model({32, 32, 1});
//   Trainer trainer(MPI_COMM_WORLD, model, global_rows, dpmlp::Sgd(0.02));
//   auto shard = trainer.shard();              // the rows this rank must provide
//   trainer.set_data(x_local, y_local);        // Views of shard.rows() rows, in Trainer::memory_space
//   auto result = trainer.train(100);          // result.first_loss, result.last_loss
#pragma once

#include <algorithm>
#include <climits>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dpmlp/backend/peer_exchange.hpp"
#include "dpmlp/backend/step_graph.hpp"
#include "dpmlp/callback_hooks.hpp"
#include "dpmlp/comm/communicator.hpp"
#include "dpmlp/devices.hpp"
#include "dpmlp/digest.hpp"
#include "dpmlp/engine/block_engine.hpp"
#include "dpmlp/engine/plan.hpp"
#include "dpmlp/epoch_order.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/linalg/gemm.hpp"
#include "dpmlp/loss.hpp"
#include "dpmlp/mlp.hpp"
#include "dpmlp/optim.hpp"
#include "dpmlp/reduction.hpp"
#include "dpmlp/trainer_options.hpp"

namespace dpmlp {

template <class ExecSpace, class Comm = default_communicator_t<ExecSpace>, class Optimizer = Sgd, class Scalar = float,
          class Loss = Mse>
class DataParallelTrainer {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "DataParallelTrainer<ExecSpace, ...>: ExecSpace must be a Kokkos execution space");
  static_assert(is_communicator<Comm>::value,
                "DataParallelTrainer<..., Comm>: Comm must model the Communicator concept (comm/communicator.hpp)");
  static_assert(is_optimizer<Optimizer>::value,
                "DataParallelTrainer<..., Optimizer>: Optimizer must model the Optimizer concept (optim.hpp)");
  static_assert(is_loss<Loss>::value,
                "DataParallelTrainer<..., Loss>: Loss must model the Loss concept (loss.hpp: Mse, L1, Huber)");

 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using communicator_type = Comm;
  using optimizer_type = Optimizer;
  using scalar_type = Scalar;
  using loss_type = Loss;
  using engine_type = detail::BlockEngine<ExecSpace, Scalar, Loss>;
  using model_type = Mlp<Scalar, memory_space>;
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using const_matrix = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;

  // Collective over `comm`. `model` is shared, not copied: training updates its parameters in place. The
  // loss is Loss() (Mse: the mean squared error).
  DataParallelTrainer(MPI_Comm comm, const model_type& model, std::int64_t global_rows,
                      const Optimizer& optimizer = Optimizer(), const TrainerOptions& options = TrainerOptions(),
                      const ExecSpace& space = ExecSpace())
      : DataParallelTrainer(comm, model, global_rows, optimizer, Loss(), options, space) {}

  // The same, learning `loss` (a dpmlp::Mse, L1 or Huber with its delta and output weights). Every rank must
  // pass the same loss: the trainer compares them and refuses a mismatch.
  DataParallelTrainer(MPI_Comm comm, const model_type& model, std::int64_t global_rows, const Optimizer& optimizer,
                      const Loss& loss, const TrainerOptions& options = TrainerOptions(),
                      const ExecSpace& space = ExecSpace());

  // This rank's rows: whole leaves of the block tree (groups of leaf_group() blocks).
  const Shard& shard() const { return plan_.shard(); }
  // The block tree of this shard layout, over its leaves (reproducible_row_sum takes it, to sum other row data
  // alike).
  const BlockTreePlan& plan() const { return plan_; }
  std::int64_t global_rows() const { return global_rows_; }
  // Rows a block: the engine sums a block's rows, then the block tree the blocks.
  std::int64_t block_rows() const { return engine_plan_.block_rows; }
  // Blocks a step over every rank (the tensor engine picks its kernel from this count, not from a rank's share).
  std::int64_t global_blocks() const { return (global_rows_ + block_rows() - 1) / block_rows(); }
  // Blocks a leaf of the block tree holds: more than one where the engine sums the tree's first levels itself
  // (the register-resident tensor kernel; the same bits). plan()'s blocks are block_rows() x leaf_group() rows.
  int leaf_group() const { return engine_plan_.leaf_group; }
  linalg::Backend gemm_backend() const { return engine_plan_.gemm; }
  Engine engine() const { return engine_plan_.engine; }
  // How a step computes its block sums (engine/plan.hpp): the same on every rank.
  const EnginePlan& engine_plan() const { return engine_plan_; }
  // The plan of train_epochs' batches (of its last batch size; a shorter last batch of an epoch may have
  // its own), planned for a batch's rows as engine_plan() is for the full batch's; null before train_epochs.
  const EnginePlan* batch_plan() const { return epochs_ ? &epochs_->full.plan : nullptr; }
  const TrainerOptions& options() const { return options_; }
  const Optimizer& optimizer() const { return optimizer_; }
  // What a step learns: each step's loss (TrainResult, StepInfo, the callbacks) is this loss's value.
  const Loss& loss() const { return loss_; }
  // The optimizer's state (optimizer().state_size(num_params) values), e.g. for checkpoints.
  const Kokkos::View<Scalar*, memory_space>& optimizer_state() const { return state_; }
  const Comm& communicator() const { return comm_; }
  const model_type& model() const { return model_; }
  const ExecSpace& space() const { return space_; }

  // This rank's rows: x is shard().rows() x inputs, y is shard().rows() x outputs, LayoutRight, in
  // memory_space. No copy is made: the trainer keeps the Views. Collective: every rank validates its rows
  // (shapes, non-finite values) and all ranks throw the first failing rank's InputError.
  void set_data(const const_matrix& x, const const_matrix& y);

  // Runs `steps` SGD steps. The losses stay on the device until the run ends; the only host waits inside
  // the loop are those of a host-synchronous communicator (MPI with device data staged through the host).
  // Non-finite losses are checked once, at the end of the run, and reported with the first bad step.
  TrainResult train(int steps);

  // Runs up to `steps` steps with callbacks (callbacks.hpp: any objects with some of the optional hooks
  // begin_training(const TrainInfo&), end_step(const StepInfo&) -> bool, end_training(const TrainResult&)).
  // Each step's loss is read on the host after the step, so this adds one host synchronization per step;
  // an end_step returning true stops training after that step (every rank sees the same loss, so every
  // rank stops at the same step). A validation callback's validate hook (validation.hpp) runs after the step
  // and before the end_step hooks, which see its value in StepInfo::val_loss.
  template <class Callback, class... More>
  TrainResult train(int steps, Callback&& callback, More&&... more) {
    begin_run(steps);
    ensure_engine();
    TrainInfo info{steps, steps_done_, comm_.rank(), comm_.size()};
    info.validation = detail::any_validates<Callback, More...>();
    detail::call_begin(info, callback, more...);
    int done = 0;
    bool stop = false;
    while (done < steps && !stop) {
      stop = step_with_callbacks(done++, [&] { step(); }, callback, more...);
    }
    const TrainResult r = end_run(done);
    detail::call_end(r, callback, more...);
    return r;
  }

  // Mini-batch training: `batch_rows` rows a step (the last batch of an epoch may be shorter), each step's
  // gradient and loss the mean over its batch. Epoch e visits the global rows in the order
  // EpochOrder(seed, e, global_rows()) (epoch_order.hpp): drawn from the seed and the epoch alone, so the
  // batches, and with the reproducible reduction the trained bits, are the same at any rank count.
  //
  // A step costs its batch, not the data: at the start of an epoch every rank gathers the rows of its share
  // of every batch into one buffer, batch after batch (on one rank a device gather; on several, one
  // all-to-all exchange of rows over MPI, every row sent once), and each step then reads only its batch's
  // rows. A batch's sums have the block tree's shape over that batch, whatever the rank count. Without
  // callbacks, on a CUDA space with a stream-ordered communicator, the second and later epochs of a batch size
  // replay one captured CUDA graph of a whole epoch (any optimizer and schedule: the update count lives on the
  // device).
  //
  // Runs until `epochs` epoch ends have passed. Epochs are counted from steps_done(): epoch steps_done() /
  // steps-per-epoch, at step steps_done() % steps-per-epoch of it. So a run restored from a checkpoint
  // anywhere, mid-epoch included, continues exactly where it stopped (same seed, same batch_rows): a run of
  // E epochs stopped after k whole epochs and some steps resumes with train_epochs(E - k, ...).
  // The peer exchange (TrainerOptions::peer_exchange) is not used here: the batches' sums go through the
  // communicator. Callbacks as in train(steps, callbacks...), plus the optional void begin_epoch(std::int64_t
  // epoch) and bool end_epoch(const EpochInfo&).
  template <class... Callbacks>
  TrainResult train_epochs(int epochs, std::int64_t batch_rows, std::uint64_t seed, Callbacks&&... callbacks) {
    std::string problem;
    const std::int64_t per_epoch = batch_rows > 0 ? (global_rows_ + batch_rows - 1) / batch_rows : 0;
    if (epochs <= 0) {
      problem = "epochs must be positive, got " + std::to_string(epochs);
    } else if (batch_rows <= 0 || batch_rows > global_rows_) {
      problem = "batch_rows must be in [1, " + std::to_string(global_rows_) + "], got " + std::to_string(batch_rows);
    } else if (per_epoch > std::numeric_limits<int>::max() / epochs) {  // per_epoch * epochs, without overflow
      problem = "too many steps in one call (" + std::to_string(per_epoch) + " steps an epoch, " + std::to_string(epochs) +
                " epochs)";
    } else if (!has_data_) {
      problem = "set_data() first";
    }
    agree(comm_.mpi_comm(), problem.empty() ? problem : "dpmlp::DataParallelTrainer::train_epochs: " + problem);
    prepare_epochs(batch_rows);
    EpochSetup& es = *epochs_;
    const std::int64_t first_epoch = steps_done_ / per_epoch, first_step = steps_done_ % per_epoch;
    const int total = static_cast<int>(per_epoch * epochs - first_step);
    begin_run(total);
    TrainInfo info{total, steps_done_, comm_.rank(), comm_.size()};
    info.epochs = true;
    info.validation = detail::any_validates<Callbacks...>();
    detail::call_begin(info, callbacks...);
    int done = 0;
    bool stop = false;
    for (int e = 0; e < epochs && !stop; ++e) {
      const std::int64_t epoch = first_epoch + e;
      fill_epoch(seed, epoch);
      const int epoch_start = done;
      detail::call_begin_epoch(epoch + 1, callbacks...);
      std::int64_t k = e == 0 ? first_step : 0;
      if constexpr (sizeof...(Callbacks) == 0) {
        // The whole epoch as one graph: captured from the second epoch of this batch size on (the first,
        // plain, warms what must not be set up during a capture).
        if (k == 0 && use_epoch_graph()) {
          if (!es.graph.ready() && es.warm) {
            note_graph_failure(es.graph.capture(space_, [&] {
              for (std::int64_t b = 0; b < per_epoch; ++b) epoch_step(b);
            }));
          }
          if (es.graph.ready()) {
            es.graph.launch(space_);
            mark_progress();
            done += static_cast<int>(per_epoch);
            k = per_epoch;
          }
        }
      }
      for (; k < per_epoch && !stop; ++k) {
        if constexpr (sizeof...(Callbacks) > 0) {
          stop = step_with_callbacks(done, [&] { epoch_step(k); }, callbacks...);
        } else {
          epoch_step(k);  // no callbacks: nothing is read back until the run ends
          mark_progress();
        }
        ++done;
      }
      es.warm = true;
      if constexpr (sizeof...(Callbacks) > 0) {
        if (k == per_epoch) {  // the epoch ended (not stopped inside it)
          const int n = done - epoch_start;
          auto losses = Kokkos::create_mirror_view_and_copy(
              Kokkos::HostSpace(), Kokkos::subview(losses_, std::make_pair(epoch_start, done)));
          double sum = 0;
          for (std::size_t i = 0; i < losses.extent(0); ++i) sum += static_cast<double>(losses(i));
          EpochInfo ei{epoch + 1, n, sum / static_cast<double>(n)};
          // Between steps (no capture is open): a validation callback evaluates here, collectively.
          ei.val_loss = detail::call_validate(ei, callbacks...);
          stop = detail::call_end_epoch(ei, callbacks...) || stop;
        }
      }
    }
    const TrainResult r = end_run(done);
    detail::call_end(r, callbacks...);
    return r;
  }

  // One step of a run with callbacks: begin_step, the step (`enqueue`), its loss read on the host, the
  // validate hooks (StepInfo::val_loss), end_step.
  // `done`: the steps this run took before it. True when a callback asks to stop.
  template <class Enqueue, class... Callbacks>
  bool step_with_callbacks(int done, const Enqueue& enqueue, Callbacks&... callbacks) {
    detail::call_begin_step(steps_done_ + done + 1, callbacks...);
    const auto t0 = std::chrono::steady_clock::now();
    enqueue();
    wait_for_space("DataParallelTrainer: a step (callbacks)");
    Scalar loss = 0;
    Kokkos::deep_copy(space_, loss, Kokkos::subview(losses_, done));
    compat::fence(space_, "dpmlp::DataParallelTrainer (callbacks)");
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    StepInfo info{steps_done_ + done + 1, done + 1, static_cast<double>(loss), ms};
    // The step has run (no capture is open): a validation callback evaluates here, collectively, and every
    // end_step sees its loss.
    info.val_loss = detail::call_validate(info, callbacks...);
    return detail::call_end_step(info, callbacks...);
  }

  // Steps taken so far (over all train() calls). A checkpoint restores it (the optimizer's step count).
  // set_steps_done is local (not collective); a count outside [0, max_steps_done] (trainer_options.hpp) is
  // refused with InputError, so the step arithmetic of every later run cannot overflow.
  std::int64_t steps_done() const { return steps_done_; }
  void set_steps_done(std::int64_t steps) {
    if (steps < 0 || steps > max_steps_done) {
      throw InputError("dpmlp::DataParallelTrainer::set_steps_done: the step count must be in [0, " +
                       std::to_string(max_steps_done) + "], got " + std::to_string(steps));
    }
    steps_done_ = steps;
  }

 // The rest is public only because CUDA's extended lambdas may not live in private member functions.
  void begin_run(int steps);

  // Waits for the run, counts its steps, and checks its losses (the one divergence check: once a run).
  TrainResult end_run(int steps);

  // Waits for everything enqueued on the space. With a stream-ordered communicator (NCCL) its collectives are
  // there: the communicator's wait gives up after the collective timeout without progress (CommError);
  // elsewhere a fence.
  void wait_for_space(const char* what) {
    if constexpr (detail::has_stream_wait<Comm, ExecSpace>::value) {
      comm_.wait(space_, what);
    } else {
      (void)what;
      compat::fence(space_, "dpmlp::DataParallelTrainer");
    }
  }
  // After each enqueued step (never inside a capture): a progress mark that wait_for_space measures progress by.
  void mark_progress() {
    if constexpr (detail::has_stream_wait<Comm, ExecSpace>::value) comm_.mark(space_);
  }

  // Whether train() replays a captured step.
  bool use_graph() const {
    // The peer exchange makes any communicator's step stream-ordered: it calls no collective.
    return options_.cuda_graph && backend::StepGraph<ExecSpace>::supported && (Comm::stream_ordered || peer_) &&
           !graph_failed_;
  }

  // Whether train_epochs() replays a captured epoch (which uses the communicator, never the peer exchange).
  bool use_epoch_graph() const {
    return options_.cuda_graph && backend::StepGraph<ExecSpace>::supported && Comm::stream_ordered &&
           !graph_failed_;
  }
  void note_graph_failure(const std::string& failure) {
    if (failure.empty()) return;
    graph_failed_ = true;
    if (comm_.rank() == 0) {
      std::fprintf(stderr, "dpmlp: CUDA graph capture failed (%s); running without graphs\n", failure.c_str());
    }
  }

  // Enqueues one full-batch step. The loss goes to losses_(loss_index_), and the index moves on, on the
  // device, so a captured step can be replayed unchanged.
  void step();

  // Enqueues step k of the prepared epoch: batch k, whose rows are this rank's part of the epoch buffer.
  void epoch_step(std::int64_t k);

  // One step over this rank's rows x, y of a step whose mean loss is inv * (sum of squared residuals):
  // `engine` fills its block sums, `reducer` (with `peer`, where not null) sums them and applies the update.
  void step_with(const engine_type& engine, const BlockTreeReducer<ExecSpace, Scalar>& reducer,
                 const const_matrix& x, const const_matrix& y, const Scalar inv, backend::PeerExchange* peer);

  // The clipping norm's fixed order: lane w of clip_lanes sums the squares of entries w, w + clip_lanes, ... in
  // order (in double), then lanes[w] += lanes[w + h] for h = clip_lanes / 2, ..., 1. The same on every space
  // and rank count, so is the coefficient.
  static constexpr int clip_lanes = 256;

  template <class Update>
  void clip_and_update(const Update& update) {
    const auto grad = grad_;
    const auto params = model_.params();
    const auto state = state_;
    const auto lanes = clip_norm_;
    const std::int64_t P = static_cast<std::int64_t>(model_.num_params());
    const double max_norm = options_.clip_grad_norm;
    Kokkos::parallel_for(
        "dpmlp::clip_norm_lanes", Kokkos::RangePolicy<ExecSpace>(space_, 0, clip_lanes), KOKKOS_LAMBDA(const int w) {
          double sum = 0;
          for (std::int64_t i = w; i < P; i += clip_lanes) sum += static_cast<double>(grad(i)) * grad(i);
          lanes(w) = sum;
        });
    Kokkos::parallel_for(
        "dpmlp::clip_norm", Kokkos::RangePolicy<ExecSpace>(space_, 0, 1), KOKKOS_LAMBDA(const int) {
          for (int h = clip_lanes / 2; h >= 1; h /= 2) {
            for (int w = 0; w < h; ++w) lanes(w) += lanes(w + h);
          }
          // lanes(clip_lanes) holds the coefficient, as torch: max_norm / (norm + 1e-6), at most 1.
          const double c = max_norm / (compat::sqrt(lanes(0)) + 1e-6);
          lanes(clip_lanes) = c < 1.0 ? c : 1.0;
        });
    Kokkos::parallel_for(
        "dpmlp::clipped_update", Kokkos::RangePolicy<ExecSpace>(space_, 0, P), KOKKOS_LAMBDA(const std::int64_t i) {
          const Scalar coefficient = static_cast<Scalar>(lanes(clip_lanes));
          update(i, P, params.data(), grad(i) * coefficient, state.data());
        });
  }

  // What a step of one batch size needs: the batch's plan and tree (over the batch's rows, so the same at any
  // rank count), the engine and reducer for this rank's share, and every rank's share.
  struct BatchShape {
    std::int64_t rows = 0, local_rows = 0;  // the batch's rows; this rank's
    EnginePlan plan;
    BlockTreePlan tree;
    engine_type engine;
    BlockTreeReducer<ExecSpace, Scalar> reducer;
    Kokkos::View<std::int64_t*, memory_space> bounds;  // rank r's rows of a batch: [bounds(r), bounds(r + 1))
  };
  // train_epochs' set-up for one batch size, kept while the batch size stays.
  struct EpochSetup {
    std::int64_t batch_rows = 0, per_epoch = 0;
    BatchShape full;
    std::unique_ptr<BatchShape> last;  // the epoch's shorter last batch, if it has one
    matrix x, y;  // this rank's rows of the epoch, batch after batch (full.local_rows rows a batch)
    Kokkos::View<std::int64_t*, memory_space> order;  // one rank: the row at each position
    // Several ranks: the exchange's buffers (each local row's position in the epoch and destination rank).
    Kokkos::View<std::int64_t*, memory_space> position;
    Kokkos::View<int*, memory_space> dest;
    Kokkos::View<std::int64_t*, memory_space> counts;
    Kokkos::View<unsigned char*, memory_space> send, recv;
    backend::StepGraph<ExecSpace> graph;  // a whole epoch, captured
    bool warm = false;                    // an epoch of this size ran (so a capture can start)
  };

  // Sets up train_epochs for `batch_rows` (collective; kept until another batch size is asked for).
  void prepare_epochs(std::int64_t batch_rows);

  void make_batch_shape(BatchShape& b, std::int64_t rows);

  // An exchanged row: its position in the epoch, then its inputs and outputs (padded to 8 bytes).
  std::size_t record_bytes() const {
    const std::size_t bytes = sizeof(std::int64_t) + std::size_t(model_.inputs() + model_.outputs()) * sizeof(Scalar);
    return (bytes + 7) / 8 * 8;
  }

  // Fills the epoch buffer with this rank's rows of every batch of epoch `epoch`, in order. Stream-ordered
  // on one rank; on several, the exchange waits for its rows on the host.
  void fill_epoch(std::uint64_t seed, std::int64_t epoch);

  // Several ranks: each of this rank's rows goes to the rank whose share of its batch holds its position, in
  // one MPI_Alltoallv of records (position, inputs, outputs), staged through the host; the receiver places
  // each by its position, so the order of the records in the buffers does not matter.
  void exchange_epoch(const EpochOrder& order);

  // The plan for steps over `rows` global rows, the same on every rank (collective). `mine`: this rank's plan.
  // The tree's leaves are groups of leaf_group blocks where the engine sums them itself (the same bits: a
  // group is a subtree), so ranks own whole groups and must take the same group: the smallest of theirs.
  // Then every rank must run the same plan: their sums would differ in the last bits, so a mix (ranks on
  // different kinds of device) would silently break the bitwise reproducibility.
  EnginePlan agreed_plan(EnginePlan mine, std::int64_t rows);

  // The full-batch engine (allocated by the constructor, or for the layered engine on the first full-batch
  // step: mini-batch training does not need it). Collective.
  void ensure_engine();

  void sync_parameters();

  std::string check_shapes(const const_matrix& x, const const_matrix& y) const;

  // The first non-finite element of v, as "global row R, column C", or "".
  std::string find_non_finite(const const_matrix& v, const char* name) const;

 private:
  Comm comm_;
  model_type model_;
  Optimizer optimizer_;
  Loss loss_;
  TrainerOptions options_;
  ExecSpace space_;
  std::int64_t global_rows_ = 0, steps_done_ = 0;
  EnginePlan engine_plan_;
  BlockTreePlan plan_;
  engine_type engine_;
  BlockTreeReducer<ExecSpace, Scalar> reducer_;
  const_matrix x_, y_;
  bool has_data_ = false;
  Kokkos::View<Scalar*, memory_space> losses_, state_;
  Kokkos::View<int, memory_space> loss_index_{"dpmlp::loss_index"};
  // The updates applied (steps_done_ at the start of a run, counted on the device during it) and the current
  // update's per-step scalars (Optimizer::prepare).
  Kokkos::View<std::int64_t, memory_space> update_count_{"dpmlp::update_count"};
  // Gradient clipping (TrainerOptions::clip_grad_norm): the reduced gradient, and the norm's lanes and the
  // coefficient.
  Kokkos::View<Scalar*, memory_space> grad_;
  Kokkos::View<double[clip_lanes + 1], memory_space> clip_norm_{"dpmlp::clip_norm"};
  Kokkos::View<double[step_scalars], memory_space> step_scalars_{"dpmlp::step_scalars"};
  bool graph_failed_ = false;
  bool engine_ready_ = false;
  std::shared_ptr<backend::PeerExchange> peer_;  // TrainerOptions::peer_exchange on two or more ranks
  std::unique_ptr<EpochSetup> epochs_;  // train_epochs' buffers and captured epoch (destroyed before comm_)
  // Last: destroyed first, before the communicator whose collective it captured.
  backend::StepGraph<ExecSpace> graph_;
};

// The members that run kernels, defined out of the class: an explicit instantiation declaration (below)
// suppresses them, where the library compiles them once.

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::DataParallelTrainer(
    MPI_Comm comm, const model_type& model, std::int64_t global_rows, const Optimizer& optimizer, const Loss& loss,
    const TrainerOptions& options, const ExecSpace& space)
    : comm_(comm), model_(model), optimizer_(optimizer), loss_(loss), options_(options), space_(space) {
  MPI_Comm c = comm_.mpi_comm();
  // First, so that every collective of this trainer has its timeout (an invalid one is refused below).
  const bool timeout_ok = options.collective_timeout_s > 0 && std::isfinite(options.collective_timeout_s);
  if (timeout_ok) set_collective_timeout(c, options.collective_timeout_s);
  using engine_t = engine_type;
  const bool reproducible = options.reduction == Reduction::reproducible;
  std::string problem;
  // Everything before a collective that can fail on one rank (a std::bad_alloc in a plan included) is caught
  // and agreed on: a rank that threw alone would leave the others waiting.
  try {
    optimizer.validate();
    loss.validate(model.outputs());
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!problem.empty()) {
  } else if (global_rows <= 0) {
    problem = "zero rows";
  } else if (global_rows < comm_.size()) {
    problem = "fewer rows (" + std::to_string(global_rows) + ") than ranks (" + std::to_string(comm_.size()) + ")";
  } else if (!(options.peer_timeout_s > 0)) {
    problem = "peer_timeout_s must be positive";
  } else if (!(options.clip_grad_norm >= 0) || !std::isfinite(options.clip_grad_norm)) {
    problem = "clip_grad_norm must be >= 0 and finite (0: no clipping), got " + std::to_string(options.clip_grad_norm);
  } else if (!timeout_ok) {
    problem = "collective_timeout_s must be positive and finite, got " + std::to_string(options.collective_timeout_s);
  } else {
    try {
      engine_plan_ = engine_t::plan(model, options, reproducible, global_rows, comm_.size());
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  agree(c, problem.empty() ? problem : "dpmlp::DataParallelTrainer: " + problem);
  {
    // Ranks that learned different losses would update their replicas differently.
    const std::string mine = loss.describe();
    const auto key = static_cast<long long>(fnv1a64(mine.data(), mine.size()) >> 1);
    long long range[2] = {key, -key};
    timed_allreduce(MPI_IN_PLACE, range, 2, MPI_LONG_LONG, MPI_MAX, c,
                    "MPI_Allreduce (DataParallelTrainer: the losses)");
    agree(c, range[0] == -range[1]
                 ? std::string()
                 : "dpmlp::DataParallelTrainer: the ranks were given different losses (this rank: " + mine + ")");
  }
  global_rows_ = global_rows;
  engine_plan_ = agreed_plan(engine_plan_, global_rows);
  all_or_none(c, [&] {
    plan_ = BlockTreePlan(global_rows, engine_plan_.block_rows * engine_plan_.leaf_group, comm_.rank(), comm_.size());
    reducer_ = BlockTreeReducer<ExecSpace, Scalar>(plan_, std::int64_t(model_.num_params()) + 1, options.reduction);
  });
  // The one-kernel engines hold only their partial sums: allocated now, as the reducer. The layered engine's
  // activations for every row can be large, and mini-batch training does not need them: on first use.
  if (engine_plan_.engine != Engine::layered) ensure_engine();
  {
    // Every rank must take the same path (the exchange's kernel pairs with the peers' kernels, not with a
    // collective), so a rank that did not ask for it refuses too.
    int asked[2] = {options.peer_exchange ? 1 : 0, options.peer_exchange ? -1 : 0}, most[2] = {0, 0};
    timed_allreduce(asked, most, 2, MPI_INT, MPI_MAX, c, "MPI_Allreduce (DataParallelTrainer: peer_exchange)");
    std::string why;
    if (most[0] != -most[1]) {
      why = "some ranks asked for peer_exchange and some did not";
    } else if (options.peer_exchange && comm_.size() > 1) {
      why = backend::peer_exchange_unsupported<ExecSpace, Scalar>();
      if (why.empty()) {
        // Collective (every rank gets here: the same option, the same types). Two ranks on one GPU: one's
        // kernel would spin waiting for the other's, which waits for the GPU.
        const int gpus = count_physical_devices<ExecSpace>(c, false, space_);
        if (gpus != comm_.size()) {
          why = "it needs one GPU per rank, but the " + std::to_string(comm_.size()) + " ranks drive " +
                std::to_string(gpus) + " distinct GPUs";
        }
      }
      if (why.empty() && options.reduction != Reduction::reproducible) why = "it needs Reduction::reproducible";
    }
    agree(c, why.empty() ? why : "dpmlp::DataParallelTrainer: peer_exchange: " + why);
    if (options.peer_exchange && comm_.size() > 1) {
      peer_ = backend::make_peer_exchange(c, reducer_, options.peer_timeout_s);
    }
  }
  all_or_none(c, [&] {
    state_ = Kokkos::View<Scalar*, memory_space>("dpmlp::optimizer_state", optimizer.state_size(model_.num_params()));
    if (options.clip_grad_norm > 0) {
      grad_ = Kokkos::View<Scalar*, memory_space>("dpmlp::clip_gradient", model_.num_params());
    }
  });
  sync_parameters();
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::set_data(const const_matrix& x,
                                                                             const const_matrix& y) {
  std::string problem = check_shapes(x, y);
  if (problem.empty()) problem = find_non_finite(x, "x");
  if (problem.empty()) problem = find_non_finite(y, "y");
  agree(comm_.mpi_comm(), problem);
  x_ = x;
  y_ = y;
  has_data_ = true;
  graph_ = backend::StepGraph<ExecSpace>();  // a captured step reads the old Views' pointers
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
TrainResult DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::train(int steps) {
  begin_run(steps);
  ensure_engine();
  int s = 0;
  if (use_graph()) {
    if (!graph_.ready()) {
      // One plain step first: it warms the caches (kernel attributes, library handles, the collective)
      // that must not be set up during a capture.
      step();
      ++s;
      note_graph_failure(graph_.capture(space_, [&] { step(); }));
    }
    for (; s < steps && graph_.ready(); ++s) {
      graph_.launch(space_);
      mark_progress();
    }
  }
  for (; s < steps; ++s) {
    step();
    mark_progress();
  }
  return end_run(steps);
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::begin_run(int steps) {
  std::string problem;
  if (steps <= 0) problem = "dpmlp::DataParallelTrainer::train: steps must be positive, got " + std::to_string(steps);
  if (problem.empty() && !has_data_) problem = "dpmlp::DataParallelTrainer::train: set_data() first";
  // steps_done_ <= max_steps_done always holds, so the subtraction cannot overflow; after this check every
  // step number of the run (steps_done_ + k, k <= steps) is at most max_steps_done.
  if (problem.empty() && steps_done_ > max_steps_done - steps) {
    problem = "dpmlp::DataParallelTrainer::train: " + std::to_string(steps) + " more steps after " +
              std::to_string(steps_done_) + " would pass the step count limit " + std::to_string(max_steps_done);
  }
  // Every rank must take the same number of steps, or the collectives would not pair up.
  long long range[2] = {steps, -static_cast<long long>(steps)};
  timed_allreduce(MPI_IN_PLACE, range, 2, MPI_LONG_LONG, MPI_MIN, comm_.mpi_comm(),
                  "MPI_Allreduce (DataParallelTrainer::train: the step counts)");
  if (problem.empty() && range[0] != -range[1]) {
    problem = "dpmlp::DataParallelTrainer::train: the ranks asked for different step counts (" +
              std::to_string(range[0]) + " to " + std::to_string(-range[1]) + ")";
  }
  agree(comm_.mpi_comm(), problem);
  if (losses_.extent(0) < static_cast<std::size_t>(steps)) {
    all_or_none(comm_.mpi_comm(), [&] { losses_ = Kokkos::View<Scalar*, memory_space>("dpmlp::losses", steps); });
    // Captured steps wrote into the old buffer.
    graph_ = backend::StepGraph<ExecSpace>();
    if (epochs_) epochs_->graph = backend::StepGraph<ExecSpace>();
  }
  Kokkos::deep_copy(space_, loss_index_, 0);
  Kokkos::deep_copy(space_, update_count_, steps_done_);
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
TrainResult DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::end_run(int steps) {
  wait_for_space("DataParallelTrainer::train: the run's steps");
  // A peer-exchange wait that timed out (on one rank, then its peers in turn): every rank throws.
  if (peer_) {
    agree<CommError>(comm_.mpi_comm(), peer_->failure());
    peer_->quiet();  // every rank has fenced its steps: no peer writes into this rank's buffer any more
  }
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), losses_);
  // A diverged run is not counted in steps_done(): it is a failed run, not progress.
  for (int s = 0; s < steps; ++s) {
    if (!std::isfinite(static_cast<double>(host(s)))) {
      throw TrainingError("dpmlp: the loss is not finite (" + std::to_string(host(s)) + ") at step " +
                          std::to_string(steps_done_ + s + 1) + " (step " + std::to_string(s + 1) +
                          " of this train() call); training stopped");
    }
  }
  steps_done_ += steps;
  TrainResult r;
  r.first_loss = host(0);
  r.last_loss = host(steps - 1);
  r.steps = steps;
  return r;
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::step() {
  step_with(engine_, reducer_, x_, y_, Scalar(1.0 / (static_cast<double>(global_rows_) * model_.outputs())),
            peer_.get());
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::epoch_step(std::int64_t k) {
  const EpochSetup& es = *epochs_;
  const BatchShape& b = k == es.per_epoch - 1 && es.last ? *es.last : es.full;
  const std::int64_t first = k * es.full.local_rows;
  const auto rows = std::make_pair(first, first + b.local_rows);
  step_with(b.engine, b.reducer, Kokkos::subview(es.x, rows, Kokkos::ALL), Kokkos::subview(es.y, rows, Kokkos::ALL),
            Scalar(1.0 / (static_cast<double>(b.rows) * model_.outputs())), nullptr);
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::step_with(
    const engine_type& engine, const BlockTreeReducer<ExecSpace, Scalar>& reducer, const const_matrix& x,
    const const_matrix& y, const Scalar inv, backend::PeerExchange* peer) {
  engine.compute(space_, x, y, inv);
  const auto params = model_.params();
  const auto losses = losses_;
  const auto state = state_;
  const std::int64_t P = static_cast<std::int64_t>(model_.num_params());
  const auto index = loss_index_;
  if (optimizer_.per_step()) {
    // The update's number and what depends on it alone, on the device (optim.hpp).
    const auto count = update_count_;
    const auto scalars = step_scalars_;
    const Optimizer opt = optimizer_;
    Kokkos::parallel_for(
        "dpmlp::prepare_update", Kokkos::RangePolicy<ExecSpace>(space_, 0, 1), KOKKOS_LAMBDA(const int) {
          count() += 1;
          opt.prepare(count(), scalars.data());
        });
  }
  const auto update = optimizer_.template step<Scalar>(step_scalars_.data());
  const bool clip = options_.clip_grad_norm > 0;
  const auto grad = grad_;
  // The optimizer update runs in the reduction's last kernel, column by column; with clipping, that kernel
  // keeps the gradient, and the update follows the norm.
  const auto apply = KOKKOS_LAMBDA(const std::int64_t i, const Scalar total) {
    if (i < P) {
      if (clip) {
        grad(i) = total;
      } else {
        update(i, P, params.data(), total, state.data());
      }
    } else {
      losses(index()) = total * inv;
      index() += 1;
    }
  };
  if (peer != nullptr) {
    peer->busy();
    backend::reduce_apply_peer(space_, reducer, engine.partials(), *peer, apply);
  } else {
    reducer.reduce_apply(space_, engine.partials(), comm_, apply);
  }
  if (clip) clip_and_update(update);
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::prepare_epochs(std::int64_t batch_rows) {
  if (epochs_ && epochs_->batch_rows == batch_rows) return;
  epochs_.reset();  // the old buffers go first
  auto es = std::make_unique<EpochSetup>();
  es->batch_rows = batch_rows;
  es->per_epoch = (global_rows_ + batch_rows - 1) / batch_rows;
  const std::int64_t last_rows = global_rows_ - (es->per_epoch - 1) * batch_rows;
  make_batch_shape(es->full, batch_rows);
  if (last_rows != batch_rows) {
    es->last = std::make_unique<BatchShape>();
    make_batch_shape(*es->last, last_rows);
  }
  const std::int64_t local =
      (es->per_epoch - 1) * es->full.local_rows + (es->last ? es->last->local_rows : es->full.local_rows);
  all_or_none(comm_.mpi_comm(), [&] {
    using namespace Kokkos;
    es->x = matrix(view_alloc(WithoutInitializing, "dpmlp::epoch_x"), local, model_.inputs());
    es->y = matrix(view_alloc(WithoutInitializing, "dpmlp::epoch_y"), local, model_.outputs());
    if (comm_.size() == 1) {
      es->order = decltype(es->order)(view_alloc(WithoutInitializing, "dpmlp::epoch_order"), global_rows_);
    } else {
      const std::int64_t n = plan_.shard().rows();
      es->position = decltype(es->position)(view_alloc(WithoutInitializing, "dpmlp::epoch_position"), n);
      es->dest = decltype(es->dest)(view_alloc(WithoutInitializing, "dpmlp::epoch_dest"), n);
      es->counts = decltype(es->counts)("dpmlp::epoch_counts", 2 * comm_.size());
      es->send = decltype(es->send)(view_alloc(WithoutInitializing, "dpmlp::epoch_send"), n * record_bytes());
      es->recv = decltype(es->recv)(view_alloc(WithoutInitializing, "dpmlp::epoch_recv"), local * record_bytes());
    }
  });
  epochs_ = std::move(es);
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::make_batch_shape(BatchShape& b, std::int64_t rows) {
  using engine_t = engine_type;
  MPI_Comm c = comm_.mpi_comm();
  std::string problem;
  EnginePlan mine;
  try {
    mine = engine_t::plan(model_, options_, options_.reduction == Reduction::reproducible, rows, comm_.size());
  } catch (const std::exception& e) {
    problem = std::string("dpmlp::DataParallelTrainer::train_epochs: ") + e.what();
  }
  agree(c, problem);
  b.plan = agreed_plan(mine, rows);
  b.rows = rows;
  const std::int64_t leaf = b.plan.block_rows * b.plan.leaf_group;
  all_or_none(c, [&] {
    b.tree = BlockTreePlan(rows, leaf, comm_.rank(), comm_.size());
    b.local_rows = b.tree.shard().rows();
    b.engine = engine_t(model_, b.local_rows, b.plan, loss_);
    b.reducer = BlockTreeReducer<ExecSpace, Scalar>(b.tree, std::int64_t(model_.num_params()) + 1, options_.reduction);
    b.bounds = decltype(b.bounds)("dpmlp::batch_bounds", comm_.size() + 1);
    auto h = Kokkos::create_mirror_view(b.bounds);
    for (int r = 0; r < comm_.size(); ++r) h(r) = make_shard(rows, leaf, r, comm_.size()).first_row;
    h(comm_.size()) = rows;
    Kokkos::deep_copy(b.bounds, h);
  });
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::fill_epoch(std::uint64_t seed, std::int64_t epoch) {
  const EpochOrder order(seed, epoch, global_rows_);
  if (comm_.size() > 1) {
    exchange_epoch(order);
    return;
  }
  // One rank: a row's place in the buffer is its position.
  const EpochSetup& es = *epochs_;
  const matrix ex = es.x, ey = es.y;
  const const_matrix x = x_, y = y_;
  const int nin = model_.inputs(), nout = model_.outputs();
  const auto rows_of = es.order;
  if constexpr (is_host_space<ExecSpace>()) {
    // A thread a row: the row's order and its copy together, no index division per element.
    Kokkos::parallel_for("dpmlp::epoch_gather_host", Kokkos::RangePolicy<ExecSpace>(space_, 0, global_rows_),
                         [=](const std::int64_t p) {
                           const std::int64_t r = order.row(p);
                           rows_of(p) = r;
                           for (int c = 0; c < nin; ++c) ex(p, c) = x(r, c);
                           for (int c = 0; c < nout; ++c) ey(p, c) = y(r, c);
                         });
    return;
  }
  Kokkos::parallel_for(
      "dpmlp::epoch_order", Kokkos::RangePolicy<ExecSpace>(space_, 0, global_rows_),
      KOKKOS_LAMBDA(const std::int64_t p) { rows_of(p) = order.row(p); });
  Kokkos::parallel_for(
      "dpmlp::epoch_gather", Kokkos::RangePolicy<ExecSpace>(space_, 0, global_rows_ * (nin + nout)),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t p = i / (nin + nout);
        const int c = static_cast<int>(i - p * (nin + nout));
        if (c < nin) {
          ex(p, c) = x(rows_of(p), c);
        } else {
          ey(p, c - nin) = y(rows_of(p), c - nin);
        }
      });
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::exchange_epoch(const EpochOrder& order) {
  // The copies below wait for the space: first wait, with the timeout, for the last epoch's collectives.
  wait_for_space("DataParallelTrainer::train_epochs: the last epoch's steps");
  EpochSetup& es = *epochs_;
  MPI_Comm c = comm_.mpi_comm();
  const int R = comm_.size(), me = comm_.rank();
  const std::int64_t B = es.batch_rows, per = es.per_epoch, lb = es.full.local_rows;
  const std::int64_t first = plan_.shard().first_row, n = plan_.shard().rows();
  const int nin = model_.inputs(), nout = model_.outputs();
  const std::size_t rec = record_bytes();
  const auto full_bounds = es.full.bounds;
  const auto last_bounds = es.last ? es.last->bounds : es.full.bounds;
  const auto position = es.position;
  const auto dest = es.dest;
  const auto counts = es.counts;  // [0, R): rows to each rank; [R, 2R): the packing cursors
  const matrix ex = es.x, ey = es.y;
  const const_matrix x = x_, y = y_;
  const auto send = es.send;
  Kokkos::deep_copy(space_, counts, 0);
  Kokkos::parallel_for(
      "dpmlp::epoch_destinations", Kokkos::RangePolicy<ExecSpace>(space_, 0, n), KOKKOS_LAMBDA(const std::int64_t r) {
        const std::int64_t p = order.position(first + r);
        position(r) = p;
        const std::int64_t k = p / B, o = p - k * B;
        const auto& bounds = k == per - 1 ? last_bounds : full_bounds;
        int q = 0;
        while (q + 1 < R && bounds(q + 1) <= o) ++q;
        dest(r) = q;
        Kokkos::atomic_add(&counts(q), std::int64_t(1));
      });
  std::vector<std::int64_t> to(R), from(R);
  {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), Kokkos::subview(counts, std::make_pair(0, R)));
    for (int q = 0; q < R; ++q) to[q] = h(q);
  }
  std::vector<std::int64_t> cursor(R, 0);
  for (int q = 1; q < R; ++q) cursor[q] = cursor[q - 1] + to[q - 1];
  {
    Kokkos::View<std::int64_t*, Kokkos::HostSpace> h(cursor.data(), R);
    Kokkos::deep_copy(Kokkos::subview(counts, std::make_pair(R, 2 * R)), h);
  }
  Kokkos::parallel_for(
      "dpmlp::epoch_pack", Kokkos::RangePolicy<ExecSpace>(space_, 0, n), KOKKOS_LAMBDA(const std::int64_t r) {
        const std::int64_t slot = Kokkos::atomic_fetch_add(&counts(R + dest(r)), std::int64_t(1));
        unsigned char* out = send.data() + slot * rec;
        const std::int64_t p = position(r);
        memcpy(out, &p, sizeof p);
        Scalar* v = reinterpret_cast<Scalar*>(out + sizeof p);
        for (int j = 0; j < nin; ++j) v[j] = x(r, j);
        for (int j = 0; j < nout; ++j) v[nin + j] = y(r, j);
      });
  timed_alltoall(to.data(), 1, MPI_INT64_T, from.data(), 1, MPI_INT64_T, c,
                 "MPI_Alltoall (DataParallelTrainer::train_epochs: the row counts)");
  std::int64_t arriving = 0;
  for (int q = 0; q < R; ++q) arriving += from[q];
  const std::int64_t expected = static_cast<std::int64_t>(ex.extent(0));
  std::vector<int> sc(R), sd(R), rc(R), rd(R);
  std::string problem = arriving == expected ? std::string()
                                             : "dpmlp::DataParallelTrainer::train_epochs: the exchange would bring " +
                                                   std::to_string(arriving) + " rows, the epoch has " +
                                                   std::to_string(expected) + " here";
  std::int64_t so = 0, ro = 0;
  for (int q = 0; q < R; ++q) {
    if (so > INT_MAX || ro > INT_MAX) problem = "dpmlp::DataParallelTrainer::train_epochs: too many rows a rank";
    sc[q] = static_cast<int>(to[q]);
    sd[q] = static_cast<int>(so);
    rc[q] = static_cast<int>(from[q]);
    rd[q] = static_cast<int>(ro);
    so += to[q];
    ro += from[q];
  }
  agree<CommError>(c, problem);
  auto hsend = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), send);
  auto hrecv = Kokkos::create_mirror_view(Kokkos::HostSpace(), es.recv);
  MPI_Datatype record = MPI_DATATYPE_NULL;
  detail::check_mpi(MPI_Type_contiguous(static_cast<int>(rec), MPI_BYTE, &record), "MPI_Type_contiguous");
  MPI_Type_commit(&record);
  try {
    // A nonblocking collective reads its buffers and its count arrays until it completes: an abandoned
    // request keeps them (comm/timed.hpp).
    const auto arrays = std::make_shared<std::vector<int>>();
    for (const auto* v : {&sc, &sd, &rc, &rd}) arrays->insert(arrays->end(), v->begin(), v->end());
    const int* a = arrays->data();
    detail::timed(
        c, "MPI_Alltoallv (DataParallelTrainer::train_epochs: the rows)",
        [&](MPI_Request* r) {
          return MPI_Ialltoallv(hsend.data(), a, a + R, record, hrecv.data(), a + 2 * R, a + 3 * R, record, c, r);
        },
        hsend, hrecv, arrays);
  } catch (...) {
    MPI_Type_free(&record);
    throw;
  }
  MPI_Type_free(&record);
  Kokkos::deep_copy(space_, es.recv, hrecv);
  const auto recv = es.recv;
  const auto mine_full = Kokkos::subview(full_bounds, me), mine_last = Kokkos::subview(last_bounds, me);
  Kokkos::parallel_for(
      "dpmlp::epoch_place", Kokkos::RangePolicy<ExecSpace>(space_, 0, arriving), KOKKOS_LAMBDA(const std::int64_t i) {
        const unsigned char* in = recv.data() + i * rec;
        std::int64_t p = 0;
        memcpy(&p, in, sizeof p);
        const std::int64_t k = p / B, o = p - k * B;
        const std::int64_t local = k * lb + o - (k == per - 1 ? mine_last() : mine_full());
        const Scalar* v = reinterpret_cast<const Scalar*>(in + sizeof p);
        for (int j = 0; j < nin; ++j) ex(local, j) = v[j];
        for (int j = 0; j < nout; ++j) ey(local, j) = v[nin + j];
      });
  // The host buffers must outlive the copies that read them.
  compat::fence(space_, "dpmlp::DataParallelTrainer::train_epochs (exchange)");
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
EnginePlan DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::agreed_plan(EnginePlan mine,
                                                                                      std::int64_t rows) {
  using engine_t = engine_type;
  MPI_Comm c = comm_.mpi_comm();
  int group = mine.leaf_group;
  timed_allreduce(MPI_IN_PLACE, &group, 1, MPI_INT, MPI_MIN, c, "MPI_Allreduce (DataParallelTrainer: the leaf group)");
  std::string regrouped;
  if (group != mine.leaf_group) {
    EngineOptions ungrouped = options_;
    ungrouped.leaf_groups = Toggle::off;
    try {
      mine = engine_t::plan(model_, ungrouped, options_.reduction == Reduction::reproducible, rows, comm_.size());
    } catch (const std::exception& e) {
      regrouped = std::string("dpmlp::DataParallelTrainer: ") + e.what();
    }
  }
  agree(c, regrouped);
  const long long key = static_cast<long long>(mine.sums_key());
  long long range[2] = {key, -key};
  timed_allreduce(MPI_IN_PLACE, range, 2, MPI_LONG_LONG, MPI_MAX, c, "MPI_Allreduce (DataParallelTrainer: the plans)");
  agree(c, range[0] == -range[1] ? std::string()
                                 : "dpmlp::DataParallelTrainer: the ranks planned different engines (this rank: " +
                                       mine.describe() + "); ask for one with TrainerOptions");
  return mine;
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::ensure_engine() {
  if (engine_ready_) return;
  all_or_none(comm_.mpi_comm(), [&] { engine_ = engine_type(model_, plan_.shard().rows(), engine_plan_, loss_); });
  engine_ready_ = true;
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
void DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::sync_parameters() {
  const auto params = model_.params();
  if (options_.broadcast_initial_params) {
    comm_.broadcast(space_, params, 0);
    wait_for_space("DataParallelTrainer: the broadcast of rank 0's parameters");
    return;
  }
  const std::uint64_t mine = digest(params);
  std::uint64_t root = mine;
  timed_bcast(&root, 1, MPI_UINT64_T, 0, comm_.mpi_comm(), "MPI_Bcast (DataParallelTrainer: rank 0's digest)");
  agree(comm_.mpi_comm(), mine == root ? std::string()
                                       : "dpmlp::DataParallelTrainer: this rank's parameters (digest " + hex16(mine) +
                                             ") differ from rank 0's (" + hex16(root) + "); refusing to train");
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
std::string DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::check_shapes(const const_matrix& x,
                                                                                        const const_matrix& y) const {
  const auto rows = static_cast<std::size_t>(plan_.shard().rows());
  auto shape = [](const const_matrix& v) { return std::to_string(v.extent(0)) + "x" + std::to_string(v.extent(1)); };
  if (x.extent(0) != rows || x.extent(1) != static_cast<std::size_t>(model_.inputs())) {
    return "dpmlp::DataParallelTrainer::set_data: x is " + shape(x) + ", expected " + std::to_string(rows) + "x" +
           std::to_string(model_.inputs()) + " (this rank's shard: global rows " +
           std::to_string(plan_.shard().first_row) + ".." + std::to_string(plan_.shard().end_row) + ", model inputs)";
  }
  if (y.extent(0) != rows || y.extent(1) != static_cast<std::size_t>(model_.outputs())) {
    return "dpmlp::DataParallelTrainer::set_data: y is " + shape(y) + ", expected " + std::to_string(rows) + "x" +
           std::to_string(model_.outputs()) + " (this rank's shard rows x model outputs)";
  }
  // The engines read rows at a stride of the row length: a View of some columns of a wider array (a
  // column subview) has longer rows and would be misread. It needs a copy, which the caller makes.
  // The pinned cuBLASLt and the CUTLASS GEMMs read x's rows with 16-byte loads, and whether the split GEMMs
  // take layer 0 depends on it (linalg::split_takes): the same on every rank only if every rank's x is aligned.
  if (engine_plan_.engine == Engine::layered &&
      (engine_plan_.gemm == linalg::Backend::cublaslt || engine_plan_.gemm == linalg::Backend::cutlass ||
       engine_plan_.gemm_split) &&
      reinterpret_cast<std::uintptr_t>(x.data()) % 16 != 0) {
    return "dpmlp::DataParallelTrainer::set_data: x's data is not 16-byte aligned (a View of rows at an offset?); "
           "deep_copy it into a View of its own";
  }
  for (const auto* v : {&x, &y}) {
    if (v->extent(0) > 1 && v->stride(0) != v->extent(1)) {
      return std::string("dpmlp::DataParallelTrainer::set_data: ") + (v == &x ? "x" : "y") +
             " is not contiguous (its rows are " + std::to_string(v->stride(0)) + " elements apart, not " +
             std::to_string(v->extent(1)) + ": a subview of some columns?); deep_copy it into a View of its own";
    }
  }
  return {};
}

template <class ExecSpace, class Comm, class Optimizer, class Scalar, class Loss>
std::string DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar, Loss>::find_non_finite(const const_matrix& v,
                                                                                           const char* name) const {
  const std::int64_t cols = v.extent(1);
  const std::int64_t n = std::int64_t(v.extent(0)) * cols;
  std::int64_t first = n;
  Kokkos::parallel_reduce(
      "dpmlp::find_non_finite", Kokkos::RangePolicy<ExecSpace>(space_, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& m) {
        const Scalar value = v(i / cols, i % cols);
        if (!compat::isfinite(value) && i < m) m = i;
      },
      Kokkos::Min<std::int64_t>(first));
  if (first >= n) return {};
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  const double bad = static_cast<double>(host(first / cols, first % cols));
  return std::string("dpmlp: ") + name + " has a non-finite value (" + std::to_string(bad) + ") at global row " +
         std::to_string(plan_.shard().first_row + first / cols) + ", column " + std::to_string(first % cols);
}

// Single-device value and gradient of `loss` (loss.hpp): grad (num_params) <- d loss / d params; returns the
// loss. The same block-wise computation and plan as a one-rank trainer's step (so the same bits).
template <class ExecSpace, class Scalar, class X, class Y, class G, class Loss,
          std::enable_if_t<is_loss<Loss>::value, int> = 0>
Scalar value_and_grad(const ExecSpace& space, const Mlp<Scalar, typename ExecSpace::memory_space>& model,
                      const X& x, const Y& y, const G& grad, const Loss& loss,
                      const EngineOptions& options = EngineOptions()) {
  const std::int64_t rows = x.extent(0);
  if (rows <= 0) throw InputError("dpmlp::value_and_grad: zero rows");
  if (grad.extent(0) != model.num_params()) throw InputError("dpmlp::value_and_grad: grad has the wrong size");
  loss.validate(model.outputs());
  using engine_t = detail::BlockEngine<ExecSpace, Scalar, Loss>;
  const EnginePlan p = engine_t::plan(model, options, true, rows, 1);
  const BlockTreePlan plan(rows, p.block_rows * p.leaf_group, 0, 1);
  engine_t blocks(model, rows, p, loss);
  BlockTreeReducer<ExecSpace, Scalar> reducer(plan, blocks.width(), Reduction::reproducible);
  const Scalar inv = Scalar(1.0 / (static_cast<double>(rows) * model.outputs()));
  blocks.compute(space, x, y, inv);
  const auto total = reducer.reduce(space, blocks.partials(), NoCommunicator{});
  Kokkos::deep_copy(space, grad, Kokkos::subview(total, std::make_pair(std::size_t(0), model.num_params())));
  Scalar value = 0;
  Kokkos::deep_copy(space, value, Kokkos::subview(total, model.num_params()));
  compat::fence(space, "dpmlp::value_and_grad");
  return value * inv;
}

// The mean squared error (Mse).
template <class ExecSpace, class Scalar, class X, class Y, class G>
Scalar value_and_grad(const ExecSpace& space, const Mlp<Scalar, typename ExecSpace::memory_space>& model,
                      const X& x, const Y& y, const G& grad, const EngineOptions& options) {
  return value_and_grad(space, model, x, y, grad, Mse(), options);
}

// The mean squared error with the engine and the rows a block alone (0: the default).
template <class ExecSpace, class Scalar, class X, class Y, class G>
Scalar value_and_grad(const ExecSpace& space, const Mlp<Scalar, typename ExecSpace::memory_space>& model,
                      const X& x, const Y& y, const G& grad, std::int64_t block_rows = 0,
                      Engine engine = Engine::automatic) {
  EngineOptions options;
  options.block_rows = block_rows;
  options.engine = engine;
  return value_and_grad(space, model, x, y, grad, options);
}

// The trainers compiled once: on CUDA builds through CMake (DPMLP_CUDA_KERNELS_SEPARATE, backend/cuda/entry.hpp)
// the dpmlp_cuda_kernels library holds the trainers of Kokkos::Cuda with the default communicator, Sgd, Adam or
// AdamW, float or double, learning Mse (src/cuda_trainers_float.cpp, src/cuda_trainers_double.cpp), and these
// explicit instantiation declarations keep a translation unit that trains one from compiling its kernels again.
// Any other trainer compiles where it is used, as in a header-only build.
#define DPMLP_CUDA_TRAINERS(X, SCALAR) X(Sgd, SCALAR) X(Adam, SCALAR) X(AdamW, SCALAR)
#define DPMLP_CUDA_TRAINER(OPTIMIZER, SCALAR) \
  DataParallelTrainer<Kokkos::Cuda, default_communicator_t<Kokkos::Cuda>, OPTIMIZER, SCALAR, Mse>
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_CUDA_KERNELS_SEPARATE)
#define DPMLP_CUDA_TRAINER_EXTERN(OPTIMIZER, SCALAR) extern template class DPMLP_CUDA_TRAINER(OPTIMIZER, SCALAR);
DPMLP_CUDA_TRAINERS(DPMLP_CUDA_TRAINER_EXTERN, float)
DPMLP_CUDA_TRAINERS(DPMLP_CUDA_TRAINER_EXTERN, double)
#undef DPMLP_CUDA_TRAINER_EXTERN
#endif

}  // namespace dpmlp
