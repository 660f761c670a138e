// SPDX-License-Identifier: BSD-3-Clause
// Eigen interop (eigen_interop.hpp): in-place maps of a host model's parameters, export and load with shape
// checks, a model made from Eigen matrices, and Eigen's forward pass against the model's own evaluator.
#include <catch2/catch.hpp>

#include <dpmlp/dpmlp.hpp>
#include <dpmlp/eigen_interop.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "check_util.hpp"

namespace {
using HostModel = dpmlp::Mlp<float, Kokkos::HostSpace>;

std::string refusal_of_load(const HostModel& m, const std::vector<Eigen::MatrixXf>& w,
                            const std::vector<Eigen::MatrixXf>& b) {
  try {
    dpmlp::eigen::load_params(m, w, b);
  } catch (const dpmlp::InputError& e) {
    return e.what();
  }
  return {};
}
}  // namespace

TEST_CASE("eigen: weight and bias maps are the parameters, in place", "[eigen]") {
  HostModel model({3, 4, 2});
  model.init_jax(dpmlp::random::PRNGKey(2), 0.5f);
  Kokkos::deep_copy(model.bias(0), 0.25f);
  for (int l = 0; l < model.layers(); ++l) {
    auto W = dpmlp::eigen::weight(model, l);
    auto b = dpmlp::eigen::bias(model, l);
    const auto Wk = model.weight(l);
    REQUIRE(W.rows() == model.widths()[l]);
    REQUIRE(W.cols() == model.widths()[l + 1]);
    REQUIRE(b.size() == model.widths()[l + 1]);
    for (int i = 0; i < W.rows(); ++i)
      for (int j = 0; j < W.cols(); ++j) CHECK(W(i, j) == Wk(i, j));
    for (int j = 0; j < b.size(); ++j) CHECK(b(j) == model.bias(l)(j));
  }
  CHECK(dpmlp::eigen::bias(model, 0)(3) == 0.25f);
  // Writing through a map changes the model (row-major: W(i, j) is params[offset + i * outputs + j]).
  dpmlp::eigen::weight(model, 1)(2, 1) = 7.0f;
  CHECK(model.params()(model.weight_offset(1) + 2 * 2 + 1) == 7.0f);
  dpmlp::eigen::bias(model, 1)(0) = -3.0f;
  CHECK(model.params()(model.bias_offset(1)) == -3.0f);
  CHECK_THROWS_AS(dpmlp::eigen::weight(model, 2), dpmlp::InputError);
  CHECK_THROWS_AS(dpmlp::eigen::bias(model, -1), dpmlp::InputError);
}

TEST_CASE("eigen: export then load gives the same bits; make_mlp reads the widths", "[eigen]") {
  // The default memory space: a device model in a GPU build (export/load go through the host).
  using Memory = Kokkos::DefaultExecutionSpace::memory_space;
  dpmlp::Mlp<float, Memory> model({5, 7, 6, 1}, dpmlp::Activation::tanh);
  model.init_jax(dpmlp::random::PRNGKey(3), 0.3f);
  const auto p = dpmlp::eigen::export_params(model);
  REQUIRE(p.weights.size() == 3);
  REQUIRE(p.biases.size() == 3);
  CHECK(p.weights[0].rows() == 5);
  CHECK(p.weights[0].cols() == 7);
  CHECK(p.weights[2].cols() == 1);
  CHECK(p.biases[1].cols() == 6);

  dpmlp::Mlp<float, Memory> other({5, 7, 6, 1}, dpmlp::Activation::tanh);
  dpmlp::eigen::load_params(other, p.weights, p.biases);
  auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), other.params());
  for (std::size_t i = 0; i < a.extent(0); ++i) CHECK(a(i) == b(i));

  const auto made = dpmlp::eigen::make_mlp<float, Memory>(p.weights, p.biases, dpmlp::Activation::tanh);
  CHECK(made.widths() == std::vector<int>{5, 7, 6, 1});
  auto c = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), made.params());
  for (std::size_t i = 0; i < a.extent(0); ++i) CHECK(a(i) == c(i));
}

