// SPDX-License-Identifier: BSD-3-Clause
// train_csv: regression on a numeric CSV file with dpmlp, data-parallel over MPI ranks.
//
//   mpirun -np N train_csv DATA.csv --target COLUMN [OPTION]...   (train_csv --help lists the options)
//
// What it does:
//   1. Rank 0 reads DATA.csv (dpmlp/csv.hpp: a header row, then numbers only) and splits its rows into train
//      and test with dpmlp::split_rows(rows, F, K), then holds out the validation rows among the training rows
//      (those split_rows(training rows, V, K + 1) holds out): deterministic for a seed, whatever the rank count.
//      Only rank 0 needs the file; each rank receives only its rows (MPI_Scatterv, with dpmlp's timeout).
//   2. Every column but the target is a feature. Features and target are standardized per column
//      (Standardizer column mode), with statistics fitted on the training rows of all ranks together (without
//      the validation rows) and applied to the validation and test rows. Any finite data give finite statistics; a value that would not be finite
//      standardized (in float, the training precision: a 1e300 in a test row) is refused on every rank,
//      naming its column and its line in DATA.csv.
//   3. An MLP (features -> H relu -> 1) starts from JAX's initialization with PRNGKey(K), scaled 0.1, and
//      trains data-parallel on the training rows: each rank holds its shard (trainer.shard()); the
//      gradient is reduced across ranks every step. Rank 0 prints progress (dpmlp::ProgressBar); the loss
//      shown is the MSE of the standardized target. The validation loss (dpmlp::Validation) is evaluated every
//      epoch (every step at full batch) or every --validate-every steps; training stops when it has not
//      improved for --patience evaluations and ends with the best parameters (dpmlp::EarlyStopping with
//      restore_best; --restore-best no keeps the last).
//   4. It prints `train mse <g> test mse <g>`: the mean squared errors in the target's original units (past
//      the double range, e.g. a target of 1e200, printed from their logarithm: 7.1e+398).
//
// --batch B: mini-batches of B training rows (DataParallelTrainer::train_epochs): each epoch visits every
//   training row once, in an order drawn from --seed and the epoch alone (the same batches at any rank count);
//   training runs E epochs (--epochs E; default: as many whole epochs as it takes to make at least S steps).
//   B = 0 (the default) or B >= the number of training rows is full batch: every step uses all training rows.
// --validation-fraction V (0.15): the share of the training rows held out; 0: none, no early stopping, and
//   exactly --steps steps. --patience P (100): evaluations without improvement before stopping; 0: never stop.
// --checkpoint FILE: if FILE exists, training resumes from it (parameters, optimizer state, step count), and
//   FILE is written at the end (after early stopping's restore). Resume with the same data, --target, --hidden,
//   --optimizer, --seed, --test-fraction and --validation-fraction: the standardization is recomputed from the
//   data and the split, not stored in FILE. Each run stops early on its own (--patience 0: exactly as one run).
// --progress: rank 0's progress display (dpmlp::ProgressBar). auto: a live line when stdout is a terminal
//   and the program was not started by an MPI launcher, plain lines otherwise (a pipe, a file, any mpirun:
//   OpenMPI gives the ranks a pseudo-terminal as stdout even when its own output goes to a log); bar: the
//   live line regardless, e.g. under mpirun on an interactive terminal; lines: plain lines; off: none.
// --write-split FILE: rank 0 writes the split as CSV (`row,set` with row = 0-based data row, set = train,
//   validation or test), e.g. for benchmarks/ols_reference.py.
// --export FILE: rank 0 writes the trained model as an ONNX file (dpmlp::save_onnx, in builds with dpmlp::onnx):
//   input "x" = the raw feature columns, in the CSV's order without the target; output "y" = the target in its
//   own units (the standardization of both is in the graph). The path is checked before training.
//
// Exit codes: 0 done, 2 bad input or a runtime error (the message is printed on every rank), 77 fewer than 2
// physical accelerators (CPU builds: pass --allow-cpu-devices to count each rank as one CPU device).
#include <dpmlp/callbacks.hpp>
#include <dpmlp/checkpoint.hpp>
#include <dpmlp/csv.hpp>
#include <dpmlp/dpmlp.hpp>
#ifdef DPMLP_HAVE_ONNX
#include <dpmlp/onnx.hpp>
#endif

#include "cli.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

