// SPDX-License-Identifier: BSD-3-Clause
// gemm_bench: times dpmlp::linalg::gemm's portable backend (the tiled team kernel on device spaces) against the
// space's vendor backend (cuBLAS on Kokkos::Cuda with cuBLAS, Eigen on host spaces) and, on CUDA, the pinned
// backends (cublaslt, cutlass, and cutlass on its 3xFP16 kernels where they run, with and without a workspace), on
// the GEMMs the layered engine runs for a model of the given widths.
//
//   gemm_bench [OPTION]...      (gemm_bench --help lists the options)
//
// For a model of widths w0, w1, ..., wL over `rows` rows in blocks of `block` rows (engine/block_engine.hpp),
// each layer l has up to three GEMMs, each a strided batch of rows / block products:
//   forward   Z = A W:        m = block, n = w(l+1), k = w(l), op N N, W shared (stride 0)
//   delta     D' = D W^T:     m = block, n = w(l),   k = w(l+1), op N T, W shared (l >= 1 only)
//   weight    G = A^T D:      m = w(l), n = w(l+1),  k = block, op T N, one G a block
// A GEMM that repeats an earlier one's shape is timed once. Prints one JSON line a GEMM: the portable time,
// the vendor time, their ratio (portable / vendor), the reference kernel's time (the one-thread-an-element
// kernel the tiled one replaces on device spaces) and whether its bits equal the portable backend's, and the
// check: the portable result agrees with the vendor's within the tolerance, relative to the largest |C|
// element. Times are the median of `repeats` calls, each fenced, after `warmup` calls. Each pinned backend's
// entry also times, for a forward or delta GEMM, the engine's own form of it where the backend fuses it
// (fused_ms): one GEMM over all the rows with the bias and relu, or relu's derivative, in its epilogue.
#include <dpmlp/dpmlp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "../examples/cli.hpp"

namespace gemm_bench {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;
using Scalar = float;
using dpmlp::linalg::Backend;
using dpmlp::linalg::BatchedGemm;
using dpmlp::linalg::Op;

struct Options {
  std::int64_t rows = 1048576;
  int block = 256, repeats = 20, warmup = 3;
  double tolerance = 1e-4;
  bool reference = true;
  std::vector<std::vector<int>> models;  // empty: the two defaults
};

std::vector<int> parse_widths(const std::string& text) {
  std::vector<int> w;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0 || v > 65536) {
      throw dpmlp::InputError("--widths: not a list of positive widths: '" + text + "'");
    }
    w.push_back(static_cast<int>(v));
  }
  if (w.size() < 2) throw dpmlp::InputError("--widths: at least two widths (inputs and outputs): '" + text + "'");
  return w;
}

std::string widths_text(const std::vector<int>& w) {
  std::string s;
  for (std::size_t i = 0; i < w.size(); ++i) s += (i ? "," : "") + std::to_string(w[i]);
  return s;
}

// The command line, bound to o: the one table that parse() reads and --help prints.
cli::Parser command_line(Options& o) {
  cli::Parser p("gemm_bench", "[OPTION]...",
                "Time dpmlp::linalg::gemm's portable backend against the vendor backend (cuBLAS on CUDA, Eigen on "
                "host spaces) on the GEMMs of the layered engine (forward, delta propagation, weight gradient) "
                "for a model, and print one JSON line a GEMM: both times, their ratio and the check that the "
                "results agree.");
  p.value("--rows", "N", o.rows, "rows of training data; a multiple of the block rows");
  p.value("--block-rows", "B", o.block, "rows a block (the batch entries are blocks)");
  p.custom("--widths", "LIST", "32,256,256,256,1 and 32,64,64,64,1",
           "the model's layer widths, inputs first (repeat the option for more models)",
           [&o](const cli::Args& a, int& i) { o.models.push_back(parse_widths(a.value(i))); });
  p.value("--repeats", "R", o.repeats, "timed calls a GEMM and backend (the median is reported)");
  p.value("--warmup", "W", o.warmup, "untimed calls before them");
  p.value("--tolerance", "T", o.tolerance, "largest |portable - vendor| allowed, relative to the largest |C|");
  p.flag("--no-reference", o.reference, "skip the reference kernel (one thread an element)", false);
  p.example("gemm_bench", "the two default models at 1,048,576 rows");
  p.example("gemm_bench --rows 65536 --widths 16,32,1", "a small model");
  p.note("Exit status: 0 every check passed, 1 a check failed, 2 bad input or a runtime error.");
  return p;
}

