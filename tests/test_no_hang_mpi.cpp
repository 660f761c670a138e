// SPDX-License-Identifier: BSD-3-Clause
// No hang, by design (docs/reliability.md): each case is a reproducer of a hang that dpmlp turns into an error
// on every rank, in bounded time. Runs at 2 and 3 ranks (tests/CMakeLists.txt), under a ctest TIMEOUT, so a
// regression shows as a failure rather than a stuck job:
//   - a rank that does not arrive at a collective (it sleeps past TrainerOptions::collective_timeout_s, as a
//     stopped or stuck rank would): every other rank throws CollectiveTimeout (a CommError) naming the
//     operation and that rank, within the timeout plus the roll call; the late rank throws it when it arrives;
//   - a rank that stalls in the middle of a run: the same, and every rank keeps the parameters of the last
//     completed step;
//   - an allocation that fails on one rank only, in the trainer's constructor: an error on every rank;
//   - a checkpoint path that is a FIFO: refused on every rank before anything opens it.
#include <catch2/catch.hpp>

#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <dpmlp/dpmlp.hpp>

#include "mpi_test_util.hpp"

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using Memory = ExecSpace::memory_space;
using Trainer = dpmlp::DataParallelTrainer<ExecSpace, dpmlp::MpiCommunicator, dpmlp::Sgd, float>;
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Memory>;
using clock_type = std::chrono::steady_clock;

constexpr std::int64_t kRows = 256;

dpmlp::Mlp<float, Memory> make_model() {
  dpmlp::Mlp<float, Memory> m({4, 8, 1});
  m.init_jax(dpmlp::random::PRNGKey(3), 0.3f);
  return m;
}

void fill(const Matrix& m, float value) { Kokkos::deep_copy(m, value); }

struct Caught {
  std::string kind;  // "CollectiveTimeout", "CommError", "InputError", "other", "" (nothing)
  std::string message;
  double seconds = 0;  // how long the call took
};

template <class F>
Caught caught(F&& f) {
  Caught c;
  const auto t0 = clock_type::now();
  try {
    f();
  } catch (const dpmlp::CollectiveTimeout& e) {
    c = {"CollectiveTimeout", e.what()};
  } catch (const dpmlp::CommError& e) {
    c = {"CommError", e.what()};
  } catch (const dpmlp::InputError& e) {
    c = {"InputError", e.what()};
  } catch (const std::exception& e) {
    c = {"other", e.what()};
  }
  c.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  return c;
}

// A temporary directory, made by rank 0 and removed by it at the end (every rank sees the same name).
struct SharedDir {
  std::string path;
  SharedDir() {
    char name[64] = {0};
    if (dpmlp_test::rank() == 0) {
      std::snprintf(name, sizeof name, "/tmp/dpmlp_no_hang_XXXXXX");
      if (!::mkdtemp(name)) name[0] = '\0';
    }
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
    path = name;
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (dpmlp_test::rank() == 0 && !path.empty()) {
      std::system(("rm -rf '" + path + "'").c_str());
    }
  }
};

// Throws std::bad_alloc (as Kokkos does when memory runs out) for one label's allocations: a Kokkos Tools
// allocation callback, installed on one rank only.
struct RefusedAllocation : std::bad_alloc {
  const char* what() const noexcept override { return "test: no memory for 'dpmlp::partials'"; }
};
void refuse_partials(const Kokkos::Profiling::SpaceHandle, const char* label, const void*, const std::uint64_t) {
  if (std::string(label) == "dpmlp::partials") throw RefusedAllocation();
}

}  // namespace