// A named namespace, not an anonymous one: CUDA's extended lambdas want enclosing functions with linkage.
namespace train_csv {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using Memory = ExecSpace::memory_space;
using HostMatrix = Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace>;
using DeviceMatrix = Kokkos::View<double**, Kokkos::LayoutRight, Memory>;
using FloatMatrix = Kokkos::View<float**, Kokkos::LayoutRight, Memory>;

struct Options {
  std::string data, target, optimizer = "adam", checkpoint, write_split, progress = "auto", export_path;
  std::string restore_best = "yes";
  int hidden = 32, steps = 500;
  long long batch = 0;
  int epochs = 0, patience = 100;
  long long validate_every = 0;
  double rate = 0, momentum = 0, test_fraction = 0.2, validation_fraction = 0.15;
  unsigned long long seed = 0;
  bool allow_cpu = false, rate_given = false;
};

// The command line, bound to o: the one table that parse() reads and --help prints.
cli::Parser command_line(Options& o) {
  cli::Parser p("train_csv", "DATA.csv --target COLUMN [OPTION]...",
                "Fit an MLP (features -> H relu -> 1) to one column of a numeric CSV file, data-parallel over the "
                "MPI ranks (mpirun -np N train_csv ...), and print the train and test mean squared errors.");
  p.operands([&o](const std::string& a) {
    if (!o.data.empty()) throw dpmlp::InputError("more than one data file ('" + o.data + "', '" + a + "')");
    o.data = a;
  });
  p.value("--target", "COLUMN", o.target, "the column to predict (required); every other column is a feature");
  p.value("--hidden", "H", o.hidden, "hidden units");
  p.value("--steps", "S", o.steps, "training steps (with --batch: at least S, in whole epochs)");
  p.value("--batch", "B", o.batch, "rows per mini-batch; 0, or at least the training rows, is full batch");
  p.custom("--epochs", "E", "enough whole epochs for --steps", "epochs of mini-batches",
           [&o](const cli::Args& a, int& i) {
             o.epochs = a.int_value(i);
             if (o.epochs <= 0) throw dpmlp::InputError("--epochs must be positive");
           });
  p.value("--optimizer", "sgd|adam", o.optimizer, "the optimizer");
  // A flag of its own says whether --rate came: any value given (0 and -0 included) is checked, never
  // taken for "the default".
  p.custom("--rate", "R", "0.01 with adam, 0.05 with sgd", "learning rate", [&o](const cli::Args& a, int& i) {
    o.rate = a.real(i);
    o.rate_given = true;
  });
  p.value("--momentum", "M", o.momentum, "SGD momentum, in [0, 1)");
  p.value("--test-fraction", "F", o.test_fraction, "the share of rows held out for the test error, in [0, 1)");
  p.value("--validation-fraction", "V", o.validation_fraction,
          "the share of the training rows held out for validation (early stopping), in [0, 1); 0: none");
  p.value("--patience", "P", o.patience,
          "stop when the validation loss has not improved for P evaluations; 0: never stop early");
  p.custom("--validate-every", "N", "every epoch (full batch: every step)", "evaluate the validation loss every N steps",
           [&o](const cli::Args& a, int& i) {
             o.validate_every = a.integer_as<long long>(i);
             if (o.validate_every <= 0) throw dpmlp::InputError("--validate-every must be positive");
           });
  p.value("--restore-best", "yes|no", o.restore_best,
          "with early stopping: end with the parameters of the best validation loss (yes) or the last step's (no)");
  p.value("--seed", "K", o.seed, "seeds the splits, the initial parameters and the order of the batches");
  p.value("--checkpoint", "FILE", o.checkpoint, "resume from FILE if it exists; write FILE at the end");
  p.value("--write-split", "FILE", o.write_split, "write the train/test split to FILE as CSV (row,set)");
  p.value("--export", "FILE", o.export_path,
          "write the trained model to FILE as ONNX: raw feature columns in (the CSV's order, without the target), "
          "the target out, the standardization in the graph",
          "");
  p.value("--progress", "auto|bar|lines|off", o.progress,
          "rank 0's progress: a live line (bar), plain lines, or none; auto: bar on a terminal, lines on a pipe, "
          "a file or under an MPI launcher");
  p.flag("--allow-cpu-devices", o.allow_cpu, "count each rank as one CPU device (CPU builds)");
  p.example("mpirun -np 2 train_csv houses.csv --target price",
            "predict price from the other columns on 2 GPUs: up to 500 full-batch Adam steps, stopped early on "
            "the validation loss (15% of the training rows), ending with the best parameters");
  p.example("mpirun -np 2 train_csv data.csv --target y --validation-fraction 0 --steps 300",
            "no validation set and no early stopping: exactly 300 steps on all training rows");
  p.example("mpirun -np 2 train_csv data.csv --target y --batch 64 > train.log",
            "mini-batches of 64 rows; the log gets plain progress lines");
  p.note("Exit status: 0 done, 2 bad input or a runtime error (the message is printed on every rank), 77 fewer "
         "than 2 physical accelerators (CPU builds: pass --allow-cpu-devices).");
  return p;
}

// The widest layer the errors' evaluator is built for (sum_squared_error).
constexpr int kMaxWidth = 2048;

// The checks that need every option read.
void check(Options& o) {
  if (o.data.empty()) {
    throw dpmlp::InputError("no data file (usage: train_csv DATA.csv --target COLUMN [OPTION]...; see --help)");
  }
  if (o.target.empty()) throw dpmlp::InputError("--target COLUMN is required (the column to predict)");
  if (o.hidden <= 0) throw dpmlp::InputError("--hidden must be positive");
  // The errors are computed by the model's evaluator, which holds a row's activations in registers; it is
  // built for layers up to kMaxWidth units. Refused here, before any data is read or any step is taken.
  if (o.hidden > kMaxWidth) {
    throw dpmlp::InputError("--hidden " + std::to_string(o.hidden) + ": train_csv evaluates models up to " +
                            std::to_string(kMaxWidth) + " units wide");
  }
  if (o.steps <= 0) throw dpmlp::InputError("--steps must be positive");
  if (o.batch < 0) throw dpmlp::InputError("--batch must not be negative");
  if (o.optimizer != "sgd" && o.optimizer != "adam") {
    throw dpmlp::InputError("--optimizer must be sgd or adam, got '" + o.optimizer + "'");
  }
  if (!o.rate_given) o.rate = o.optimizer == "adam" ? 0.01 : 0.05;
  if (!(o.rate > 0) || !std::isfinite(o.rate)) {
    char given[32];
    std::snprintf(given, sizeof given, "%g", o.rate);
    throw dpmlp::InputError(std::string("--rate must be positive and finite, got ") + given);
  }
  if (!(o.momentum >= 0 && o.momentum < 1)) throw dpmlp::InputError("--momentum must be in [0, 1)");
  if (o.momentum != 0 && o.optimizer != "sgd") throw dpmlp::InputError("--momentum applies to --optimizer sgd only");
  if (!(o.test_fraction >= 0 && o.test_fraction < 1)) throw dpmlp::InputError("--test-fraction must be in [0, 1)");
  if (!(o.validation_fraction >= 0 && o.validation_fraction < 1)) {
    throw dpmlp::InputError("--validation-fraction must be in [0, 1)");
  }
  if (o.patience < 0) throw dpmlp::InputError("--patience must not be negative (0: no early stopping)");
  if (o.restore_best != "yes" && o.restore_best != "no") {
    throw dpmlp::InputError("--restore-best must be yes or no, got '" + o.restore_best + "'");
  }
  if (o.progress != "auto" && o.progress != "bar" && o.progress != "lines" && o.progress != "off") {
    throw dpmlp::InputError("--progress must be auto, bar, lines or off, got '" + o.progress + "'");
  }
#ifndef DPMLP_HAVE_ONNX
  if (!o.export_path.empty()) {
    throw dpmlp::InputError("--export: this train_csv was built without ONNX export (dpmlp::onnx is built where "
                            "ONNX and protobuf are found; Debian: libonnx-dev, libprotobuf-dev)");
  }
#endif
}

// --export FILE, before any training: FILE must not be a directory, and its directory must exist (the file
// itself is written at the end, through a temporary in that directory).
void check_export_path(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw dpmlp::InputError("--export " + path + ": is a directory");
  }
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw dpmlp::InputError("--export " + path + ": the directory '" + dir + "' does not exist");
  }
}

