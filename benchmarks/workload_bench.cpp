// SPDX-License-Identifier: BSD-3-Clause
// workload_bench: times dpmlp training of any MLP on a synthetic regression problem, full batch or in
// mini-batch epochs, under mpirun (the rank count is mpirun's -np).
//
//   mpirun -np <ranks> workload_bench --widths 32,256,256,256,1 [OPTION]...   (--help lists the options)
//
// The problem, the same for every rank count and drawn on the device with JAX's PRNG (dpmlp::random), each rank
// drawing only its shard's rows, so benchmarks/anchors/workload_jax.py can draw the very same numbers:
//   kx, kp = split(PRNGKey(0), 2)
//   x = normal(kx, (rows, inputs))                          rows x inputs
//   P = normal(kp, (inputs, outputs)) / sqrt(inputs)        a fixed random projection
//   y = tanh(x P)                                           rows x outputs, smooth in x, so the loss can fall
// The model starts from LeCun-normal weights, W_l = normal(split(PRNGKey(1), layers)[l], (w_l, w_l+1)) /
// sqrt(w_l), biases zero (Mlp::init_jax with scale 1, then each layer scaled): with Mlp::init_jax's default
// scale of 0.1, the output of a 256-wide layer is 1.6 times as large as its input, and SGD at the seed's rate
// diverges on [32,256,256,256,1] in three steps.
//
// Full mode: `steps` steps of DataParallelTrainer::train a repeat. Epoch mode: train_epochs(epochs, batch,
// seed) a repeat. Each repeat is a fresh trainer from the same initial parameters over the same data (so its
// losses and final parameters do not depend on the repeat count). Full mode: after a warm-up run on a
// throwaway trainer, a repeat's time runs from a barrier after set_data to a barrier after the run (which
// fences), so it includes what the library does on the first steps of a trainer (a CUDA graph's capture), as
// benchmarks/train_bench times it. Epoch mode: the repeat's trainer first runs `warmup` epochs (default 2:
// the first epoch of a batch size warms up, the second captures the epoch's CUDA graph), and the timed epochs
// follow, as the epochs of a long training run do.
//
// Prints one JSON line (rank 0): the configuration, the plan the trainer chose, every repeat's time, their
// median, the per-100-steps or per-epoch time, the last repeat's first and last loss (full mode: the whole
// data's; epoch mode: the first and the last batch's), the FNV-1a digest of the trained parameters' bytes
// (compare runs of different rank counts or builds bit for bit), and the check: "pass" when the loss fell
// and is finite. A diverged run (TrainingError) is a "fail" with the error in the line.
#include <dpmlp/dpmlp.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "../examples/cli.hpp"
#include "json_string.hpp"

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using Memory = ExecSpace::memory_space;

struct Options {
  std::vector<int> widths = {32, 256, 256, 256, 1};
  std::string widths_text = "32,256,256,256,1";
  std::string activation = "relu", mode = "full", optimizer = "sgd", precision = "float";
  std::string reduction = "reproducible";
  std::string comm = dpmlp::default_communicator_t<ExecSpace>::name();
  std::int64_t rows = 1 << 20, batch = 4096, block_rows = 0;
  int steps = 100, epochs = 1, repeats = 3, warmup = -1;  // warmup -1: 5 steps (full) or 1 epoch (epoch)
  double rate = 0;                                        // 0: 0.02 (sgd), 0.001 (adam)
  std::uint64_t seed = 0;
  dpmlp::Engine engine = dpmlp::Engine::automatic;
  std::string gemm = "default";
  dpmlp::Toggle split_operands = dpmlp::Toggle::automatic;
  dpmlp::Toggle gemm_3xfp16 = dpmlp::Toggle::automatic;
  bool graph = false, allow_cpu = false;
};

#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
constexpr const char* kComms = "nccl|mpi";
#else
constexpr const char* kComms = "mpi";
#endif

// "32,256,1" -> {32, 256, 1}; anything but positive integers separated by commas is an InputError.
std::vector<int> parse_widths(const std::string& text) {
  std::vector<int> widths;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0 || v > (1 << 20)) {
      throw dpmlp::InputError("--widths: '" + item + "' is not a positive width (in '" + text + "')");
    }
    widths.push_back(static_cast<int>(v));
  }
  if (widths.size() < 2) throw dpmlp::InputError("--widths needs at least inputs,outputs (got '" + text + "')");
  return widths;
}