TEST_CASE("a rank that does not arrive at a collective: CommError naming it on the others, in bounded time",
          "[mpi][no_hang]") {
  const int size = dpmlp_test::size(), me = dpmlp_test::rank(), late = size - 1;
  if (size < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  dpmlp::TrainerOptions options;
  options.collective_timeout_s = 1;
  auto model = make_model();
  Trainer trainer(MPI_COMM_WORLD, model, kRows, dpmlp::Sgd(0.05), options);
  Matrix x("x", trainer.shard().rows(), 4), y("y", trainer.shard().rows(), 1);
  fill(x, 0.5f);
  fill(y, 0.25f);
  trainer.set_data(x, y);
  trainer.train(2);
  const std::uint64_t before = dpmlp::params_digest(trainer);

  // The late rank comes after the others gave up (timeout 1 s, then at most 1 s of roll call).
  if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  const Caught c = caught([&] { trainer.train(1); });
  std::printf("rank %d: %s after %.2f s: %s\n", me, c.kind.c_str(), c.seconds, c.message.c_str());
  INFO("rank " << me << " caught " << (c.kind.empty() ? "nothing" : c.kind) << " after " << c.seconds
               << " s: " << c.message);
  CHECK(c.kind == "CollectiveTimeout");  // a CommError
  CHECK_THAT(c.message, Catch::Contains("MPI_Allreduce (DataParallelTrainer::train: the step counts)"));
  if (me != late) {
    CHECK_THAT(c.message, Catch::Contains("rank " + std::to_string(late) + " did not arrive"));
    CHECK_THAT(c.message, Catch::Contains("end the program"));
    // The timeout, then the roll call (at most min(timeout, 2 s)), and some slack for a loaded machine.
    CHECK(c.seconds >= 0.9);
    CHECK(c.seconds < 4.0);
  } else {
    CHECK_THAT(c.message, Catch::Contains("rank " + std::to_string(late) + " arrived after rank "));
    CHECK(c.seconds < 1.0);  // it does not wait for a collective the others abandoned
  }
  // The parameters are those after the last completed step, and the communicator is not used again.
  CHECK(dpmlp::params_digest(trainer) == before);
  CHECK(trainer.steps_done() == 2);
  CHECK(dpmlp::collective_abandoned(trainer.communicator().mpi_comm()));
  const Caught again = caught([&] { trainer.train(1); });
  CHECK(again.kind == "CollectiveTimeout");
  CHECK_THAT(again.message, Catch::Contains("refused, an earlier collective failed"));
  CHECK(again.seconds < 0.5);
}

TEST_CASE("a rank that stops in the middle of a run: the parameters are those after the last completed step",
          "[mpi][no_hang]") {
  const int size = dpmlp_test::size(), me = dpmlp_test::rank(), late = size - 1;
  if (size < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  dpmlp::TrainerOptions options;
  options.collective_timeout_s = 1;
  auto model = make_model();
  Trainer trainer(MPI_COMM_WORLD, model, kRows, dpmlp::Sgd(0.05), options);
  Matrix x("x", trainer.shard().rows(), 4), y("y", trainer.shard().rows(), 1);
  fill(x, 0.5f);
  fill(y, 0.25f);
  trainer.set_data(x, y);
  const std::uint64_t before = dpmlp::params_digest(trainer);
  // The late rank stalls after the second step of five (a callback that sleeps, as a stuck rank would).
  struct Stall {
    bool stalls;
    bool end_step(const dpmlp::StepInfo& s) {
      if (stalls && s.step_in_run == 2) std::this_thread::sleep_for(std::chrono::milliseconds(3500));
      return false;
    }
  } stall{me == late};
  const Caught c = caught([&] { trainer.train(5, stall); });
  std::printf("rank %d: %s after %.2f s: %s\n", me, c.kind.c_str(), c.seconds, c.message.c_str());
  INFO("rank " << me << " caught " << (c.kind.empty() ? "nothing" : c.kind) << " after " << c.seconds
               << " s: " << c.message);
  CHECK(c.kind == "CollectiveTimeout");
  // The reproducible reduction's allgather of the third step.
  CHECK_THAT(c.message, Catch::Contains("MPI_Allgather (dpmlp::MpiCommunicator::allgather)"));
  if (me != late) CHECK_THAT(c.message, Catch::Contains("rank " + std::to_string(late) + " did not arrive"));
  // Every rank holds the parameters after the two completed steps: the same bits, not the initial ones. A
  // failed run is not counted in steps_done().
  const std::uint64_t after = dpmlp::params_digest(trainer);
  CHECK(after != before);
  std::uint64_t lo = after, hi = after;
  MPI_Allreduce(&after, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&after, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi);
  CHECK(trainer.steps_done() == 0);
}

TEST_CASE("an allocation that fails on one rank in the trainer's constructor: an error on every rank",
          "[mpi][no_hang]") {
  const int size = dpmlp_test::size(), me = dpmlp_test::rank(), failing = size - 1;
  auto model = make_model();
  if (me == failing) Kokkos::Tools::Experimental::set_allocate_data_callback(refuse_partials);
  dpmlp::TrainerOptions options;
  options.engine = dpmlp::Engine::fused;  // its partial sums are allocated by the constructor
  options.collective_timeout_s = 10;  // a hang would show as a CommError, not an error naming the allocation
  const Caught c = caught([&] { Trainer trainer(MPI_COMM_WORLD, model, kRows, dpmlp::Sgd(0.05), options); });
  if (me == failing) Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
  INFO("rank " << me << " caught " << (c.kind.empty() ? "nothing" : c.kind) << " after " << c.seconds
               << " s: " << c.message);
  CHECK(c.kind == "InputError");
  CHECK_THAT(c.message, Catch::Contains("rank " + std::to_string(failing) + ": "));
  CHECK_THAT(c.message, Catch::Contains("no memory for 'dpmlp::partials'"));
  CHECK(c.seconds < 5.0);
  CHECK(dpmlp_test::all(c.kind == "InputError"));
  // The ranks still work together afterwards: the failure was agreed, nothing was abandoned.
  Trainer trainer(MPI_COMM_WORLD, model, kRows, dpmlp::Sgd(0.05), options);
  CHECK(trainer.global_rows() == kRows);
}

TEST_CASE("a checkpoint path that is a FIFO is refused on every rank, without blocking", "[mpi][no_hang]") {
  const SharedDir dir;
  REQUIRE(dpmlp_test::all(!dir.path.empty()));
  const std::string fifo = dir.path + "/run.ckpt";
  int made = 1;
  if (dpmlp_test::rank() == 0) made = ::mkfifo(fifo.c_str(), 0600) == 0 ? 1 : 0;
  REQUIRE(dpmlp_test::all(made == 1));
  auto model = make_model();
  dpmlp::TrainerOptions options;
  options.collective_timeout_s = 10;
  Trainer trainer(MPI_COMM_WORLD, model, kRows, dpmlp::Sgd(0.05), options);
  for (const bool load : {true, false}) {
    INFO((load ? "load_checkpoint" : "save_checkpoint"));
    const Caught c = caught([&] {
      if (load) {
        dpmlp::load_checkpoint(trainer, fifo);
      } else {
        dpmlp::save_checkpoint(trainer, fifo);
      }
    });
    INFO("rank " << dpmlp_test::rank() << " caught " << (c.kind.empty() ? "nothing" : c.kind) << " after "
                 << c.seconds << " s: " << c.message);
    CHECK(c.kind == "InputError");
    CHECK_THAT(c.message, Catch::Contains("rank 0: "));
    CHECK_THAT(c.message, Catch::Contains("'" + fifo + "' is a FIFO (named pipe), not a regular file"));
    CHECK(c.seconds < 5.0);
    CHECK(dpmlp_test::all(c.kind == "InputError"));
  }
  // The FIFO is still there: a refused save does not replace it.
  struct stat st;
  CHECK((dpmlp_test::rank() != 0 || (::stat(fifo.c_str(), &st) == 0 && S_ISFIFO(st.st_mode))));
  // The .npy reader (local) refuses it too.
  if (dpmlp_test::rank() == 0) {
    const Caught c = caught([&] { dpmlp::read_npy_header(fifo); });
    CHECK(c.kind == "InputError");
    CHECK_THAT(c.message, Catch::Contains("is a FIFO (named pipe), not a regular file"));
    CHECK(c.seconds < 5.0);
  }
}

TEST_CASE("collective_timeout_s must be positive and finite", "[mpi][no_hang]") {
  auto model = make_model();
  for (const double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity()}) {
    dpmlp::TrainerOptions options;
    options.collective_timeout_s = bad;
    const Caught c = caught([&] { Trainer trainer(MPI_COMM_WORLD, model, kRows, dpmlp::Sgd(0.05), options); });
    INFO("collective_timeout_s " << bad << ": " << c.kind << ": " << c.message);
    CHECK(c.kind == "InputError");
    CHECK_THAT(c.message, Catch::Contains("collective_timeout_s must be positive and finite"));
  }
}
