// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/callbacks.hpp: ready-made callbacks for DataParallelTrainer::train(steps, callbacks...).
//
//   dpmlp::ProgressBar progress;                      // rank 0 prints; a live line on a terminal
//   dpmlp::EarlyStopping stop(/*patience*/ 20, /*min_delta*/ 1e-4);
//   dpmlp::LossHistory history;
//   auto result = trainer.train(1000, progress, stop, history);   // result.steps <= 1000
//
// A callback is any object with some of the optional hooks (data_parallel_trainer.hpp):
//   void begin_training(const TrainInfo&);     // once, before the first step of a train() call
//   void begin_step(std::int64_t step);        // before every step (its 1-based number over all calls)
//   bool end_step(const StepInfo&);            // after every step; true asks to stop (void: never stops)
//   void begin_epoch(std::int64_t epoch);      // train_epochs only: before every epoch (1-based)
//   bool end_epoch(const EpochInfo&);          // train_epochs only: after every epoch; true asks to stop
//   void end_training(const TrainResult&);     // once, after the last step
// The trainer passes callbacks by reference, so their state (a history, the best loss) is there to read
// after train() returns.
//
// Every rank calls every hook with the same StepInfo::loss (the loss is the mean over all ranks' rows, and
// every rank computes it from the same reduced buffer), so a decision taken from the loss alone, as
// EarlyStopping's, is the same on every rank and all ranks stop after the same step. A callback that decides
// from anything rank-local (a clock, a file) must agree across ranks itself (EarlyStopping's optional
// communicator shows how), or the ranks would leave the loop at different steps and hang in the next
// collective.
#pragma once

#include <mpi.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "dpmlp/data_parallel_trainer.hpp"
#include "dpmlp/errors.hpp"

namespace dpmlp {

namespace detail {
// a + b, clamped to the int64 range instead of overflowing. A trainer keeps its step numbers far from the
// limits (max_steps_done, trainer_options.hpp); a hook may also be called by other code, with any values.
inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  if (b > 0 && a > std::numeric_limits<std::int64_t>::max() - b) return std::numeric_limits<std::int64_t>::max();
  if (b < 0 && a < std::numeric_limits<std::int64_t>::min() - b) return std::numeric_limits<std::int64_t>::min();
  return a + b;
}
}  // namespace detail

// Progress of a training run, printed by rank 0 only (other ranks print nothing).
//
// Live line (Mode::terminal): one line rewritten in place ("\r" ... "\033[K"), at most every
// `min_redraw_ms` and always at the last step:
//   step 40/100  loss 0.123457  0.213 ms/step  ETA 0.0 s
// Plain lines (Mode::lines): one line every `every` steps and at the last step, no control characters:
//   step 40/100 loss 0.123457 ms/step 0.213 eta_s 0.013
// and at the end of the run, in both modes:
//   done 100 steps loss 1.041 -> 0.0123 in 0.021 s
// Mode::automatic (the default) chooses at begin_training: the live line when the FILE*'s descriptor is a
// terminal (isatty) and the process was not started by an MPI launcher, plain lines otherwise. So output to a
// pipe or a file never gets escape codes, under mpirun too: OpenMPI's mpirun gives each rank a pseudo-terminal
// as stdout even when mpirun's own output goes to a pipe or a file, and a rank cannot tell the two apart.
// An MPI launcher is recognized by the variables it sets in its processes' environment (launched_by_mpi():
// OpenMPI's OMPI_COMM_WORLD_SIZE, MPICH/Hydra's PMI_RANK or PMI_SIZE, PMIx's PMIX_RANK, Slurm srun's
// SLURM_PROCID); they choose the output's format only, never anything computed. Mode::terminal forces the live
// line (mpirun on an interactive terminal), Mode::lines the plain lines.
// Step numbers count all train() calls on the trainer (StepInfo::step), so a resumed run continues where the
// checkpoint left off; "/N" is the step at which this call will end if nothing stops it. ms/step is the mean
// over this call's steps so far, and the ETA is that mean times the steps left.
class ProgressBar {
 public:
  enum class Mode { automatic, terminal, lines };

  // every = 0: about ten lines per run (every max(1, steps / 10) steps). The FILE* is not owned.
  explicit ProgressBar(std::FILE* out = stdout, int every = 0, Mode mode = Mode::automatic)
      : out_(out), every_(every), mode_(mode) {
    if (every < 0) throw InputError("dpmlp::ProgressBar: every must be >= 0, got " + std::to_string(every));
  }

  // Redraw throttle of the terminal line (default 100 ms).
  ProgressBar& set_min_redraw_ms(double ms) {
    min_redraw_ms_ = ms;
    return *this;
  }
  // Whether this bar writes the live line (resolved at begin_training for Mode::automatic).
  bool terminal() const { return terminal_; }

