// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/callbacks.hpp: ready-made callbacks for DataParallelTrainer::train(steps, callbacks...).
//
//   dpmlp::ProgressBar progress;                      // rank 0 prints; a live line on a terminal
//   dpmlp::EarlyStopping stop(/*patience*/ 20, /*min_delta*/ 1e-4);
//   dpmlp::LossHistory history;
//   auto result = trainer.train(1000, progress, stop, history);   // result.steps <= 1000
//
// With a held-out set (validation.hpp), EarlyStopping watches the validation loss and can restore the best
// parameters at the end, as Keras' EarlyStopping(monitor='val_loss', restore_best_weights=True):
//   dpmlp::Validation val(trainer, val_rows, dpmlp::every_steps(10));  // then val.set_data(x_val, y_val)
//   stop.restore_best(trainer);
//   trainer.train(5000, val, stop, progress);                           // progress shows val_loss too
//
// A callback is any object with some of the optional hooks (data_parallel_trainer.hpp):
//   void begin_training(const TrainInfo&);     // once, before the first step of a train() call
//   void begin_step(std::int64_t step);        // before every step (its 1-based number over all calls)
//   bool end_step(const StepInfo&);            // after every step; true asks to stop (void: never stops)
//   void begin_epoch(std::int64_t epoch);      // train_epochs only: before every epoch (1-based)
//   bool end_epoch(const EpochInfo&);          // train_epochs only: after every epoch; true asks to stop
//   void end_training(const TrainResult&);     // once, after the last step
// and a validation callback's (dpmlp::Validation), called after a step or an epoch and before the end_step /
// end_epoch hooks, which then see the value in StepInfo::val_loss / EpochInfo::val_loss:
//   std::optional<double> validate(const StepInfo&);  std::optional<double> validate(const EpochInfo&);
// The trainer passes callbacks by reference, so their state (a history, the best loss) is there to read
// after train() returns.
//
// Every rank calls every hook with the same StepInfo::loss and val_loss (the loss is the mean over all ranks' rows, and
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
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "dpmlp/data_parallel_trainer.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/validation.hpp"

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
// Once a validation callback has reported a loss in this run (StepInfo / EpochInfo::val_loss), every line
// also shows the latest one after the loss, `val_loss 0.131` (`val_loss 0.131 (step 40)` on the done line,
// with the step it was evaluated after).
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
    has_val_ = false;
    last_step_ = val_step_ = 0;
    if (!active_) return;
    if (mode_ == Mode::automatic) {
      const int fd = fileno(out_);
      terminal_ = fd >= 0 && isatty(fd) == 1 && !launched_by_mpi();
    } else {
      terminal_ = mode_ == Mode::terminal;
    }
  }

  bool end_step(const StepInfo& s) {
    last_step_ = s.step;
    if (s.val_loss) {
      has_val_ = true;
      val_ = *s.val_loss;
      val_step_ = s.step;
    }
    if (!active_) return false;
    sum_ms_ += s.step_ms;
    since_draw_ms_ += s.step_ms;
    const double mean_ms = sum_ms_ / s.step_in_run;
    const double eta_s = mean_ms * (steps_ - s.step_in_run) / 1000.0;
    const bool last = s.step_in_run == steps_;
    if (terminal_) {
      if (last || !drawn_ || since_draw_ms_ >= min_redraw_ms_) {
        std::fprintf(out_, "\rstep %lld/%lld  loss %.6g%s  %.3f ms/step  ETA %.1f s\033[K",
                     static_cast<long long>(s.step), static_cast<long long>(total_), s.loss, val_text("  ").c_str(),
                     mean_ms, eta_s);
        std::fflush(out_);
        drawn_ = true;
        since_draw_ms_ = 0;
      }
    } else if (last || s.step_in_run % every_now_ == 0) {
      std::fprintf(out_, "step %lld/%lld loss %.6g%s ms/step %.3f eta_s %.3f\n", static_cast<long long>(s.step),
                   static_cast<long long>(total_), s.loss, val_text(" ").c_str(), mean_ms, eta_s);
      std::fflush(out_);
    }
    return false;
  }

  // A validation loss evaluated at the end of an epoch: shown from the next line on.
  void end_epoch(const EpochInfo& e) {
    if (e.val_loss) {
      has_val_ = true;
      val_ = *e.val_loss;
      val_step_ = last_step_;
    }
  }

  void end_training(const TrainResult& r) {
    if (!active_) return;
    if (terminal_ && drawn_) std::fputc('\n', out_);
    std::string val;
    if (has_val_) val = val_text(" ") + " (step " + std::to_string(val_step_) + ")";
    std::fprintf(out_, "done %d steps loss %.6g -> %.6g%s in %.3f s\n", r.steps, r.first_loss, r.last_loss,
                 val.c_str(), sum_ms_ / 1000.0);
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
  bool has_val_ = false;  // whether this run has reported a validation loss yet; the latest in val_
  double val_ = 0;
  std::int64_t val_step_ = 0, last_step_ = 0;

  // "<gap>val_loss <value>", or "" before the run's first validation loss.
  std::string val_text(const char* gap) const {
    if (!has_val_) return {};
    char text[64];
    std::snprintf(text, sizeof text, "%sval_loss %.6g", gap, val_);
    return text;
  }
};