dpmlp::Activation activation_from_name(const std::string& name) {
  for (dpmlp::Activation a : {dpmlp::Activation::relu, dpmlp::Activation::tanh, dpmlp::Activation::identity}) {
    if (name == dpmlp::activation_name(a)) return a;
  }
  throw dpmlp::InputError("--activation: relu, tanh or identity, not '" + name + "'");
}

// The command line, bound to o: the one table that parse() reads and --help prints.
cli::Parser command_line(Options& o) {
  cli::Parser p("workload_bench", "[OPTION]...",
                "Time dpmlp training of an MLP of any widths on a synthetic regression problem (y = tanh of a "
                "fixed random projection of normal x, drawn on the device), full batch or in mini-batch epochs, on "
                "1 or more ranks (mpirun -np <ranks> workload_bench), and print one JSON line: every repeat's time, "
                "the median, the losses, the trained parameters' digest and a check that the loss fell.");
  p.custom("--widths", "W0,W1,...", o.widths_text, "the model: inputs, hidden layers, outputs",
           [&o](const cli::Args& a, int& i) {
             o.widths_text = a.value(i);
             o.widths = parse_widths(o.widths_text);
           });
  p.value("--activation", "relu|tanh|identity", o.activation, "the hidden layers' activation");
  p.value("--rows", "N", o.rows, "rows of the data, over all ranks");
  p.value("--mode", "full|epoch", o.mode,
          "full: full-batch steps (DataParallelTrainer::train); epoch: mini-batch epochs (train_epochs)");
  p.value("--steps", "S", o.steps, "full mode: steps a repeat");
  p.value("--epochs", "E", o.epochs, "epoch mode: epochs a repeat");
  p.value("--batch", "B", o.batch, "epoch mode: rows a mini-batch (the last batch of an epoch may be shorter)");
  p.value("--seed", "S", o.seed, "epoch mode: the seed of the epochs' row order");
  p.value("--optimizer", "sgd|adam", o.optimizer, "dpmlp::Sgd or dpmlp::Adam");
  p.value("--rate", "R", o.rate, "the learning rate", "0.02 for sgd, 0.001 for adam");
  p.value("--precision", "float|double", o.precision, "the trainer's scalar type (Mlp<float> or Mlp<double>)");
  p.value("--reduction", "reproducible|fast", o.reduction,
          "the gradient sum: reproducible (the same bits at any rank count) or fast (the allreduce's order)");
  p.custom("--engine", "automatic|fused|tensor|layered|host", dpmlp::engine_name(o.engine), "the per-block gradient engine",
           [&o](const cli::Args& a, int& i) { o.engine = dpmlp::engine_from_name(a.value(i)); });
  p.value("--block-rows", "B", o.block_rows, "rows per reduction block; 0 lets the trainer choose");
  p.value("--gemm", "default|cutlass|cublaslt|cublas|portable|eigen", o.gemm,
          "the layered engine's GEMM backend (default: the space's, linalg::default_backend)");
  p.custom("--split-operands", "automatic|off|on", dpmlp::toggle_name(o.split_operands),
           "the layered engine's GEMMs over operands split in memory (EngineOptions::split_operands)",
           [&o](const cli::Args& a, int& i) { o.split_operands = dpmlp::toggle_from_name(a.value(i)); });
  p.custom("--gemm-3xfp16", "automatic|off|on", dpmlp::toggle_name(o.gemm_3xfp16),
           "the layered engine's cutlass GEMMs on the block-scaled 3xFP16 kernels (EngineOptions::gemm_3xfp16)",
           [&o](const cli::Args& a, int& i) { o.gemm_3xfp16 = dpmlp::toggle_from_name(a.value(i)); });
  p.flag("--graph", o.graph,
         "replay steps as a CUDA graph where the trainer can (TrainerOptions::cuda_graph: CUDA, NCCL, sgd)");
  p.value("--repeats", "R", o.repeats, "timed repeats, each a fresh trainer from the same parameters");
  p.value("--warmup", "W", o.warmup, "warm-up: steps of a throwaway run (full), or epochs each repeat runs before its timed ones (epoch); 0: none",
          "5 steps or 1 epoch");
  p.value("--comm", kComms, o.comm, "the communicator");
  p.flag("--allow-cpu-devices", o.allow_cpu, "count each rank as one CPU device (CPU builds)");
  p.example("mpirun -np 1 workload_bench --widths 32,256,256,256,1 --rows 1048576 --graph",
            "100 full-batch SGD steps of a three-hidden-layer model on a million rows, one GPU");
  p.example("mpirun -np 1 workload_bench --widths 32,32,1 --mode epoch --batch 4096 --graph",
            "one epoch of 256 mini-batch steps");
  p.example("mpirun -np 2 workload_bench --widths 32,64,1 --rows 2000 --steps 3 --allow-cpu-devices",
            "a small run on two CPU ranks");
  p.note("Exit status: 0 the check passed, 1 it failed (the loss did not fall, or training diverged), 2 bad "
         "input or a runtime error (an engine that refuses the options, double among them, says why).");
  return p;
}