// What every rank knows about the data set after rank 0 has read it.
struct Layout {
  long long rows = 0, n_train = 0, n_test = 0;
  long long n_fit = 0, n_val = 0;  // the training rows: those the steps learn from, and those held out
  int cols = 0, target = -1;
  std::vector<std::string> columns;
};

void broadcast_string(std::string& s, MPI_Comm comm) {
  long long n = static_cast<long long>(s.size());
  dpmlp::timed_bcast(&n, 1, MPI_LONG_LONG, 0, comm, "MPI_Bcast (train_csv: a column name's length)");
  s.resize(static_cast<std::size_t>(n));
  if (n > 0) dpmlp::timed_bcast(&s[0], static_cast<int>(n), MPI_CHAR, 0, comm, "MPI_Bcast (train_csv: a column name)");
}

// Rank 0 sends each rank the rows `order[first_r .. end_r)` of `table` (every column, then the row's line
// number in the file as column `cols`: exact in a double); returns this rank's, cols + 1 wide.
HostMatrix scatter_rows(MPI_Comm comm, const dpmlp::CsvTable* table, const std::vector<std::int64_t>& order,
                        long long first, long long end, int cols) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  long long mine[2] = {first, end};
  std::vector<long long> ranges(2 * static_cast<std::size_t>(size));
  dpmlp::timed_gather(mine, 2, MPI_LONG_LONG, ranges.data(), 2, MPI_LONG_LONG, 0, comm,
                      "MPI_Gather (train_csv: the ranks' row ranges)");
  std::vector<int> counts(size, 0), displs(size, 0);
  std::vector<double> packed;
  std::string problem;
  if (rank == 0) {
    long long total = 0;
    for (int r = 0; r < size; ++r) {
      const long long n = (ranges[2 * r + 1] - ranges[2 * r]) * (cols + 1);
      if (n > INT_MAX || total > INT_MAX) {
        problem = "the data are too large to scatter with int counts (" + std::to_string(n) + " values for rank " +
                  std::to_string(r) + ")";
        break;
      }
      counts[r] = static_cast<int>(n);
      displs[r] = static_cast<int>(total);
      total += n;
    }
    if (problem.empty()) {
      packed.reserve(static_cast<std::size_t>(total));
      for (int r = 0; r < size; ++r) {
        for (long long i = ranges[2 * r]; i < ranges[2 * r + 1]; ++i) {
          const std::int64_t row = order[static_cast<std::size_t>(i)];
          for (int c = 0; c < cols; ++c) packed.push_back((*table)(row, c));
          packed.push_back(static_cast<double>(table->lines[static_cast<std::size_t>(row)]));
        }
      }
    }
  }
  dpmlp::agree(comm, problem);
  HostMatrix local("rows", static_cast<std::size_t>(end - first), static_cast<std::size_t>(cols) + 1);
  dpmlp::timed_scatterv(packed.data(), counts.data(), displs.data(), MPI_DOUBLE, local.data(),
                        static_cast<int>((end - first) * (cols + 1)), MPI_DOUBLE, 0, comm,
                        "MPI_Scatterv (train_csv: the rows)");
  return local;
}

