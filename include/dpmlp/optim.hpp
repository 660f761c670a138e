// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/optim.hpp: optimizers, as policy types of DataParallelTrainer, and learning-rate schedules.
//
// An Optimizer has
//   static constexpr const char* name();
//   void validate() const;                                   // InputError for bad settings
//   std::size_t state_size(std::size_t num_params) const;   // its state: one contiguous buffer (checkpoints
//                                                           // carry it), zero-initialized
//   bool per_step() const;   // whether its update depends on the update's number t (a schedule, Adam)
//   KOKKOS_FUNCTION void prepare(std::int64_t t, double* scalars) const;   // the per-step scalars of update t
//                                                                           // (1-based), at most step_scalars
//   template <class Scalar> Step<Scalar> step(const double* scalars) const;
// and its Step<Scalar> is a small copyable functor the update kernel calls per parameter on the device:
//   KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t num_params, Scalar* params,
//                                          Scalar grad, Scalar* state) const;
// The trainer keeps the update count on the device: where per_step(), a one-thread kernel before each step's
// update counts it and calls prepare() into a small device buffer that the Step reads (`scalars`). So nothing
// of a step is computed on the host, and a step (or a whole epoch) can be captured in a CUDA graph and
// replayed with any optimizer and schedule. Everything that depends on t alone (the schedule's factor, Adam's
// bias corrections) is computed once a step, in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {

// The most per-step scalars an optimizer's prepare() writes.
inline constexpr int step_scalars = 4;

// A learning-rate schedule: the factor the optimizer's learning rate is multiplied by at each update, with
// PyTorch's torch.optim.lr_scheduler semantics for one scheduler.step() after every optimizer step (k = t - 1
// updates before update t):
//   constant()                     1                                                     (no scheduler)
//   step_decay(step_size, gamma)   gamma^floor(k / step_size)                            (StepLR)
//   exponential(gamma)             gamma^k                                               (ExponentialLR)
//   cosine(t_max, min_factor)      min + (1 - min) (1 + cos(pi k / t_max)) / 2           (CosineAnnealingLR,
//                                                                                        eta_min = min * lr)
// and, before any of them, .with_warmup(w, start): start + (1 - start) k / w for k < w, then the schedule
// from its own k = 0 (SequentialLR of LinearLR(start, 1, w) and the schedule, milestone w).
struct LrSchedule {
  enum class Kind { constant, step_decay, exponential, cosine };
  Kind kind = Kind::constant;
  std::int64_t step_size = 1, t_max = 1, warmup = 0;
  double gamma = 1.0, min_factor = 0.0, warmup_start = 0.0;

  static LrSchedule constant() { return LrSchedule(); }
  static LrSchedule step_decay(std::int64_t step_size, double gamma) {
    LrSchedule s;
    s.kind = Kind::step_decay, s.step_size = step_size, s.gamma = gamma;
    return s;
  }
  static LrSchedule exponential(double gamma) {
    LrSchedule s;
    s.kind = Kind::exponential, s.gamma = gamma;
    return s;
  }
  static LrSchedule cosine(std::int64_t t_max, double min_factor = 0.0) {
    LrSchedule s;
    s.kind = Kind::cosine, s.t_max = t_max, s.min_factor = min_factor;
    return s;
  }
  LrSchedule with_warmup(std::int64_t steps, double start_factor = 1.0 / 3.0) const {
    LrSchedule s = *this;
    s.warmup = steps, s.warmup_start = start_factor;
    return s;
  }

  bool is_constant() const { return kind == Kind::constant && warmup == 0; }

  // The factor at update t (1-based).
  KOKKOS_INLINE_FUNCTION double factor(std::int64_t t) const {
    std::int64_t k = t - 1;
    if (k < warmup) return warmup_start + (1.0 - warmup_start) * static_cast<double>(k) / static_cast<double>(warmup);
    k -= warmup;
    switch (kind) {
      case Kind::step_decay: return compat::pow(gamma, compat::floor(static_cast<double>(k / step_size)));
      case Kind::exponential: return compat::pow(gamma, static_cast<double>(k));
      case Kind::cosine:
        return min_factor + (1.0 - min_factor) *
                                (1.0 + compat::cos(3.14159265358979323846 * static_cast<double>(k) /
                                                   static_cast<double>(t_max))) / 2.0;
      default: return 1.0;
    }
  }

