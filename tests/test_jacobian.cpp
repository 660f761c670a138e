// SPDX-License-Identifier: BSD-3-Clause
// Input Jacobians (jacobian.hpp, Evaluator::jacobian) on the default execution space (the GPU in a CUDA build):
// against an fp64 chain rule computed here on the host with Eigen, against central finite differences of the
// model's own forward pass, against themselves (the outputs, the direction grouping, a user's kernel), the
// standardizer's chain rule (scale_jacobian), and the shape refusals.
#include <catch2/catch.hpp>

#include <dpmlp/dpmlp.hpp>
#include <dpmlp/eigen_interop.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "check_util.hpp"

// Named (not anonymous) namespace: CUDA's extended lambdas below live in these functions.
namespace jacobian_test {
using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;
template <class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Memory>;
template <class T>
using Cube = Kokkos::View<T***, Kokkos::LayoutRight, Memory>;

const std::vector<std::vector<int>> shapes = {
    {3, 1},                     // one linear layer
    {1, 12, 4},                 // one input
    {5, 16, 1},                 // one output
    {19, 24, 5},                // inputs not a multiple of the direction group
    {4, 32, 32, 16},            // 16 outputs
    {3, 8, 8, 8, 8, 8, 2},      // six layers
    {7, 250, 3},                // near MaxWidth (256)
    {256, 40, 2},               // as many inputs as MaxWidth
};
const dpmlp::Activation activations[] = {dpmlp::Activation::relu, dpmlp::Activation::tanh,
                                         dpmlp::Activation::identity};

int widest(const std::vector<int>& w) { return *std::max_element(w.begin(), w.end()); }
int total(const std::vector<int>& w) { return std::accumulate(w.begin(), w.end(), 0); }
int rows_for(const std::vector<int>& w) { return widest(w) >= 128 ? 12 : 48; }

template <class Scalar>
dpmlp::Mlp<Scalar, Memory> model_for(const std::vector<int>& widths, dpmlp::Activation act, int seed) {
  dpmlp::Mlp<Scalar, Memory> model(widths, act);
  // Weights ~ N(0, (1.5 / sqrt(widest))^2): pre-activations of order one, tanh not saturated.
  model.init_jax(dpmlp::random::PRNGKey(seed), static_cast<Scalar>(1.5 / std::sqrt(double(widest(widths)))));
  // Nonzero biases, so that they are exercised too (init_jax leaves them zero).
  auto params = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  for (int l = 0; l < model.layers(); ++l) {
    for (int j = 0; j < widths[l + 1]; ++j) params(model.bias_offset(l) + j) = Scalar(0.1) * Scalar((j % 7) - 3);
  }
  Kokkos::deep_copy(model.params(), params);
  return model;
}

// rows x inputs, uniform in [-1, 1] (std::mt19937: independent of the library's generator).
template <class Scalar>
Matrix<Scalar> inputs_for(int rows, int n, unsigned seed) {
  Matrix<Scalar> x("x", rows, n);
  auto h = Kokkos::create_mirror_view(x);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n; ++i) h(r, i) = static_cast<Scalar>(u(gen));
  Kokkos::deep_copy(x, h);
  return x;
}

// ---- the fp64 reference: the chain rule on the host, with Eigen. Layer l: z = W_l^T a + b_l, a' = act(z)
// (the last layer linear); G = d a / d x goes to W_l^T G, then each row times act'(z), act' from z itself
// (relu: 1 where z > 0, else 0; tanh: 1 - tanh(z)^2). Abs is the same product of absolute values, |W|^T and
// |act'|: the scale of the rounding errors (below).
struct Reference {
  std::vector<Eigen::MatrixXd> w;  // inputs x outputs, as the model
  std::vector<Eigen::VectorXd> b;
  dpmlp::Activation act;

