// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/activation.hpp: the hidden layers' activations, device-callable.
#pragma once

#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {

enum class Activation { relu, tanh, identity };

inline const char* activation_name(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::tanh: return "tanh";
    case Activation::identity: return "identity";
  }
  return "?";
}

namespace detail {
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar activate(Activation a, Scalar z) {
  if (a == Activation::relu) return z > Scalar(0) ? z : Scalar(0);
  if (a == Activation::tanh) return compat::tanh(z);
  return z;
}
// The derivative, written in terms of the activation's output (all three allow it), so the backward pass
// needs only the stored activations.
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar activate_grad_from_output(Activation a, Scalar y) {
  if (a == Activation::relu) return y > Scalar(0) ? Scalar(1) : Scalar(0);
  if (a == Activation::tanh) return Scalar(1) - y * y;
  return Scalar(1);
}
}  // namespace detail

}  // namespace dpmlp
