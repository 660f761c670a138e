// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/data_parallel_trainer.hpp: data-parallel training, one MPI rank per device.
//
// The batch is sharded over the ranks of a communicator (whole row blocks per rank), the parameters are
// replicated, and each step the gradient of the global mean squared error is summed across ranks with one
// collective over one contiguous buffer (gradient + loss). Every kernel runs on the trainer's ExecSpace.
//
//   using Trainer = dpmlp::DataParallelTrainer<Kokkos::DefaultExecutionSpace>;
//   dpmlp::Mlp<float, Trainer::memory_space> model({32, 32, 1});
//   Trainer trainer(MPI_COMM_WORLD, model, global_rows, dpmlp::Sgd(0.02));
//   auto shard = trainer.shard();              // the rows this rank must provide
//   trainer.set_data(x_local, y_local);        // Views of shard.rows() rows, in Trainer::memory_space
//   auto result = trainer.train(100);          // result.first_loss, result.last_loss
#pragma once

#include <algorithm>
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
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/linalg/gemm.hpp"
#include "dpmlp/mlp.hpp"
#include "dpmlp/optim.hpp"
#include "dpmlp/reduction.hpp"
#include "dpmlp/trainer_options.hpp"

namespace dpmlp {

// The order in which epoch `epoch` of DataParallelTrainer::train_epochs visits the global rows, as each row's
// position in it: a permutation of [0, rows) drawn from (seed, epoch) alone, never from the rank count: the
// rows sorted by 32 random bits (JAX's threefry, key fold_in(PRNGKey(seed), epoch), element r for row r),
// ties broken by row index. O(rows log rows) on the host.
inline std::vector<std::int64_t> epoch_positions(std::uint64_t seed, std::int64_t epoch, std::int64_t rows) {
  const random::Key key = random::fold_in(random::PRNGKey(seed), static_cast<std::uint32_t>(epoch));
  std::vector<std::pair<std::uint32_t, std::int64_t>> keyed(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) keyed[r] = {random::bits(key, static_cast<std::uint64_t>(r)), r};
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::int64_t> position(static_cast<std::size_t>(rows));
  for (std::int64_t p = 0; p < rows; ++p) position[keyed[p].second] = p;
  return position;
}


template <class ExecSpace, class Comm = default_communicator_t<ExecSpace>, class Optimizer = Sgd, class Scalar = float>
class DataParallelTrainer {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "DataParallelTrainer<ExecSpace, ...>: ExecSpace must be a Kokkos execution space");
  static_assert(is_communicator<Comm>::value,
                "DataParallelTrainer<..., Comm>: Comm must model the Communicator concept (comm/communicator.hpp)");
  static_assert(is_optimizer<Optimizer>::value,
                "DataParallelTrainer<..., Optimizer>: Optimizer must model the Optimizer concept (optim.hpp)");

 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using communicator_type = Comm;
  using optimizer_type = Optimizer;
  using scalar_type = Scalar;
  using model_type = Mlp<Scalar, memory_space>;
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using const_matrix = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;

