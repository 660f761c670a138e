// SPDX-License-Identifier: BSD-3-Clause
// multi_gpu_train: the seed program (a JAX data-parallel MLP over every accelerator, held to a one-device
// run) on dpmlp.
//
//   mpirun -np <gpus> multi_gpu_train [OPTION]...      (multi_gpu_train --help lists the options)
//
// Each rank draws only its own rows of the seed's data (JAX's partitionable threefry: element i depends on
// the key and i alone), standardizes them natively, and trains data-parallel. Rank 0 then runs the same
// steps on its one device over all rows, and the two runs are held to one answer.
//
// Exit codes: 0 PASS, 1 FAIL, 2 bad input or a runtime error, 77 fewer than 2 physical accelerators (skip).
#include <dpmlp/dpmlp.hpp>

#include "cli.hpp"
#include "seed_problem.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using Memory = ExecSpace::memory_space;

struct Options {
  bool allow_cpu = false, allow_single = false, graph = false, peer = false;
  std::int64_t rows = 20000;
  int cols = 16, hidden = 32, steps = 100, warmup = 5;
  double rate = 0.02, peer_timeout = 60;
  std::string comm = dpmlp::default_communicator_t<ExecSpace>::name();
  std::string reduction = "reproducible";
  dpmlp::Engine engine = dpmlp::Engine::automatic;
  dpmlp::TensorKernel tensor_kernel = dpmlp::TensorKernel::automatic;
  std::int64_t block_rows = 0;
};

#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
constexpr const char* kComms = "mpi|nccl";
#else
constexpr const char* kComms = "mpi";
#endif

// The command line, bound to o: the one table that parse() reads and --help prints.
cli::Parser command_line(Options& o) {
  cli::Parser p("multi_gpu_train", "[OPTION]...",
                "Train the seed's MLP data-parallel over every rank's accelerator (mpirun -np <gpus> "
                "multi_gpu_train), then rerun the same steps on rank 0's device alone over all rows, and print PASS "
                "if the two runs agree.");
  p.flag("--allow-cpu-devices", o.allow_cpu,
         "count each rank as one CPU device (exercises the program; not a hardware pass)");
  p.flag("--allow-single-cpu-device", o.allow_single, "with --allow-cpu-devices, run on one rank too");
  seed::add_options(p, o, kComms, "training steps, full batch SGD", "steps of a throwaway run before the timed one");
  p.value("--peer-timeout", "S", o.peer_timeout,
          "with --peer, seconds a rank waits for another before the run fails (TrainerOptions::peer_timeout_s)");
  p.example("mpirun -np 2 multi_gpu_train", "the seed's run on 2 GPUs");
  p.example("mpirun -np 2 multi_gpu_train --allow-cpu-devices --comm mpi --steps 30",
            "the same program on a CPU build, each rank counted as one device");
  p.note("Exit status: 0 PASS, 1 FAIL, 2 bad input or a runtime error, 77 fewer than 2 physical accelerators "
         "(skip).");
  return p;
}

// The checks that need every option read.
void check(const Options& o) {
  if (o.rows <= 0) throw dpmlp::InputError("--rows must be positive");
  if (o.cols <= 0 || o.hidden <= 0) throw dpmlp::InputError("--cols and --hidden must be positive");
  seed::check_cols(o.cols);
  if (o.steps <= 0) throw dpmlp::InputError("--steps must be positive");
  if (o.warmup < 0) throw dpmlp::InputError("--warmup must not be negative");
  if (!(o.rate > 0) || !std::isfinite(o.rate)) throw dpmlp::InputError("--rate must be positive and finite");
  if (o.reduction != "reproducible" && o.reduction != "fast") {
    throw dpmlp::InputError("--reduction must be reproducible or fast, got '" + o.reduction + "'");
  }
  if (o.allow_single && !o.allow_cpu) throw dpmlp::InputError("--allow-single-cpu-device needs --allow-cpu-devices");
}

struct RunResult {
  dpmlp::TrainResult losses;
  dpmlp::Engine engine = dpmlp::Engine::layered;  // the one the trainer chose
  double prep_ms = 0, train_ms = 0, checksum = 0;
  std::vector<float> params;
};

// The seed's program over the ranks of `comm`: draw this rank's rows, standardize, train.
template <class Comm>
RunResult run(MPI_Comm comm, const Options& o, bool timed) {
  namespace rnd = dpmlp::random;
  const int features = dpmlp::Standardizer::features(o.cols);

  dpmlp::Mlp<float, Memory> model({features, o.hidden, 1});
  model.init_jax(rnd::PRNGKey(1), 0.1f);
  const dpmlp::Sgd sgd(o.rate);
  dpmlp::TrainerOptions topt;
  topt.reduction = o.reduction == "fast" ? dpmlp::Reduction::fast : dpmlp::Reduction::reproducible;
  topt.block_rows = o.block_rows;
  topt.cuda_graph = o.graph;
  topt.peer_exchange = o.peer;
  topt.peer_timeout_s = o.peer_timeout;
  topt.engine = o.engine;
  topt.tensor_kernel = o.tensor_kernel;
  dpmlp::DataParallelTrainer<ExecSpace, Comm> trainer(comm, model, o.rows, sgd, topt);
  ExecSpace space;

  RunResult result;
  dpmlp::timed_barrier(comm, "MPI_Barrier (multi_gpu_train: before the data)");
  const auto data = seed::make(space, trainer.shard(), o.cols);
  result.prep_ms = data.prep_ms;
  result.engine = trainer.engine();
  result.checksum = dpmlp::reproducible_row_sum(space, trainer.communicator(), trainer.plan(), data.row_sums)[0];
  const auto& x = data.x;
  const auto& y = data.y;

  trainer.set_data(x, y);
  if (timed && o.warmup > 0) {
    // A throwaway run on a copy of the model takes the first-launch costs (module loading, library handles,
    // the first collective) out of the timed run.
    auto scratch = model.clone();
    dpmlp::DataParallelTrainer<ExecSpace, Comm> warm(comm, scratch, o.rows, sgd, topt);
    warm.set_data(x, y);
    warm.train(o.warmup);
  }
  dpmlp::timed_barrier(comm, "MPI_Barrier (multi_gpu_train: before the timed run)");
  const double t0 = seed::now_ms();
  result.losses = trainer.train(o.steps);
  result.train_ms = seed::now_ms() - t0;

  auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  result.params.assign(p.data(), p.data() + p.extent(0));
  return result;
}