  template <class Scalar>
  explicit Reference(const dpmlp::Mlp<Scalar, Memory>& model) : act(model.activation()) {
    const auto p = dpmlp::eigen::export_params(model);
    for (int l = 0; l < model.layers(); ++l) {
      w.push_back(p.weights[l].template cast<double>());
      b.push_back(p.biases[l].template cast<double>().transpose());
    }
  }

  struct Row {
    Eigen::VectorXd y;
    Eigen::MatrixXd jac, abs;
    double min_hidden_z = std::numeric_limits<double>::infinity();  // smallest |z| of a hidden unit
    std::vector<bool> positive;                                      // every hidden z > 0
  };

  Row operator()(const Eigen::VectorXd& x) const {
    Row out;
    const int n0 = static_cast<int>(x.size());
    Eigen::VectorXd a = x;
    Eigen::MatrixXd g = Eigen::MatrixXd::Identity(n0, n0), abs = g;
    for (std::size_t l = 0; l < w.size(); ++l) {
      const Eigen::VectorXd z = w[l].transpose() * a + b[l];
      Eigen::MatrixXd dz = w[l].transpose() * g;
      Eigen::MatrixXd dabs = w[l].cwiseAbs().transpose() * abs;
      a = z;
      if (l + 1 < w.size()) {
        for (int k = 0; k < z.size(); ++k) {
          double d = 1.0;
          if (act == dpmlp::Activation::relu) {
            a(k) = z(k) > 0 ? z(k) : 0.0;
            d = z(k) > 0 ? 1.0 : 0.0;
          } else if (act == dpmlp::Activation::tanh) {
            a(k) = std::tanh(z(k));
            d = 1.0 - a(k) * a(k);
          }
          dz.row(k) *= d;
          dabs.row(k) *= std::fabs(d);
          out.min_hidden_z = std::min(out.min_hidden_z, std::fabs(z(k)));
          out.positive.push_back(z(k) > 0);
        }
      }
      g = dz;
      abs = dabs;
    }
    out.y = a;
    out.jac = g;
    out.abs = abs;
    return out;
  }
};

template <class T>
Eigen::VectorXd row_of(const typename Matrix<T>::HostMirror& x, int r) {
  Eigen::VectorXd v(x.extent(1));
  for (int i = 0; i < v.size(); ++i) v(i) = static_cast<double>(x(r, i));
  return v;
}

// ---- central finite differences of the model's own forward pass (Evaluator::operator()), on the device:
// fd(r, j, i) = (f_j(x + h e_i) - f_j(x - h e_i)) / ((x_i + h) - (x_i - h)).
template <class T>
struct LocalRow {
  T* p;
  KOKKOS_INLINE_FUNCTION T& operator()(int i) const { return p[i]; }
};

Cube<double> finite_differences(const dpmlp::Mlp<double, Memory>& model, const Matrix<double>& x, double h) {
  const int rows = x.extent(0), n_in = model.inputs(), n_out = model.outputs();
  Cube<double> fd("fd", rows, n_out, n_in);
  const auto eval = model.evaluator();
  Kokkos::parallel_for(
      "fd", Kokkos::RangePolicy<Space>(0, rows), KOKKOS_LAMBDA(const int r) {
        double xs[256], yp[256], ym[256];
        for (int i = 0; i < n_in; ++i) xs[i] = x(r, i);
        for (int i = 0; i < n_in; ++i) {
          const double xp = x(r, i) + h, xm = x(r, i) - h;
          xs[i] = xp;
          eval(LocalRow<double>{xs}, LocalRow<double>{yp});
          xs[i] = xm;
          eval(LocalRow<double>{xs}, LocalRow<double>{ym});
          xs[i] = x(r, i);
          for (int j = 0; j < n_out; ++j) fd(r, j, i) = (yp[j] - ym[j]) / (xp - xm);
        }
      });
  return fd;
}

