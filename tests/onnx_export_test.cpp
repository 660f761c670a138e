// SPDX-License-Identifier: BSD-3-Clause
// dpmlp::save_onnx (dpmlp/onnx.hpp, the dpmlp::onnx component).
//
// [onnx]: what save_onnx refuses (bad paths, unfitted or mismatched Standardizers, values that float32 cannot
// hold) and that a refusal leaves no file behind; that a second save replaces the first.
// [.][onnxruntime-write] (hidden; run by tests/check_onnx_runtime.cmake, ctest onnx_runtime): writes models
// of several depths, activations, output counts and standardizations as ONNX files into $DPMLP_ONNX_DIR,
// with 1,000 raw input rows and dpmlp's predictions for them as .npy files and a manifest, for
// tests/check_onnx_runtime.py to run through onnxruntime.
#include <catch2/catch.hpp>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <dpmlp/dpmlp.hpp>
#include <dpmlp/npy.hpp>
#include <dpmlp/onnx.hpp>

#include "check_util.hpp"

namespace onnx_test {

using Host = Kokkos::HostSpace;
using HostExec = Kokkos::DefaultHostExecutionSpace;

// A fresh directory under $TMPDIR (or /tmp), removed with the files in it at the end of the scope.
struct TempDir {
  std::string path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && base[0] ? base : "/tmp") + "/dpmlp_onnx_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    path = buf.data();
  }
  ~TempDir() {
    for (const std::string& f : files()) std::remove((path + "/" + f).c_str());
    ::rmdir(path.c_str());
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") out.push_back(name);
      }
      ::closedir(d);
    }
    return out;
  }
};

long long file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
}

// Parameters drawn on the host: weights ~ N(0, 1.5^2 / fan_in) (large enough that tanh and relu layers do not
// stay in their linear or dead parts), biases ~ U(-0.5, 0.5) (non-zero, unlike init_jax's, so a bias that
// went to the wrong place shows).
template <class Scalar>
void fill(dpmlp::Mlp<Scalar, Host>& m, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(-0.5, 0.5);
  const auto p = m.params();
  for (int l = 0; l < m.layers(); ++l) {
    const double s = 1.5 / std::sqrt(static_cast<double>(m.widths()[l]));
    for (std::size_t i = m.weight_offset(l); i < m.bias_offset(l); ++i) p(i) = static_cast<Scalar>(s * normal(gen));
    for (int j = 0; j < m.widths()[l + 1]; ++j) p(m.bias_offset(l) + j) = static_cast<Scalar>(uniform(gen));
  }
}

}  // namespace onnx_test

using namespace onnx_test;
using dpmlp::Activation;
using dpmlp_test::refusal;

TEST_CASE("onnx: bad paths are refused, and a refusal leaves no file", "[onnx]") {
  TempDir dir;
  dpmlp::Mlp<float, Host> m({3, 4, 1});
  fill(m, 1);
  std::string e = refusal([&] { dpmlp::save_onnx(m, ""); });
  CHECK(e.find("the path is empty") != std::string::npos);
  e = refusal([&] { dpmlp::save_onnx(m, dir.path); });
  CHECK(e.find(dir.path + " is a directory") != std::string::npos);
  e = refusal([&] { dpmlp::save_onnx(m, dir / "missing/model.onnx"); });
  INFO(e);
  CHECK(e.find(dir / "missing/model.onnx") != std::string::npos);
  CHECK(e.find("No such file or directory") != std::string::npos);
  CHECK(dir.files().empty());
}

TEST_CASE("onnx: Standardizers that do not fit the model are refused", "[onnx]") {
  TempDir dir;
  const std::string path = dir / "m.onnx";
  dpmlp::Mlp<float, Host> m({4, 8, 2}, Activation::tanh);
  fill(m, 2);
  dpmlp::Standardizer unfitted, three, two;
  three.set_columns({0, 1, 2}, {1, 1, 1});
  two.set_columns({5, 6}, {2, 3});
  std::string e = refusal([&] { dpmlp::save_onnx(m, &unfitted, nullptr, path); });
  CHECK(e.find("the input (x) Standardizer has not been fitted") != std::string::npos);
  e = refusal([&] { dpmlp::save_onnx(m, &three, nullptr, path); });
  CHECK(e.find("the input (x) Standardizer has 3 columns; the model has 4") != std::string::npos);
  e = refusal([&] { dpmlp::save_onnx(m, nullptr, &three, path); });
  CHECK(e.find("the output (y) Standardizer has 3 columns; the model has 2") != std::string::npos);
  e = refusal([&] { dpmlp::save_onnx(m, nullptr, &unfitted, path); });
  CHECK(e.find("the output (y) Standardizer has not been fitted") != std::string::npos);
  CHECK(dir.files().empty());
  // The same output Standardizer is accepted on the side whose width it has.
  CHECK(refusal([&] { dpmlp::save_onnx(m, nullptr, &two, path); }).empty());
  CHECK(file_size(path) > 0);
}

