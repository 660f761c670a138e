// SPDX-License-Identifier: BSD-3-Clause
// train_bench: times dpmlp training on the seed's problem at any size, under mpirun (1 or more ranks).
//
//   mpirun -np <ranks> train_bench [OPTION]...      (train_bench --help lists the options)
//
// --peer: TrainerOptions::peer_exchange (2 or more ranks on CUDA: the subtree sums written straight into the
// other GPUs' memory, one kernel with the tree, the combine and the update; backend/cuda/peer.hpp).
//
// --breakdown: instead, where a step's time goes on this rank count, one JSON line: microseconds per call
// of the block engine, the local tree reduction, the whole reduction (local + collective + combine), the
// combine kernel, with --peer the peer exchange's kernel, a training step (plain and, where supported,
// replayed as a CUDA graph), and an empty kernel launch; each the mean of back-to-back calls on the stream,
// fenced once at the end.
//
// Prints one JSON line (rank 0): the configuration, every repeat's time for `steps` steps (a fresh trainer
// each repeat, the same initial parameters; after a warm-up run), their median, and the check: the loss
// fell, and the final parameters agree with a one-device run (rank 0 alone) within the example's 1e-3.
// params_digest: the FNV-1a digest of the trained parameters' bytes (dpmlp/digest.hpp), so runs of different
// builds or rank counts can be compared bit for bit.
#include <dpmlp/dpmlp.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../examples/cli.hpp"
#include "../examples/seed_problem.hpp"

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using Memory = ExecSpace::memory_space;

struct Options {
  std::int64_t rows = 20000, block_rows = 0;
  int cols = 16, hidden = 32, steps = 100, repeats = 5, warmup = 5;
  double rate = 0.02;
  std::string comm = dpmlp::default_communicator_t<ExecSpace>::name();
  std::string reduction = "reproducible";
  dpmlp::Engine engine = dpmlp::Engine::automatic;
  dpmlp::TensorKernel tensor_kernel = dpmlp::TensorKernel::automatic;
  dpmlp::Toggle leaf_groups = dpmlp::Toggle::automatic;
  bool check = true, allow_cpu = false, graph = false, breakdown = false, peer = false;
};

#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
constexpr const char* kComms = "nccl|mpi";
#else
constexpr const char* kComms = "mpi";
#endif

// The command line, bound to o: the one table that parse() reads and --help prints.
cli::Parser command_line(Options& o) {
  cli::Parser p("train_bench", "[OPTION]...",
                "Time dpmlp training on the seed's problem at any size, on 1 or more ranks (mpirun -np <ranks> "
                "train_bench), and print one JSON line: every repeat's time, the median, and a check against a "
                "one-device run.");
  seed::add_options(p, o, kComms, "training steps per repeat", "steps of a throwaway run before the repeats");
  p.value("--repeats", "R", o.repeats, "timed repeats, each a fresh trainer from the same parameters");
  p.custom("--leaf-groups", "automatic|off|on", dpmlp::toggle_name(o.leaf_groups),
           "whether the register-resident kernel sums groups of 8 blocks itself (EngineOptions::leaf_groups)",
           [&o](const cli::Args& a, int& i) { o.leaf_groups = dpmlp::toggle_from_name(a.value(i)); });
  p.flag("--no-check", o.check, "skip the comparison with a one-device run", false);
  p.flag("--breakdown", o.breakdown, "instead, time a step's parts (one JSON line, microseconds per call)");
  p.flag("--allow-cpu-devices", o.allow_cpu, "count each rank as one CPU device (CPU builds)");
  p.example("mpirun -np 2 train_bench --rows 1000000 --hidden 64", "2 GPUs, a million rows, 64 hidden units");
  p.example("mpirun -np 2 train_bench --breakdown", "where a step's time goes");
  p.note("Exit status: 0 the check passed (or was skipped), 1 it failed, 2 bad input or a runtime error.");
  return p;
}

