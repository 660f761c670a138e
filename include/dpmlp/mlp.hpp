// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/mlp.hpp: the network. A fully connected MLP, inputs -> hidden layers -> outputs, with its parameters
// in one contiguous buffer (so a gradient is one buffer and one collective), JAX's initialization, and a
// device-callable evaluator for inference (and input Jacobians) inside a user's kernels. How a step computes
// its gradient is the engines' business (engine/), not the model's.
//
// Parameter layout, layer l = 0 .. L-1 with widths w[l] -> w[l+1]:
//   [ W_0 (w0 x w1, row-major: inputs x outputs, as in JAX), b_0 (w1), W_1 (w1 x w2), b_1 (w2), ... ]
// Hidden layers use the model's activation; the last layer is linear (regression).
#pragma once

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/activation.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/random.hpp"

namespace dpmlp {

namespace detail {
// The output row of Evaluator::jacobian(in, jac), which has none.
struct NoOutputRow {};
}  // namespace detail

// A small copyable view of a model for inference inside a user's kernels, on any execution space that can
// read the model's memory: `eval(inputs, outputs)` for one row, where inputs and outputs are anything
// indexable with (i): rank-1 Views or subviews, or a plain pointer wrapped in an unmanaged View. It keeps
// two rows of activations on the stack, so the widest layer may have at most MaxWidth units (checked when
// the evaluator is made) and there may be at most MaxLayers layers. `eval.jacobian(inputs, outputs, jac)`
// also gives the derivatives of the outputs with respect to the inputs (below).
template <class Scalar, int MaxWidth = 256, int MaxLayers = 8>
struct Evaluator {
  const Scalar* params = nullptr;
  int layers = 0;
  int widths[MaxLayers + 1] = {};
  Activation activation = Activation::relu;

  // The outputs and their Jacobian for one row: out(j) as operator() writes it, and jac(j, i) = d out(j) /
  // d in(i), outputs x inputs (jac: anything indexable with (j, i), e.g. a rank-2 View or a row's subview of
  // a rows x outputs x inputs View). Forward mode: the tangents of Directions inputs at a time travel through
  // the layers with the activations, in two stack buffers of MaxWidth x Directions, so a row needs
  // (2 + 2 * Directions) * MaxWidth scalars of stack and no allocation; each group of directions repeats the
  // forward pass, 1 / Directions of the tangents' work. A hidden unit's derivative is the activation's, taken
  // from its output as training's gradient takes it (detail::activate_grad_from_output: relu's is 0 where
  // z <= 0). Every entry is computed by the same operations whatever Directions is: it changes the speed and
  // the stack, not the values.
  template <int Directions = 4, class In, class Out, class Jac>
  KOKKOS_INLINE_FUNCTION void jacobian(const In& in, const Out& out, const Jac& jac) const {
    jacobian_impl<Directions>(in, out, jac);
  }
  // The Jacobian alone.
  template <int Directions = 4, class In, class Jac>
  KOKKOS_INLINE_FUNCTION void jacobian(const In& in, const Jac& jac) const {
    jacobian_impl<Directions>(in, detail::NoOutputRow{}, jac);
  }

  template <class In, class Out>
  KOKKOS_INLINE_FUNCTION void operator()(const In& in, const Out& out) const {
    Scalar buf[2][MaxWidth];
    for (int i = 0; i < widths[0]; ++i) buf[0][i] = static_cast<Scalar>(in(i));
    const Scalar* w = params;
    int cur = 0;
    for (int l = 0; l < layers; ++l) {
      const int n_in = widths[l], n_out = widths[l + 1];
      const Scalar* b = w + n_in * n_out;
      const bool last = l + 1 == layers;
      for (int j = 0; j < n_out; ++j) {
        const Scalar z = pre_activation(buf[cur], w, b, n_in, n_out, j);
        buf[1 - cur][j] = last ? z : detail::activate(activation, z);
      }
      w = b + n_out;
      cur = 1 - cur;
    }
    for (int j = 0; j < widths[layers]; ++j) out(j) = buf[cur][j];
  }

