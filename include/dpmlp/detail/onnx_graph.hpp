// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/detail/onnx_graph.hpp: what dpmlp::save_onnx (dpmlp/onnx.hpp) hands to the compiled part of
// dpmlp::onnx (src/onnx.cpp): a model and its standardization as plain host data. Kept free of Kokkos and
// of ONNX's headers, so that the library is compiled against protobuf alone and the header-only part against
// Kokkos alone.
#pragma once

#include <string>
#include <vector>

namespace dpmlp {
namespace detail {
namespace onnx_export {

struct Graph {
  std::vector<int> widths;   // {inputs, hidden..., outputs}
  std::string activation;    // the hidden layers': "relu", "tanh" or "identity" (activation_name())
  std::vector<double> params;  // the Mlp's parameter layout: W_0 (w0 x w1, row-major), b_0, W_1, b_1, ...
  // The input and output column standardization, each either absent or one mean and one scale per column:
  // the graph computes (x - x_mean) / x_scale before the first layer and out * y_scale + y_mean after the
  // last.
  bool has_x = false, has_y = false;
  std::vector<double> x_mean, x_scale, y_mean, y_scale;
};

// The ONNX model's bytes (a serialized ModelProto). Every value must be finite in float32 (and every scale
// positive); otherwise an InputError naming it. Checked with ONNX's own checker before it is returned.
std::string serialize(const Graph& graph);

// serialize(graph), written to `path` through `path.tmp.<pid>` and a rename (a reader never sees half a
// file). InputError for an empty path, a directory, or a file that cannot be written.
void write(const Graph& graph, const std::string& path);

}  // namespace onnx_export
}  // namespace detail
}  // namespace dpmlp