  // Whether an MPI launcher (or Slurm's srun) started this process, from the variables it sets in the
  // process's environment. Mode::automatic reads this to choose a format, nothing else.
  static bool launched_by_mpi() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"}) {
      if (std::getenv(name) != nullptr) return true;
    }
    return false;
  }

  void begin_training(const TrainInfo& info) {
    active_ = info.rank == 0 && out_ != nullptr;
    total_ = detail::saturating_add(info.steps_before, info.steps);
    steps_ = info.steps;
    every_now_ = every_ > 0 ? every_ : (info.steps / 10 > 0 ? info.steps / 10 : 1);
    sum_ms_ = 0;
    since_draw_ms_ = 0;
    drawn_ = false;
    if (!active_) return;
    if (mode_ == Mode::automatic) {
      const int fd = fileno(out_);
      terminal_ = fd >= 0 && isatty(fd) == 1 && !launched_by_mpi();
    } else {
      terminal_ = mode_ == Mode::terminal;
    }
  }

  bool end_step(const StepInfo& s) {
    if (!active_) return false;
    sum_ms_ += s.step_ms;
    since_draw_ms_ += s.step_ms;
    const double mean_ms = sum_ms_ / s.step_in_run;
    const double eta_s = mean_ms * (steps_ - s.step_in_run) / 1000.0;
    const bool last = s.step_in_run == steps_;
    if (terminal_) {
      if (last || !drawn_ || since_draw_ms_ >= min_redraw_ms_) {
        std::fprintf(out_, "\rstep %lld/%lld  loss %.6g  %.3f ms/step  ETA %.1f s\033[K",
                     static_cast<long long>(s.step), static_cast<long long>(total_), s.loss, mean_ms, eta_s);
        std::fflush(out_);
        drawn_ = true;
        since_draw_ms_ = 0;
      }
    } else if (last || s.step_in_run % every_now_ == 0) {
      std::fprintf(out_, "step %lld/%lld loss %.6g ms/step %.3f eta_s %.3f\n", static_cast<long long>(s.step),
                   static_cast<long long>(total_), s.loss, mean_ms, eta_s);
      std::fflush(out_);
    }
    return false;
  }

  void end_training(const TrainResult& r) {
    if (!active_) return;
    if (terminal_ && drawn_) std::fputc('\n', out_);
    std::fprintf(out_, "done %d steps loss %.6g -> %.6g in %.3f s\n", r.steps, r.first_loss, r.last_loss,
                 sum_ms_ / 1000.0);
    std::fflush(out_);
  }

 private:
  std::FILE* out_;
  int every_;
  Mode mode_;
  double min_redraw_ms_ = 100.0;
  bool active_ = false, terminal_ = false, drawn_ = false;
  std::int64_t total_ = 0;
  int steps_ = 0, every_now_ = 1;
  double sum_ms_ = 0, since_draw_ms_ = 0;
};

// Stops training when the loss has not improved on the best loss so far by more than min_delta for
// `patience` consecutive steps (Keras' rule: an improvement is loss < best - min_delta). The state is reset
// at the start of each train() call.
//
// Every rank sees the same loss, so every rank stops after the same step. With the reproducible reduction
// (the default) the loss is bitwise equal on every rank by construction (every rank runs the same combine
// program). With Reduction::fast it is what the allreduce returns on each rank: the same bits with the MPI
// and NCCL implementations we know, but MPI does not promise it. `agree` (optional) removes the question:
// when given, each step's decision is combined over that communicator (logical or, one small MPI_Allreduce
// per step, a host synchronization), so all ranks stop together whatever the bits.
class EarlyStopping {
 public:
  explicit EarlyStopping(int patience = 10, double min_delta = 0.0, MPI_Comm agree = MPI_COMM_NULL)
      : patience_(patience), min_delta_(min_delta), comm_(agree) {
    if (patience < 1) throw InputError("dpmlp::EarlyStopping: patience must be >= 1, got " + std::to_string(patience));
    if (!(min_delta >= 0) || !std::isfinite(min_delta)) {
      throw InputError("dpmlp::EarlyStopping: min_delta must be finite and >= 0, got " + std::to_string(min_delta));
    }
  }

  void begin_training(const TrainInfo&) {
    best_ = std::numeric_limits<double>::infinity();
    best_step_ = 0;
    wait_ = 0;
    stopped_step_ = 0;
  }

  bool end_step(const StepInfo& s) {
    if (s.loss < best_ - min_delta_) {
      best_ = s.loss;
      best_step_ = s.step;
      wait_ = 0;
    } else {
      ++wait_;
    }
    bool stop = wait_ >= patience_;
    if (comm_ != MPI_COMM_NULL) {
      int mine = stop ? 1 : 0, any = 0;
      timed_allreduce(&mine, &any, 1, MPI_INT, MPI_LOR, comm_, "MPI_Allreduce (dpmlp::EarlyStopping)");
      stop = any != 0;
    }
    if (stop) stopped_step_ = s.step;
    return stop;
  }

  int patience() const { return patience_; }
  double min_delta() const { return min_delta_; }
  // The best loss seen in the last train() call, and the step (StepInfo::step) at which it was seen.
  double best_loss() const { return best_; }
  std::int64_t best_step() const { return best_step_; }
  // The step after which it stopped training, or 0 if it did not.
  std::int64_t stopped_step() const { return stopped_step_; }
  bool stopped() const { return stopped_step_ != 0; }

 private:
  int patience_;
  double min_delta_;
  MPI_Comm comm_;
  double best_ = std::numeric_limits<double>::infinity();
  std::int64_t best_step_ = 0, stopped_step_ = 0;
  int wait_ = 0;
};

// Records every step's loss (and its step number), across train() calls, until clear().
class LossHistory {
 public:
  void end_step(const StepInfo& s) {
    losses_.push_back(s.loss);
    steps_.push_back(s.step);
    step_ms_.push_back(s.step_ms);
  }
  const std::vector<double>& losses() const { return losses_; }
  const std::vector<std::int64_t>& steps() const { return steps_; }
  const std::vector<double>& step_ms() const { return step_ms_; }
  std::size_t size() const { return losses_.size(); }
  void clear() {
    losses_.clear();
    steps_.clear();
    step_ms_.clear();
  }

 private:
  std::vector<double> losses_;
  std::vector<std::int64_t> steps_;
  std::vector<double> step_ms_;
};

}  // namespace dpmlp