// Stops training when the monitored loss has not improved on the best so far by more than min_delta for
// `patience` consecutive checks (Keras' rule: an improvement is value < best - min_delta). The state is reset
// at the start of each train() call.
//
// What it monitors (monitor(), Keras' `monitor`):
//   Monitor::automatic (the default): the validation loss when the run has a validation callback
//     (TrainInfo::validation: dpmlp::Validation among the callbacks), else the training loss;
//   Monitor::val_loss: the validation loss (StepInfo::val_loss, EpochInfo::val_loss); a run without a
//     validation callback is refused (InputError at its start, on every rank);
//   Monitor::loss: every step's training loss (StepInfo::loss).
// A check is a step for the training loss, and an evaluation for the validation loss (every N steps, or
// every N epochs: validation.hpp), so `patience` counts evaluations there, as Keras counts epochs.
//
// restore_best(trainer) (Keras' restore_best_weights=True): whenever the monitored loss improves, a copy of
// the parameters is kept on the device (one deep copy of the contiguous parameter buffer, enqueued between
// steps on the trainer's execution space), and at the end of the run (end_training, whether it stopped early
// or not) the parameters of the best check are copied back. For the validation loss those are exactly the
// parameters it was evaluated on; for the training loss, the parameters after that step's update (its loss
// was computed before it). The optimizer state and the step count stay those of the last step: a checkpoint
// written afterwards holds the best parameters with them.
//
// Every rank sees the same loss, so every rank stops after the same step, and keeps the same parameters. With
// the reproducible reduction (the default) the training loss is bitwise equal on every rank by construction
// (every rank runs the same combine program), and so is the validation loss (validation.hpp). With
// Reduction::fast the training loss is what the allreduce returns on each rank: the same bits with the MPI
// and NCCL implementations we know, but MPI does not promise it. `agree` (optional) removes the question: when
// given, each check's decision is combined over that communicator (logical or, one small MPI_Allreduce per
// check, a host synchronization), so all ranks stop together whatever the bits.
class EarlyStopping {
 public:
  enum class Monitor { automatic, loss, val_loss };

  explicit EarlyStopping(int patience = 10, double min_delta = 0.0, MPI_Comm agree = MPI_COMM_NULL)
      : patience_(patience), min_delta_(min_delta), comm_(agree) {
    if (patience < 1) throw InputError("dpmlp::EarlyStopping: patience must be >= 1, got " + std::to_string(patience));
    if (!(min_delta >= 0) || !std::isfinite(min_delta)) {
      throw InputError("dpmlp::EarlyStopping: min_delta must be finite and >= 0, got " + std::to_string(min_delta));
    }
  }

