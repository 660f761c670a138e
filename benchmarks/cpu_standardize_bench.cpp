// SPDX-License-Identifier: BSD-3-Clause
// cpu_standardize_bench: times dpmlp::Standardizer::transform_rows (the seed's row mode) on the default
// execution space, for the comparison with numpy in benchmarks/cpu_bench.py.
//
//   cpu_standardize_bench [OPTION]...      (cpu_standardize_bench --help lists the options)
//
// The same work as numpy's standardize_np in benchmarks/anchors/jax_ref.py: rows x cols raw doubles (JAX's
// normal draws from PRNGKey(0), widened, as the seed) -> rows x 2*cols features, plus the sum of all
// features (the checksum). dpmlp computes in double and writes float features (what training consumes) and
// each row's feature sum in double; the timed region is transform_rows plus the host sum of the row sums,
// fenced. Prints one JSON line: every repeat's time in ms, the median, and the checksum.
#include <dpmlp/dpmlp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../examples/cli.hpp"

namespace cpu_standardize_bench {

struct Options {
  std::int64_t rows = 20000;
  int cols = 16, repeats = 11;
};

// The command line, bound to o: the one table that parse() reads and --help prints.
cli::Parser command_line(Options& o) {
  cli::Parser p("cpu_standardize_bench", "[OPTION]...",
                "Time dpmlp::Standardizer::transform_rows (the seed's row mode) on the default execution space and "
                "print one JSON line: every repeat's time in ms, the median, and the checksum. "
                "benchmarks/cpu_bench.py compares it with numpy.");
  p.value("--rows", "N", o.rows, "rows of raw data");
  p.value("--cols", "C", o.cols, "raw columns per row; 2*C features out");
  p.value("--repeats", "R", o.repeats, "timed repeats, after one warm-up");
  p.example("KOKKOS_NUM_THREADS=1 cpu_standardize_bench --rows 1000000", "a million rows on one thread");
  p.note("Exit status: 0 done, 2 bad input or a runtime error.");
  return p;
}

void check(const Options& o) {
  if (o.rows <= 0 || o.cols <= 0 || o.repeats <= 0) {
    throw dpmlp::InputError("--rows, --cols, --repeats must be positive");
  }
}

// A named function, not main: CUDA's extended lambdas need an enclosing function whose address can be taken.
void run(const Options& o) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Memory = Space::memory_space;
  const std::int64_t rows = o.rows;
  const int cols = o.cols, repeats = o.repeats;
  Space space;
  Kokkos::View<double*, Memory> flat("raw", rows * cols);
  dpmlp::random::normal(space, dpmlp::random::split(dpmlp::random::PRNGKey(0), 2)[0], flat, 0);
  Kokkos::View<const double**, Kokkos::LayoutRight, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> raw(flat.data(),
                                                                                                        rows, cols);
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> out("features", rows, 2 * cols);
  Kokkos::View<double*, Memory> sums("row_sums", rows);
  space.fence();
  const dpmlp::Standardizer standardizer;
  std::vector<double> ms;
  double checksum = 0;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run is a warm-up (page faults on the outputs)
    const auto t0 = std::chrono::steady_clock::now();
    standardizer.transform_rows(space, raw, out, sums);
    double total = 0;
    Kokkos::parallel_reduce(
        "sum", Kokkos::RangePolicy<Space>(space, 0, rows),
        KOKKOS_LAMBDA(const std::int64_t i, double& acc) { acc += sums(i); }, total);
    space.fence();
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) ms.push_back(t);
    checksum = total;
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  std::printf("{\"bench\": \"dpmlp_standardize_rows\", \"rows\": %lld, \"cols\": %d, \"space\": \"%s\", "
              "\"threads\": %d, \"times_ms\": [",
              static_cast<long long>(rows), cols, Space::name(), Space().concurrency());
  for (std::size_t i = 0; i < ms.size(); ++i) std::printf("%s%.4f", i ? ", " : "", ms[i]);
  std::printf("], \"median_ms\": %.4f, \"checksum\": %.6f}\n", median, checksum);
}

}  // namespace cpu_standardize_bench

// The command line is read before Kokkos starts: --help and a bad option start nothing.
int main(int argc, char* argv[]) {
  int code = 0;
  try {
    cpu_standardize_bench::Options o;
    const cli::Parser parser = cpu_standardize_bench::command_line(o);
    if (!parser.parse(argc, argv)) {
      parser.print_usage(stdout);
      return 0;
    }
    cpu_standardize_bench::check(o);
    dpmlp::compat::initialize();
    cpu_standardize_bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu_standardize_bench: error: %s\n", e.what());
    code = 2;
  }
  if (Kokkos::is_initialized()) Kokkos::finalize();
  return code;
}
