// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/onnx.hpp: a trained model as a standard ONNX file, for inference outside dpmlp (onnxruntime,
// TensorRT, OpenVINO, a browser, ...). Link dpmlp::onnx (CMake: find_package(dpmlp COMPONENTS onnx), or the
// target dpmlp::onnx of a build that found ONNX and protobuf); the rest of dpmlp does not need it.
//
//   dpmlp::save_onnx(model, "model.onnx");                 // the network alone
//   dpmlp::save_onnx(model, &sx, &sy, "model.onnx");       // with the column standardization of x and y
//
// The graph (ONNX IR version 7, opset 13, float32):
//   input  "x": [N, inputs], N a dynamic batch dimension ("N"); raw rows, as they were before sx
//   (x - x_mean) / x_scale                     Sub, Div        when an input Standardizer is given
//   h = x @ W_l + b_l, then the activation     Gemm, Relu|Tanh for each hidden layer (identity: no node)
//   out = h @ W_last + b_last                  Gemm
//   out * y_scale + y_mean                     Mul, Add        when an output Standardizer is given
//   output "y": [N, outputs], in the target's own units
// The standardization is explicit nodes, not folded into the first and last layers: folding turns
// (x - mean) / scale into x @ (W / scale) + (b - mean / scale @ W), whose float32 bias loses the digits of a
// column whose mean is large against its spread. W_l is stored as dpmlp holds it, (in, out): Gemm with
// transB = 0.
//
// Values are stored in float32 whatever the model's Scalar: a double model's parameters and every mean and
// scale are rounded to float. A value that is not finite in float32 (a parameter or mean past 3.4e38, a NaN
// from a diverged run) or a scale that rounds to zero is an InputError naming it; so is a Standardizer
// that has not been fitted or whose column count is not the model's inputs (sx) or outputs (sy).
//
// The file is written to `path.tmp.<pid>` and renamed over `path` (a reader never sees half a file); an
// empty path, a directory, a missing parent directory or a failed write is an InputError naming the path.
// Host-side and not collective, like save_npy_model: in an MPI program rank 0 saves (the parameters are the
// same on every rank), inside dpmlp::all_or_none where every rank must learn of a failure.
#pragma once

#include <string>
#include <vector>

#include "dpmlp/activation.hpp"
#include "dpmlp/detail/onnx_graph.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/mlp.hpp"
#include "dpmlp/standardizer.hpp"

namespace dpmlp {

namespace detail {
namespace onnx_export {

// Copies a fitted Standardizer's statistics into mean/scale, after checking it has `columns` columns.
inline void take_standardizer(const Standardizer& s, int columns, const char* which, const std::string& path,
                              std::vector<double>& mean, std::vector<double>& scale) {
  const std::string who = "dpmlp::save_onnx: " + path + ": the " + which + " Standardizer";
  if (s.column_mean().empty()) {
    throw InputError(who + " has not been fitted (fit_columns or set_columns); pass nullptr for none");
  }
  if (static_cast<long long>(s.column_mean().size()) != columns) {
    throw InputError(who + " has " + std::to_string(s.column_mean().size()) + " columns; the model has " +
                     std::to_string(columns));
  }
  mean = s.column_mean();
  scale = s.column_scale();
}

}  // namespace onnx_export
}  // namespace detail

// Writes `model` as an ONNX file at `path`, with `x` (the inputs' column standardization) and `y` (the
// outputs') as graph nodes where given (nullptr: none on that side), so the file maps raw rows to
// predictions in the target's units. The model may live in any memory space: its parameters are copied to
// the host once.
template <class Scalar, class MemorySpace>
void save_onnx(const Mlp<Scalar, MemorySpace>& model, const Standardizer* x, const Standardizer* y,
               const std::string& path) {
  detail::onnx_export::Graph g;
  g.widths = model.widths();
  g.activation = activation_name(model.activation());
  if (x) {
    g.has_x = true;
    detail::onnx_export::take_standardizer(*x, model.inputs(), "input (x)", path, g.x_mean, g.x_scale);
  }
  if (y) {
    g.has_y = true;
    detail::onnx_export::take_standardizer(*y, model.outputs(), "output (y)", path, g.y_mean, g.y_scale);
  }
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  g.params.assign(host.data(), host.data() + host.extent(0));
  detail::onnx_export::write(g, path);
}

// The network alone: "x" is the model's own input (already standardized, if it was trained so), "y" its
// own output.
template <class Scalar, class MemorySpace>
void save_onnx(const Mlp<Scalar, MemorySpace>& model, const std::string& path) {
  save_onnx(model, nullptr, nullptr, path);
}

}  // namespace dpmlp
