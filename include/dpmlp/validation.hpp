// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/validation.hpp: the loss on a held-out validation set during training, as a callback.
//
//   dpmlp::Validation val(trainer, val_rows, dpmlp::every_steps(10));   // or dpmlp::every_epochs()
//   const dpmlp::Shard vs = val.shard();      // this rank's validation rows: [vs.first_row, vs.end_row)
//   val.set_data(x_val, y_val);               // Views of vs.rows() rows, in the trainer's memory space
//   dpmlp::EarlyStopping stop(20);            // watches val_loss: the run has a validation callback
//   stop.restore_best(trainer);               // at the end, the parameters of the best val_loss
//   trainer.train(5000, val, stop, progress); // progress shows val_loss
//
// The validation set is sharded over the trainer's ranks as the training rows are (whole blocks, a function of
// the validation set's global row count and the rank count), each rank provides its rows, and they stay on the
// device. The loss is the trainer's loss (Trainer::loss(), loss.hpp) on those rows, in double
// (detail::validation_row_loss), for the model's current parameters, computed row by row with the model's
// evaluator and summed with the block tree (reduction.hpp): the same bits on every rank, and at any rank count,
// so every rank takes the same decision from it (EarlyStopping) and no rank leaves the training loop alone.
//
// As a callback it has the validate hooks (callback_hooks.hpp), which the trainer calls after a step, once the
// step has run (between steps, never inside a captured CUDA graph), and before any end_step / end_epoch hook,
// which then see the value in StepInfo::val_loss / EpochInfo::val_loss:
//   every_steps(N):  after every step whose number (StepInfo::step, counted over all train calls) is a
//                    multiple of N;
//   every_epochs(N): in train_epochs, after every whole epoch whose number is a multiple of N; in train(),
//                    where every full-batch step is a pass over all the data, after every N-th step.
// evaluate() is collective (one allgather of a few doubles and a host read), as are the constructor and
// set_data; every rank must make the same calls.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dpmlp/data_parallel_trainer.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/mlp.hpp"
#include "dpmlp/reduction.hpp"
#include "dpmlp/trainer_options.hpp"

namespace dpmlp {

// How often a Validation evaluates: every_steps(n) or every_epochs(n). n must be positive (checked, on every
// rank, when the Validation is made).
struct ValidationFrequency {
  enum class Unit { steps, epochs };
  Unit unit = Unit::epochs;
  std::int64_t every = 1;
};
inline ValidationFrequency every_steps(std::int64_t n) { return {ValidationFrequency::Unit::steps, n}; }
inline ValidationFrequency every_epochs(std::int64_t n = 1) { return {ValidationFrequency::Unit::epochs, n}; }

namespace detail {
// The trainer's loss on one row r, before the mean: its outputs' loss terms w_j l(d) (`loss`: the loss's term
// in double, loss.hpp), summed; every loss divides the sum over rows by rows x outputs (validation_loss_scale).
// The validation loss is defined here and nowhere else.
template <class Term, class Pred, class Y>
KOKKOS_INLINE_FUNCTION double validation_row_loss(const Term& loss, const Pred& pred, const Y& y, std::int64_t r,
                                                  int outputs) {
  double sum = 0;
  for (int j = 0; j < outputs; ++j) {
    const double d = static_cast<double>(pred(r, j)) - static_cast<double>(y(r, j));
    sum += loss.value(d, j);
  }
  return sum;
}
inline double validation_loss_scale(std::int64_t rows, int outputs) {
  return 1.0 / (static_cast<double>(rows) * static_cast<double>(outputs));
}

// The largest model the validation evaluates (the evaluator keeps two layers' activations a row).
constexpr int validation_max_width = 2048;
constexpr int validation_max_layers = 16;

// row_loss(r) <- validation_row_loss of this rank's row r, for the model's parameters now.
template <int MaxWidth, class ExecSpace, class Scalar, class Term, class X, class Y, class Pred, class Rows>
void validation_row_losses(const ExecSpace& space, const Mlp<Scalar, typename ExecSpace::memory_space>& model,
                           const Term& loss, const X& x, const Y& y, const Pred& pred, const Rows& row_loss) {
  const auto eval = model.template evaluator<MaxWidth, validation_max_layers>();
  const int outputs = model.outputs();
  Kokkos::parallel_for(
      "dpmlp::Validation::rows", Kokkos::RangePolicy<ExecSpace>(space, 0, static_cast<std::int64_t>(x.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t r) {
        eval(Kokkos::subview(x, r, Kokkos::ALL), Kokkos::subview(pred, r, Kokkos::ALL));
        row_loss(r) = validation_row_loss(loss, pred, y, r, outputs);
      });
}
}  // namespace detail

template <class Trainer>
class Validation {
 public:
  using trainer_type = Trainer;
  using execution_space = typename Trainer::execution_space;
  using memory_space = typename Trainer::memory_space;
  using scalar_type = typename Trainer::scalar_type;
  using const_matrix = typename Trainer::const_matrix;