 private:
  // Unit j's input to its activation: the sum over the layer's inputs in increasing order from +0, then the
  // bias. Inference and the Jacobian both take it from here, so their outputs have the same bits.
  KOKKOS_FORCEINLINE_FUNCTION static Scalar pre_activation(const Scalar* in, const Scalar* w, const Scalar* b,
                                                           int n_in, int n_out, int j) {
    Scalar z = Scalar(0);
    for (int i = 0; i < n_in; ++i) z += in[i] * w[i * n_out + j];
    return z + b[j];
  }

  template <int Directions, class In, class Out, class Jac>
  KOKKOS_INLINE_FUNCTION void jacobian_impl(const In& in, const Out& out, const Jac& jac) const {
    static_assert(Directions >= 1, "dpmlp::Evaluator::jacobian: Directions must be at least 1");
    constexpr bool with_output = !std::is_same<Out, detail::NoOutputRow>::value;
    // act[c][i]: unit i's activation; tangent[c][i * Directions + d]: its derivative along input first + d.
    // Both hold the layer's inputs in [cur] and its outputs in [1 - cur]. Directions past the last input (the
    // last group's tail) carry zeros, so every loop over d has the constant bound Directions.
    Scalar act[2][MaxWidth];
    Scalar tangent[2][MaxWidth * Directions];
    const int n_inputs = widths[0];
    for (int first = 0; first < n_inputs; first += Directions) {
      for (int i = 0; i < n_inputs; ++i) act[0][i] = static_cast<Scalar>(in(i));
      const Scalar* w = params;
      int cur = 0;
      for (int l = 0; l < layers; ++l) {
        const int n_in = widths[l], n_out = widths[l + 1];
        const Scalar* b = w + n_in * n_out;
        const bool last = l + 1 == layers;
        for (int j = 0; j < n_out; ++j) {
          // The value as operator() computes it (the same function, so the same bits).
          const Scalar z = pre_activation(act[cur], w, b, n_in, n_out, j);
          Scalar dz[Directions];
          if (l == 0) {
            // The inputs' tangents are the unit vectors: d z_j / d in(first + d) is W_0[first + d][j].
            for (int d = 0; d < Directions; ++d) dz[d] = first + d < n_in ? w[(first + d) * n_out + j] : Scalar(0);
          } else {
            for (int d = 0; d < Directions; ++d) dz[d] = Scalar(0);
            for (int i = 0; i < n_in; ++i) {
              const Scalar wij = w[i * n_out + j];
              for (int d = 0; d < Directions; ++d) dz[d] += tangent[cur][i * Directions + d] * wij;
            }
          }
          if (last) {
            act[1 - cur][j] = z;
            for (int d = 0; d < Directions; ++d) tangent[1 - cur][j * Directions + d] = dz[d];
          } else {
            const Scalar y = detail::activate(activation, z);
            const Scalar g = detail::activate_grad_from_output(activation, y);
            act[1 - cur][j] = y;
            for (int d = 0; d < Directions; ++d) tangent[1 - cur][j * Directions + d] = g * dz[d];
          }
        }
        w = b + n_out;
        cur = 1 - cur;
      }
      const int n_outputs = widths[layers];
      const int count = n_inputs - first < Directions ? n_inputs - first : Directions;
      for (int j = 0; j < n_outputs; ++j) {
        for (int d = 0; d < count; ++d) jac(j, first + d) = tangent[cur][j * Directions + d];
      }
      if constexpr (with_output) {
        if (first == 0) {
          for (int j = 0; j < n_outputs; ++j) out(j) = act[cur][j];
        }
      }
    }
  }
};

template <class Scalar = float, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class Mlp {
  static_assert(std::is_floating_point<Scalar>::value, "dpmlp::Mlp: Scalar must be float or double");

 public:
  using scalar_type = Scalar;
  using memory_space = MemorySpace;
  using params_type = Kokkos::View<Scalar*, MemorySpace>;
  using matrix_type = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using vector_type = Kokkos::View<Scalar*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  // widths = {inputs, hidden..., outputs}; at least {inputs, outputs}. The seed's model is the default.
  explicit Mlp(std::vector<int> widths = {32, 32, 1}, Activation hidden = Activation::relu)
      : widths_(std::move(widths)), activation_(hidden) {
    if (widths_.size() < 2) throw InputError("dpmlp::Mlp: widths needs at least {inputs, outputs}");
    for (std::size_t i = 0; i < widths_.size(); ++i) {
      if (widths_[i] <= 0) {
        throw InputError("dpmlp::Mlp: width " + std::to_string(i) + " is " + std::to_string(widths_[i]) +
                         "; widths must be positive");
      }
    }
    std::size_t off = 0;
    for (int l = 0; l < layers(); ++l) {
      weight_offset_.push_back(off);
      off += std::size_t(widths_[l]) * widths_[l + 1];
      bias_offset_.push_back(off);
      off += widths_[l + 1];
    }
    params_ = params_type("dpmlp::Mlp::params", off);
  }

  int layers() const { return static_cast<int>(widths_.size()) - 1; }
  int inputs() const { return widths_.front(); }
  int outputs() const { return widths_.back(); }
  const std::vector<int>& widths() const { return widths_; }
  Activation activation() const { return activation_; }
  std::size_t num_params() const { return params_.extent(0); }
  std::size_t weight_offset(int l) const { return weight_offset_.at(l); }
  std::size_t bias_offset(int l) const { return bias_offset_.at(l); }

  // All parameters, contiguous. Copies of an Mlp share them (Kokkos View semantics); clone() does not.
  params_type params() const { return params_; }
  matrix_type weight(int l) const {
    return matrix_type(params_.data() + weight_offset(l), widths_[l], widths_[l + 1]);
  }
  vector_type bias(int l) const { return vector_type(params_.data() + bias_offset(l), widths_[l + 1]); }

  // Device-callable inference for one row (see Evaluator). It reads the parameters in place: it sees
  // training's updates, and must not outlive the model's parameter buffer.
  template <int MaxWidth = 256, int MaxLayers = 8>
  Evaluator<Scalar, MaxWidth, MaxLayers> evaluator() const {
    Evaluator<Scalar, MaxWidth, MaxLayers> e;
    if (layers() > MaxLayers) {
      throw InputError("dpmlp::Mlp::evaluator: " + std::to_string(layers()) + " layers, at most " +
                       std::to_string(MaxLayers) + " (raise MaxLayers)");
    }
    for (int w : widths_) {
      if (w > MaxWidth) {
        throw InputError("dpmlp::Mlp::evaluator: a layer of " + std::to_string(w) + " units, at most " +
                         std::to_string(MaxWidth) + " (raise MaxWidth)");
      }
    }
    e.params = params_.data();
    e.layers = layers();
    for (int i = 0; i <= layers(); ++i) e.widths[i] = widths_[i];
    e.activation = activation_;
    return e;
  }

  Mlp clone() const {
    Mlp copy(widths_, activation_);
    Kokkos::deep_copy(copy.params_, params_);
    return copy;
  }

  // JAX's initialization in the seed: keys = split(key, layers); W_l = normal(keys[l], (w_l, w_{l+1})) * scale;
  // biases zero. For the seed's 2 layers, split(key, 2) is jax.random.split(key).
  template <class ExecSpace = typename MemorySpace::execution_space>
  void init_jax(random::Key key, Scalar scale = Scalar(0.1), const ExecSpace& space = ExecSpace()) {
    const auto keys = random::split(key, layers());
    Kokkos::deep_copy(space, params_, Scalar(0));
    for (int l = 0; l < layers(); ++l) {
      auto w = Kokkos::subview(params_, std::make_pair(weight_offset(l), bias_offset(l)));
      random::normal(space, keys[l], w, 0);
      const Scalar s = scale;
      Kokkos::parallel_for(
          "dpmlp::Mlp::init_scale", Kokkos::RangePolicy<ExecSpace>(space, 0, w.extent(0)),
          KOKKOS_LAMBDA(const std::int64_t i) { w(i) = w(i) * s; });
    }
    compat::fence(space, "dpmlp::Mlp::init_jax");
  }

 private:
  std::vector<int> widths_;
  Activation activation_;
  std::vector<std::size_t> weight_offset_, bias_offset_;
  params_type params_;
};

}  // namespace dpmlp
