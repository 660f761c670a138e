// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/optim.hpp: optimizers, as policy types of DataParallelTrainer.
//
// An Optimizer has
//   static constexpr const char* name();
//   std::size_t state_size(std::size_t num_params) const;   // its state: one contiguous buffer (checkpoints
//                                                           // carry it), zero-initialized
//   template <class Scalar> Step<Scalar> step(std::int64_t t) const;   // host side, before step t (1-based)
//   static constexpr bool step_depends_on_t;   // false: step(t) is the same for all t (graph capture works)
// and its Step<Scalar> is a small copyable functor the update kernel calls per parameter on the device:
//   KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t num_params, Scalar* params,
//                                          Scalar grad, Scalar* state) const;
// Everything that depends on t alone (Adam's bias corrections) is computed once on the host, in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {

// Stochastic gradient descent, with optional (heavy-ball) momentum: v <- momentum v + g; p <- p - rate v.
// With momentum 0 it is exactly the seed's p <- p - rate g.
struct Sgd {
  double learning_rate = 0.01;
  double momentum = 0.0;

  Sgd() = default;
  explicit Sgd(double rate, double momentum_ = 0.0) : learning_rate(rate), momentum(momentum_) {}

  static constexpr const char* name() { return "sgd"; }
  // step(t) is the same for every t, so a captured step can be replayed (backend/cuda_graph.hpp).
  static constexpr bool step_depends_on_t = false;
  std::size_t state_size(std::size_t num_params) const { return momentum != 0.0 ? num_params : 0; }

  void validate() const {
    if (!(learning_rate > 0) || !std::isfinite(learning_rate)) {
      throw InputError("dpmlp::Sgd: the learning rate must be positive and finite, got " +
                       std::to_string(learning_rate));
    }
    if (!(momentum >= 0 && momentum < 1)) {
      throw InputError("dpmlp::Sgd: momentum must be in [0, 1), got " + std::to_string(momentum));
    }
  }

  template <class Scalar>
  struct Step {
    Scalar rate, momentum;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t, Scalar* params, Scalar grad,
                                           Scalar* state) const {
      if (momentum != Scalar(0)) {
        const Scalar v = momentum * state[i] + grad;
        state[i] = v;
        params[i] = params[i] - rate * v;
      } else {
        params[i] = params[i] - rate * grad;
      }
    }
  };

  template <class Scalar>
  Step<Scalar> step(std::int64_t) const {
    return Step<Scalar>{static_cast<Scalar>(learning_rate), static_cast<Scalar>(momentum)};
  }
};

// Adam (Kingma & Ba), with the bias-corrected step size computed on the host per step.
struct Adam {
  double learning_rate = 1e-3, beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;

  Adam() = default;
  explicit Adam(double rate) : learning_rate(rate) {}

  static constexpr const char* name() { return "adam"; }
  static constexpr bool step_depends_on_t = true;
  // First moments, then second moments.
  std::size_t state_size(std::size_t num_params) const { return 2 * num_params; }

  void validate() const {
    if (!(learning_rate > 0) || !std::isfinite(learning_rate)) {
      throw InputError("dpmlp::Adam: the learning rate must be positive and finite, got " +
                       std::to_string(learning_rate));
    }
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && epsilon > 0)) {
      throw InputError("dpmlp::Adam: needs 0 <= beta1, beta2 < 1 and epsilon > 0");
    }
  }

  template <class Scalar>
  struct Step {
    Scalar beta1, beta2, step_size, epsilon_hat;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t n, Scalar* params, Scalar grad,
                                           Scalar* state) const {
      const Scalar m = beta1 * state[i] + (Scalar(1) - beta1) * grad;
      const Scalar v = beta2 * state[n + i] + (Scalar(1) - beta2) * grad * grad;
      state[i] = m;
      state[n + i] = v;
      params[i] = params[i] - step_size * m / (compat::sqrt(v) + epsilon_hat);
    }
  };

  // The paper's "efficient version": alpha_t = alpha sqrt(1 - beta2^t) / (1 - beta1^t), epsilon scaled alike.
  template <class Scalar>
  Step<Scalar> step(std::int64_t t) const {
    const double c1 = 1.0 - std::pow(beta1, static_cast<double>(t));
    const double c2 = std::sqrt(1.0 - std::pow(beta2, static_cast<double>(t)));
    return Step<Scalar>{static_cast<Scalar>(beta1), static_cast<Scalar>(beta2),
                        static_cast<Scalar>(learning_rate * c2 / c1), static_cast<Scalar>(epsilon * c2)};
  }
};

template <class O, class = void>
struct is_optimizer : std::false_type {};
template <class O>
struct is_optimizer<O, std::void_t<decltype(O::name()), decltype(std::declval<const O&>().state_size(std::size_t(1))),
                                   decltype(std::declval<const O&>().template step<float>(std::int64_t(1))),
                                   decltype(std::declval<const O&>().validate()),
                                   decltype(O::step_depends_on_t)>> : std::true_type {};

}  // namespace dpmlp