// Columns [c0, c1) of m, as a LayoutRight View in Memory.
DeviceMatrix columns_to_device(const HostMatrix& m, int c0, int c1) {
  HostMatrix h("columns", m.extent(0), static_cast<std::size_t>(c1 - c0));
  for (std::size_t r = 0; r < m.extent(0); ++r) {
    for (int c = c0; c < c1; ++c) h(r, c - c0) = m(r, c);
  }
  DeviceMatrix d("columns", h.extent(0), h.extent(1));
  Kokkos::deep_copy(d, h);
  return d;
}

// One row's output, as the evaluator wants it (indexable with (j)).
struct Out1 {
  float* p;
  KOKKOS_INLINE_FUNCTION float& operator()(int j) const { return p[j]; }
};

// Sum over this rank's rows of (prediction - y)^2 in units of y_scale (the standardized target's units),
// with a model evaluator of MaxWidth. Computed there, not in y's own units, so that it cannot overflow for
// any finite y (a target of 1e200 has squared errors past the double range); the caller scales the mean.
// y is standardized as (y - mean) / scale, or as y / scale - mean / scale where the difference overflows
// (the Standardizer's rule; the test rows' values were checked finite by transform_columns).
template <int MaxWidth>
double sum_squared_error(const dpmlp::Mlp<float, Memory>& model, const FloatMatrix& x, const DeviceMatrix& y,
                         double y_mean, double y_scale) {
  const auto eval = model.evaluator<MaxWidth>();
  double sum = 0;
  Kokkos::parallel_reduce(
      "train_csv::sse", Kokkos::RangePolicy<ExecSpace>(0, static_cast<std::int64_t>(x.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t r, double& acc) {
        float out[1] = {0.0f};
        eval(Kokkos::subview(x, r, Kokkos::ALL), Out1{out});
        const double diff = y(r, 0) - y_mean;
        const double z = dpmlp::compat::isfinite(diff) ? diff / y_scale : y(r, 0) / y_scale - y_mean / y_scale;
        const double d = static_cast<double>(out[0]) - z;
        acc += d * d;
      },
      sum);
  return sum;
}

// "%g" of mean * scale^2 (a mean squared error in standardized units, back in the target's units), also
// where that is past the double range (a target of 1e200): then from its decimal logarithm.
std::string scaled_mse(double mean, double scale) {
  char text[64];
  const double value = mean * scale * scale;
  if (std::isfinite(value) || !std::isfinite(mean) || mean <= 0) {
    std::snprintf(text, sizeof text, "%g", value);
  } else {
    const double exponent10 = std::log10(mean) + 2 * std::log10(scale);
    const double whole = std::floor(exponent10);
    std::snprintf(text, sizeof text, "%ge+%.0f", std::pow(10.0, exponent10 - whole), whole);
  }
  return text;
}

double sum_squared_error(const dpmlp::Mlp<float, Memory>& model, const FloatMatrix& x, const DeviceMatrix& y,
                         double y_mean, double y_scale) {
  int widest = 0;
  for (int w : model.widths()) widest = std::max(widest, w);
  if (widest <= 256) return sum_squared_error<256>(model, x, y, y_mean, y_scale);
  if (widest <= kMaxWidth) return sum_squared_error<kMaxWidth>(model, x, y, y_mean, y_scale);
  throw dpmlp::InputError("train_csv evaluates models up to " + std::to_string(kMaxWidth) +
                          " units wide; this one has " + std::to_string(widest));
}

template <class Optimizer>
int run(const Options& o, const Optimizer& optimizer, int devices) {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ExecSpace space;

  // ---- 1. rank 0 reads and splits; everyone learns the layout
  dpmlp::CsvTable table;
  dpmlp::RowSplit split;
  std::vector<std::int64_t> fit_rows, val_rows;  // rank 0: the training rows the steps learn from; validation
  Layout L;
  dpmlp::all_or_none(comm, [&] {
    if (rank != 0) return;
    if (!o.export_path.empty()) check_export_path(o.export_path);
    table = dpmlp::read_csv(o.data);
    L.target = table.require_column(o.target);
    if (table.cols() < 2) throw dpmlp::InputError(o.data + ":1: the target is the only column; there are no features");
    split = dpmlp::split_rows(table.rows, o.test_fraction, o.seed);
    L.rows = table.rows;
    L.cols = table.cols();
    L.n_train = static_cast<long long>(split.train.size());
    L.n_test = static_cast<long long>(split.test.size());
    // The validation rows: those split_rows(training rows, V, K + 1) puts in its held-out part.
    const long long n_val = std::llround(o.validation_fraction * static_cast<double>(L.n_train));
    if (n_val >= L.n_train) {
      throw dpmlp::InputError("--validation-fraction " + std::to_string(o.validation_fraction) + " of " +
                              std::to_string(L.n_train) + " training rows leaves none to train on");
    }
    fit_rows = split.train;
    if (n_val > 0) {
      const dpmlp::RowSplit v = dpmlp::split_rows(L.n_train, o.validation_fraction, o.seed + 1);
      fit_rows.clear();
      for (auto i : v.train) fit_rows.push_back(split.train[static_cast<std::size_t>(i)]);
      for (auto i : v.test) val_rows.push_back(split.train[static_cast<std::size_t>(i)]);
    }
    L.n_fit = static_cast<long long>(fit_rows.size());
    L.n_val = static_cast<long long>(val_rows.size());
    L.columns = table.columns;
    if (!o.write_split.empty()) {
      // A FIFO here would block fopen on rank 0 while the others wait.
      dpmlp::require_regular_or_absent(o.write_split, "--write-split: ");
      std::FILE* f = std::fopen(o.write_split.c_str(), "w");
      if (!f) throw dpmlp::InputError("--write-split " + o.write_split + ": cannot open for writing");
      std::fprintf(f, "row,set\n");
      std::vector<int> set(static_cast<std::size_t>(table.rows), 0);  // 0 train, 1 validation, 2 test
      for (auto i : val_rows) set[static_cast<std::size_t>(i)] = 1;
      for (auto i : split.test) set[static_cast<std::size_t>(i)] = 2;
      const char* names[3] = {"train", "validation", "test"};
      for (long long i = 0; i < table.rows; ++i) {
        std::fprintf(f, "%lld,%s\n", i, names[set[static_cast<std::size_t>(i)]]);
      }
      if (std::fclose(f) != 0) throw dpmlp::InputError("--write-split " + o.write_split + ": write failed");
    }
  });
  long long meta[7] = {L.rows, L.n_train, L.n_test, L.cols, L.target, L.n_fit, L.n_val};
  dpmlp::timed_bcast(meta, 7, MPI_LONG_LONG, 0, comm, "MPI_Bcast (train_csv: the data set's shape)");
  L.rows = meta[0];
  L.n_train = meta[1];
  L.n_test = meta[2];
  L.cols = static_cast<int>(meta[3]);
  L.target = static_cast<int>(meta[4]);
  L.n_fit = meta[5];
  L.n_val = meta[6];
  L.columns.resize(static_cast<std::size_t>(L.cols));
  for (auto& name : L.columns) broadcast_string(name, comm);
  const int features = L.cols - 1;
  // The model's input layer is as wide as the features; the errors' evaluator holds up to kMaxWidth. Every
  // rank knows L.cols, so every rank refuses alike, before any training.
  if (features > kMaxWidth) {
    throw dpmlp::InputError(o.data + ":1: " + std::to_string(features) + " feature columns; train_csv evaluates " +
                            "models up to " + std::to_string(kMaxWidth) + " units wide");
  }

  // Mini-batches when --batch is below the training rows: whole epochs, at least --steps steps.
  const bool minibatch = o.batch > 0 && o.batch < L.n_fit;
  const long long per_epoch = minibatch ? (L.n_fit + o.batch - 1) / o.batch : 1;
  const long long epochs_ll = o.epochs > 0 ? o.epochs : (o.steps + per_epoch - 1) / per_epoch;
  if (minibatch && epochs_ll * per_epoch > INT_MAX) throw dpmlp::InputError("--epochs: too many steps");
  const int epochs = static_cast<int>(epochs_ll);

  // ---- 2. the trainer (it decides the shards), then each rank's rows
  // The model's allocation can fail on one rank alone (a rank with less free memory): every rank learns it.
  dpmlp::Mlp<float, Memory> model;
  dpmlp::all_or_none(comm, [&] {
    model = dpmlp::Mlp<float, Memory>({features, o.hidden, 1});
    model.init_jax(dpmlp::random::PRNGKey(o.seed), 0.1f);
  });
  using Trainer = dpmlp::DataParallelTrainer<ExecSpace, dpmlp::default_communicator_t<ExecSpace>, Optimizer>;
  Trainer trainer(comm, model, L.n_fit, optimizer);
  // The validation set: its own shards, on the device (dpmlp::Validation); every epoch (a full-batch step is
  // one), or every --validate-every steps.
  std::optional<dpmlp::Validation<Trainer>> validation;
  if (L.n_val > 0) {
    validation.emplace(trainer, L.n_val,
                       o.validate_every > 0 ? dpmlp::every_steps(o.validate_every) : dpmlp::every_epochs());
  }
  const dpmlp::Shard shard = trainer.shard();
  const long long val_first = validation ? validation->shard().first_row : 0;
  const long long val_end = validation ? validation->shard().end_row : 0;
  const long long test_first = L.n_test * rank / size, test_end = L.n_test * (rank + 1) / size;
  const HostMatrix train_rows =
      scatter_rows(comm, rank == 0 ? &table : nullptr, fit_rows, shard.first_row, shard.end_row, L.cols);
  const HostMatrix val_rows_here = scatter_rows(comm, rank == 0 ? &table : nullptr, val_rows, val_first, val_end, L.cols);
  const HostMatrix test_rows = scatter_rows(comm, rank == 0 ? &table : nullptr, split.test, test_first, test_end, L.cols);
  table = dpmlp::CsvTable();  // rank 0: the rows now live in the ranks' buffers

  // The target moves to the last column: features are columns [0, features), the target column `features`.
  auto target_last = [&](const HostMatrix& m) {
    HostMatrix out("reordered", m.extent(0), m.extent(1));
    for (std::size_t r = 0; r < m.extent(0); ++r) {
      int k = 0;
      for (int c = 0; c < L.cols; ++c) {
        if (c != L.target) out(r, k++) = m(r, c);
      }
      out(r, features) = m(r, L.target);
    }
    return out;
  };
  const HostMatrix train_all = target_last(train_rows), test_all = target_last(test_rows);
  const HostMatrix val_all = target_last(val_rows_here);
  const DeviceMatrix x_train = columns_to_device(train_all, 0, features);
  const DeviceMatrix y_train = columns_to_device(train_all, features, features + 1);
  const DeviceMatrix x_val = columns_to_device(val_all, 0, features);
  const DeviceMatrix y_val = columns_to_device(val_all, features, features + 1);
  const DeviceMatrix x_test = columns_to_device(test_all, 0, features);
  const DeviceMatrix y_test = columns_to_device(test_all, features, features + 1);
  // Each row's line in the file (the column scatter_rows appended), for messages about a row.
  auto lines_of = [&](const HostMatrix& m) {
    std::vector<long long> lines(m.extent(0));
    for (std::size_t r = 0; r < m.extent(0); ++r) lines[r] = static_cast<long long>(m(r, L.cols));
    return lines;
  };
  const std::vector<long long> train_lines = lines_of(train_rows), test_lines = lines_of(test_rows);
  const std::vector<long long> val_lines = lines_of(val_rows_here);
  // Messages name a column by its 1-based number and name in the file, and a row by its line, as the CSV
  // reader's do.
  auto column_label = [&](int file_column) {
    return [&L, file_column](int) {
      return "column " + std::to_string(file_column + 1) + " ('" +
             dpmlp::detail::csv::printable(L.columns[static_cast<std::size_t>(file_column)]) + "')";
    };
  };
  auto labels = [&](const std::vector<long long>& lines, const char* set) {
    dpmlp::Standardizer::Labels l;
    l.row = [&o, &lines, set](std::int64_t r) {
      return "line " + std::to_string(lines[static_cast<std::size_t>(r)]) + " of " + o.data + " (a " + set + " row)";
    };
    return l;
  };
  dpmlp::Standardizer::Labels x_train_labels = labels(train_lines, "training");
  dpmlp::Standardizer::Labels x_test_labels = labels(test_lines, "test");
  dpmlp::Standardizer::Labels x_val_labels = labels(val_lines, "validation");
  dpmlp::Standardizer::Labels y_train_labels = x_train_labels, y_test_labels = x_test_labels;
  dpmlp::Standardizer::Labels y_val_labels = x_val_labels;
  // Feature k is file column k, or k + 1 from the target on.
  x_train_labels.column = x_test_labels.column = x_val_labels.column = [&L, column_label](int k) {
    return column_label(k < L.target ? k : k + 1)(k);
  };
  y_train_labels.column = y_test_labels.column = y_val_labels.column = column_label(L.target);

  // ---- 3. standardize: fit on the training rows of all ranks (without the validation rows), apply to train,
  // validation and test
  // Any finite data gives finite statistics; a value that would not be finite standardized into float (in
  // the training rows or the test rows, the target included) is refused on every rank, naming its line.
  dpmlp::Standardizer sx, sy;
  sx.fit_columns(space, x_train, comm, x_train_labels);
  sy.fit_columns(space, y_train, comm, y_train_labels);
  FloatMatrix fx_train("x_train", x_train.extent(0), features), fy_train("y_train", y_train.extent(0), 1);
  FloatMatrix fx_test("x_test", x_test.extent(0), features), fy_test("y_test", y_test.extent(0), 1);
  FloatMatrix fx_val("x_val", x_val.extent(0), features), fy_val("y_val", y_val.extent(0), 1);
  sx.transform_columns(space, x_train, fx_train, comm, x_train_labels);
  sy.transform_columns(space, y_train, fy_train, comm, y_train_labels);
  sx.transform_columns(space, x_val, fx_val, comm, x_val_labels);
  sy.transform_columns(space, y_val, fy_val, comm, y_val_labels);
  sx.transform_columns(space, x_test, fx_test, comm, x_test_labels);
  sy.transform_columns(space, y_test, fy_test, comm, y_test_labels);
  const double y_mean = sy.column_mean()[0], y_scale = sy.column_scale()[0];
  trainer.set_data(fx_train, fy_train);
  if (validation) validation->set_data(fx_val, fy_val);

  // ---- 4. train (resuming from the checkpoint if there is one)
  int exists = 0;
  if (rank == 0 && !o.checkpoint.empty()) exists = access(o.checkpoint.c_str(), F_OK) == 0 ? 1 : 0;
  dpmlp::timed_bcast(&exists, 1, MPI_INT, 0, comm, "MPI_Bcast (train_csv: whether the checkpoint exists)");
  if (exists) dpmlp::load_checkpoint(trainer, o.checkpoint);
  if (rank == 0) {
    std::printf("# train_csv: %s: %lld rows, %d features, target '%s'; train %lld rows, test %lld (seed %llu)",
                o.data.c_str(), L.rows, features, o.target.c_str(), L.n_train, L.n_test, o.seed);
    if (L.n_val > 0) std::printf("; %lld of the training rows held out for validation", L.n_val);
    std::printf("\n");
    const std::string batching =
        minibatch ? "mini-batches of " + std::to_string(o.batch) + " rows, " + std::to_string(epochs) + " epochs of " +
                        std::to_string(per_epoch) + " steps"
                  : std::string("full batch");
    std::printf("# model %d-%d-1 relu, %s rate %g%s, %s; %d rank%s on %d %s device%s (%s)\n", features,
                o.hidden, o.optimizer.c_str(), o.rate,
                o.momentum != 0 ? (" momentum " + std::to_string(o.momentum)).c_str() : "", batching.c_str(), size,
                size == 1 ? "" : "s", devices, dpmlp::platform_name<ExecSpace>(), devices == 1 ? "" : "s",
                ExecSpace::name());
    if (o.allow_cpu && dpmlp::is_host_space<ExecSpace>()) {
      std::printf("# --allow-cpu-devices: each rank counts as one CPU device\n");
    }
    if (exists) {
      std::printf("# resumed from %s at step %lld\n", o.checkpoint.c_str(), static_cast<long long>(trainer.steps_done()));
    }
    std::printf("# loss: MSE of the standardized target\n");
    if (L.n_val > 0) {
      const std::string when = o.validate_every > 0 ? "every " + std::to_string(o.validate_every) + " steps"
                                : minibatch           ? std::string("every epoch")
                                                      : std::string("every step");
      if (o.patience > 0) {
        std::printf("# early stopping: validation loss %s, patience %d, %s\n", when.c_str(), o.patience,
                    o.restore_best == "yes" ? "ending with the best parameters" : "ending with the last parameters");
      } else {
        std::printf("# validation loss %s; no early stopping (--patience 0)\n", when.c_str());
      }
    }
    std::fflush(stdout);
  }
  using Mode = dpmlp::ProgressBar::Mode;
  const Mode mode = o.progress == "bar" ? Mode::terminal : o.progress == "lines" ? Mode::lines : Mode::automatic;
  dpmlp::ProgressBar progress(o.progress == "off" ? nullptr : stdout, 0, mode);
  dpmlp::EarlyStopping stop(o.patience > 0 ? o.patience : 1);
  if (validation && o.restore_best == "yes") stop.restore_best(trainer);
  auto train = [&](auto&... callbacks) {
    if (minibatch) {
      trainer.train_epochs(epochs, o.batch, o.seed, progress, callbacks...);
    } else {
      trainer.train(o.steps, progress, callbacks...);
    }
  };
  if (validation && o.patience > 0) {
    train(*validation, stop);
  } else if (validation) {
    train(*validation);
  } else {
    train();
  }
  if (rank == 0 && validation && o.patience > 0 && stop.best_step() > 0) {
    if (stop.stopped()) {
      std::printf("# early stopping: stopped after step %lld;", static_cast<long long>(stop.stopped_step()));
    } else {
      std::printf("# early stopping: did not stop;");
    }
    std::printf(" best validation loss %.6g after step %lld%s\n", stop.best_loss(),
                static_cast<long long>(stop.best_step()), stop.restored() ? ", its parameters restored" : "");
    std::fflush(stdout);
  }
  if (!o.checkpoint.empty()) {
    dpmlp::save_checkpoint(trainer, o.checkpoint);
    if (rank == 0) {
      std::printf("# checkpoint: %s (step %lld)\n", o.checkpoint.c_str(), static_cast<long long>(trainer.steps_done()));
    }
  }

  // ---- 5. the errors, in the target's original units
  double sums[3] = {sum_squared_error(model, fx_train, y_train, y_mean, y_scale),
                    sum_squared_error(model, fx_test, y_test, y_mean, y_scale),
                    sum_squared_error(model, fx_val, y_val, y_mean, y_scale)};
  dpmlp::timed_allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, comm, "MPI_Allreduce (train_csv: the errors)");
  if (rank == 0) {
    if (L.n_val > 0) {
      std::printf("# validation mse %s (%lld rows)\n", scaled_mse(sums[2] / static_cast<double>(L.n_val), y_scale).c_str(),
                  L.n_val);
    }
    const std::string train_mse = scaled_mse(sums[0] / static_cast<double>(L.n_fit), y_scale);
    if (L.n_test > 0) {
      std::printf("train mse %s test mse %s\n", train_mse.c_str(),
                  scaled_mse(sums[1] / static_cast<double>(L.n_test), y_scale).c_str());
    } else {
      std::printf("train mse %s test mse n/a (--test-fraction 0)\n", train_mse.c_str());
    }
    std::fflush(stdout);
  }

  // ---- 6. the model for deployment: rank 0 writes it; every rank learns of a failure
#ifdef DPMLP_HAVE_ONNX
  if (!o.export_path.empty()) {
    dpmlp::all_or_none(comm, [&] {
      if (rank == 0) dpmlp::save_onnx(model, &sx, &sy, o.export_path);
    });
    if (rank == 0) {
      std::string names;
      for (int c = 0; c < L.cols; ++c) {
        if (c == L.target) continue;
        names += (names.empty() ? "" : ", ") + dpmlp::detail::csv::printable(L.columns[static_cast<std::size_t>(c)]);
      }
      std::printf("# exported %s (ONNX): input x [N, %d] = %s; output y [N, 1] = %s\n", o.export_path.c_str(),
                  features, names.c_str(), dpmlp::detail::csv::printable(o.target).c_str());
      std::fflush(stdout);
    }
  }
#endif
  return 0;
}