template <class Comm>
int main_with(const Options& o) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  int found = dpmlp::count_physical_devices<ExecSpace>(MPI_COMM_WORLD, o.allow_cpu);
  const bool single_cpu_comparison = o.allow_cpu && o.allow_single && size == 1;
  if (found < 2 && !single_cpu_comparison) {
    if (rank == 0) std::printf("requires >= 2 physical accelerator devices; found %d\n", found);
    return 77;
  }

  const RunResult multi = run<Comm>(MPI_COMM_WORLD, o, true);

  // The one-device reference: rank 0 alone, all rows.
  MPI_Comm self = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? 0 : MPI_UNDEFINED, 0, &self);
  double ref[3] = {0, 0, 0};  // first loss, last loss, max |dparam|
  // The reference can fail on rank 0 alone (all rows on one device may not fit): every rank learns it.
  std::string failure;
  if (rank == 0) {
    try {
      const RunResult single = run<Comm>(self, o, false);
      ref[0] = single.losses.first_loss;
      ref[1] = single.losses.last_loss;
      for (std::size_t i = 0; i < multi.params.size(); ++i) {
        ref[2] = std::max(ref[2], static_cast<double>(std::fabs(multi.params[i] - single.params[i])));
      }
    } catch (const std::exception& e) {
      failure = std::string("the one-device reference run failed: ") + e.what();
    }
    MPI_Comm_free(&self);
  }
  dpmlp::agree<dpmlp::InputError>(MPI_COMM_WORLD, failure);
  dpmlp::timed_bcast(ref, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD, "MPI_Bcast (multi_gpu_train: the reference)");

  const double first = multi.losses.first_loss, last = multi.losses.last_loss;
  const bool agrees = std::fabs(last - ref[1]) <= 1e-3 * std::max(1.0, std::fabs(ref[1]));
  const bool passed = first > last && ref[2] < 1e-3 && agrees;
  if (rank == 0) {
    std::printf("# devices: %d x %s\n", found, dpmlp::platform_name<ExecSpace>());
    if (o.allow_cpu && dpmlp::is_host_space<ExecSpace>()) {
      std::printf("# --allow-cpu-devices: each rank counts as one CPU device. This exercises the program; it is "
                  "NOT a hardware pass.\n");
    }
    std::printf("# native prep: %s\n", ExecSpace::name());
    const std::string engine =
        multi.engine != dpmlp::Engine::layered
            ? std::string(dpmlp::engine_name(multi.engine))
            : std::string("layered (gemm: ") +
                  dpmlp::linalg::backend_name(dpmlp::linalg::default_backend<ExecSpace>(o.reduction == "reproducible")) +
                  ")";
    std::printf("# comm: %s%s, reduction: %s, engine: %s, cuda graph: %s, ranks: %d\n", Comm::name(),
                o.peer ? " (sums by peer exchange)" : "", o.reduction.c_str(), engine.c_str(), o.graph ? "requested" : "off", size);
    std::printf("prep %8.1f ms checksum=%.6f\n", multi.prep_ms, multi.checksum);
    std::printf("train %8.1f ms loss %.4f -> %.4f\n", multi.train_ms, first, last);
    std::printf("# train time: %d steps, steady state (first-launch costs taken by a %d-step warm-up run)\n",
                o.steps, o.warmup);
    std::printf("single device: loss %.4f -> %.4f, max |dparam| %.2e\n", ref[0], ref[1], ref[2]);
    std::printf("# params digest: %s\n",
                dpmlp::hex16(dpmlp::fnv1a64(multi.params.data(), multi.params.size() * sizeof(float))).c_str());
    std::printf("%s\n", passed ? "PASS" : "FAIL");
    std::fflush(stdout);
  }
  return passed ? 0 : 1;
}

int main_checked(const Options& o) {
  if (o.comm == "mpi") return main_with<dpmlp::MpiCommunicator>(o);
#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
  if (o.comm == "nccl") return main_with<dpmlp::NcclCommunicator>(o);
#endif
  throw dpmlp::InputError("--comm " + o.comm + " is not available in this build (mpi" +
#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
                          std::string(", nccl") +
#endif
                          ")");
}

}  // namespace

// The command line is read before Kokkos starts: --help (printed by rank 0) and a bad option start no device.
int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int code = 0;
  try {
    Options o;
    const cli::Parser parser = command_line(o);
    if (cli::read_command_line(parser, argc, argv, MPI_COMM_WORLD, [&] { check(o); })) {
      dpmlp::initialize_kokkos_for_rank(MPI_COMM_WORLD);
      code = main_checked(o);
    }
  } catch (const dpmlp::CollectiveTimeout& e) {
    // Some rank may never reach MPI_Finalize: end every process now.
    std::fprintf(stderr, "multi_gpu_train: error (rank %d): %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "multi_gpu_train: error (rank %d): %s\n", rank, e.what());
    code = 2;
  }
  if (Kokkos::is_initialized()) Kokkos::finalize();
  MPI_Finalize();
  return code;
}