  // What it watches (above). Returns *this, to chain.
  EarlyStopping& monitor(Monitor m) {
    monitor_ = m;
    return *this;
  }

  // Keep the best parameters of `trainer`'s model on the device, and copy them back at the end of each run
  // (above). Collective over the trainer's communicator (it allocates one parameter buffer; a failure on any
  // rank is an InputError on every rank). The trainer must outlive the runs. Returns *this, to chain.
  template <class Trainer>
  EarlyStopping& restore_best(Trainer& trainer) {
    using Params = std::decay_t<decltype(trainer.model().params())>;
    const Params params = trainer.model().params();
    const auto space = trainer.space();
    Params best;
    all_or_none(trainer.communicator().mpi_comm(), [&] {
      best = Params(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::EarlyStopping::best"), params.extent(0));
    });
    keep_ = [params, best, space] { Kokkos::deep_copy(space, best, params); };
    restore_ = [params, best, space] {
      Kokkos::deep_copy(space, params, best);
      compat::fence(space, "dpmlp::EarlyStopping::restore_best");
    };
    return *this;
  }

  void begin_training(const TrainInfo& info) {
    best_ = std::numeric_limits<double>::infinity();
    best_step_ = 0;
    wait_ = 0;
    stopped_step_ = 0;
    last_step_ = 0;
    restored_ = false;
    if (monitor_ == Monitor::val_loss && !info.validation) {
      throw InputError(
          "dpmlp::EarlyStopping: it monitors val_loss, but no callback of this run reports one (pass a "
          "dpmlp::Validation to train / train_epochs, or monitor the training loss: Monitor::loss)");
    }
    watch_val_ = monitor_ == Monitor::val_loss || (monitor_ == Monitor::automatic && info.validation);
  }

  bool end_step(const StepInfo& s) {
    last_step_ = s.step;
    if (!watch_val_) return check(s.loss, s.step);
    if (!s.val_loss) return false;  // no evaluation after this step (the same on every rank)
    return check(*s.val_loss, s.step);
  }

  bool end_epoch(const EpochInfo& e) {
    if (!watch_val_ || !e.val_loss) return false;
    return check(*e.val_loss, last_step_);  // the epoch's last step
  }

  void end_training(const TrainResult&) {
    if (restore_ && best_step_ != 0) {
      restore_();
      restored_ = true;
    }
  }

  int patience() const { return patience_; }
  double min_delta() const { return min_delta_; }
  // Whether the last run watched the validation loss.
  bool watches_val_loss() const { return watch_val_; }
  // The best monitored loss seen in the last train() call, and the step (StepInfo::step) at which it was seen
  // (0: none).
  double best_loss() const { return best_; }
  std::int64_t best_step() const { return best_step_; }
  // The step after which it stopped training, or 0 if it did not.
  std::int64_t stopped_step() const { return stopped_step_; }
  bool stopped() const { return stopped_step_ != 0; }
  // Whether the last run ended with the parameters of best_step() copied back (restore_best).
  bool restored() const { return restored_; }

 private:
  bool check(double value, std::int64_t step) {
    if (value < best_ - min_delta_) {
      best_ = value;
      best_step_ = step;
      wait_ = 0;
      if (keep_) keep_();
    } else {
      ++wait_;
    }
    bool stop = wait_ >= patience_;
    if (comm_ != MPI_COMM_NULL) {
      int mine = stop ? 1 : 0, any = 0;
      timed_allreduce(&mine, &any, 1, MPI_INT, MPI_LOR, comm_, "MPI_Allreduce (dpmlp::EarlyStopping)");
      stop = any != 0;
    }
    if (stop) stopped_step_ = step;
    return stop;
  }

  int patience_;
  double min_delta_;
  MPI_Comm comm_;
  Monitor monitor_ = Monitor::automatic;
  bool watch_val_ = false, restored_ = false;
  double best_ = std::numeric_limits<double>::infinity();
  std::int64_t best_step_ = 0, stopped_step_ = 0, last_step_ = 0;
  int wait_ = 0;
  std::function<void()> keep_, restore_;
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