int main_checked(const Options& o) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int found = dpmlp::count_physical_devices<ExecSpace>(MPI_COMM_WORLD, o.allow_cpu);
  if (found < 2) {
    if (rank == 0) std::printf("requires >= 2 physical accelerator devices; found %d\n", found);
    return 77;
  }
  if (o.optimizer == "adam") return run(o, dpmlp::Adam(o.rate), found);
  return run(o, dpmlp::Sgd(o.rate, o.momentum), found);
}

}  // namespace train_csv

// The command line is read before Kokkos starts: --help (printed by rank 0) and a bad option start no device.
int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int code = 0;
  try {
    train_csv::Options o;
    const cli::Parser parser = train_csv::command_line(o);
    if (cli::read_command_line(parser, argc, argv, MPI_COMM_WORLD, [&] { train_csv::check(o); })) {
      dpmlp::initialize_kokkos_for_rank(MPI_COMM_WORLD);
      code = train_csv::main_checked(o);
    }
  } catch (const dpmlp::CollectiveTimeout& e) {
    // Some rank may never reach MPI_Finalize: end every process now.
    std::fprintf(stderr, "train_csv: error (rank %d): %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_csv: error (rank %d): %s\n", rank, e.what());
    code = 2;
  }
  if (Kokkos::is_initialized()) Kokkos::finalize();
  MPI_Finalize();
  return code;
}