TEST_CASE("onnx: values that float32 cannot hold are refused, naming them", "[onnx]") {
  TempDir dir;
  const std::string path = dir / "m.onnx";
  SECTION("a double model's weight past float's range") {
    dpmlp::Mlp<double, Host> m({2, 3, 1});
    fill(m, 3);
    m.params()(m.weight_offset(1) + 2) = 1e39;
    const std::string e = refusal([&] { dpmlp::save_onnx(m, path); });
    INFO(e);
    CHECK(e.find("layer 1's weight [2] is 1e+39: not finite in float32") != std::string::npos);
  }
  SECTION("a NaN bias") {
    dpmlp::Mlp<float, Host> m({2, 3, 1});
    fill(m, 4);
    m.params()(m.bias_offset(0) + 1) = std::numeric_limits<float>::quiet_NaN();
    const std::string e = refusal([&] { dpmlp::save_onnx(m, path); });
    INFO(e);
    CHECK(e.find("layer 0's bias [1] is nan: not finite") != std::string::npos);
  }
  SECTION("a mean past float's range, a scale that rounds to zero") {
    dpmlp::Mlp<float, Host> m({2, 3, 1});
    fill(m, 5);
    dpmlp::Standardizer big, tiny;
    big.set_columns({0, 1e300}, {1, 1});
    tiny.set_columns({0}, {1e-50});
    std::string e = refusal([&] { dpmlp::save_onnx(m, &big, nullptr, path); });
    INFO(e);
    CHECK(e.find("the input standardization's mean [1] is 1e+300: not finite") != std::string::npos);
    e = refusal([&] { dpmlp::save_onnx(m, nullptr, &tiny, path); });
    INFO(e);
    CHECK(e.find("the output standardization's scale [0] is 1e-50: a scale must be positive") != std::string::npos);
  }
  CHECK(dir.files().empty());
}

TEST_CASE("onnx: a second save replaces the first, through a temporary that does not stay", "[onnx]") {
  TempDir dir;
  const std::string path = dir / "m.onnx";
  dpmlp::Mlp<float, Host> small({2, 1}), large({2, 64, 64, 1});
  fill(small, 6);
  fill(large, 7);
  dpmlp::save_onnx(large, path);
  const long long large_size = file_size(path);
  dpmlp::save_onnx(small, path);
  const long long small_size = file_size(path);
  INFO("large " << large_size << " bytes, small " << small_size);
  CHECK(large_size > 4 * (2 * 64 + 64 * 64));
  CHECK(small_size > 0);
  CHECK(small_size < large_size);
  CHECK(dir.files() == std::vector<std::string>{"m.onnx"});
}

// ---- the onnxruntime half (hidden; run by tests/check_onnx_runtime.cmake)