// The library's Jacobian and outputs, on the host.
template <class Scalar>
struct Computed {
  typename Cube<Scalar>::HostMirror jac;
  typename Matrix<Scalar>::HostMirror y;
};
template <class Scalar>
Computed<Scalar> computed(const dpmlp::Mlp<Scalar, Memory>& model, const Matrix<Scalar>& x) {
  Cube<Scalar> jac("J", x.extent(0), model.outputs(), model.inputs());
  Matrix<Scalar> y("y", x.extent(0), model.outputs());
  dpmlp::jacobian(Space(), model, x, y, jac);
  return {Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), jac),
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y)};
}

std::string describe(const std::vector<int>& widths, dpmlp::Activation act) {
  std::string s;
  for (int w : widths) s += (s.empty() ? "" : "-") + std::to_string(w);
  return s + " " + dpmlp::activation_name(act);
}

// The fp64 reference against the library in Scalar, for one model. Rounding: each layer's tangent is a dot
// product of n_in terms, off by at most about n_in u (|W|^T |T|) (u: Scalar's unit roundoff), and the
// activation derivatives (|act'| <= 1) carry it on; over the layers the errors add up to about
// sum(widths) u times the absolute product `abs`. A tanh derivative from a rounded activation adds errors of
// the same order (|x| <= 1, so every activation is of order one). The check allows 8 times that, per row,
// relative to the row's largest abs entry. A row with a relu pre-activation within `kink` of zero is skipped:
// there a rounding may legitimately flip the unit (derivative 0 or 1). Such rows are rare (1 of 12 rows of the
// 250-unit relu model in float, none elsewhere, on the CPU); at most a quarter may be skipped.
template <class Scalar>
void check_against_reference(const std::vector<int>& widths, dpmlp::Activation act, double& worst_ratio) {
  const auto model = model_for<Scalar>(widths, act, 11);
  const int rows = rows_for(widths);
  const auto x = inputs_for<Scalar>(rows, widths.front(), 5);
  const auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  const auto got = computed(model, x);
  const Reference ref(model);
  const double u = std::numeric_limits<Scalar>::epsilon() / 2;
  const double kink = std::is_same<Scalar, float>::value ? 1e-4 : 1e-10;
  int skipped = 0;
  double worst_j = 0, worst_y = 0;
  for (int r = 0; r < rows; ++r) {
    const auto want = ref(row_of<Scalar>(hx, r));
    if (act == dpmlp::Activation::relu && want.min_hidden_z < kink) {
      ++skipped;
      continue;
    }
    const double scale = std::max(1.0, want.abs.cwiseAbs().maxCoeff());
    const double bound = 8 * u * total(widths) * scale;
    for (int j = 0; j < widths.back(); ++j) {
      worst_y = dpmlp_test::nan_max(worst_y, std::fabs(double(got.y(r, j)) - want.y(j)) / bound);
      for (int i = 0; i < widths.front(); ++i) {
        worst_j = dpmlp_test::nan_max(worst_j, std::fabs(double(got.jac(r, j, i)) - want.jac(j, i)) / bound);
      }
    }
  }
  INFO(describe(widths, act) << (sizeof(Scalar) == 4 ? " float" : " double") << ": largest |J - J_ref| is "
                             << worst_j << " of the bound, |y - y_ref| " << worst_y << "; " << skipped << " of "
                             << rows << " rows skipped (relu kink)");
  CHECK(worst_j <= 1.0);
  CHECK(worst_y <= 1.0);
  CHECK(skipped <= rows / 4);
  worst_ratio = dpmlp_test::nan_max(worst_ratio, worst_j);
}
}  // namespace jacobian_test

using namespace jacobian_test;

TEST_CASE("jacobian: fp64 models against the fp64 chain rule", "[jacobian]") {
  double worst = 0;
  for (auto act : activations)
    for (const auto& widths : shapes) check_against_reference<double>(widths, act, worst);
  WARN("double: largest |J - J_ref| over all models: " << worst << " of the bound (8 sum(widths) u |W|-products)");
}

