// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/jacobian.hpp: a model's input Jacobians over many rows, on any execution space.
//
//   dpmlp::jacobian(space, model, x, J);      // J(r, j, i) = d output_j / d input_i at row r of x
//   dpmlp::jacobian(space, model, x, y, J);   // and y(r, j) = output_j, as the forward pass gives it
//   dpmlp::scale_jacobian(space, J, output_scale, input_scale);   // J(r, j, i) *= output_scale[j] / input_scale[i]
//
// x is rows x inputs, y rows x outputs, J rows x outputs x inputs (a LayoutRight J keeps each row's Jacobian
// contiguous, outputs x inputs row-major); any layout and any floating-point type works, all in memory the
// space can read. One thread computes one row with the model's Evaluator::jacobian (forward mode, no
// allocation); jacobian() enqueues its kernel on `space` and does not fence.
//
// Standardized data: a model trained on x_std = (x - mean_x) / scale_x to predict y_std = (y - mean_y) /
// scale_y has d y_j / d x_i = scale_y[j] * d y_std_j / d x_std_i / scale_x[i] (the means do not enter):
// scale_jacobian(space, J, y_standardizer.column_scale(), x_standardizer.column_scale()) on the Jacobian of
// the standardized rows.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/mlp.hpp"

namespace dpmlp {

namespace detail {
// Row r of a rows x n View, indexable with (i), as Evaluator takes a row; lighter in a kernel than a subview.
template <class View>
struct MatrixRow {
  View view;
  std::int64_t row;
  KOKKOS_INLINE_FUNCTION typename View::reference_type operator()(int i) const { return view(row, i); }
};
// Row r's outputs x inputs Jacobian of a rows x outputs x inputs View, indexable with (j, i).
template <class View>
struct JacobianRow {
  View view;
  std::int64_t row;
  KOKKOS_INLINE_FUNCTION typename View::reference_type operator()(int j, int i) const { return view(row, j, i); }
};

inline std::string jacobian_shape(std::size_t a, std::size_t b) {
  return std::to_string(a) + " x " + std::to_string(b);
}
inline std::string jacobian_shape(std::size_t a, std::size_t b, std::size_t c) {
  return jacobian_shape(a, b) + " x " + std::to_string(c);
}

template <class ExecSpace, class View>
constexpr bool jacobian_space_reads() {
  return Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible;
}

// One thread a row, with an evaluator whose stack buffers are MaxWidth units wide. Y is NoOutputRow where
// the outputs are not asked for.
template <int MaxWidth, int MaxLayers, int Directions, class ExecSpace, class Scalar, class MemorySpace, class X,
          class Y, class J>
void jacobian_rows(const ExecSpace& space, const Mlp<Scalar, MemorySpace>& model, const X& x, const Y& y,
                   const J& jac) {
  const auto eval = model.template evaluator<MaxWidth, MaxLayers>();
  Kokkos::parallel_for(
      "dpmlp::jacobian", Kokkos::RangePolicy<ExecSpace>(space, 0, static_cast<std::int64_t>(x.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t r) {
        const MatrixRow<X> in{x, r};
        const JacobianRow<J> jr{jac, r};
        // Named here, outside the constexpr-if: CUDA's extended lambdas may not first capture a variable
        // inside one.
        const auto& e = eval;
        const Y& outputs = y;
        if constexpr (std::is_same<Y, NoOutputRow>::value) {
          (void)outputs;
          e.template jacobian<Directions>(in, jr);
        } else {
          e.template jacobian<Directions>(in, MatrixRow<Y>{outputs, r}, jr);
        }
      });
}

// The narrowest of 32, 64, 128 and MaxWidth units that holds the model's widest layer: a row's stack is
// (2 + 2 * Directions) x that many scalars, and on a GPU every resident thread reserves it, so a small model
// should not pay for MaxWidth.
template <int MaxWidth, int MaxLayers, int Directions, class ExecSpace, class Scalar, class MemorySpace, class X,
          class Y, class J>
void jacobian_checked(const ExecSpace& space, const Mlp<Scalar, MemorySpace>& model, const X& x,
                      const Y& y, const J& jac) {
  static_assert(jacobian_space_reads<ExecSpace, Mlp<Scalar, MemorySpace>>(),
                "dpmlp::jacobian: the execution space cannot read the model's memory");
  static_assert(std::is_floating_point<typename J::non_const_value_type>::value &&
                    !std::is_const<typename J::value_type>::value,
                "dpmlp::jacobian: J must be a View of writable floating-point values");
  static_assert(static_cast<int>(X::rank) == 2, "dpmlp::jacobian: x must be a rank-2 View (rows x inputs)");
  static_assert(static_cast<int>(J::rank) == 3, "dpmlp::jacobian: J must be a rank-3 View (rows x outputs x inputs)");
  static_assert(jacobian_space_reads<ExecSpace, X>(), "dpmlp::jacobian: the execution space cannot read x");
  static_assert(jacobian_space_reads<ExecSpace, J>(), "dpmlp::jacobian: the execution space cannot write J");
  const std::size_t rows = x.extent(0), n_in = model.inputs(), n_out = model.outputs();
  const std::string what = "dpmlp::jacobian: ";
  if (x.extent(1) != n_in) {
    throw InputError(what + "x is " + jacobian_shape(x.extent(0), x.extent(1)) + " (rows x inputs), the model takes " +
                     std::to_string(n_in) + " inputs");
  }
  if (jac.extent(0) != rows || jac.extent(1) != n_out || jac.extent(2) != n_in) {
    throw InputError(what + "J is " + jacobian_shape(jac.extent(0), jac.extent(1), jac.extent(2)) +
                     ", it must be rows x outputs x inputs = " + jacobian_shape(rows, n_out, n_in));
  }
  if constexpr (!std::is_same<Y, NoOutputRow>::value) {
    static_assert(static_cast<int>(Y::rank) == 2, "dpmlp::jacobian: y must be a rank-2 View (rows x outputs)");
    static_assert(jacobian_space_reads<ExecSpace, Y>(), "dpmlp::jacobian: the execution space cannot write y");
    static_assert(!std::is_const<typename Y::value_type>::value, "dpmlp::jacobian: y must be writable");
    if (y.extent(0) != rows || y.extent(1) != n_out) {
      throw InputError(what + "y is " + jacobian_shape(y.extent(0), y.extent(1)) +
                       ", it must be rows x outputs = " + jacobian_shape(rows, n_out));
    }
  }
  int widest = 0;
  for (int w : model.widths()) widest = w > widest ? w : widest;
  if (widest > MaxWidth || model.layers() > MaxLayers) {
    throw InputError(what + "a model of " + std::to_string(model.layers()) + " layers and up to " +
                     std::to_string(widest) + " units a layer; this call takes at most " + std::to_string(MaxLayers) +
                     " layers of at most " + std::to_string(MaxWidth) +
                     " units (raise the MaxWidth and MaxLayers template arguments)");
  }
  if constexpr (MaxWidth > 32) {
    if (widest <= 32) return jacobian_rows<32, MaxLayers, Directions>(space, model, x, y, jac);
  }
  if constexpr (MaxWidth > 64) {
    if (widest <= 64) return jacobian_rows<64, MaxLayers, Directions>(space, model, x, y, jac);
  }
  if constexpr (MaxWidth > 128) {
    if (widest <= 128) return jacobian_rows<128, MaxLayers, Directions>(space, model, x, y, jac);
  }
  jacobian_rows<MaxWidth, MaxLayers, Directions>(space, model, x, y, jac);
}
}  // namespace detail

// J(r, j, i) = d output_j / d input_i of `model` at row r of x (rows x inputs): J is rows x outputs x inputs.
// Shapes that do not fit, or a model wider than MaxWidth units or deeper than MaxLayers layers, are an
// InputError (nothing is launched). Directions: input directions a thread carries at once (Evaluator::jacobian).
template <int MaxWidth = 256, int MaxLayers = 8, int Directions = 4, class ExecSpace, class Scalar, class MemorySpace,
          class X, class J>
void jacobian(const ExecSpace& space, const Mlp<Scalar, MemorySpace>& model, const X& x, const J& jac) {
  detail::jacobian_checked<MaxWidth, MaxLayers, Directions>(space, model, x, detail::NoOutputRow{}, jac);
}

// The same, and the outputs y (rows x outputs), computed as the forward pass computes them (Evaluator).
template <int MaxWidth = 256, int MaxLayers = 8, int Directions = 4, class ExecSpace, class Scalar, class MemorySpace,
          class X, class Y, class J>
void jacobian(const ExecSpace& space, const Mlp<Scalar, MemorySpace>& model, const X& x, const Y& y, const J& jac) {
  detail::jacobian_checked<MaxWidth, MaxLayers, Directions>(space, model, x, y, jac);
}

// J(r, j, i) *= output_scale[j] / input_scale[i] (in double), for J rows x outputs x inputs: the Jacobian of
// standardized rows into the data's own units (see the top of this file). An empty vector is all ones. Sizes
// that do not fit J, or a scale that is zero or not finite, are an InputError. Returns when J is scaled.
template <class ExecSpace, class J>
void scale_jacobian(const ExecSpace& space, const J& jac, const std::vector<double>& output_scale,
                    const std::vector<double>& input_scale) {
  static_assert(static_cast<int>(J::rank) == 3, "dpmlp::scale_jacobian: J must be a rank-3 View");
  static_assert(detail::jacobian_space_reads<ExecSpace, J>(), "dpmlp::scale_jacobian: the space cannot write J");
  const std::int64_t rows = jac.extent(0);
  const int n_out = static_cast<int>(jac.extent(1)), n_in = static_cast<int>(jac.extent(2));
  const auto check = [](const std::vector<double>& s, int n, const char* which) {
    if (!s.empty() && static_cast<int>(s.size()) != n) {
      throw InputError(std::string("dpmlp::scale_jacobian: ") + std::to_string(s.size()) + " " + which +
                       " scales for a Jacobian of " + std::to_string(n) + " " + which + "s");
    }
    for (std::size_t k = 0; k < s.size(); ++k) {
      if (!std::isfinite(s[k]) || s[k] == 0) {
        throw InputError(std::string("dpmlp::scale_jacobian: ") + which + " " + std::to_string(k) + "'s scale is " +
                         std::to_string(s[k]) + "; scales must be finite and nonzero");
      }
    }
  };
  check(output_scale, n_out, "output");
  check(input_scale, n_in, "input");
  Kokkos::View<double**, Kokkos::LayoutRight, typename ExecSpace::memory_space> factor("dpmlp::scale_jacobian", n_out,
                                                                                     n_in);
  auto host = Kokkos::create_mirror_view(factor);
  for (int j = 0; j < n_out; ++j) {
    for (int i = 0; i < n_in; ++i) {
      host(j, i) = (output_scale.empty() ? 1.0 : output_scale[j]) / (input_scale.empty() ? 1.0 : input_scale[i]);
    }
  }
  Kokkos::deep_copy(space, factor, host);
  using T = typename J::non_const_value_type;
  const std::int64_t per_row = std::int64_t(n_out) * n_in;
  Kokkos::parallel_for(
      "dpmlp::scale_jacobian", Kokkos::RangePolicy<ExecSpace>(space, 0, rows * per_row),
      KOKKOS_LAMBDA(const std::int64_t k) {
        const std::int64_t r = k / per_row;
        const int j = static_cast<int>(k % per_row / n_in), i = static_cast<int>(k % n_in);
        jac(r, j, i) = static_cast<T>(static_cast<double>(jac(r, j, i)) * factor(j, i));
      });
  // The factors live in this call's View: done before it goes.
  compat::fence(space, "dpmlp::scale_jacobian");
}

}  // namespace dpmlp