  // Collective over the trainer's communicator. global_rows: the validation rows over all ranks. Every rank
  // must pass the same rows and frequency; an empty set, a frequency below 1, ranks that disagree, or a model
  // wider than 2048 units or deeper than 16 layers are an InputError on every rank.
  Validation(Trainer& trainer, std::int64_t global_rows, ValidationFrequency every = every_epochs())
      : trainer_(&trainer), every_(every), global_rows_(global_rows) {
    MPI_Comm c = comm();
    const auto& model = trainer.model();
    std::string problem;
    if (global_rows <= 0) {
      problem = "an empty validation set (" + std::to_string(global_rows) + " rows); it needs at least one row";
    } else if (every.every < 1) {
      problem = std::string("validate every ") + std::to_string(every.every) +
                (every.unit == ValidationFrequency::Unit::steps ? " steps" : " epochs") + ": it must be at least 1";
    } else if (model.layers() > detail::validation_max_layers) {
      problem = "the model has " + std::to_string(model.layers()) + " layers; validation evaluates at most " +
                std::to_string(detail::validation_max_layers);
    } else {
      for (int w : model.widths()) widest_ = w > widest_ ? w : widest_;
      if (widest_ > detail::validation_max_width) {
        problem = "the model has a layer of " + std::to_string(widest_) + " units; validation evaluates at most " +
                  std::to_string(detail::validation_max_width);
      }
    }
    // The same set and frequency on every rank: their evaluations are collective and must pair up.
    long long mine[3] = {global_rows, every.every, every.unit == ValidationFrequency::Unit::steps ? 1 : 0};
    long long range[6] = {mine[0], mine[1], mine[2], -mine[0], -mine[1], -mine[2]};
    timed_allreduce(MPI_IN_PLACE, range, 6, MPI_LONG_LONG, MPI_MAX, c,
                    "MPI_Allreduce (dpmlp::Validation: the rows and frequency)");
    if (problem.empty() && (range[0] != -range[3] || range[1] != -range[4] || range[2] != -range[5])) {
      problem = "the ranks passed different validation rows or frequencies (rows " + std::to_string(-range[3]) +
                " to " + std::to_string(range[0]) + ")";
    }
    agree(c, problem.empty() ? problem : "dpmlp::Validation: " + problem);
    all_or_none(c, [&] {
      const std::int64_t block = default_block_rows(global_rows);
      plan_ = BlockTreePlan(global_rows, block, trainer.communicator().rank(), trainer.communicator().size());
      reducer_ = BlockTreeReducer<execution_space, double>(plan_, 1, Reduction::reproducible);
      const std::int64_t rows = plan_.shard().rows();
      pred_ = Kokkos::View<scalar_type**, Kokkos::LayoutRight, memory_space>("dpmlp::Validation::pred", rows,
                                                                             model.outputs());
      row_loss_ = Kokkos::View<double*, memory_space>("dpmlp::Validation::row_loss", rows);
      partials_ = Kokkos::View<double**, Kokkos::LayoutRight, memory_space>("dpmlp::Validation::partials",
                                                                            plan_.shard().local_blocks(), 1);
      // The trainer's loss in double, its output weights on the device (the first ones in the term itself).
      const std::vector<double>& w = trainer.loss().output_weights();
      loss_weights_ = Kokkos::View<double*, memory_space>("dpmlp::Validation::loss_weights", model.outputs());
      auto h = Kokkos::create_mirror_view(loss_weights_);
      LossWeights<double> lw;
      for (int j = 0; j < model.outputs(); ++j) {
        h(j) = w.empty() ? 1.0 : w[static_cast<std::size_t>(j)];
        if (j < LossWeights<double>::inline_count) lw.first[j] = h(j);
      }
      Kokkos::deep_copy(loss_weights_, h);
      lw.all = loss_weights_.data();
      loss_ = trainer.loss().template term<double>(lw);
    });
  }