  // Collective over `comm`. `model` is shared, not copied: training updates its parameters in place.
  DataParallelTrainer(MPI_Comm comm, const model_type& model, std::int64_t global_rows,
                      const Optimizer& optimizer = Optimizer(), const TrainerOptions& options = TrainerOptions(),
                      const ExecSpace& space = ExecSpace())
      : comm_(comm), model_(model), optimizer_(optimizer), options_(options), space_(space) {
    MPI_Comm c = comm_.mpi_comm();
    using engine_t = detail::BlockEngine<ExecSpace, Scalar>;
    const bool reproducible = options.reduction == Reduction::reproducible;
    std::string problem;
    try {
      optimizer.validate();
    } catch (const InputError& e) {
      problem = e.what();
    }
    if (!problem.empty()) {
    } else if (global_rows <= 0) {
      problem = "zero rows";
    } else if (global_rows < comm_.size()) {
      problem = "fewer rows (" + std::to_string(global_rows) + ") than ranks (" + std::to_string(comm_.size()) + ")";
    } else if (!(options.peer_timeout_s > 0)) {
      problem = "peer_timeout_s must be positive";
    } else {
      try {
        engine_plan_ = engine_t::plan(model, options, reproducible, global_rows, comm_.size());
      } catch (const InputError& e) {
        problem = e.what();
      }
    }
    agree(c, problem.empty() ? problem : "dpmlp::DataParallelTrainer: " + problem);
    global_rows_ = global_rows;
    // The tree's leaves: groups of leaf_group blocks where the engine sums them itself (the same bits: a group is
    // a subtree), so ranks own whole groups. Every rank must take the same group: the smallest of theirs.
    int group = engine_plan_.leaf_group;
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &group, 1, MPI_INT, MPI_MIN, c), "MPI_Allreduce");
    std::string regrouped;
    if (group != engine_plan_.leaf_group) {
      EngineOptions ungrouped = options;
      ungrouped.leaf_groups = Toggle::off;
      try {
        engine_plan_ = engine_t::plan(model, ungrouped, reproducible, global_rows, comm_.size());
      } catch (const InputError& e) {
        regrouped = std::string("dpmlp::DataParallelTrainer: ") + e.what();
      }
    }
    agree(c, regrouped);
    // Every rank must run the same plan: their sums would differ in the last bits, so a mix (ranks on different
    // kinds of device) would silently break the bitwise reproducibility.
    {
      const long long key = static_cast<long long>(engine_plan_.sums_key());
      long long range[2] = {key, -key};
      detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_LONG_LONG, MPI_MAX, c), "MPI_Allreduce");
      agree(c, range[0] == -range[1] ? std::string()
                                     : "dpmlp::DataParallelTrainer: the ranks planned different engines (this rank: " +
                                           engine_plan_.describe() + "); ask for one with TrainerOptions");
    }
    plan_ = BlockTreePlan(global_rows, engine_plan_.block_rows * engine_plan_.leaf_group, comm_.rank(), comm_.size());
    engine_ = engine_t(model_, plan_.shard().rows(), engine_plan_);
    reducer_ = BlockTreeReducer<ExecSpace, Scalar>(plan_, engine_.width(), options.reduction);
    {
      // Every rank must take the same path (the exchange's kernel pairs with the peers' kernels, not with a
      // collective), so a rank that did not ask for it refuses too.
      int asked[2] = {options.peer_exchange ? 1 : 0, options.peer_exchange ? -1 : 0}, most[2] = {0, 0};
      detail::check_mpi(MPI_Allreduce(asked, most, 2, MPI_INT, MPI_MAX, c), "MPI_Allreduce");
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
    state_ = Kokkos::View<Scalar*, memory_space>("dpmlp::optimizer_state", optimizer.state_size(model_.num_params()));
    sync_parameters();
  }

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
  const TrainerOptions& options() const { return options_; }
  const Optimizer& optimizer() const { return optimizer_; }
  // The optimizer's state (optimizer().state_size(num_params) values), e.g. for checkpoints.
  const Kokkos::View<Scalar*, memory_space>& optimizer_state() const { return state_; }
  const Comm& communicator() const { return comm_; }
  const model_type& model() const { return model_; }
  const ExecSpace& space() const { return space_; }

  // This rank's rows: x is shard().rows() x inputs, y is shard().rows() x outputs, LayoutRight, in
  // memory_space. No copy is made: the trainer keeps the Views. Collective: every rank validates its rows
  // (shapes, non-finite values) and all ranks throw the first failing rank's InputError.
  void set_data(const const_matrix& x, const const_matrix& y) {
    std::string problem = check_shapes(x, y);
    if (problem.empty()) problem = find_non_finite(x, "x");
    if (problem.empty()) problem = find_non_finite(y, "y");
    agree(comm_.mpi_comm(), problem);
    x_ = x;
    y_ = y;
    has_data_ = true;
    graph_ = backend::StepGraph<ExecSpace>();  // a captured step reads the old Views' pointers
  }

  // Runs `steps` SGD steps. The losses stay on the device until the run ends; the only host waits inside
  // the loop are those of a host-synchronous communicator (MPI with device data staged through the host).
  // Non-finite losses are checked once, at the end of the run, and reported with the first bad step.
  TrainResult train(int steps) {
    begin_run(steps);
    int s = 0;
    if (use_graph()) {
      if (!graph_.ready()) {
        // One plain step first: it warms the caches (kernel attributes, library handles, the collective)
        // that must not be set up during a capture.
        step();
        ++s;
        const std::string failure = graph_.capture(space_, [&] { step(); });
        graph_failed_ = !failure.empty();
        if (graph_failed_ && comm_.rank() == 0) {
          std::fprintf(stderr, "dpmlp: CUDA graph capture failed (%s); running without graphs\n", failure.c_str());
        }
      }
      for (; s < steps && graph_.ready(); ++s) graph_.launch(space_);
    }
    for (; s < steps; ++s) step();
    return end_run(steps);
  }

  // Runs up to `steps` steps with callbacks (callbacks.hpp: any objects with some of the optional hooks
  // begin_training(const TrainInfo&), end_step(const StepInfo&) -> bool, end_training(const TrainResult&)).
  // Each step's loss is read on the host after the step, so this adds one host synchronization per step;
  // an end_step returning true stops training after that step (every rank sees the same loss, so every
  // rank stops at the same step).
  template <class Callback, class... More>
  TrainResult train(int steps, Callback&& callback, More&&... more) {
    begin_run(steps);
    TrainInfo info{steps, steps_done_, comm_.rank(), comm_.size()};
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

  // Mini-batch training: `epochs` passes over the data, each visiting every global row once in the order
  // epoch_positions(seed, epoch) gives (drawn from the seed and the epoch alone, so the same batches at any
  // rank count), `batch_rows` rows a step (the last batch of an epoch may be shorter); each step's gradient
  // and loss are the mean over its batch. Epochs are numbered from steps_done() / steps-per-epoch, so a run
  // resumed from a checkpoint at an epoch boundary continues with the next epoch's order.
  // A step still reads the shard's every row (rows outside the batch contribute exact zeros): the batch's
  // sums keep the block tree's shape, so the reproducible reduction gives the same bits at any rank count.
  // The cost of a step is that of a full-batch step. CUDA graphs are not used here.
  // Callbacks as in train(steps, callbacks...), plus the optional void begin_epoch(std::int64_t epoch) and
  // bool end_epoch(const EpochInfo&).
  template <class... Callbacks>
  TrainResult train_epochs(int epochs, std::int64_t batch_rows, std::uint64_t seed, Callbacks&&... callbacks) {
    std::string problem;
    const std::int64_t per_epoch = batch_rows > 0 ? (global_rows_ + batch_rows - 1) / batch_rows : 0;
    if (epochs <= 0) {
      problem = "epochs must be positive, got " + std::to_string(epochs);
    } else if (batch_rows <= 0 || batch_rows > global_rows_) {
      problem = "batch_rows must be in [1, " + std::to_string(global_rows_) + "], got " + std::to_string(batch_rows);
    } else if (per_epoch * epochs > std::numeric_limits<int>::max()) {
      problem = "too many steps in one call (" + std::to_string(per_epoch * epochs) + ")";
    } else if (steps_done_ % per_epoch != 0) {
      problem = "steps_done() is " + std::to_string(steps_done_) + ", not a multiple of the " +
                std::to_string(per_epoch) + " steps of an epoch: resume at an epoch boundary";
    }
    agree(comm_.mpi_comm(), problem.empty() ? problem : "dpmlp::DataParallelTrainer::train_epochs: " + problem);
    const int total = static_cast<int>(per_epoch * epochs);
    begin_run(total);
    TrainInfo info{total, steps_done_, comm_.rank(), comm_.size()};
    detail::call_begin(info, callbacks...);
    const std::int64_t first = plan_.shard().first_row, rows = plan_.shard().rows();
    if (static_cast<std::int64_t>(positions_.extent(0)) != rows) {
      positions_ = Kokkos::View<std::int64_t*, memory_space>("dpmlp::epoch_positions", rows);
    }
    auto host_pos = Kokkos::create_mirror_view(positions_);
    const std::int64_t first_epoch = steps_done_ / per_epoch;
    int done = 0;
    bool stop = false;
    for (int e = 0; e < epochs && !stop; ++e) {
      const auto pos = epoch_positions(seed, first_epoch + e, global_rows_);
      for (std::int64_t r = 0; r < rows; ++r) host_pos(r) = pos[first + r];
      Kokkos::deep_copy(space_, positions_, host_pos);
      const int epoch_start = done;
      detail::call_begin_epoch(first_epoch + e + 1, callbacks...);
      for (std::int64_t k = 0; k < per_epoch && !stop; ++k) {
        const std::int64_t lo = k * batch_rows, hi = std::min(global_rows_, lo + batch_rows);
        const auto batch_step = [&] {
          step(Scalar(1.0 / (static_cast<double>(hi - lo) * model_.outputs())),
               detail::RowWindow{positions_.data(), lo, hi});
        };
        if constexpr (sizeof...(Callbacks) > 0) {
          stop = step_with_callbacks(done, batch_step, callbacks...);
        } else {
          batch_step();  // no callbacks: nothing is read back until the run ends
        }
        ++done;
      }
      // The host buffer must not change while the copy to the device may still read it.
      compat::fence(space_, "dpmlp::DataParallelTrainer::train_epochs (epoch)");
      if constexpr (sizeof...(Callbacks) > 0) {
        if (done - epoch_start == per_epoch) {
          auto losses = Kokkos::create_mirror_view_and_copy(
              Kokkos::HostSpace(), Kokkos::subview(losses_, std::make_pair(epoch_start, done)));
          double sum = 0;
          for (std::size_t i = 0; i < losses.extent(0); ++i) sum += static_cast<double>(losses(i));
          const EpochInfo ei{first_epoch + e + 1, done - epoch_start, sum / static_cast<double>(done - epoch_start)};
          stop = detail::call_end_epoch(ei, callbacks...) || stop;
        }
      }
    }
    const TrainResult r = end_run(done);
    detail::call_end(r, callbacks...);
    return r;
  }

  // One step of a run with callbacks: begin_step, the step (`enqueue`), its loss read on the host, end_step.
  // `done`: the steps this run took before it. True when a callback asks to stop.
  template <class Enqueue, class... Callbacks>
  bool step_with_callbacks(int done, const Enqueue& enqueue, Callbacks&... callbacks) {
    detail::call_begin_step(steps_done_ + done + 1, callbacks...);
    const auto t0 = std::chrono::steady_clock::now();
    enqueue();
    Scalar loss = 0;
    Kokkos::deep_copy(space_, loss, Kokkos::subview(losses_, done));
    compat::fence(space_, "dpmlp::DataParallelTrainer (callbacks)");
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return detail::call_end_step(StepInfo{steps_done_ + done + 1, done + 1, static_cast<double>(loss), ms},
                                 callbacks...);
  }

  // Steps taken so far (over all train() calls). A checkpoint restores it (the optimizer's step count).
  std::int64_t steps_done() const { return steps_done_; }
  void set_steps_done(std::int64_t steps) { steps_done_ = steps; }

 // The rest is public only because CUDA's extended lambdas may not live in private member functions.
  void begin_run(int steps) {
    std::string problem;
    if (steps <= 0) problem = "dpmlp::DataParallelTrainer::train: steps must be positive, got " + std::to_string(steps);
    if (problem.empty() && !has_data_) problem = "dpmlp::DataParallelTrainer::train: set_data() first";
    // Every rank must take the same number of steps, or the collectives would not pair up.
    long long range[2] = {steps, -static_cast<long long>(steps)};
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_LONG_LONG, MPI_MIN, comm_.mpi_comm()),
                      "MPI_Allreduce");
    if (problem.empty() && range[0] != -range[1]) {
      problem = "dpmlp::DataParallelTrainer::train: the ranks asked for different step counts (" +
                std::to_string(range[0]) + " to " + std::to_string(-range[1]) + ")";
    }
    agree(comm_.mpi_comm(), problem);
    if (losses_.extent(0) < static_cast<std::size_t>(steps)) {
      losses_ = Kokkos::View<Scalar*, memory_space>("dpmlp::losses", steps);
      graph_ = backend::StepGraph<ExecSpace>();  // it wrote into the old buffer
    }
    host_steps_enqueued_ = 0;
    Kokkos::deep_copy(space_, loss_index_, 0);
  }

  // Waits for the run, counts its steps, and checks its losses (the one divergence check: once a run).
  TrainResult end_run(int steps) {
    compat::fence(space_, "dpmlp::DataParallelTrainer::train");
    // A peer-exchange wait that timed out (on one rank, then its peers in turn): every rank throws.
    if (peer_) {
      agree<CommError>(comm_.mpi_comm(), peer_->failure());
      peer_->quiet();  // every rank has fenced its steps: no peer writes into this rank's buffer any more
    }
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), losses_);
    host_steps_enqueued_ = 0;
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

  // Whether train() replays a captured step.
  bool use_graph() const {
    // The peer exchange makes any communicator's step stream-ordered: it calls no collective.
    return options_.cuda_graph && backend::StepGraph<ExecSpace>::supported && (Comm::stream_ordered || peer_) &&
           !Optimizer::step_depends_on_t && !graph_failed_;
  }

  // Enqueues one step. The loss goes to losses_(loss_index_), and the index moves on, on the device, so a
  // captured step can be replayed unchanged.
  void step() { step(Scalar(1.0 / (static_cast<double>(global_rows_) * model_.outputs())), detail::RowWindow()); }

  // One step over the rows in `window`, whose mean loss is inv * (sum of squared residuals).
  void step(const Scalar inv, const detail::RowWindow& window) {
    engine_.compute(space_, x_, y_, inv, window);
    const auto params = model_.params();
    const auto losses = losses_;
    const auto state = state_;
    const std::int64_t P = static_cast<std::int64_t>(model_.num_params());
    const auto index = loss_index_;
    const auto update = optimizer_.template step<Scalar>(steps_done_ + 1 + host_steps_enqueued_++);
    // The optimizer update runs in the reduction's last kernel, column by column.
    const auto apply = KOKKOS_LAMBDA(const std::int64_t i, const Scalar total) {
      if (i < P) {
        update(i, P, params.data(), total, state.data());
      } else {
        losses(index()) = total * inv;
        index() += 1;
      }
    };
    if (peer_) {
      peer_->busy();
      backend::reduce_apply_peer(space_, reducer_, engine_.partials(), *peer_, apply);
    } else {
      reducer_.reduce_apply(space_, engine_.partials(), comm_, apply);
    }
  }

  void sync_parameters() {
    const auto params = model_.params();
    if (options_.broadcast_initial_params) {
      comm_.broadcast(space_, params, 0);
      compat::fence(space_, "dpmlp::DataParallelTrainer::broadcast");
      return;
    }
    const std::uint64_t mine = digest(params);
    std::uint64_t root = mine;
    detail::check_mpi(MPI_Bcast(&root, 1, MPI_UINT64_T, 0, comm_.mpi_comm()), "MPI_Bcast");
    agree(comm_.mpi_comm(), mine == root ? std::string()
                                         : "dpmlp::DataParallelTrainer: this rank's parameters (digest " + hex16(mine) +
                                               ") differ from rank 0's (" + hex16(root) + "); refusing to train");
  }

  std::string check_shapes(const const_matrix& x, const const_matrix& y) const {
    const auto rows = static_cast<std::size_t>(plan_.shard().rows());
    auto shape = [](const const_matrix& v) {
      return std::to_string(v.extent(0)) + "x" + std::to_string(v.extent(1));
    };
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
    for (const auto* v : {&x, &y}) {
      if (v->extent(0) > 1 && v->stride(0) != v->extent(1)) {
        return std::string("dpmlp::DataParallelTrainer::set_data: ") + (v == &x ? "x" : "y") +
               " is not contiguous (its rows are " + std::to_string(v->stride(0)) + " elements apart, not " +
               std::to_string(v->extent(1)) + ": a subview of some columns?); deep_copy it into a View of its own";
      }
    }
    return {};
  }

  // The first non-finite element of v, as "global row R, column C", or "".
  std::string find_non_finite(const const_matrix& v, const char* name) const {
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

 private:
  Comm comm_;
  model_type model_;
  Optimizer optimizer_;
  TrainerOptions options_;
  ExecSpace space_;
  std::int64_t global_rows_ = 0, steps_done_ = 0;
  EnginePlan engine_plan_;
  BlockTreePlan plan_;
  detail::BlockEngine<ExecSpace, Scalar> engine_;
  BlockTreeReducer<ExecSpace, Scalar> reducer_;
  const_matrix x_, y_;
  bool has_data_ = false;
  Kokkos::View<Scalar*, memory_space> losses_, state_;
  Kokkos::View<int, memory_space> loss_index_{"dpmlp::loss_index"};
  Kokkos::View<std::int64_t*, memory_space> positions_;  // train_epochs: each shard row's place in the epoch
  std::int64_t host_steps_enqueued_ = 0;  // steps enqueued in this train() call (for step-dependent optimizers)
  bool graph_failed_ = false;
  std::shared_ptr<backend::PeerExchange> peer_;  // TrainerOptions::peer_exchange on two or more ranks
  // Last: destroyed first, before the communicator whose collective it captured.
  backend::StepGraph<ExecSpace> graph_;
};