// The checks that need every option read.
void check(const Options& o) {
  if (o.rows <= 0 || o.cols <= 0 || o.hidden <= 0 || o.steps <= 0 || o.repeats <= 0) {
    throw dpmlp::InputError("--rows, --cols, --hidden, --steps and --repeats must be positive");
  }
  seed::check_cols(o.cols);
  if (o.warmup < 0) throw dpmlp::InputError("--warmup must not be negative");
  if (o.reduction != "reproducible" && o.reduction != "fast") throw dpmlp::InputError("--reduction: reproducible|fast");
}

struct Timing {
  std::vector<double> ms;
  dpmlp::TrainResult last;
  std::vector<float> params;
  double prep_ms = 0;
  dpmlp::Engine engine = dpmlp::Engine::layered;
  dpmlp::Kernel kernel = dpmlp::Kernel::layered;
  int leaf_group = 1;  // blocks a leaf of the block tree
};

dpmlp::TrainerOptions trainer_options(const Options& o) {
  dpmlp::TrainerOptions topt;
  topt.reduction = o.reduction == "fast" ? dpmlp::Reduction::fast : dpmlp::Reduction::reproducible;
  topt.block_rows = o.block_rows;
  topt.cuda_graph = o.graph;
  topt.engine = o.engine;
  topt.tensor_kernel = o.tensor_kernel;
  topt.leaf_groups = o.leaf_groups;
  topt.peer_exchange = o.peer;
  return topt;
}

