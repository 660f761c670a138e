// SPDX-License-Identifier: BSD-3-Clause
// split_bench: times the layered engine's rows x weights GEMMs over split operands (linalg::split_gemm, on
// Hopper's kernels where the build has them) against the GEMMs the engine runs otherwise (the cutlass
// backend, which splits in registers), on the two shapes of a hidden layer of a deep model:
//   forward  Y = relu(A W + b), A rows x k, W k x n      (N N, the bias-and-activation epilogue)
//   delta    D' = (D W^T) * relu'(Y), D rows x k, W n x k (N T, the activation-gradient epilogue)
// Variants: "unsplit" (the space's default GEMM backend: cutlass on CUDA, eigen on a CPU, with the engine's
// element-wise kernel where it has no fused epilogue, which is not timed here), "split" (the split GEMM writing C and C_lo, the engine's use),
// "split_no_lo" (C only), "split_tile64" and "split_tile128" (the Hopper kernels' two tile shapes forced),
// "split_weights" (B' from W, once a step), and "lo_pass" (a pass computing C_lo from C: what an unsplit
// GEMM's output costs a split GEMM after it).
// Prints one JSON line a shape and variant: the median time of `repeats` samples, each `inner` back-to-back
// calls between fences, and the check that the split result agrees with the unsplit one (within 1e-5 of the
// largest |C|). Meant for GPUs; on a CPU build the split GEMM is its one-thread-an-element portable form.
//
//   split_bench [OPTION]...      (split_bench --help lists the options)
#include <dpmlp/dpmlp.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../examples/cli.hpp"

