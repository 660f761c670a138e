// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/trainer_options.hpp: what a DataParallelTrainer is told (TrainerOptions) and what it tells its caller
// and callbacks (TrainResult, TrainInfo, StepInfo, EpochInfo).
#pragma once

#include <cstdint>
#include <optional>

#include "dpmlp/comm/timed.hpp"
#include "dpmlp/engine/options.hpp"
#include "dpmlp/reduction.hpp"

namespace dpmlp {

// How a DataParallelTrainer trains: the engine's options (EngineOptions: the engine, block rows, GEMMs, the
// tensor kernel, leaf groups) and the trainer's own.
struct TrainerOptions : EngineOptions {
  // reproducible: the final parameters are bitwise identical whatever the rank count (docs/design.md).
  Reduction reduction = Reduction::reproducible;
  // At start, rank 0's parameters are broadcast to every rank. With `false`, the ranks instead check that
  // they already hold the same parameters (by digest) and refuse to train if not.
  bool broadcast_initial_params = true;
  // On CUDA with a stream-ordered communicator (NCCL), capture one step as a CUDA graph and replay it
  // (backend/step_graph.hpp). Elsewhere it is ignored.
  bool cuda_graph = false;
  // Global-norm gradient clipping before every update, torch.nn.utils.clip_grad_norm_(parameters, max_norm):
  // the summed gradient g is scaled by min(1, clip_grad_norm / (||g|| + 1e-6)). ||g|| is summed in a fixed
  // order from the reduced gradient (clip_lanes in data_parallel_trainer.hpp), so the bits stay the same
  // at any rank count. 0: off.
  double clip_grad_norm = 0;
  // With two or more ranks on CUDA and the reproducible reduction: exchange the block tree's subtree sums by
  // writing them straight into the other ranks' GPU memory (CUDA IPC; the GPUs need peer access, as over
  // NVLink), in one kernel that also sums the local tree, runs the combine and applies the update
  // (backend/cuda/peer.hpp). A step is then two kernels and no collective call; the bits are those of the
  // allgather path. Every rank must ask for it; on one rank it is ignored, elsewhere refused.
  bool peer_exchange = false;
  // With peer_exchange: a rank that waits more than this many seconds for another gives up, skips the rest of
  // the run's exchange steps, and every rank throws CommError when the run ends.
  double peer_timeout_s = 60;
  // How long any one collective of this trainer (on its own duplicate of the communicator: the MPI ones, the
  // agreement on errors, a fence that waits for NCCL collectives) may wait for the other ranks, in seconds;
  // positive and finite. Past it, every rank that can still act throws CommError naming the operation and the
  // ranks that did not arrive, and the trainer's communicator is abandoned: the parameters are those after
  // the last completed step, and the program should end (comm/timed.hpp, docs/reliability.md). Longer than
  // the longest gap between the ranks' arrivals at a collective that a healthy run can have (a rank's data
  // loading or checkpoint writing between two collectives included). The communicator's own set-up (its
  // duplicate, NCCL's initialization) comes first and uses the timeout of the MPI_Comm the trainer is given
  // (set_collective_timeout, or the same default).
  double collective_timeout_s = default_collective_timeout_s;
};

// The most steps a trainer counts (steps_done(), and so a checkpoint's step count): 2^62. A step count in
// [0, max_steps_done] plus the steps of one train() call (fewer than 2^31) stays far below INT64_MAX, so no
// step number computed from them (StepInfo::step, TrainInfo::steps_before + steps, the optimizer's t) can
// overflow. A trainer refuses a run that would take it past this count, and a checkpoint beyond it is refused.
inline constexpr std::int64_t max_steps_done = std::int64_t(1) << 62;

struct TrainResult {
  double first_loss = 0, last_loss = 0;
  int steps = 0;
};

// What callbacks are told (callbacks.hpp).
struct TrainInfo {
  int steps;                 // steps asked for in this train() call
  std::int64_t steps_before;  // steps taken before it
  int rank, size;
  bool epochs = false;       // train_epochs: end_epoch hooks follow each whole epoch; train(): every step is a
                             // full pass over the data
  bool validation = false;   // a callback of this run reports a validation loss (a `validate` hook:
                             // StepInfo::val_loss, EpochInfo::val_loss)
};
struct StepInfo {
  std::int64_t step;  // steps taken so far, over all train() calls
  int step_in_run;    // 1-based within this train() call
  double loss;        // this step's loss (the mean over all ranks' rows), computed before the step's update
  double step_ms;     // wall time of the step, including the loss read
  // The validation loss of the parameters after this step's update, where a validation callback evaluated it
  // after this step (dpmlp::Validation: every N steps); the same bits on every rank. Empty otherwise.
  std::optional<double> val_loss = std::nullopt;
};

// What an end_epoch hook is told (train_epochs).
struct EpochInfo {
  std::int64_t epoch;  // epochs completed so far, over all calls (this one included)
  int steps;           // mini-batch steps in this epoch
  double mean_loss;    // the mean of this epoch's batch losses
  // The validation loss of the parameters at the end of this epoch, where a validation callback evaluated it
  // (dpmlp::Validation: every N epochs); the same bits on every rank. Empty otherwise.
  std::optional<double> val_loss = std::nullopt;
};

}  // namespace dpmlp