TEST_CASE("jacobian: fp32 models against the fp64 chain rule", "[jacobian]") {
  double worst = 0;
  for (auto act : activations)
    for (const auto& widths : shapes) check_against_reference<float>(widths, act, worst);
  WARN("float: largest |J - J_ref| over all models: " << worst << " of the bound (8 sum(widths) u |W|-products)");
}

// Central differences with h = 2^-17: truncation h^2 / 6 |f'''| (about 1e-11 |f'''|), rounding at most about
// sum(widths) u |f| / h (under 1e-8 |f| here). The check allows 1e-7 relative to the row's largest
// |W|-product; an activation derivative left out is off by order one, one off by 0.1% fails too. relu is
// piecewise linear, so its differences are exact up to rounding, except where a unit switches within
// [x - h, x + h]: those entries are skipped (found with the reference, which gives every hidden unit's sign).
TEST_CASE("jacobian: fp64 models against central finite differences", "[jacobian]") {
  const double h = std::ldexp(1.0, -17);
  double worst_all = 0;
  for (auto act : activations) {
    for (const auto& widths : shapes) {
      const auto model = model_for<double>(widths, act, 23);
      const int rows = rows_for(widths), n_in = widths.front(), n_out = widths.back();
      const auto x = inputs_for<double>(rows, n_in, 7);
      const auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
      const auto got = computed(model, x);
      const auto fd = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), finite_differences(model, x, h));
      const Reference ref(model);
      double worst = 0;
      int skipped = 0;
      for (int r = 0; r < rows; ++r) {
        const Eigen::VectorXd xr = row_of<double>(hx, r);
        const auto at = ref(xr);
        const double tol = 1e-7 * std::max(1.0, at.abs.cwiseAbs().maxCoeff());
        for (int i = 0; i < n_in; ++i) {
          if (act == dpmlp::Activation::relu) {
            Eigen::VectorXd xp = xr, xm = xr;
            xp(i) += h;
            xm(i) -= h;
            if (ref(xp).positive != at.positive || ref(xm).positive != at.positive) {
              ++skipped;
              continue;
            }
          }
          for (int j = 0; j < n_out; ++j) {
            worst = dpmlp_test::nan_max(worst, std::fabs(got.jac(r, j, i) - fd(r, j, i)) / tol);
          }
        }
      }
      INFO(describe(widths, act) << ": largest |J - FD| is " << worst << " of the tolerance; " << skipped << " of "
                                 << rows * n_in << " columns skipped (relu switches within h)");
      CHECK(worst <= 1.0);
      CHECK(skipped <= rows * n_in / 10);
      worst_all = dpmlp_test::nan_max(worst_all, worst);
    }
  }
  WARN("largest |J - FD| over all models: " << worst_all << " of the tolerance (1e-7 |W|-products)");
}