  void validate(const char* who) const {
    const std::string w = std::string(who) + ": the learning-rate schedule ";
    if (warmup < 0 || !(warmup_start >= 0 && warmup_start <= 1)) {
      throw InputError(w + "needs warm-up steps >= 0 and a start factor in [0, 1]");
    }
    if (kind == Kind::step_decay && (step_size <= 0 || !(gamma > 0 && gamma <= 1))) {
      throw InputError(w + "(step decay) needs step_size > 0 and gamma in (0, 1]");
    }
    if (kind == Kind::exponential && !(gamma > 0 && gamma <= 1)) {
      throw InputError(w + "(exponential) needs gamma in (0, 1]");
    }
    if (kind == Kind::cosine && (t_max <= 0 || !(min_factor >= 0 && min_factor <= 1))) {
      throw InputError(w + "(cosine) needs t_max > 0 and a minimum factor in [0, 1]");
    }
  }
};

// Stochastic gradient descent, with optional (heavy-ball) momentum, PyTorch's torch.optim.SGD:
// v <- momentum v + g; p <- p - lr_t v. With momentum 0 and no schedule it is exactly the seed's p <- p - lr g.
struct Sgd {
  double learning_rate = 0.01;
  double momentum = 0.0;
  LrSchedule schedule;

  Sgd() = default;
  explicit Sgd(double rate, double momentum_ = 0.0, LrSchedule schedule_ = LrSchedule())
      : learning_rate(rate), momentum(momentum_), schedule(schedule_) {}

  static constexpr const char* name() { return "sgd"; }
  std::size_t state_size(std::size_t num_params) const { return momentum != 0.0 ? num_params : 0; }
  bool per_step() const { return !schedule.is_constant(); }

  void validate() const {
    if (!(learning_rate > 0) || !std::isfinite(learning_rate)) {
      throw InputError("dpmlp::Sgd: the learning rate must be positive and finite, got " +
                       std::to_string(learning_rate));
    }
    if (!(momentum >= 0 && momentum < 1)) {
      throw InputError("dpmlp::Sgd: momentum must be in [0, 1), got " + std::to_string(momentum));
    }
    schedule.validate("dpmlp::Sgd");
  }

  // scalars[0]: the learning rate of update t.
  KOKKOS_INLINE_FUNCTION void prepare(std::int64_t t, double* scalars) const {
    scalars[0] = learning_rate * schedule.factor(t);
  }

  template <class Scalar>
  struct Step {
    Scalar rate, momentum;
    const double* scalars;  // null: the constant rate
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t, Scalar* params, Scalar grad,
                                           Scalar* state) const {
      const Scalar r = scalars != nullptr ? static_cast<Scalar>(scalars[0]) : rate;
      if (momentum != Scalar(0)) {
        const Scalar v = momentum * state[i] + grad;
        state[i] = v;
        params[i] = params[i] - r * v;
      } else {
        params[i] = params[i] - r * grad;
      }
    }
  };

  template <class Scalar>
  Step<Scalar> step(const double* scalars) const {
    return Step<Scalar>{static_cast<Scalar>(learning_rate), static_cast<Scalar>(momentum),
                        per_step() ? scalars : nullptr};
  }
};

// Adam (Kingma & Ba), PyTorch's torch.optim.Adam, and with `weight_decay` > 0 and `decoupled` its AdamW
// (Loshchilov & Hutter: p <- p (1 - lr_t weight_decay) before the Adam step). Coupled weight decay (Adam's
// own, g <- g + weight_decay p) is not offered.
struct Adam {
  double learning_rate = 1e-3, beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  double weight_decay = 0.0;  // decoupled (AdamW); 0 for Adam
  LrSchedule schedule;