// The checks that need every option read.
void check(const Options& o) {
  if (o.rows <= 0 || o.steps <= 0 || o.epochs <= 0 || o.batch <= 0 || o.repeats <= 0) {
    throw dpmlp::InputError("--rows, --steps, --epochs, --batch and --repeats must be positive");
  }
  if (o.block_rows < 0) throw dpmlp::InputError("--block-rows must not be negative");
  if (o.rate < 0 || !std::isfinite(o.rate)) throw dpmlp::InputError("--rate must be positive");
  activation_from_name(o.activation);
  if (o.mode != "full" && o.mode != "epoch") throw dpmlp::InputError("--mode: full or epoch, not '" + o.mode + "'");
  if (o.mode == "epoch" && o.batch > o.rows) throw dpmlp::InputError("--batch must not exceed --rows");
  if (o.optimizer != "sgd" && o.optimizer != "adam") {
    throw dpmlp::InputError("--optimizer: sgd or adam, not '" + o.optimizer + "'");
  }
  if (o.precision != "float" && o.precision != "double") {
    throw dpmlp::InputError("--precision: float or double, not '" + o.precision + "'");
  }
  if (o.reduction != "reproducible" && o.reduction != "fast") throw dpmlp::InputError("--reduction: reproducible|fast");
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A number for JSON: non-finite values as null (JSON has no NaN).
std::string json_number(double v, const char* format = "%.6g") {
  if (!std::isfinite(v)) return "null";
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

template <class Scalar>
using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, Memory>;

template <class Scalar>
struct Data {
  Matrix<Scalar> x, y;
};

// Rows [shard.first_row, shard.end_row) of the problem (see the top of this file). Each element of a draw
// depends on its key and flat index alone, so a rank's rows are its slice of the one global draw.
template <class Scalar>
Data<Scalar> make_data(const ExecSpace& space, const dpmlp::Shard& shard, int inputs, int outputs) {
  namespace rnd = dpmlp::random;
  const auto keys = rnd::split(rnd::PRNGKey(0), 2);
  const std::int64_t rows = shard.rows();
  Data<Scalar> d;
  d.x = Matrix<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "workload::x"), rows, inputs);
  d.y = Matrix<Scalar>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "workload::y"), rows, outputs);
  Kokkos::View<Scalar*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> x_flat(d.x.data(), rows * inputs);
  rnd::normal(space, keys[0], x_flat, static_cast<std::uint64_t>(shard.first_row) * inputs);
  Kokkos::View<Scalar*, Memory> projection("workload::projection", std::size_t(inputs) * outputs);
  rnd::normal(space, keys[1], projection, 0);
  const Matrix<Scalar> x = d.x, y = d.y;
  const Scalar scale = static_cast<Scalar>(1.0 / std::sqrt(static_cast<double>(inputs)));
  Kokkos::parallel_for(
      "workload::targets", Kokkos::RangePolicy<ExecSpace>(space, 0, rows * outputs),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t r = i / outputs;
        const int j = static_cast<int>(i % outputs);
        Scalar z = 0;
        for (int k = 0; k < inputs; ++k) z += x(r, k) * projection(std::int64_t(k) * outputs + j);
        y(r, j) = dpmlp::compat::tanh(z * scale);
      });
  dpmlp::compat::fence(space, "workload::make_data");
  return d;
}

// LeCun-normal initial parameters (see the top of this file), scaled on the host: they are few.
template <class Scalar>
dpmlp::Mlp<Scalar, Memory> initial_model(const Options& o) {
  dpmlp::Mlp<Scalar, Memory> model(o.widths, activation_from_name(o.activation));
  model.init_jax(dpmlp::random::PRNGKey(1), Scalar(1));
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
  for (int l = 0; l < model.layers(); ++l) {
    const Scalar s = static_cast<Scalar>(1.0 / std::sqrt(static_cast<double>(o.widths[l])));
    for (std::size_t i = model.weight_offset(l); i < model.bias_offset(l); ++i) h(i) *= s;
  }
  Kokkos::deep_copy(model.params(), h);
  return model;
}