  // This rank's validation rows: [shard().first_row, shard().end_row) of the validation set.
  const Shard& shard() const { return plan_.shard(); }
  std::int64_t global_rows() const { return global_rows_; }
  const ValidationFrequency& frequency() const { return every_; }

  // This rank's validation rows: x is shard().rows() x inputs, y is shard().rows() x outputs, in the trainer's
  // memory space. No copy: the Views are kept. Collective: shapes and non-finite values are checked on every
  // rank, and every rank throws the first failing rank's InputError.
  void set_data(const const_matrix& x, const const_matrix& y) {
    std::string problem = check_shapes(x, y);
    if (problem.empty()) problem = find_non_finite(x, "x");
    if (problem.empty()) problem = find_non_finite(y, "y");
    agree(comm(), problem);
    x_ = x;
    y_ = y;
    has_data_ = true;
  }

  // The trainer's loss (Trainer::loss()) on the validation set for the model's parameters now: the same
  // bits on every rank and at any rank count. Collective.
  double evaluate() {
    agree(comm(), has_data_ ? std::string() : "dpmlp::Validation::evaluate: set_data() first");
    const execution_space& space = trainer_->space();
    const auto& model = trainer_->model();
    if (widest_ <= 256) {
      detail::validation_row_losses<256>(space, model, loss_, x_, y_, pred_, row_loss_);
    } else {
      detail::validation_row_losses<detail::validation_max_width>(space, model, loss_, x_, y_, pred_, row_loss_);
    }
    sum_blocks();
    const auto total = reducer_.reduce(space, partials_, trainer_->communicator());
    double sum = 0;
    Kokkos::deep_copy(space, sum, Kokkos::subview(total, 0));
    trainer_->wait_for_space("dpmlp::Validation::evaluate");
    return sum * detail::validation_loss_scale(global_rows_, model.outputs());
  }

  // ---- the callback's hooks (callback_hooks.hpp)
  void begin_training(const TrainInfo& info) { in_epochs_ = info.epochs; }
  std::optional<double> validate(const StepInfo& s) {
    last_step_ = s.step;
    const bool steps = every_.unit == ValidationFrequency::Unit::steps;
    if ((!steps && in_epochs_) || s.step % every_.every != 0) return std::nullopt;
    return record(evaluate(), s.step);
  }
  std::optional<double> validate(const EpochInfo& e) {
    if (every_.unit != ValidationFrequency::Unit::epochs || e.epoch % every_.every != 0) return std::nullopt;
    return record(evaluate(), last_step_);
  }

  // Every validation loss the hooks computed, and the step (StepInfo::step) after which each was computed,
  // across train calls, until clear().
  const std::vector<double>& losses() const { return losses_; }
  const std::vector<std::int64_t>& steps() const { return steps_; }
  void clear() {
    losses_.clear();
    steps_.clear();
  }