TEST_CASE("eigen: loading from column vectors, double matrices, and by hand", "[eigen]") {
  HostModel model({2, 3, 1});
  std::vector<Eigen::MatrixXd> w{Eigen::MatrixXd(2, 3), Eigen::MatrixXd(3, 1)};
  w[0] << 1, 2, 3, 4, 5, 6;
  w[1] << 7, 8, 9;
  std::vector<Eigen::VectorXd> b{Eigen::VectorXd(3), Eigen::VectorXd(1)};
  b[0] << 0.5, 0.25, 0.125;
  b[1] << -1;
  dpmlp::eigen::load_params(model, w, b);
  const std::vector<float> want{1, 2, 3, 4, 5, 6, 0.5f, 0.25f, 0.125f, 7, 8, 9, -1};
  REQUIRE(model.num_params() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(model.params()(i) == want[i]);
}

TEST_CASE("eigen: shape checks name the layer and both shapes, and leave the model unchanged", "[eigen]") {
  HostModel model({3, 4, 2});
  Kokkos::deep_copy(model.params(), 1.5f);
  const std::vector<Eigen::MatrixXf> good_w{Eigen::MatrixXf::Zero(3, 4), Eigen::MatrixXf::Zero(4, 2)};
  const std::vector<Eigen::MatrixXf> good_b{Eigen::MatrixXf::Zero(1, 4), Eigen::MatrixXf::Zero(2, 1)};
  CHECK(refusal_of_load(model, good_w, good_b).empty());
  Kokkos::deep_copy(model.params(), 1.5f);

  CHECK(refusal_of_load(model, {good_w[0]}, good_b) ==
        "dpmlp::eigen: 1 weight matrices and 2 biases for a model of 2 layers");
  CHECK(refusal_of_load(model, {Eigen::MatrixXf::Zero(4, 3), good_w[1]}, good_b) ==
        "dpmlp::eigen: weight 0 is 4x3, the model's layer 0 needs 3x4 (inputs x outputs)");
  CHECK(refusal_of_load(model, good_w, {good_b[0], Eigen::MatrixXf::Zero(1, 3)}) ==
        "dpmlp::eigen: bias 1 is 1x3, the model's layer 1 needs a vector of 2");
  CHECK(refusal_of_load(model, good_w, {Eigen::MatrixXf::Zero(2, 2), good_b[1]}) ==
        "dpmlp::eigen: bias 0 is 2x2, the model's layer 0 needs a vector of 4");
  for (std::size_t i = 0; i < model.num_params(); ++i) CHECK(model.params()(i) == 1.5f);

  // make_mlp: consecutive weights must chain.
  CHECK_THROWS_AS(dpmlp::eigen::make_mlp<float>(std::vector<Eigen::MatrixXf>{Eigen::MatrixXf::Zero(3, 4),
                                                                             Eigen::MatrixXf::Zero(5, 2)},
                                                good_b),
                  dpmlp::InputError);
  CHECK_THROWS_AS(dpmlp::eigen::make_mlp<float>(std::vector<Eigen::MatrixXf>{}, good_b), dpmlp::InputError);
}

TEST_CASE("eigen: predict agrees with the model's evaluator", "[eigen]") {
  for (auto act : {dpmlp::Activation::relu, dpmlp::Activation::tanh, dpmlp::Activation::identity}) {
    HostModel model({6, 9, 5, 2}, act);
    model.init_jax(dpmlp::random::PRNGKey(11), 0.5f);
    Kokkos::deep_copy(model.bias(0), 0.1f);
    const int rows = 40;
    Eigen::MatrixXf x(rows, 6);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 6; ++c) x(r, c) = dpmlp::random::normal(dpmlp::random::PRNGKey(5), r * 6 + c);
    const Eigen::MatrixXf got = dpmlp::eigen::predict(model, x);
    REQUIRE(got.rows() == rows);
    REQUIRE(got.cols() == 2);
    const auto eval = model.evaluator();
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
      Kokkos::View<float*, Kokkos::HostSpace> in("in", 6), out("out", 2);
      for (int c = 0; c < 6; ++c) in(c) = x(r, c);
      eval(in, out);
      for (int j = 0; j < 2; ++j) worst = dpmlp_test::nan_max(worst, double(std::fabs(out(j) - got(r, j))));
    }
    INFO(dpmlp::activation_name(act));
    CHECK(worst < 1e-5);
  }
  HostModel model({3, 1});
  CHECK_THROWS_AS(dpmlp::eigen::predict(model, Eigen::MatrixXf::Zero(2, 4)), dpmlp::InputError);
}