  Adam() = default;
  explicit Adam(double rate, LrSchedule schedule_ = LrSchedule()) : learning_rate(rate), schedule(schedule_) {}

  static constexpr const char* name() { return "adam"; }
  // First moments, then second moments.
  std::size_t state_size(std::size_t num_params) const { return 2 * num_params; }
  bool per_step() const { return true; }

  void validate() const {
    if (!(learning_rate > 0) || !std::isfinite(learning_rate)) {
      throw InputError("dpmlp::Adam: the learning rate must be positive and finite, got " +
                       std::to_string(learning_rate));
    }
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && epsilon > 0)) {
      throw InputError("dpmlp::Adam: needs 0 <= beta1, beta2 < 1 and epsilon > 0");
    }
    if (!(weight_decay >= 0) || !std::isfinite(weight_decay)) {
      throw InputError("dpmlp::Adam: weight_decay must be >= 0 and finite, got " + std::to_string(weight_decay));
    }
    schedule.validate("dpmlp::Adam");
  }

  // The paper's "efficient version": alpha_t = lr_t sqrt(1 - beta2^t) / (1 - beta1^t), epsilon scaled alike.
  // scalars: alpha_t, epsilon sqrt(1 - beta2^t), and the decay factor 1 - lr_t weight_decay.
  KOKKOS_INLINE_FUNCTION void prepare(std::int64_t t, double* scalars) const {
    const double lr = learning_rate * schedule.factor(t);
    const double c1 = 1.0 - compat::pow(beta1, static_cast<double>(t));
    const double c2 = compat::sqrt(1.0 - compat::pow(beta2, static_cast<double>(t)));
    scalars[0] = lr * c2 / c1;
    scalars[1] = epsilon * c2;
    scalars[2] = 1.0 - lr * weight_decay;
  }

  template <class Scalar>
  struct Step {
    Scalar beta1, beta2;
    const double* scalars;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t n, Scalar* params, Scalar grad,
                                           Scalar* state) const {
      const Scalar step_size = static_cast<Scalar>(scalars[0]), epsilon_hat = static_cast<Scalar>(scalars[1]);
      const Scalar m = beta1 * state[i] + (Scalar(1) - beta1) * grad;
      const Scalar v = beta2 * state[n + i] + (Scalar(1) - beta2) * grad * grad;
      state[i] = m;
      state[n + i] = v;
      // Without weight decay the factor is exactly 1, and so is the product.
      const Scalar p = params[i] * static_cast<Scalar>(scalars[2]);
      params[i] = p - step_size * m / (compat::sqrt(v) + epsilon_hat);
    }
  };

  template <class Scalar>
  Step<Scalar> step(const double* scalars) const {
    return Step<Scalar>{static_cast<Scalar>(beta1), static_cast<Scalar>(beta2), scalars};
  }
};

// AdamW with PyTorch's defaults (torch.optim.AdamW: weight_decay 0.01): Adam with decoupled weight decay.
struct AdamW : Adam {
  AdamW() { weight_decay = 0.01; }
  explicit AdamW(double rate, double weight_decay_ = 0.01, LrSchedule schedule_ = LrSchedule()) : Adam(rate, schedule_) {
    weight_decay = weight_decay_;
  }
  static constexpr const char* name() { return "adamw"; }
};

template <class O, class = void>
struct is_optimizer : std::false_type {};
template <class O>
struct is_optimizer<O, std::void_t<decltype(O::name()), decltype(std::declval<const O&>().state_size(std::size_t(1))),
                                   decltype(std::declval<const O&>().template step<float>(std::declval<const double*>())),
                                   decltype(std::declval<const O&>().prepare(std::int64_t(1), std::declval<double*>())),
                                   decltype(std::declval<const O&>().per_step()),
                                   decltype(std::declval<const O&>().validate())>> : std::true_type {};

}  // namespace dpmlp
