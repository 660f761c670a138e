// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/eigen_interop.hpp: an Mlp's parameters as Eigen matrices.
//
//   // Host models: views, no copy (writing through them changes the model).
//   auto W0 = dpmlp::eigen::weight(model, 0);   // Eigen::Map of a row-major (inputs x outputs) matrix
//   auto b0 = dpmlp::eigen::bias(model, 0);     // Eigen::Map of a row vector (1 x outputs)
//   // Any model (device models go through a host copy):
//   dpmlp::eigen::Params<float> p = dpmlp::eigen::export_params(model);  // p.weights[l], p.biases[l]
//   dpmlp::eigen::load_params(model, p.weights, p.biases);               // shapes checked (InputError)
//   auto m = dpmlp::eigen::make_mlp<float, Kokkos::HostSpace>(p.weights, p.biases);   // widths from shapes
//   Eigen::MatrixXf out = dpmlp::eigen::predict(model, x);                // host forward pass, rows x outputs
//
// Shapes follow the parameter layout (mlp.hpp): layer l's weight is widths[l] x widths[l+1] (inputs x
// outputs, as in JAX: out = in * W + b) and its bias has widths[l+1] values. Exported weights are plain
// (column-major) Eigen::Matrix<Scalar, Dynamic, Dynamic>, i.e. Eigen::MatrixXf for float; biases are row
// vectors (Eigen::RowVectorXf). load_params accepts any Eigen dense matrices of the right sizes, and biases
// as row or column vectors.
#pragma once

#include <Eigen/Core>

#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/mlp.hpp"

namespace dpmlp {
namespace eigen {

template <class Scalar>
using RowMajorMatrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;
template <class Scalar>
using RowVector = Eigen::Matrix<Scalar, 1, Eigen::Dynamic>;

template <class Scalar>
struct Params {
  std::vector<Matrix<Scalar>> weights;   // weights[l]: widths[l] x widths[l+1]
  std::vector<RowVector<Scalar>> biases;  // biases[l]: 1 x widths[l+1]
};

namespace detail {
template <class MemorySpace>
constexpr bool host_accessible() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;
}

inline void check_layer(int l, int layers, const char* what) {
  if (l < 0 || l >= layers) {
    throw InputError(std::string("dpmlp::eigen::") + what + ": layer " + std::to_string(l) + " of a model with " +
                     std::to_string(layers) + " layers");
  }
}

inline std::string shape(Eigen::Index r, Eigen::Index c) { return std::to_string(r) + "x" + std::to_string(c); }
}  // namespace detail

// Layer l's weight matrix, in place (row-major, inputs x outputs). Host-accessible models only.
template <class Scalar, class MemorySpace>
Eigen::Map<RowMajorMatrix<Scalar>> weight(const Mlp<Scalar, MemorySpace>& model, int l) {
  static_assert(detail::host_accessible<MemorySpace>(),
                "dpmlp::eigen::weight: the model's memory is not host-accessible; use export_params()");
  detail::check_layer(l, model.layers(), "weight");
  return Eigen::Map<RowMajorMatrix<Scalar>>(model.params().data() + model.weight_offset(l), model.widths()[l],
                                            model.widths()[l + 1]);
}

// Layer l's bias, in place (a row vector of outputs). Host-accessible models only.
template <class Scalar, class MemorySpace>
Eigen::Map<RowVector<Scalar>> bias(const Mlp<Scalar, MemorySpace>& model, int l) {
  static_assert(detail::host_accessible<MemorySpace>(),
                "dpmlp::eigen::bias: the model's memory is not host-accessible; use export_params()");
  detail::check_layer(l, model.layers(), "bias");
  return Eigen::Map<RowVector<Scalar>>(model.params().data() + model.bias_offset(l), model.widths()[l + 1]);
}

// All parameters as host Eigen matrices (copies). Works for any memory space.
template <class Scalar, class MemorySpace>
Params<Scalar> export_params(const Mlp<Scalar, MemorySpace>& model) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  Params<Scalar> p;
  for (int l = 0; l < model.layers(); ++l) {
    const int n_in = model.widths()[l], n_out = model.widths()[l + 1];
    p.weights.push_back(
        Eigen::Map<const RowMajorMatrix<Scalar>>(host.data() + model.weight_offset(l), n_in, n_out));
    p.biases.push_back(Eigen::Map<const RowVector<Scalar>>(host.data() + model.bias_offset(l), n_out));
  }
  return p;
}