template <class Comm>
Timing time_runs(MPI_Comm comm, const Options& o, int repeats, int warmup) {
  const int features = dpmlp::Standardizer::features(o.cols);
  const dpmlp::TrainerOptions topt = trainer_options(o);
  const dpmlp::Sgd sgd(o.rate);
  dpmlp::Mlp<float, Memory> initial({features, o.hidden, 1});
  initial.init_jax(dpmlp::random::PRNGKey(1), 0.1f);
  Timing t;
  ExecSpace space;
  // The data, once: its shard is the same for every trainer over this communicator.
  auto model = initial.clone();
  dpmlp::DataParallelTrainer<ExecSpace, Comm> first(comm, model, o.rows, sgd, topt);
  const auto data = seed::make(space, first.shard(), o.cols);
  t.prep_ms = data.prep_ms;
  t.engine = first.engine();
  t.kernel = first.engine_plan().kernel;
  t.leaf_group = first.leaf_group();
  first.set_data(data.x, data.y);
  if (warmup > 0) first.train(warmup);
  for (int r = 0; r < repeats; ++r) {
    auto m = initial.clone();
    dpmlp::DataParallelTrainer<ExecSpace, Comm> trainer(comm, m, o.rows, sgd, topt);
    trainer.set_data(data.x, data.y);
    MPI_Barrier(comm);
    const double t0 = seed::now_ms();
    t.last = trainer.train(o.steps);
    MPI_Barrier(comm);
    t.ms.push_back(seed::now_ms() - t0);
    if (r + 1 == repeats) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.params());
      t.params.assign(h.data(), h.data() + h.extent(0));
    }
  }
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class Comm>
int bench(const Options& o) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int devices = dpmlp::count_physical_devices<ExecSpace>(MPI_COMM_WORLD, o.allow_cpu);
  const Timing multi = time_runs<Comm>(MPI_COMM_WORLD, o, o.repeats, o.warmup);

  double drift = -1, single_last = multi.last.last_loss;
  if (o.check) {
    MPI_Comm self = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? 0 : MPI_UNDEFINED, 0, &self);
    if (rank == 0) {
      const Timing single = time_runs<Comm>(self, o, 1, 0);
      drift = 0;
      for (std::size_t i = 0; i < single.params.size(); ++i) {
        drift = std::max(drift, static_cast<double>(std::fabs(single.params[i] - multi.params[i])));
      }
      single_last = single.last.last_loss;
      MPI_Comm_free(&self);
    }
    MPI_Bcast(&drift, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(&single_last, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
  const bool fell = multi.last.last_loss < multi.last.first_loss;
  const bool agrees = std::fabs(multi.last.last_loss - single_last) <= 1e-3 * std::max(1.0, std::fabs(single_last));
  const bool pass = fell && std::isfinite(multi.last.last_loss) && (!o.check || (drift < 1e-3 && agrees));
  if (rank == 0) {
    std::printf("{\"bench\": \"dpmlp_train\", \"rows\": %lld, \"hidden\": %d, \"features\": %d, \"steps\": %d, "
                "\"ranks\": %d, \"devices\": %d, \"platform\": \"%s\", \"space\": \"%s\", \"comm\": \"%s\", "
                "\"reduction\": \"%s\", \"engine\": \"%s\", \"kernel\": \"%s\", \"gemm\": \"%s\", \"graph\": %s, \"peer\": %s, \"leaf_group\": %d, \"repeats\": %d, \"warmup_steps\": %d, \"times_ms\": [",
                static_cast<long long>(o.rows), o.hidden, dpmlp::Standardizer::features(o.cols), o.steps, size,
                devices, dpmlp::platform_name<ExecSpace>(), ExecSpace::name(), Comm::name(), o.reduction.c_str(),
                dpmlp::engine_name(multi.engine), dpmlp::kernel_name(multi.kernel),
                multi.engine != dpmlp::Engine::layered ? "none" : dpmlp::linalg::backend_name(dpmlp::linalg::default_backend<ExecSpace>(o.reduction == "reproducible")),
                o.graph ? "true" : "false", o.peer ? "true" : "false", multi.leaf_group, o.repeats, o.warmup);
    for (std::size_t i = 0; i < multi.ms.size(); ++i) std::printf("%s%.3f", i ? ", " : "", multi.ms[i]);
    std::printf("], \"median_ms\": %.3f, \"prep_ms\": %.3f, \"first_loss\": %.6f, \"last_loss\": %.6f, "
                "\"single_last_loss\": %.6f, \"max_dparam\": %.3e, \"params_digest\": \"%s\", \"check\": \"%s\"}\n",
                median(multi.ms), multi.prep_ms, multi.last.first_loss, multi.last.last_loss, single_last, drift,
                dpmlp::hex16(dpmlp::fnv1a64(multi.params.data(), multi.params.size() * sizeof(float))).c_str(),
                !o.check ? "skipped" : pass ? "pass" : "fail");
    std::fflush(stdout);
  }
  return pass ? 0 : 1;
}

template <class Comm>
int breakdown(const Options& o) {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int features = dpmlp::Standardizer::features(o.cols);
  dpmlp::TrainerOptions topt = trainer_options(o);
  topt.cuda_graph = false;  // the pieces are timed one by one; step_us sets it per measurement
  const dpmlp::Sgd sgd(o.rate);
  dpmlp::Mlp<float, Memory> model({features, o.hidden, 1});
  model.init_jax(dpmlp::random::PRNGKey(1), 0.1f);
  ExecSpace space;
  dpmlp::DataParallelTrainer<ExecSpace, Comm> trainer(comm, model, o.rows, sgd, topt);
  const auto data = seed::make(space, trainer.shard(), o.cols);
  trainer.set_data(data.x, data.y);
  // The trainer's engine, kernel included (the tensor engine picks its kernel from the global block count).
  dpmlp::detail::BlockEngine<ExecSpace, float> engine(model, trainer.shard().rows(), trainer.engine_plan());
  dpmlp::BlockTreeReducer<ExecSpace, float> reducer(trainer.plan(), engine.width(), topt.reduction);
  const int n = std::max(o.steps, 20);
  auto per_call_us = [&](auto&& f) {
    f();
    space.fence();
    MPI_Barrier(comm);
    const double t0 = seed::now_ms();
    for (int i = 0; i < n; ++i) f();
    space.fence();
    MPI_Barrier(comm);
    return (seed::now_ms() - t0) * 1000.0 / n;
  };
  const double engine_us = per_call_us([&] { engine.compute(space, data.x, data.y, 1e-5f); });
  const double local_us = per_call_us([&] { reducer.reduce_local(space, engine.partials()); });
  const double reduce_us = per_call_us([&] { reducer.reduce(space, engine.partials(), trainer.communicator()); });
  const double combine_us = per_call_us([&] { reducer.combine_apply(space, [] KOKKOS_FUNCTION(std::int64_t, float) {}); });
  // The peer exchange's one kernel (tree, exchange, combine; no update), where --peer asks for it.
  double peer_us = -1;
  if (o.peer && size > 1) {
    const auto peer = dpmlp::backend::make_peer_exchange(comm, reducer, topt.peer_timeout_s);
    if (peer) {
      peer_us = per_call_us([&] {
        dpmlp::backend::reduce_apply_peer(space, reducer, engine.partials(), *peer,
                                          [] KOKKOS_FUNCTION(std::int64_t, float) {});
      });
    }
  }
  const double empty_us = per_call_us([&] {
    Kokkos::parallel_for("dpmlp::bench::empty", Kokkos::RangePolicy<ExecSpace>(space, 0, 1),
                         KOKKOS_LAMBDA(const int) {});
  });
  auto step_us = [&](bool graph) {
    topt.cuda_graph = graph;
    auto m = model.clone();
    dpmlp::DataParallelTrainer<ExecSpace, Comm> t(comm, m, o.rows, sgd, topt);
    t.set_data(data.x, data.y);
    t.train(5);
    MPI_Barrier(comm);
    const double t0 = seed::now_ms();
    t.train(n);
    MPI_Barrier(comm);
    return (seed::now_ms() - t0) * 1000.0 / n;
  };
  const double plain_us = step_us(false), graph_us = step_us(true);
  if (rank == 0) {
    std::printf("{\"bench\": \"dpmlp_breakdown\", \"rows\": %lld, \"hidden\": %d, \"ranks\": %d, \"comm\": \"%s\", "
                "\"reduction\": \"%s\", \"peer\": %s, \"engine\": \"%s\", \"leaf_group\": %d, \"local_blocks\": %lld, \"width\": %lld, \"calls\": %d, "
                "\"engine_us\": %.2f, \"reduce_local_us\": %.2f, \"reduce_us\": %.2f, \"combine_us\": %.2f, \"peer_us\": %.2f, "
                "\"empty_launch_us\": %.2f, \"step_us\": %.2f, \"graph_step_us\": %.2f}\n",
                static_cast<long long>(o.rows), o.hidden, size, Comm::name(), o.reduction.c_str(),
                o.peer ? "true" : "false", dpmlp::engine_name(trainer.engine()), trainer.leaf_group(),
                static_cast<long long>(trainer.shard().local_blocks()),
                static_cast<long long>(engine.width()), n, engine_us, local_us, reduce_us, combine_us, peer_us, empty_us,
                plain_us, graph_us);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

// The command line is read before Kokkos starts: --help (printed by rank 0) and a bad option start no device.
int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    Options o;
    const cli::Parser parser = command_line(o);
    if (cli::read_command_line(parser, argc, argv, MPI_COMM_WORLD, [&] { check(o); })) {
      dpmlp::initialize_kokkos_for_rank(MPI_COMM_WORLD);
      if (o.comm == "mpi") {
        code = o.breakdown ? breakdown<dpmlp::MpiCommunicator>(o) : bench<dpmlp::MpiCommunicator>(o);
      }
#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
      else if (o.comm == "nccl") {
        code = o.breakdown ? breakdown<dpmlp::NcclCommunicator>(o) : bench<dpmlp::NcclCommunicator>(o);
      }
#endif
      else {
        throw dpmlp::InputError("--comm " + o.comm + " is not available in this build");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_bench: error: %s\n", e.what());
    code = 2;
  }
  if (Kokkos::is_initialized()) Kokkos::finalize();
  MPI_Finalize();
  return code;
}