void check(Options& o) {
  if (o.rows <= 0 || o.block <= 0 || o.repeats <= 0 || o.warmup < 0 || !(o.tolerance >= 0)) {
    throw dpmlp::InputError("--rows, --block-rows, --repeats must be positive; --warmup, --tolerance not negative");
  }
  if (o.rows % o.block != 0) throw dpmlp::InputError("--rows must be a multiple of --block-rows");
  if (o.models.empty()) o.models = {{32, 256, 256, 256, 1}, {32, 64, 64, 64, 1}};
}

// One of the engine's GEMMs: its name and its BatchedGemm without pointers.
struct Case {
  std::string kind;
  int layer = 0;
  BatchedGemm<Scalar> g;
};

std::vector<Case> engine_gemms(const std::vector<int>& w, std::int64_t rows, int block) {
  std::vector<Case> cases;
  const std::int64_t blocks = rows / block;
  for (int l = 0; l + 1 < static_cast<int>(w.size()); ++l) {
    const int in = w[l], out = w[l + 1];
    Case f{"forward", l, {}};
    f.g.op_a = Op::N, f.g.op_b = Op::N;
    f.g.m = block, f.g.n = out, f.g.k = in;
    f.g.lda = in, f.g.stride_a = std::int64_t(block) * in;
    f.g.ldb = out, f.g.stride_b = 0;
    f.g.ldc = out, f.g.stride_c = std::int64_t(block) * out;
    f.g.batch = blocks;
    cases.push_back(f);
    if (l >= 1) {
      Case d{"delta", l, {}};
      d.g.op_a = Op::N, d.g.op_b = Op::T;
      d.g.m = block, d.g.n = in, d.g.k = out;
      d.g.lda = out, d.g.stride_a = std::int64_t(block) * out;
      d.g.ldb = out, d.g.stride_b = 0;
      d.g.ldc = in, d.g.stride_c = std::int64_t(block) * in;
      d.g.batch = blocks;
      cases.push_back(d);
    }
    Case g{"weight_grad", l, {}};
    g.g.op_a = Op::T, g.g.op_b = Op::N;
    g.g.m = in, g.g.n = out, g.g.k = block;
    g.g.lda = in, g.g.stride_a = std::int64_t(block) * in;
    g.g.ldb = out, g.g.stride_b = std::int64_t(block) * out;
    g.g.ldc = out, g.g.stride_c = std::int64_t(in) * out;
    g.g.batch = blocks;
    cases.push_back(g);
  }
  return cases;
}

bool same_shape(const BatchedGemm<Scalar>& a, const BatchedGemm<Scalar>& b) {
  return a.op_a == b.op_a && a.op_b == b.op_b && a.m == b.m && a.n == b.n && a.k == b.k && a.lda == b.lda &&
         a.ldb == b.ldb && a.ldc == b.ldc && a.stride_a == b.stride_a && a.stride_b == b.stride_b &&
         a.stride_c == b.stride_c && a.batch == b.batch;
}

// Elements a strided batch spans (rows x ld of the last entry after batch - 1 strides).
std::int64_t span(std::int64_t batch, std::int64_t stride, std::int64_t rows, std::int64_t ld) {
  return (batch - 1) * stride + rows * ld;
}