// Single-device value and gradient of the mean squared error: grad (num_params) <- d loss / d params; returns
// the loss. The same block-wise computation and plan as a one-rank trainer's step (so the same bits).
template <class ExecSpace, class Scalar, class X, class Y, class G>
Scalar value_and_grad(const ExecSpace& space, const Mlp<Scalar, typename ExecSpace::memory_space>& model,
                      const X& x, const Y& y, const G& grad, const EngineOptions& options) {
  const std::int64_t rows = x.extent(0);
  if (rows <= 0) throw InputError("dpmlp::value_and_grad: zero rows");
  if (grad.extent(0) != model.num_params()) throw InputError("dpmlp::value_and_grad: grad has the wrong size");
  using engine_t = detail::BlockEngine<ExecSpace, Scalar>;
  const EnginePlan p = engine_t::plan(model, options, true, rows, 1);
  const BlockTreePlan plan(rows, p.block_rows * p.leaf_group, 0, 1);
  engine_t blocks(model, rows, p);
  BlockTreeReducer<ExecSpace, Scalar> reducer(plan, blocks.width(), Reduction::reproducible);
  const Scalar inv = Scalar(1.0 / (static_cast<double>(rows) * model.outputs()));
  blocks.compute(space, x, y, inv);
  const auto total = reducer.reduce(space, blocks.partials(), NoCommunicator{});
  Kokkos::deep_copy(space, grad, Kokkos::subview(total, std::make_pair(std::size_t(0), model.num_params())));
  Scalar loss = 0;
  Kokkos::deep_copy(space, loss, Kokkos::subview(total, model.num_params()));
  compat::fence(space, "dpmlp::value_and_grad");
  return loss * inv;
}

// The same with the engine and the rows a block alone (0: the default).
template <class ExecSpace, class Scalar, class X, class Y, class G>
Scalar value_and_grad(const ExecSpace& space, const Mlp<Scalar, typename ExecSpace::memory_space>& model,
                      const X& x, const Y& y, const G& grad, std::int64_t block_rows = 0,
                      Engine engine = Engine::automatic) {
  EngineOptions options;
  options.block_rows = block_rows;
  options.engine = engine;
  return value_and_grad(space, model, x, y, grad, options);
}

}  // namespace dpmlp