TEST_CASE("jacobian: the outputs are the evaluator's, the grouping of directions changes nothing", "[jacobian]") {
  for (auto act : activations) {
    for (const auto& widths :
         {std::vector<int>{19, 24, 5}, std::vector<int>{4, 32, 32, 16}, std::vector<int>{7, 250, 3}}) {
      const auto model = model_for<float>(widths, act, 3);
      const int rows = 20, n_in = widths.front(), n_out = widths.back();
      const auto x = inputs_for<float>(rows, n_in, 9);
      const auto got = computed(model, x);
      // The forward pass alone, and the Jacobian without outputs, with other groupings of directions and the
      // default evaluator's 256-unit buffers (the batched call uses the narrowest that fits), in a user kernel.
      Matrix<float> y("y", rows, n_out);
      Cube<float> j1("J1", rows, n_out, n_in), j3("J3", rows, n_out, n_in), j8("J8", rows, n_out, n_in),
          j_alone("J_alone", rows, n_out, n_in);
      const auto eval = model.evaluator();
      Kokkos::parallel_for(
          "user_kernel", Kokkos::RangePolicy<Space>(0, rows), KOKKOS_LAMBDA(const int r) {
            const auto xr = Kokkos::subview(x, r, Kokkos::ALL);
            eval(xr, Kokkos::subview(y, r, Kokkos::ALL));
            eval.jacobian<1>(xr, Kokkos::subview(j1, r, Kokkos::ALL, Kokkos::ALL));
            eval.jacobian<3>(xr, Kokkos::subview(j3, r, Kokkos::ALL, Kokkos::ALL));
          });
      dpmlp::jacobian<256, 8, 8>(Space(), model, x, j8);
      dpmlp::jacobian(Space(), model, x, j_alone);
      const auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
      double y_diff = 0, j_diff = 0;
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < n_out; ++j) y_diff = dpmlp_test::nan_max(y_diff, std::fabs(hy(r, j) - got.y(r, j)));
      for (const auto& other : {j1, j3, j8, j_alone}) {
        const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), other);
        for (int r = 0; r < rows; ++r)
          for (int j = 0; j < n_out; ++j)
            for (int i = 0; i < n_in; ++i)
              j_diff = dpmlp_test::nan_max(j_diff, std::fabs(h(r, j, i) - got.jac(r, j, i)));
      }
      INFO(describe(widths, act));
      CHECK(y_diff == 0);
      CHECK(j_diff == 0);
    }
  }
}

// A model of standardized data, in the data's units: g(x) = mean_y + scale_y * f((x - mean_x) / scale_x), so
// dg_j / dx_i = scale_y[j] J_ji / scale_x[i]; checked against the reference's chain rule through the two
// affine maps written out (central differences of g on the host, in double).
TEST_CASE("scale_jacobian: the Jacobian of standardized rows in the data's units", "[jacobian]") {
  const std::vector<int> widths{3, 16, 2};
  const auto model = model_for<double>(widths, dpmlp::Activation::tanh, 31);
  dpmlp::Standardizer sx, sy;
  sx.set_columns({10.0, -2.0, 0.5}, {4.0, 0.25, 3.0});
  sy.set_columns({100.0, 1.0}, {50.0, 0.01});
  const int rows = 16;
  const auto x_std = inputs_for<double>(rows, 3, 13);
  Cube<double> jac("J", rows, 2, 3);
  dpmlp::jacobian(Space(), model, x_std, jac);
  dpmlp::scale_jacobian(Space(), jac, sy.column_scale(), sx.column_scale());
  const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), jac);
  const auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x_std);
  const Reference ref(model);
  const auto g = [&](const Eigen::VectorXd& x_raw) {
    Eigen::VectorXd s(3);
    for (int i = 0; i < 3; ++i) s(i) = (x_raw(i) - sx.column_mean()[i]) / sx.column_scale()[i];
    Eigen::VectorXd y = ref(s).y;
    for (int j = 0; j < 2; ++j) y(j) = sy.column_mean()[j] + sy.column_scale()[j] * y(j);
    return y;
  };
  double worst = 0;
  for (int r = 0; r < rows; ++r) {
    Eigen::VectorXd x_raw(3);
    for (int i = 0; i < 3; ++i) x_raw(i) = sx.column_mean()[i] + sx.column_scale()[i] * hx(r, i);
    for (int i = 0; i < 3; ++i) {
      const double h = 1e-5 * sx.column_scale()[i];
      Eigen::VectorXd xp = x_raw, xm = x_raw;
      xp(i) += h;
      xm(i) -= h;
      const Eigen::VectorXd fd = (g(xp) - g(xm)) / (xp(i) - xm(i));
      for (int j = 0; j < 2; ++j) {
        // Relative, as the entries span 50 / 0.25 = 200 to 0.01 / 4 times the model's own; near-zero entries
        // relative to a thousandth of their column's factor.
        const double want = fd(j);
        const double near_zero = 1e-3 * sy.column_scale()[j] / sx.column_scale()[i];
        worst = dpmlp_test::nan_max(worst, std::fabs(got(r, j, i) - want) / (std::fabs(want) + near_zero));
      }
    }
  }
  WARN("scale_jacobian: largest relative difference from the raw-unit differences: " << worst);
  CHECK(worst < 1e-6);
  // Empty scales are ones: J unchanged.
  Cube<double> again("J", rows, 2, 3);
  dpmlp::jacobian(Space(), model, x_std, again);
  auto before = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), again);
  dpmlp::scale_jacobian(Space(), again, {}, {});
  auto after = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), again);
  bool same = true;
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < 3; ++i) same = same && before(r, j, i) == after(r, j, i);
  CHECK(same);
}