// The median time of `repeats` fenced calls, in ms, after `warmup` calls.
template <class F>
double median_ms(const Space& space, int warmup, int repeats, const F& f) {
  for (int i = 0; i < warmup; ++i) f();
  space.fence();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    space.fence();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

using view = Kokkos::View<Scalar*, Memory>;

// max |p - q| / max |q| over the first n elements (0 when q is all zeros and p equals it).
double max_rel_diff(const Space& space, const view& p, const view& q, std::int64_t n) {
  double diff = 0, scale = 0;
  Kokkos::parallel_reduce(
      "gemm_bench::diff", Kokkos::RangePolicy<Space>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i, double& m) {
        const double d = static_cast<double>(p(i)) - static_cast<double>(q(i));
        const double a = d < 0 ? -d : d;
        if (!(a <= m)) m = a;  // a NaN wins
      },
      Kokkos::Max<double>(diff));
  Kokkos::parallel_reduce(
      "gemm_bench::scale", Kokkos::RangePolicy<Space>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i, double& m) {
        const double a = q(i) < 0 ? -static_cast<double>(q(i)) : static_cast<double>(q(i));
        if (a > m) m = a;
      },
      Kokkos::Max<double>(scale));
  if (diff != diff) return diff;
  return scale > 0 ? diff / scale : diff;
}

// Whether the first n elements of p and q have the same bits.
bool same_bits(const view& p, const view& q, std::int64_t n) {
  const auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), Kokkos::subview(p, std::make_pair(std::int64_t(0), n)));
  const auto hq = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), Kokkos::subview(q, std::make_pair(std::int64_t(0), n)));
  return std::memcmp(hp.data(), hq.data(), sizeof(Scalar) * n) == 0;
}

