// SPDX-License-Identifier: BSD-3-Clause
// The tests' fp64 MLP in dpmlp's parameter layout (per layer W (n_in x n_out) row-major, then b): the forward
// pass and back-propagation from an output delta, in Eigen. test_mlp (the mean squared error) and test_loss
// (every loss) build their reference gradients on it.
#pragma once

#include <dpmlp/activation.hpp>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dpmlp_test {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

inline double act_f(dpmlp::Activation act, double z) {
  return act == dpmlp::Activation::relu ? std::max(z, 0.0) : act == dpmlp::Activation::tanh ? std::tanh(z) : z;
}
inline double act_df(dpmlp::Activation act, double a) {  // from the activation's output
  return act == dpmlp::Activation::relu ? (a > 0 ? 1.0 : 0.0) : act == dpmlp::Activation::tanh ? 1 - a * a : 1.0;
}

struct Net {
  std::vector<MatD> W;
  std::vector<Eigen::RowVectorXd> b;
};
inline Net unpack(const std::vector<int>& widths, const std::vector<double>& p) {
  Net n;
  std::size_t off = 0;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    n.W.push_back(Eigen::Map<const MatD>(p.data() + off, widths[l], widths[l + 1]));
    off += std::size_t(widths[l]) * widths[l + 1];
    n.b.push_back(Eigen::Map<const Eigen::RowVectorXd>(p.data() + off, widths[l + 1]));
    off += widths[l + 1];
  }
  return n;
}

// The activations of every layer (A[0] = x, A[L] = the predictions; the last layer is linear).
inline std::vector<MatD> forward(const Net& n, dpmlp::Activation act, const MatD& x) {
  const std::size_t L = n.W.size();
  std::vector<MatD> A(L + 1);
  A[0] = x;
  for (std::size_t l = 0; l < L; ++l) {
    MatD z = (A[l] * n.W[l]).rowwise() + n.b[l];
    A[l + 1] = l + 1 == L ? z : MatD(z.unaryExpr([&](double v) { return act_f(act, v); }));
  }
  return A;
}

// The gradient of the loss whose derivative by the predictions is `delta` (rows x outputs), in the parameter
// layout, into grad (resized to the parameter count).
inline void backprop(const std::vector<int>& widths, const Net& n, dpmlp::Activation act, const std::vector<MatD>& A,
                     MatD delta, std::vector<double>& grad) {
  const int L = static_cast<int>(n.W.size());
  std::size_t count = 0;
  for (int l = 0; l < L; ++l) count += std::size_t(widths[l]) * widths[l + 1] + widths[l + 1];
  grad.assign(count, 0.0);
  for (int l = L - 1; l >= 0; --l) {
    std::size_t woff = 0;
    for (int k = 0; k < l; ++k) woff += std::size_t(widths[k]) * widths[k + 1] + widths[k + 1];
    Eigen::Map<MatD>(grad.data() + woff, widths[l], widths[l + 1]) = A[l].transpose() * delta;
    Eigen::Map<Eigen::RowVectorXd>(grad.data() + woff + std::size_t(widths[l]) * widths[l + 1], widths[l + 1]) =
        delta.colwise().sum();
    if (l > 0) {
      delta = ((delta * n.W[l].transpose()).array() * A[l].unaryExpr([&](double a) { return act_df(act, a); }).array())
                  .matrix();
    }
  }
}

}  // namespace dpmlp_test