TEST_CASE("jacobian: shapes that do not fit are refused", "[jacobian]") {
  const auto model = model_for<float>({4, 8, 2}, dpmlp::Activation::tanh, 1);
  Matrix<float> x("x", 5, 4), x3("x3", 5, 3), y("y", 5, 2), y_rows("y", 4, 2), y_cols("y", 5, 3);
  Cube<float> jac("J", 5, 2, 4);
  using dpmlp_test::refusal;
  CHECK(refusal([&] { dpmlp::jacobian(Space(), model, x, jac); }).empty());
  CHECK(refusal([&] { dpmlp::jacobian(Space(), model, x, y, jac); }).empty());
  CHECK(refusal([&] { dpmlp::jacobian(Space(), model, x3, jac); }) ==
        "dpmlp::jacobian: x is 5 x 3 (rows x inputs), the model takes 4 inputs");
  CHECK(refusal([&] { dpmlp::jacobian(Space(), model, x, Cube<float>("J", 4, 2, 4)); }) ==
        "dpmlp::jacobian: J is 4 x 2 x 4, it must be rows x outputs x inputs = 5 x 2 x 4");
  CHECK(refusal([&] { dpmlp::jacobian(Space(), model, x, Cube<float>("J", 5, 4, 2)); }) ==
        "dpmlp::jacobian: J is 5 x 4 x 2, it must be rows x outputs x inputs = 5 x 2 x 4");
  CHECK(refusal([&] { dpmlp::jacobian(Space(), model, x, Cube<float>("J", 5, 2, 3)); }) != "");
  CHECK(refusal([&] { dpmlp::jacobian(Space(), model, x, y_rows, jac); }) ==
        "dpmlp::jacobian: y is 4 x 2, it must be rows x outputs = 5 x 2");
  CHECK(refusal([&] { dpmlp::jacobian(Space(), model, x, y_cols, jac); }) != "");
  // Wider or deeper than the call's buffers.
  const auto wide = model_for<float>({4, 40, 2}, dpmlp::Activation::tanh, 1);
  const std::string too_wide = refusal([&] { dpmlp::jacobian<32>(Space(), wide, x, jac); });
  CHECK(too_wide.find("at most 8 layers of at most 32 units") != std::string::npos);
  CHECK(refusal([&] { dpmlp::jacobian<64>(Space(), wide, x, jac); }).empty());
  const auto deep = model_for<float>({4, 3, 3, 3, 2}, dpmlp::Activation::tanh, 1);
  CHECK(refusal([&] { dpmlp::jacobian<256, 3>(Space(), deep, x, jac); }) != "");
  // scale_jacobian: sizes and scales.
  CHECK(refusal([&] { dpmlp::scale_jacobian(Space(), jac, {1.0, 2.0, 3.0}, {}); }) ==
        "dpmlp::scale_jacobian: 3 output scales for a Jacobian of 2 outputs");
  CHECK(refusal([&] { dpmlp::scale_jacobian(Space(), jac, {}, {1.0, 2.0}); }) ==
        "dpmlp::scale_jacobian: 2 input scales for a Jacobian of 4 inputs");
  CHECK(refusal([&] { dpmlp::scale_jacobian(Space(), jac, {1.0, 0.0}, {}); }).find("output 1's scale") !=
        std::string::npos);
}
