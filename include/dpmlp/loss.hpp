// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/loss.hpp: training losses, as policy types of DataParallelTrainer (like the optimizer, optim.hpp).
//
// With d = prediction - target for row r and output j, over N rows and O outputs, every loss is
//   loss = 1 / (N O) * sum_r sum_j w_j l(d_rj)
// with per-output weights w_j (all 1 by default), and l one of
//   Mse           d^2                                                  torch.nn.MSELoss
//   L1            |d|                                                  torch.nn.L1Loss
//   Huber(delta)  0.5 d^2 where |d| <= delta, else delta (|d| - 0.5 delta)   torch.nn.HuberLoss(delta=delta)
// With unit weights that is PyTorch's reduction='mean' (the mean over rows and outputs); with weights it is
// PyTorch's (w * loss_fn(pred, y, reduction='none')).mean(): the weights multiply the terms, the mean still
// divides by N O (so weights that are all 1 change nothing, and weights that are all 2 double the loss). The
// gradient is that of the loss: scale w_j l'(d) a prediction, scale = 1 / (N O); L1's l'(0) is 0 (torch's
// sign), Huber's l' is d inside [-delta, delta] and delta sign(d) outside.
//
// A Loss has
//   static constexpr const char* name();
//   std::string describe() const;          // e.g. "huber(delta=0.5), weights [1, 2]"
//   void validate(int outputs) const;      // InputError for bad settings (weights not one a model output, ...)
//   const std::vector<double>& output_weights() const;   // empty: every output weighs 1
//   template <class Scalar> Term<Scalar> term(const LossWeights<Scalar>& w) const;
// and its Term<Scalar> is a small copyable functor the engines call per prediction on the device:
//   KOKKOS_INLINE_FUNCTION Scalar value(Scalar d, int j) const;               // w_j l(d)
//   KOKKOS_INLINE_FUNCTION Scalar grad(Scalar d, int j, Scalar scale) const;  // scale w_j l'(d)
// with value(0, j) == 0 and grad(0, j, scale) == 0: the layered engine gives the rows outside a mini-batch
// window d = 0. Each engine takes the term as a template argument (no runtime switch in its inner loops) and
// sums value() where it summed the squared residuals, in the same fixed shapes, so every loss keeps the bits
// identical at any rank count.
//
// Mse's term computes (w_j d) d and 2 scale (w_j d): with w_j = 1 the products w_j d are exact, so an
// unweighted Mse has exactly the bits of d d and 2 scale d, whatever the compiler contracts into FMAs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dpmlp/exceptions.hpp"
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {

// The per-output weights as an engine's kernels read them: the first `inline_count` by value (kernel
// arguments: on a GPU a constant-memory operand, no load and no register), the rest through `all`, every
// weight in memory the engine's space reads (needed only with more than inline_count outputs, which only the
// layered engine takes).
template <class Scalar>
struct LossWeights {
  static constexpr int inline_count = 4;
  Scalar first[inline_count] = {Scalar(1), Scalar(1), Scalar(1), Scalar(1)};
  const Scalar* all = nullptr;
  KOKKOS_INLINE_FUNCTION Scalar operator()(int j) const { return j < inline_count ? first[j] : all[j]; }
};

namespace detail {

// The shortest of %.15g and %.17g that reads back as v (0.3, not 0.29999999999999999).
inline std::string loss_number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", v);
  if (std::strtod(text, nullptr) != v) std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

// InputError unless `weights` is empty or has one finite, non-negative weight an output, not all zero.
inline void validate_loss_weights(const char* who, const std::vector<double>& weights, int outputs) {
  if (weights.empty()) return;
  const std::string w = std::string(who) + ": ";
  if (weights.size() != static_cast<std::size_t>(outputs)) {
    throw InputError(w + std::to_string(weights.size()) + " output weights for a model of " +
                     std::to_string(outputs) + " output" + (outputs == 1 ? "" : "s") + " (one weight an output)");
  }
  bool any = false;
  for (std::size_t j = 0; j < weights.size(); ++j) {
    if (!(weights[j] >= 0) || !std::isfinite(weights[j])) {
      throw InputError(w + "output weight " + std::to_string(j) + " is " + loss_number(weights[j]) +
                       "; weights must be finite and >= 0");
    }
    any = any || weights[j] > 0;
  }
  if (!any) throw InputError(w + "every output weight is 0: nothing would be learned");
}

inline std::string describe_loss_weights(const std::vector<double>& weights) {
  if (weights.empty()) return {};
  std::string s = ", weights [";
  for (std::size_t j = 0; j < weights.size(); ++j) s += (j ? ", " : "") + loss_number(weights[j]);
  return s + "]";
}

}  // namespace detail

// Mean squared error, torch.nn.MSELoss: l(d) = d^2. The default loss.
struct Mse {
  std::vector<double> weights;  // one an output, or empty (all 1)

  Mse() = default;
  explicit Mse(std::vector<double> weights_) : weights(std::move(weights_)) {}

  static constexpr const char* name() { return "mse"; }
  std::string describe() const { return name() + detail::describe_loss_weights(weights); }
  const std::vector<double>& output_weights() const { return weights; }
  void validate(int outputs) const { detail::validate_loss_weights("dpmlp::Mse", weights, outputs); }

  template <class Scalar>
  struct Term {
    LossWeights<Scalar> w;
    KOKKOS_INLINE_FUNCTION Scalar value(Scalar d, int j) const { return (w(j) * d) * d; }
    KOKKOS_INLINE_FUNCTION Scalar grad(Scalar d, int j, Scalar scale) const { return Scalar(2) * scale * (w(j) * d); }
  };
  template <class Scalar>
  Term<Scalar> term(const LossWeights<Scalar>& w) const {
    return Term<Scalar>{w};
  }
};

// Mean absolute error, torch.nn.L1Loss: l(d) = |d|, l'(d) = sign(d) (0 at 0).
struct L1 {
  std::vector<double> weights;  // one an output, or empty (all 1)

  L1() = default;
  explicit L1(std::vector<double> weights_) : weights(std::move(weights_)) {}

  static constexpr const char* name() { return "l1"; }
  std::string describe() const { return name() + detail::describe_loss_weights(weights); }
  const std::vector<double>& output_weights() const { return weights; }
  void validate(int outputs) const { detail::validate_loss_weights("dpmlp::L1", weights, outputs); }

  template <class Scalar>
  struct Term {
    LossWeights<Scalar> w;
    KOKKOS_INLINE_FUNCTION Scalar value(Scalar d, int j) const { return w(j) * (d < Scalar(0) ? -d : d); }
    KOKKOS_INLINE_FUNCTION Scalar grad(Scalar d, int j, Scalar scale) const {
      const Scalar sign = d > Scalar(0) ? Scalar(1) : d < Scalar(0) ? Scalar(-1) : Scalar(0);
      return scale * (w(j) * sign);
    }
  };
  template <class Scalar>
  Term<Scalar> term(const LossWeights<Scalar>& w) const {
    return Term<Scalar>{w};
  }
};

// Huber loss, torch.nn.HuberLoss(delta): l(d) = 0.5 d^2 where |d| <= delta, else delta (|d| - 0.5 delta);
// l'(d) = d inside [-delta, delta], delta sign(d) outside (both continuous at |d| = delta). delta > 0, default
// 1.0 as in PyTorch. (torch.nn.SmoothL1Loss(beta) is Huber(beta) / beta.)
struct Huber {
  double delta = 1.0;
  std::vector<double> weights;  // one an output, or empty (all 1)

  Huber() = default;
  explicit Huber(double delta_, std::vector<double> weights_ = {}) : delta(delta_), weights(std::move(weights_)) {}

  static constexpr const char* name() { return "huber"; }
  std::string describe() const {
    return std::string(name()) + "(delta=" + detail::loss_number(delta) + ")" + detail::describe_loss_weights(weights);
  }
  const std::vector<double>& output_weights() const { return weights; }
  void validate(int outputs) const {
    if (!(delta > 0) || !std::isfinite(delta)) {
      throw InputError("dpmlp::Huber: delta must be positive and finite, got " + detail::loss_number(delta));
    }
    detail::validate_loss_weights("dpmlp::Huber", weights, outputs);
  }

  template <class Scalar>
  struct Term {
    LossWeights<Scalar> w;
    Scalar delta = Scalar(1);
    KOKKOS_INLINE_FUNCTION Scalar value(Scalar d, int j) const {
      const Scalar a = d < Scalar(0) ? -d : d;
      return w(j) * (a <= delta ? Scalar(0.5) * a * a : delta * (a - Scalar(0.5) * delta));
    }
    KOKKOS_INLINE_FUNCTION Scalar grad(Scalar d, int j, Scalar scale) const {
      const Scalar g = d > delta ? delta : d < -delta ? -delta : d;
      return scale * (w(j) * g);
    }
  };
  template <class Scalar>
  Term<Scalar> term(const LossWeights<Scalar>& w) const {
    return Term<Scalar>{w, static_cast<Scalar>(delta)};
  }
};

template <class L, class = void>
struct is_loss : std::false_type {};
template <class L>
struct is_loss<L, std::void_t<decltype(L::name()), decltype(std::declval<const L&>().describe()),
                              decltype(std::declval<const L&>().validate(1)),
                              decltype(std::declval<const L&>().output_weights()),
                              decltype(std::declval<const L&>().template term<float>(LossWeights<float>())
                                           .value(1.0f, 0)),
                              decltype(std::declval<const L&>().template term<float>(LossWeights<float>())
                                           .grad(1.0f, 0, 1.0f))>> : std::true_type {};

// The device functor of loss L in Scalar.
template <class L, class Scalar>
using loss_term_t = decltype(std::declval<const L&>().template term<Scalar>(LossWeights<Scalar>()));

}  // namespace dpmlp