namespace split_bench {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;
namespace la = dpmlp::linalg;

struct Options {
  std::vector<std::int64_t> rows;  // empty: 1048576 and 4096
  int width = 256, repeats = 10, warmup = 2;
};

cli::Parser command_line(Options& o) {
  cli::Parser p("split_bench", "[OPTION]...",
                "Time the layered engine's forward and delta GEMMs over split operands (linalg::split_gemm) "
                "against the unsplit ones (cutlass on CUDA), and print one JSON line a shape and variant.");
  p.custom("--rows", "M", "1048576 and 4096", "rows of the GEMM (repeat the option for more)",
           [&o](const cli::Args& a, int& i) { o.rows.push_back(std::stoll(a.value(i))); });
  p.value("--width", "W", o.width, "the layer's width: n = k = W, a multiple of 32");
  p.value("--repeats", "R", o.repeats, "timed samples a variant (the median is reported)");
  p.value("--warmup", "W", o.warmup, "untimed samples before them");
  p.example("split_bench", "a 256-wide hidden layer at 1M and at 4096 rows");
  p.note("Exit status: 0 every check passed, 1 a check failed, 2 bad input or a runtime error.");
  return p;
}

Kokkos::View<float*, Memory> normal_view(const char* label, std::int64_t count, std::uint32_t seed, float scale) {
  Kokkos::View<float*, Memory> v(std::string(label), static_cast<std::size_t>(count));
  dpmlp::random::normal(Space(), dpmlp::random::PRNGKey(seed), v, 0);
  if (scale != 1.0f) {
    Kokkos::parallel_for(
        "scale", Kokkos::RangePolicy<Space>(0, count), KOKKOS_LAMBDA(const std::int64_t i) { v(i) *= scale; });
  }
  return v;
}

double median_us(const std::function<void()>& call, int inner, const Options& o) {
  Space space;
  for (int i = 0; i < o.warmup; ++i) call();
  space.fence();
  std::vector<double> us;
  for (int r = 0; r < o.repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) call();
    space.fence();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / inner);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

double max_abs(const Kokkos::View<float*, Memory>& v) {
  double m = 0;
  Kokkos::parallel_reduce(
      "max_abs", Kokkos::RangePolicy<Space>(0, v.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, double& acc) { acc = std::max(acc, double(std::fabs(v(i)))); },
      Kokkos::Max<double>(m));
  return m;
}

double max_abs_diff(const Kokkos::View<float*, Memory>& a, const Kokkos::View<float*, Memory>& b) {
  double m = 0;
  Kokkos::parallel_reduce(
      "max_abs_diff", Kokkos::RangePolicy<Space>(0, a.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, double& acc) { acc = std::max(acc, double(std::fabs(a(i) - b(i)))); },
      Kokkos::Max<double>(m));
  return m;
}

bool run_shape(std::int64_t rows, bool delta, const Options& o) {
  const int m = static_cast<int>(rows), n = o.width, k = o.width;
  const auto a = normal_view("a", rows * k, 1, 1.0f);
  const auto w = normal_view("w", std::int64_t(k) * n, 2, 1.0f / std::sqrt(float(k)));
  const auto bias = normal_view("bias", n, 3, 0.1f);
  const auto y = normal_view("y", rows * n, 4, 1.0f);  // relu'(Y): about half the elements pass
  Kokkos::View<float*, Memory> a_lo("a_lo", a.extent(0)), bp("b_split", std::size_t(3) * k * n);
  Kokkos::View<float*, Memory> c("c", std::size_t(rows) * n), c_lo("c_lo", c.extent(0)), ref("ref", c.extent(0));
  Kokkos::parallel_for(
      "a_lo", Kokkos::RangePolicy<Space>(0, a.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) { a_lo(i) = la::tf32_lo(a(i)); });
  la::SplitWeights sw;
  sw.w = w.data(), sw.k = k, sw.n = n, sw.transposed = delta, sw.b_split = bp.data();
  const auto split_weights = [&] {
    Kokkos::parallel_for("split_weights", Kokkos::RangePolicy<Space>(0, sw.size()), sw);
  };
  split_weights();
  la::SplitGemm g;
  g.m = m, g.n = n, g.k = k, g.a = a.data(), g.a_lo = a_lo.data(), g.lda = k, g.b_split = bp.data();
  g.c = c.data(), g.c_lo = c_lo.data(), g.ldc = n;
  g.epilogue = delta ? la::SplitEpilogue::activation_grad : la::SplitEpilogue::bias_activation;
  g.src = delta ? y.data() : bias.data(), g.src_ld = delta ? n : 0, g.act = dpmlp::Activation::relu;
  la::BatchedGemm<float> u;
  u.op_b = delta ? la::Op::T : la::Op::N;
  u.m = m, u.n = n, u.k = k, u.a = a.data(), u.lda = k, u.b = w.data(), u.ldb = delta ? k : n;
  u.c = ref.data(), u.ldc = n;
  const la::Backend backend = la::default_backend<Space>(true);  // cutlass on CUDA builds with CUTLASS
  bool fused = true;  // the backend did the epilogue in the GEMM's pass
  const auto unsplit = [&] {
    const Space space;
    if (delta) {
      fused = la::gemm_with_activation_grad(space, backend, u, y.data(), n, dpmlp::Activation::relu);
    } else {
      fused = la::gemm_with_bias(space, backend, u, bias.data(), dpmlp::Activation::relu);
    }
  };
  unsplit();
  if (!fused) {  // the engine's element-wise kernel, for the check
    const auto r = ref;
    const auto bv = bias, yv = y;
    const std::int64_t nn = n;
    Kokkos::parallel_for(
        "epilogue", Kokkos::RangePolicy<Space>(0, ref.extent(0)), KOKKOS_LAMBDA(const std::int64_t i) {
          r(i) = delta ? r(i) * dpmlp::detail::activate_grad_from_output(dpmlp::Activation::relu, yv(i))
                       : dpmlp::detail::activate(dpmlp::Activation::relu, r(i) + bv(i % nn));
        });
  }
  la::split_gemm(Space(), g);
  const double scale = max_abs(ref), diff = max_abs_diff(c, ref);
  const bool ok = diff <= 1e-5 * std::max(scale, 1e-30);
  const int inner = rows >= 65536 ? 1 : 50;
  struct Variant {
    const char* name;
    std::function<void()> call;
  };
  la::SplitGemm no_lo = g, tile64 = g, tile128 = g;
  no_lo.c_lo = nullptr, tile64.tile_rows = 64, tile128.tile_rows = 128;
  const bool hopper =
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
      std::is_same<Space, Kokkos::Cuda>::value && la::split_3xtf32::runs_here();
#else
      false;
#endif
  std::vector<Variant> variants = {
      {"unsplit", unsplit},
      {"split", [&] { la::split_gemm(Space(), g); }},
      {"split_no_lo", [&] { la::split_gemm(Space(), no_lo); }},
      {"split_weights", split_weights},
      {"lo_pass", [&] {
         Kokkos::parallel_for(
             "lo_pass", Kokkos::RangePolicy<Space>(0, c.extent(0)),
             KOKKOS_LAMBDA(const std::int64_t i) { c_lo(i) = la::tf32_lo(c(i)); });
       }}};
  if (hopper) {
    variants.push_back({"split_tile64", [&] { la::split_gemm(Space(), tile64); }});
    variants.push_back({"split_tile128", [&] { la::split_gemm(Space(), tile128); }});
  }
  for (const Variant& v : variants) {
    const double t = median_us(v.call, inner, o);
    const bool gemm = v.name != std::string("split_weights") && v.name != std::string("lo_pass");
    std::printf(
        "{\"bench\": \"split_gemm\", \"shape\": \"%s\", \"variant\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
        "\"hopper_kernels\": %s, \"median_us\": %.2f, \"tflops_eff\": %.1f, \"max_diff_rel\": %.3g, \"check\": "
        "\"%s\"}\n",
        delta ? "delta" : "forward", v.name, m, n, k, hopper ? "true" : "false", t,
        gemm ? 2.0 * m * n * k / (t * 1e6) : 0.0, diff / std::max(scale, 1e-30), ok ? "pass" : "fail");
    std::fflush(stdout);
  }
  return ok;
}

int run(Options& o) {
  if (o.rows.empty()) o.rows = {1048576, 4096};
  if (o.width <= 0 || o.width % la::split_tile_k != 0 || o.repeats <= 0 || o.warmup < 0) {
    throw dpmlp::InputError("--width must be a positive multiple of 32, --repeats positive, --warmup not negative");
  }
  bool pass = true;
  for (const std::int64_t rows : o.rows) {
    if (rows <= 0 || rows > INT_MAX) throw dpmlp::InputError("--rows must be in [1, 2^31)");
    for (const bool delta : {false, true}) pass = run_shape(rows, delta, o) && pass;
  }
  return pass ? 0 : 1;
}

}  // namespace split_bench

// The command line is read before Kokkos starts: --help and a bad option start nothing.
int main(int argc, char* argv[]) {
  int code = 0;
  try {
    split_bench::Options o;
    const cli::Parser parser = split_bench::command_line(o);
    if (!parser.parse(argc, argv)) {
      parser.print_usage(stdout);
      return 0;
    }
    dpmlp::compat::initialize();
    code = split_bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "split_bench: error: %s\n", e.what());
    code = 2;
  }
  if (Kokkos::is_initialized()) Kokkos::finalize();
  return code;
}