dpmlp::TrainerOptions trainer_options(const Options& o) {
  dpmlp::TrainerOptions topt;
  topt.reduction = o.reduction == "fast" ? dpmlp::Reduction::fast : dpmlp::Reduction::reproducible;
  topt.block_rows = o.block_rows;
  topt.cuda_graph = o.graph;
  topt.engine = o.engine;
  topt.split_operands = o.split_operands;
  topt.gemm_3xfp16 = o.gemm_3xfp16;
  if (o.gemm != "default") {
    bool known = false;
    for (auto b : {dpmlp::linalg::Backend::eigen, dpmlp::linalg::Backend::cublas, dpmlp::linalg::Backend::portable,
                   dpmlp::linalg::Backend::cublaslt, dpmlp::linalg::Backend::cutlass}) {
      if (o.gemm == dpmlp::linalg::backend_name(b)) topt.gemm = b, known = true;
    }
    if (!known) throw dpmlp::InputError("--gemm: unknown backend '" + o.gemm + "'");
  }
  return topt;
}

struct Result {
  std::vector<double> ms;
  dpmlp::TrainResult last;
  std::string params_digest, error;
  dpmlp::EnginePlan plan;  // what the timed steps ran (in epoch mode, the batches' plan)
  std::int64_t steps = 0;
};

template <class Comm, class Optimizer, class Scalar>
Result time_runs(MPI_Comm comm, const Options& o, const Optimizer& optimizer) {
  using Trainer = dpmlp::DataParallelTrainer<ExecSpace, Comm, Optimizer, Scalar>;
  const dpmlp::TrainerOptions topt = trainer_options(o);
  const auto initial = initial_model<Scalar>(o);
  const bool epochs = o.mode == "epoch";
  const int warmup = o.warmup >= 0 ? o.warmup : epochs ? 2 : 5;
  Result res;
  res.steps = epochs ? o.epochs * ((o.rows + o.batch - 1) / o.batch) : o.steps;
  ExecSpace space;
  // The data, once: its shard is the same for every trainer over this communicator.
  auto model = initial.clone();
  Trainer first(comm, model, o.rows, optimizer, topt);
  const auto data = make_data<Scalar>(space, first.shard(), o.widths.front(), o.widths.back());
  res.plan = first.engine_plan();
  first.set_data(data.x, data.y);
  auto run = [&](Trainer& t, int count) {
    return epochs ? t.train_epochs(count, o.batch, o.seed) : t.train(count);
  };
  try {
    if (warmup > 0 && !epochs) run(first, warmup);
    for (int r = 0; r < o.repeats; ++r) {
      auto m = initial.clone();
      Trainer trainer(comm, m, o.rows, optimizer, topt);
      trainer.set_data(data.x, data.y);
      // Epoch mode times epochs in steady state, as a training run spends them: after `warmup` epochs of
      // the same trainer (the first epoch of a batch size warms up, the second captures the epoch graph).
      if (warmup > 0 && epochs) run(trainer, warmup);
      MPI_Barrier(comm);
      const double t0 = now_ms();
      res.last = run(trainer, epochs ? o.epochs : o.steps);
      MPI_Barrier(comm);
      res.ms.push_back(now_ms() - t0);
      if (epochs && trainer.batch_plan() != nullptr) res.plan = *trainer.batch_plan();
      if (r + 1 == o.repeats) res.params_digest = dpmlp::hex16(dpmlp::digest(m.params()));
    }
  } catch (const dpmlp::TrainingError& e) {
    // Every rank sees the same losses, so every rank throws it at the same step: no rank is left waiting.
    res.error = e.what();
    res.last.first_loss = res.last.last_loss = std::nan("");
  }
  return res;
}