namespace onnx_test {

struct Case {
  std::string name;
  std::vector<int> widths;
  Activation activation;
  bool x_standardizer, y_standardizer;
};

// Writes <name>.onnx, <name>_x.npy (rows x inputs raw rows, float32) and <name>_y.npy (rows x outputs, dpmlp's
// predictions in float64: the model's evaluator on the standardized rows, un-standardized in double as
// examples/train_csv does), and the case's manifest line.
template <class Scalar>
void write_case(const std::string& dir, std::ofstream& manifest, const Case& c, unsigned seed) {
  const std::int64_t rows = 1000;
  dpmlp::Mlp<Scalar, Host> m(c.widths, c.activation);
  fill(m, seed);
  const int in = m.inputs(), out = m.outputs();
  // Raw rows: column k centred at 100 (k + 1) (alternating sign) with spread 3 (k + 1), rounded to float so
  // that the float32 graph input holds them exactly.
  std::mt19937_64 gen(seed + 1000);
  std::normal_distribution<double> normal(0.0, 1.0);
  Kokkos::View<double**, Kokkos::LayoutRight, Host> raw("raw", rows, in);
  std::vector<float> x_file(static_cast<std::size_t>(rows * in));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int k = 0; k < in; ++k) {
      const double centre = c.x_standardizer ? (k % 2 ? -100.0 : 100.0) * (k + 1) : 0.0;
      const float v = static_cast<float>(centre + 3.0 * (k + 1) * normal(gen));
      raw(r, k) = v;
      x_file[static_cast<std::size_t>(r * in + k)] = v;
    }
  }
  dpmlp::Standardizer sx, sy;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Host> xs("xs", rows, in);
  if (c.x_standardizer) {
    sx.fit_columns(HostExec(), raw);
    sx.transform_columns(HostExec(), raw, xs);
  } else {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int k = 0; k < in; ++k) xs(r, k) = static_cast<Scalar>(raw(r, k));
    }
  }
  std::vector<double> mean(out), scale(out);
  for (int j = 0; j < out; ++j) {
    mean[j] = j % 2 ? -250.0 * (j + 1) : 40.0 * (j + 1);
    scale[j] = 0.5 + 20.0 * j;
  }
  sy.set_columns(mean, scale);
  if (c.y_standardizer || c.x_standardizer) {
    dpmlp::save_onnx(m, c.x_standardizer ? &sx : nullptr, c.y_standardizer ? &sy : nullptr, dir + "/" + c.name + ".onnx");
  } else {
    dpmlp::save_onnx(m, dir + "/" + c.name + ".onnx");
  }
  const auto eval = m.evaluator();
  std::vector<double> y_file(static_cast<std::size_t>(rows * out));
  Kokkos::View<Scalar*, Host> o("o", out);
  for (std::int64_t r = 0; r < rows; ++r) {
    eval(Kokkos::subview(xs, r, Kokkos::ALL), o);
    for (int j = 0; j < out; ++j) {
      const double v = static_cast<double>(o(j));
      y_file[static_cast<std::size_t>(r * out + j)] = c.y_standardizer ? v * scale[j] + mean[j] : v;
    }
  }
  dpmlp::save_npy(dir + "/" + c.name + "_x.npy", x_file, {std::size_t(rows), std::size_t(in)});
  dpmlp::save_npy(dir + "/" + c.name + "_y.npy", y_file, {std::size_t(rows), std::size_t(out)});
  manifest << c.name << ' ' << in << ' ' << out << ' ' << m.layers() << ' ' << dpmlp::activation_name(c.activation)
           << ' ' << (c.x_standardizer ? 1 : 0) << ' ' << (c.y_standardizer ? 1 : 0) << ' '
           << (sizeof(Scalar) == 4 ? "float" : "double") << '\n';
}

}  // namespace onnx_test

TEST_CASE("onnx: write models, rows and dpmlp's predictions for onnxruntime", "[.][onnxruntime-write]") {
  const char* d = std::getenv("DPMLP_ONNX_DIR");
  REQUIRE(d != nullptr);
  const std::string dir = d;
  std::ofstream manifest(dir + "/manifest.txt");
  manifest << "# name inputs outputs layers activation x_standardized y_standardized model_scalar\n";
  const std::vector<Case> float_cases = {
      {"linear_plain", {5, 1}, Activation::relu, false, false},
      {"relu_1hidden_plain", {5, 16, 1}, Activation::relu, false, false},
      {"relu_1hidden_std", {6, 32, 1}, Activation::relu, true, true},
      {"tanh_2hidden_std_4out", {3, 32, 32, 4}, Activation::tanh, true, true},
      {"relu_3hidden_xstd_3out", {8, 64, 32, 16, 3}, Activation::relu, true, false},
      {"tanh_1hidden_ystd_2out", {4, 24, 2}, Activation::tanh, false, true},
      {"identity_2hidden_std_2out", {4, 8, 8, 2}, Activation::identity, true, true},
      {"relu_6hidden_std", {10, 48, 48, 48, 48, 48, 48, 1}, Activation::relu, true, true},
  };
  unsigned seed = 11;
  for (const Case& c : float_cases) write_case<float>(dir, manifest, c, seed++);
  write_case<double>(dir, manifest, {"double_tanh_2hidden_std", {7, 24, 24, 1}, Activation::tanh, true, true}, seed++);
  manifest.close();
  REQUIRE(manifest.good());
}