// Checks that weights/biases fit `widths`; returns "" or what is wrong.
template <class W, class B>
std::string check_shapes(const std::vector<int>& widths, const std::vector<W>& weights, const std::vector<B>& biases) {
  const std::size_t layers = widths.size() - 1;
  if (weights.size() != layers || biases.size() != layers) {
    return "dpmlp::eigen: " + std::to_string(weights.size()) + " weight matrices and " +
           std::to_string(biases.size()) + " biases for a model of " + std::to_string(layers) + " layers";
  }
  for (std::size_t l = 0; l < layers; ++l) {
    const Eigen::Index n_in = widths[l], n_out = widths[l + 1];
    if (weights[l].rows() != n_in || weights[l].cols() != n_out) {
      return "dpmlp::eigen: weight " + std::to_string(l) + " is " + detail::shape(weights[l].rows(), weights[l].cols()) +
             ", the model's layer " + std::to_string(l) + " needs " + detail::shape(n_in, n_out) +
             " (inputs x outputs)";
    }
    const bool vector_shape = biases[l].rows() == 1 || biases[l].cols() == 1;
    if (!vector_shape || biases[l].size() != n_out) {
      return "dpmlp::eigen: bias " + std::to_string(l) + " is " + detail::shape(biases[l].rows(), biases[l].cols()) +
             ", the model's layer " + std::to_string(l) + " needs a vector of " + std::to_string(n_out);
    }
  }
  return {};
}

// Copies weights and biases into the model's parameters (any memory space). InputError, with the model
// unchanged, when a shape does not fit.
template <class Scalar, class MemorySpace, class W, class B>
void load_params(const Mlp<Scalar, MemorySpace>& model, const std::vector<W>& weights, const std::vector<B>& biases) {
  const std::string problem = check_shapes(model.widths(), weights, biases);
  if (!problem.empty()) throw InputError(problem);
  Kokkos::View<Scalar*, Kokkos::HostSpace> host("dpmlp::eigen::load_params", model.num_params());
  for (int l = 0; l < model.layers(); ++l) {
    Eigen::Map<RowMajorMatrix<Scalar>>(host.data() + model.weight_offset(l), model.widths()[l],
                                       model.widths()[l + 1]) = weights[l].template cast<Scalar>();
    Eigen::Map<RowVector<Scalar>> b(host.data() + model.bias_offset(l), model.widths()[l + 1]);
    for (Eigen::Index j = 0; j < b.size(); ++j) b(j) = static_cast<Scalar>(biases[l](j));
  }
  Kokkos::deep_copy(model.params(), host);
}

// A new model whose widths are read from the weights' shapes, holding these parameters.
template <class Scalar, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space, class W, class B>
Mlp<Scalar, MemorySpace> make_mlp(const std::vector<W>& weights, const std::vector<B>& biases,
                                  Activation hidden = Activation::relu) {
  if (weights.empty()) throw InputError("dpmlp::eigen::make_mlp: no weight matrices");
  std::vector<int> widths{static_cast<int>(weights[0].rows())};
  for (std::size_t l = 0; l < weights.size(); ++l) {
    if (l > 0 && weights[l].rows() != weights[l - 1].cols()) {
      throw InputError("dpmlp::eigen::make_mlp: weight " + std::to_string(l) + " is " +
                       detail::shape(weights[l].rows(), weights[l].cols()) + " but weight " + std::to_string(l - 1) +
                       " has " + std::to_string(weights[l - 1].cols()) + " outputs");
    }
    widths.push_back(static_cast<int>(weights[l].cols()));
  }
  Mlp<Scalar, MemorySpace> model(widths, hidden);  // checks the widths are positive
  load_params(model, weights, biases);
  return model;
}

// The model's outputs for the rows of x (rows x inputs), computed on the host with Eigen in Scalar
// precision: rows x outputs. Works for any memory space (through a host copy of the parameters).
template <class Scalar, class MemorySpace, class Derived>
Matrix<Scalar> predict(const Mlp<Scalar, MemorySpace>& model, const Eigen::MatrixBase<Derived>& x) {
  if (x.cols() != model.inputs()) {
    throw InputError("dpmlp::eigen::predict: x has " + std::to_string(x.cols()) + " columns, the model " +
                     std::to_string(model.inputs()) + " inputs");
  }
  const Params<Scalar> p = export_params(model);
  Matrix<Scalar> a = x.template cast<Scalar>();
  for (int l = 0; l < model.layers(); ++l) {
    Matrix<Scalar> z = a * p.weights[l];
    z.rowwise() += p.biases[l];
    if (l + 1 < model.layers()) {
      const Activation act = model.activation();
      z = z.unaryExpr([act](Scalar v) { return dpmlp::detail::activate(act, v); });
    }
    a = std::move(z);
  }
  return a;
}

}  // namespace eigen
}  // namespace dpmlp