template <class Comm, class Optimizer, class Scalar>
int bench(const Options& o, const Optimizer& optimizer) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int devices = dpmlp::count_physical_devices<ExecSpace>(MPI_COMM_WORLD, o.allow_cpu);
  const Result r = time_runs<Comm, Optimizer, Scalar>(MPI_COMM_WORLD, o, optimizer);
  const bool epochs = o.mode == "epoch";
  const bool pass = r.error.empty() && std::isfinite(r.last.first_loss) && std::isfinite(r.last.last_loss) &&
                    r.last.last_loss < r.last.first_loss;
  if (rank == 0) {
    const double med = r.ms.empty() ? std::nan("") : median(r.ms);
    std::string line = "{\"bench\": \"dpmlp_workload\", \"widths\": [";
    for (std::size_t i = 0; i < o.widths.size(); ++i) line += (i ? ", " : "") + std::to_string(o.widths[i]);
    line += "], \"activation\": " + json_string(o.activation) + ", \"rows\": " + std::to_string(o.rows) +
            ", \"mode\": " + json_string(o.mode) + ", \"batch\": " + std::to_string(epochs ? o.batch : o.rows) +
            ", \"steps\": " + std::to_string(r.steps) + ", \"epochs\": " + (epochs ? std::to_string(o.epochs) : "null") +
            ", \"optimizer\": " + json_string(o.optimizer) + ", \"rate\": " + json_number(optimizer.learning_rate) +
            ", \"precision\": " + json_string(o.precision) + ", \"ranks\": " + std::to_string(size) +
            ", \"devices\": " + std::to_string(devices) + ", \"platform\": " +
            json_string(dpmlp::platform_name<ExecSpace>()) + ", \"space\": " + json_string(ExecSpace::name()) +
            ", \"threads\": " + std::to_string(ExecSpace().concurrency()) +
            ", \"comm\": " + json_string(Comm::name()) + ", \"reduction\": " + json_string(o.reduction) +
            ", \"engine\": " + json_string(dpmlp::engine_name(r.plan.engine)) +
            ", \"kernel\": " + json_string(dpmlp::kernel_name(r.plan.kernel)) +
            ", \"gemm\": " + json_string(r.plan.engine == dpmlp::Engine::layered ? dpmlp::linalg::backend_name(r.plan.gemm) : "none") +
            ", \"gemm_wgmma\": " + (r.plan.gemm_wgmma ? "true" : "false") +
            ", \"gemm_split\": " + (r.plan.gemm_split ? "true" : "false") +
            ", \"gemm_f16x3\": " + (r.plan.gemm_f16x3 ? "true" : "false") +
            ", \"block_rows\": " + std::to_string(r.plan.block_rows) + ", \"graph\": " + (o.graph ? "true" : "false") +
            ", \"repeats\": " + std::to_string(o.repeats) + ", \"times_ms\": [";
    for (std::size_t i = 0; i < r.ms.size(); ++i) line += (i ? ", " : "") + json_number(r.ms[i], "%.3f");
    line += "], \"median_ms\": " + json_number(med, "%.3f");
    if (epochs) {
      line += ", \"ms_per_epoch\": " + json_number(med / o.epochs, "%.3f");
    } else {
      line += ", \"ms_per_100_steps\": " + json_number(med * 100.0 / o.steps, "%.3f");
    }
    line += ", \"first_loss\": " + json_number(r.last.first_loss, "%.8g") +
            ", \"last_loss\": " + json_number(r.last.last_loss, "%.8g") +
            ", \"params_digest\": " + (r.params_digest.empty() ? "null" : json_string(r.params_digest)) +
            ", \"check\": " + (pass ? "\"pass\"" : "\"fail\"");
    if (!r.error.empty()) line += ", \"error\": " + json_string(r.error);
    std::printf("%s}\n", line.c_str());
    std::fflush(stdout);
  }
  return pass ? 0 : 1;
}

template <class Comm, class Optimizer>
int by_precision(const Options& o, const Optimizer& optimizer) {
  return o.precision == "double" ? bench<Comm, Optimizer, double>(o, optimizer)
                                 : bench<Comm, Optimizer, float>(o, optimizer);
}

template <class Comm>
int by_optimizer(const Options& o) {
  if (o.optimizer == "adam") return by_precision<Comm>(o, dpmlp::Adam(o.rate > 0 ? o.rate : 1e-3));
  return by_precision<Comm>(o, dpmlp::Sgd(o.rate > 0 ? o.rate : 0.02));
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
        code = by_optimizer<dpmlp::MpiCommunicator>(o);
      }
#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
      else if (o.comm == "nccl") {
        code = by_optimizer<dpmlp::NcclCommunicator>(o);
      }
#endif
      else {
        throw dpmlp::InputError("--comm " + o.comm + " is not available in this build");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "workload_bench: error: %s\n", e.what());
    code = 2;
  }
  if (Kokkos::is_initialized()) Kokkos::finalize();
  MPI_Finalize();
  return code;
}