  // ---- the rest is public only because CUDA's extended lambdas may not live in private member functions
  // partials(b, 0) <- the sum of this rank's block b's row losses, in row order.
  void sum_blocks() {
    const std::int64_t rows = plan_.shard().rows(), block = plan_.shard().block_rows;
    const auto rl = row_loss_;
    const auto partials = partials_;
    Kokkos::parallel_for(
        "dpmlp::Validation::blocks", Kokkos::RangePolicy<execution_space>(trainer_->space(), 0, plan_.shard().local_blocks()),
        KOKKOS_LAMBDA(const std::int64_t b) {
          const std::int64_t end = (b + 1) * block < rows ? (b + 1) * block : rows;
          double acc = 0.0;
          for (std::int64_t r = b * block; r < end; ++r) acc += rl(r);
          partials(b, 0) = acc;
        });
  }

  // The first non-finite element of v, as "validation row R, column C", or "".
  std::string find_non_finite(const const_matrix& v, const char* name) const {
    const std::int64_t cols = v.extent(1);
    const std::int64_t n = std::int64_t(v.extent(0)) * cols;
    std::int64_t first = n;
    Kokkos::parallel_reduce(
        "dpmlp::Validation::find_non_finite", Kokkos::RangePolicy<execution_space>(trainer_->space(), 0, n),
        KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& m) {
          if (!compat::isfinite(v(i / cols, i % cols)) && i < m) m = i;
        },
        Kokkos::Min<std::int64_t>(first));
    if (first >= n) return {};
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    return std::string("dpmlp::Validation::set_data: ") + name + " has a non-finite value (" +
           std::to_string(static_cast<double>(host(first / cols, first % cols))) + ") at validation row " +
           std::to_string(plan_.shard().first_row + first / cols) + ", column " + std::to_string(first % cols);
  }

 private:
  MPI_Comm comm() const { return trainer_->communicator().mpi_comm(); }

  std::string check_shapes(const const_matrix& x, const const_matrix& y) const {
    const auto rows = static_cast<std::size_t>(plan_.shard().rows());
    const auto& model = trainer_->model();
    auto shape = [](const const_matrix& v) { return std::to_string(v.extent(0)) + "x" + std::to_string(v.extent(1)); };
    const std::string where = " (this rank's validation shard: rows " + std::to_string(plan_.shard().first_row) +
                              ".." + std::to_string(plan_.shard().end_row) + " of " + std::to_string(global_rows_) +
                              ")";
    if (x.extent(0) != rows || x.extent(1) != static_cast<std::size_t>(model.inputs())) {
      return "dpmlp::Validation::set_data: x is " + shape(x) + ", expected " + std::to_string(rows) + "x" +
             std::to_string(model.inputs()) + " (shard rows x model inputs)" + where;
    }
    if (y.extent(0) != rows || y.extent(1) != static_cast<std::size_t>(model.outputs())) {
      return "dpmlp::Validation::set_data: y is " + shape(y) + ", expected " + std::to_string(rows) + "x" +
             std::to_string(model.outputs()) + " (shard rows x model outputs)" + where;
    }
    return {};
  }

  double record(double loss, std::int64_t step) {
    losses_.push_back(loss);
    steps_.push_back(step);
    return loss;
  }

  Trainer* trainer_;
  ValidationFrequency every_;
  std::int64_t global_rows_ = 0;
  int widest_ = 0;
  BlockTreePlan plan_;
  BlockTreeReducer<execution_space, double> reducer_;
  Kokkos::View<scalar_type**, Kokkos::LayoutRight, memory_space> pred_;
  Kokkos::View<double*, memory_space> row_loss_;
  Kokkos::View<double**, Kokkos::LayoutRight, memory_space> partials_;
  loss_term_t<typename Trainer::loss_type, double> loss_;  // the trainer's loss, in double
  Kokkos::View<double*, memory_space> loss_weights_;
  const_matrix x_, y_;
  bool has_data_ = false, in_epochs_ = false;
  std::int64_t last_step_ = 0;
  std::vector<double> losses_;
  std::vector<std::int64_t> steps_;
};

}  // namespace dpmlp