// A named function, not main: CUDA's extended lambdas need an enclosing function whose address can be taken.
int run(const Options& o) {
  Space space;
  // The vendor library as its users call it: cuBLAS's own choice of kernel (not the pinned cuBLASLt one).
  const Backend by_default = dpmlp::linalg::default_backend<Space>(false);
  const Backend vendor =
      by_default == Backend::cublaslt || by_default == Backend::cutlass ? Backend::cublas : by_default;
  const bool has_vendor = vendor != Backend::portable;
  std::vector<Backend> pinned;
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
  if (std::is_same<Space, Kokkos::Cuda>::value) pinned.push_back(Backend::cublaslt);
#endif
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
  if (std::is_same<Space, Kokkos::Cuda>::value) pinned.push_back(Backend::cutlass);
#endif
  // The largest operands any GEMM here needs; one buffer each, filled once.
  std::int64_t na = 1, nb = 1, nc = 1;
  std::vector<std::pair<std::vector<int>, std::vector<Case>>> all;
  for (const auto& w : o.models) {
    auto cases = engine_gemms(w, o.rows, o.block);
    for (const Case& c : cases) {
      const auto& g = c.g;
      na = std::max(na, span(g.batch, g.stride_a, g.op_a == Op::N ? g.m : g.k, g.lda));
      nb = std::max(nb, span(g.batch, g.stride_b, g.op_b == Op::N ? g.k : g.n, g.ldb));
      nc = std::max(nc, span(g.batch, g.stride_c, g.m, g.ldc));
    }
    all.emplace_back(w, std::move(cases));
  }
  view a("a", na), b("b", nb), c_portable("c_portable", nc), c_vendor("c_vendor", nc), c_reference("c_reference", nc);
  std::int64_t widest = 1;
  for (const auto& w : o.models) widest = std::max<std::int64_t>(widest, *std::max_element(w.begin(), w.end()));
  view bias("bias", widest);  // zeros
  dpmlp::random::normal(space, dpmlp::random::PRNGKey(11), a, 0);
  dpmlp::random::normal(space, dpmlp::random::PRNGKey(12), b, 0);
  space.fence();
  bool pass = true;
  for (const auto& model : all) {
    std::vector<BatchedGemm<Scalar>> done;
    for (const Case& c : model.second) {
      BatchedGemm<Scalar> g = c.g;
      bool repeat = false;
      for (const auto& d : done) repeat = repeat || same_shape(d, g);
      if (repeat) continue;
      done.push_back(g);
      g.a = a.data();
      g.b = b.data();
      const std::int64_t n_c = span(g.batch, g.stride_c, g.m, g.ldc);
      g.c = c_portable.data();
      const double portable_ms = median_ms(space, o.warmup, o.repeats, [&] { dpmlp::linalg::gemm(space, Backend::portable, g); });
      double vendor_ms = -1, rel = -1;
      if (has_vendor) {
        g.c = c_vendor.data();
        vendor_ms = median_ms(space, o.warmup, o.repeats, [&] { dpmlp::linalg::gemm(space, vendor, g); });
        rel = max_rel_diff(space, c_portable, c_vendor, n_c);
      }
      double reference_ms = -1;
      bool reference_same = false;
      if (o.reference) {
        g.c = c_reference.data();
        reference_ms = median_ms(space, o.warmup > 0 ? 1 : 0, std::min(o.repeats, 5),
                                 [&] { dpmlp::linalg::detail::gemm_portable_reference(space, g); });
        reference_same = same_bits(c_portable, c_reference, n_c);
      }
      const bool ok = (!has_vendor || rel <= o.tolerance) && (!o.reference || reference_same);
      pass = pass && ok;
      const double flops = 2.0 * g.m * g.n * double(g.k) * double(g.batch);
      std::printf("{\"bench\": \"dpmlp_gemm\", \"space\": \"%s\", \"widths\": [%s], \"rows\": %lld, \"gemm\": \"%s\", "
                  "\"layer\": %d, \"op\": \"%c%c\", \"m\": %d, \"n\": %d, \"k\": %d, \"batch\": %lld, "
                  "\"repeats\": %d, \"portable_ms\": %.4f, \"portable_tflops\": %.3f, \"vendor\": \"%s\", ",
                  Space::name(), widths_text(model.first).c_str(), static_cast<long long>(o.rows), c.kind.c_str(),
                  c.layer, g.op_a == Op::N ? 'N' : 'T', g.op_b == Op::N ? 'N' : 'T', g.m, g.n, g.k,
                  static_cast<long long>(g.batch), o.repeats, portable_ms, flops / portable_ms * 1e-9,
                  has_vendor ? dpmlp::linalg::backend_name(vendor) : "none");
      if (has_vendor) {
        std::printf("\"vendor_ms\": %.4f, \"vendor_tflops\": %.3f, \"ratio\": %.3f, \"max_rel_diff\": %.3e, ",
                    vendor_ms, flops / vendor_ms * 1e-9, portable_ms / vendor_ms, rel);
      } else {
        std::printf("\"vendor_ms\": null, \"vendor_tflops\": null, \"ratio\": null, \"max_rel_diff\": null, ");
      }
      if (o.reference) {
        std::printf("\"reference_ms\": %.4f, \"reference_bits_equal\": %s, ", reference_ms,
                    reference_same ? "true" : "false");
      } else {
        std::printf("\"reference_ms\": null, \"reference_bits_equal\": null, ");
      }
      // The pinned backends the layered engine runs by default on this space (its reproducible GEMMs), each
      // timed on the same GEMM and compared with the portable result.
      std::printf("\"pinned\": {");
      bool first = true;
      // The cutlass backend runs again on the 3xFP16 kernels (BatchedGemm::f16x3, EngineOptions::gemm_3xfp16)
      // where those take the GEMM: op(B) split in every CTA, and split once into a workspace where they use one
      // (as the layered engine runs them; the same bits).
      struct Run {
        Backend backend;
        bool f16x3;
        std::size_t workspace;
        const char* suffix;
      };
      std::vector<Run> runs;
      for (Backend p : pinned) {
        runs.push_back({p, false, 0, ""});
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
        BatchedGemm<Scalar> h = g;
        h.f16x3 = true;
        if (p == Backend::cutlass && dpmlp::linalg::cutlass_3xtf32::runs_on_f16x3(h)) {
          runs.push_back({p, true, 0, "_3xfp16"});
          const std::size_t ws = dpmlp::linalg::gemm_workspace_bytes(space, p, h);
          if (ws > 0) runs.push_back({p, true, ws, "_3xfp16_split_b"});
        }
#endif
      }
      for (const Run& run : runs) {
        Kokkos::View<unsigned char*, Memory> ws("workspace", run.workspace);
        g.c = c_vendor.data();
        g.f16x3 = run.f16x3;
        g.workspace = ws.data();
        g.workspace_bytes = run.workspace;
        const double ms = median_ms(space, o.warmup, o.repeats, [&] { dpmlp::linalg::gemm(space, run.backend, g); });
        g.f16x3 = false;
        g.workspace = nullptr;
        g.workspace_bytes = 0;
        const double r = max_rel_diff(space, c_portable, c_vendor, n_c);
        const bool p_ok = r <= o.tolerance;
        pass = pass && p_ok;
        // The engine's own form of a forward or delta GEMM: one GEMM over all the rows with its epilogue
        // fused (bias and relu; relu's derivative read from Y), where the backend fuses it; null elsewhere.
        double fused_ms = -1;
        if (c.kind == "forward" || c.kind == "delta") {
          BatchedGemm<Scalar> f = g;
          f.m = static_cast<int>(o.rows), f.batch = 1, f.stride_a = f.stride_b = f.stride_c = 0;
          f.c = c_vendor.data();
          f.f16x3 = run.f16x3;
          f.workspace = ws.data();
          f.workspace_bytes = run.workspace;
          const Scalar* y = c_reference.data();  // Y for relu's derivative: C's shape, any values
          const auto call = [&] {
            return c.kind == "forward"
                       ? dpmlp::linalg::gemm_with_bias(space, run.backend, f, bias.data(), dpmlp::Activation::relu)
                       : dpmlp::linalg::gemm_with_activation_grad(space, run.backend, f, y, f.n,
                                                                  dpmlp::Activation::relu);
          };
          if (call()) fused_ms = median_ms(space, o.warmup, o.repeats, [&] { call(); });
        }
        bool wgmma = false;  // the cutlass backend's Hopper kernels ran it
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUTLASS)
        wgmma = run.backend == Backend::cutlass && !run.f16x3 && dpmlp::linalg::cutlass_3xtf32::runs_on_wgmma(g);
#endif
        char fused[32] = "null";
        if (fused_ms >= 0) std::snprintf(fused, sizeof fused, "%.4f", fused_ms);
        std::printf("%s\"%s%s\": {\"ms\": %.4f, \"tflops\": %.3f, \"max_rel_diff\": %.3e, \"wgmma\": %s, "
                    "\"fused_ms\": %s, \"check\": \"%s\"}",
                    first ? "" : ", ", dpmlp::linalg::backend_name(run.backend), run.suffix, ms, flops / ms * 1e-9, r,
                    wgmma ? "true" : "false", fused, p_ok ? "pass" : "fail");
        first = false;
      }
      std::printf("}, ");
      std::printf("\"check\": \"%s\"}\n", ok ? "pass" : "fail");
      std::fflush(stdout);
    }
  }
  return pass ? 0 : 1;
}

}  // namespace gemm_bench

// The command line is read before Kokkos starts: --help and a bad option start nothing.
int main(int argc, char* argv[]) {
  int code = 0;
  try {
    gemm_bench::Options o;
    const cli::Parser parser = gemm_bench::command_line(o);
    if (!parser.parse(argc, argv)) {
      parser.print_usage(stdout);
      return 0;
    }
    gemm_bench::check(o);
    dpmlp::compat::initialize();
    code = gemm_bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: error: %s\n", e.what());
    code = 2;
  }
  if (Kokkos::is_initialized()) Kokkos::finalize();
  return code;
}
