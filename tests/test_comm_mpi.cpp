// SPDX-License-Identifier: BSD-3-Clause
// The communicators (MpiCommunicator everywhere, NcclCommunicator on CUDA builds with NCCL) and the
// collective error agreement of errors.hpp. Runs under main_mpi.cpp at 1, 2 and 3 ranks.
//
// Every check is a CHECK, never a REQUIRE: a rank that stopped early would leave the others waiting in the
// next collective. Values are small integers and quarters, so every sum is exact in float whatever the
// reduction order, and results are compared with ==.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <dpmlp/comm/mpi.hpp>
#include <dpmlp/comm/communicator.hpp>
#include <dpmlp/devices.hpp>
#include <dpmlp/errors.hpp>
#include <dpmlp/kokkos_compat.hpp>

#include "mpi_test_util.hpp"

#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
#include <cuda_runtime.h>
#endif

namespace {

// ---- communicator type properties

static_assert(!std::is_copy_constructible<dpmlp::MpiCommunicator>::value, "communicators are not copyable");
static_assert(!std::is_copy_assignable<dpmlp::MpiCommunicator>::value, "communicators are not copyable");
static_assert(std::is_nothrow_move_constructible<dpmlp::MpiCommunicator>::value, "communicators move");
static_assert(std::is_nothrow_move_assignable<dpmlp::MpiCommunicator>::value, "communicators move");
static_assert(!dpmlp::MpiCommunicator::stream_ordered, "MPI collectives complete before they return");
static_assert(std::is_same<dpmlp::default_communicator_t<Kokkos::DefaultHostExecutionSpace>,
                           dpmlp::MpiCommunicator>::value,
              "host spaces use MPI");
#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
static_assert(!std::is_copy_constructible<dpmlp::NcclCommunicator>::value, "communicators are not copyable");
static_assert(!std::is_copy_assignable<dpmlp::NcclCommunicator>::value, "communicators are not copyable");
static_assert(std::is_nothrow_move_constructible<dpmlp::NcclCommunicator>::value, "communicators move");
static_assert(std::is_nothrow_move_assignable<dpmlp::NcclCommunicator>::value, "communicators move");
static_assert(dpmlp::NcclCommunicator::stream_ordered, "NCCL collectives are enqueued on the stream");
static_assert(std::is_same<dpmlp::default_communicator_t<Kokkos::Cuda>, dpmlp::NcclCommunicator>::value,
              "CUDA uses NCCL when it is there");
#endif

// ---- helpers

template <class T, class ExecSpace>
using DeviceView = Kokkos::View<T*, typename ExecSpace::memory_space>;

// Reads v back to the host after the collectives enqueued on space finished. A stream-ordered communicator
// returns before the data moved, so the fence is part of what is tested.
template <class ExecSpace, class View>
typename View::HostMirror to_host(const ExecSpace& space, const View& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(space, h, v);
  dpmlp::compat::fence(space, "test_comm::to_host");
  return h;
}

template <class ExecSpace, class View, class F>
void fill(const ExecSpace& space, const View& v, F&& value) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.extent(0); ++i) h(i) = value(i);
  Kokkos::deep_copy(space, v, h);
  // No fence: the collective that follows on the same space is ordered after this copy (or fences itself).
}

// The message of the ErrorT that f throws; "<no exception>" or "<other: ...>" otherwise. Never throws, so a
// failed expectation on one rank does not take that rank out of the collectives that follow.
template <class ErrorT, class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const ErrorT& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<other: ") + e.what() + ">";
  }
  return "<no exception>";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- the checks, for any communicator type and execution space

template <class T, class Comm, class ExecSpace>
void check_allreduce(const Comm& comm, const ExecSpace& space, std::size_t n) {
  const int r = comm.rank(), s = comm.size();
  DeviceView<T, ExecSpace> v("v", n);
  fill(space, v, [&](std::size_t i) { return T(r + 1) * T(i % 17 + 1) + T(0.25) * T(r); });
  comm.allreduce_sum(space, v);
  auto h = to_host(space, v);
  const T ranks_plus_one = T(s * (s + 1) / 2), ranks = T(s * (s - 1) / 2);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (h(i) != ranks_plus_one * T(i % 17 + 1) + T(0.25) * ranks) ++wrong;
  }
  CHECK(wrong == 0);
}

// 100 allreduces in a row on rows of one 2-D View (contiguous row subviews), one fence at the end: what a
// training loop does with a stream-ordered communicator.
template <class T, class Comm, class ExecSpace>
void check_many_allreduces(const Comm& comm, const ExecSpace& space) {
  const int r = comm.rank(), s = comm.size();
  const int steps = 100, n = 257;
  Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space> v("v", steps, n);
  auto h = Kokkos::create_mirror_view(v);
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < n; ++i) h(t, i) = T(r + 1) * T(t + 1) + T(i % 5);
  }
  Kokkos::deep_copy(space, v, h);
  for (int t = 0; t < steps; ++t) comm.allreduce_sum(space, Kokkos::subview(v, t, Kokkos::ALL()));
  Kokkos::deep_copy(space, h, v);
  dpmlp::compat::fence(space, "test_comm::check_many_allreduces");
  std::size_t wrong = 0;
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < n; ++i) {
      if (h(t, i) != T(s * (s + 1) / 2) * T(t + 1) + T(s) * T(i % 5)) ++wrong;
    }
  }
  CHECK(wrong == 0);
}

template <class T>
T gather_value(int rank, std::size_t i) {
  // Distinct per (rank, i), and within range of every tested type (uint8 wraps on purpose).
  return static_cast<T>((rank * 37 + static_cast<int>(i) * 3 + 1) & 0x7f);
}

template <class T, class Comm, class ExecSpace>
void check_allgather(const Comm& comm, const ExecSpace& space, std::size_t m) {
  const int r = comm.rank(), s = comm.size();
  DeviceView<T, ExecSpace> send("send", m), recv("recv", m * static_cast<std::size_t>(s));
  fill(space, send, [&](std::size_t i) { return gather_value<T>(r, i); });
  comm.allgather(space, send, recv);
  auto h = to_host(space, recv);
  std::size_t wrong = 0;
  for (int q = 0; q < s; ++q) {
    for (std::size_t i = 0; i < m; ++i) {
      if (h(static_cast<std::size_t>(q) * m + i) != gather_value<T>(q, i)) ++wrong;
    }
  }
  CHECK(wrong == 0);
  // A recv of the wrong size is refused on every rank alike (a local check, before any communication).
  DeviceView<T, ExecSpace> short_recv("short_recv", m * static_cast<std::size_t>(s) + 1);
  CHECK_THROWS_AS(comm.allgather(space, send, short_recv), std::invalid_argument);
}

template <class T, class Comm, class ExecSpace>
void check_broadcast(const Comm& comm, const ExecSpace& space, std::size_t n, int root) {
  const int r = comm.rank();
  DeviceView<T, ExecSpace> v("v", n);
  fill(space, v, [&](std::size_t i) { return gather_value<T>(r, i); });
  comm.broadcast(space, v, root);
  auto h = to_host(space, v);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (h(i) != gather_value<T>(root, i)) ++wrong;
  }
  CHECK(wrong == 0);
}

template <class Comm, class ExecSpace>
void check_collectives(const Comm& comm, const ExecSpace& space) {
  INFO("communicator " << Comm::name() << " on " << ExecSpace::name() << ", rank " << comm.rank() << " of "
                       << comm.size());
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(1000), std::size_t(1) << 20}) {
    INFO("allreduce_sum of " << n << " elements");
    check_allreduce<float>(comm, space, n);
    check_allreduce<double>(comm, space, n);
  }
  check_many_allreduces<float>(comm, space);
  check_many_allreduces<double>(comm, space);
  for (std::size_t m : {std::size_t(1), std::size_t(5), std::size_t(4099)}) {
    INFO("allgather of " << m << " elements per rank");
    check_allgather<float>(comm, space, m);
    check_allgather<double>(comm, space, m);
    check_allgather<std::int32_t>(comm, space, m);
    check_allgather<std::int64_t>(comm, space, m);
    check_allgather<std::uint8_t>(comm, space, m);
  }
  for (int root : {0, comm.size() - 1}) {
    INFO("broadcast from root " << root);
    check_broadcast<float>(comm, space, 1000, root);
    check_broadcast<double>(comm, space, 1000, root);
    check_broadcast<std::int32_t>(comm, space, 33, root);
    check_broadcast<std::int64_t>(comm, space, 33, root);
    check_broadcast<std::uint8_t>(comm, space, 4097, root);
  }
}

// The communicator works on a private duplicate: same group, different context.
void check_duplicate(MPI_Comm comm) {
  CHECK(comm != MPI_COMM_NULL);
  CHECK(comm != MPI_COMM_WORLD);
  int relation = MPI_UNEQUAL;
  MPI_Comm_compare(comm, MPI_COMM_WORLD, &relation);
  CHECK(relation == MPI_CONGRUENT);
}

// Move construction and move assignment hand the duplicate over; the moved-to communicator still works and
// the moved-from one frees nothing twice (its destructor runs at the end of this function).
template <class Comm, class ExecSpace>
void check_moves(const ExecSpace& space) {
  Comm a(MPI_COMM_WORLD);
  const MPI_Comm original = a.mpi_comm();
  Comm b(std::move(a));
  CHECK(b.mpi_comm() == original);
  CHECK(a.mpi_comm() == MPI_COMM_NULL);
  CHECK(b.rank() == dpmlp_test::rank());
  CHECK(b.size() == dpmlp_test::size());
  check_allreduce<double>(b, space, 1000);

  Comm c(MPI_COMM_WORLD);  // c's own duplicate is freed by the assignment
  c = std::move(b);
  CHECK(c.mpi_comm() == original);
  CHECK(b.mpi_comm() == MPI_COMM_NULL);
  check_allreduce<double>(c, space, 1000);
  check_broadcast<float>(c, space, 10, c.size() - 1);
}

template <class ExecSpace>
void check_mpi_communicator(const ExecSpace& space) {
  {
    dpmlp::MpiCommunicator comm(MPI_COMM_WORLD);
    CHECK(std::string(comm.name()) == "mpi");
    CHECK(comm.rank() == dpmlp_test::rank());
    CHECK(comm.size() == dpmlp_test::size());
    check_duplicate(comm.mpi_comm());
    check_collectives(comm, space);
  }
  check_moves<dpmlp::MpiCommunicator>(space);
}

// NCCL needs one GPU per rank; with fewer GPUs than ranks every rank skips the NCCL tests (the count is
// collective, so all ranks decide alike). MPI always runs.
template <class Comm>
bool runnable() {
#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
  if (std::is_same<Comm, dpmlp::NcclCommunicator>::value) {
    const int gpus = dpmlp::count_physical_devices<Kokkos::Cuda>(MPI_COMM_WORLD, false, Kokkos::Cuda());
    if (gpus != dpmlp_test::size()) {
      WARN("NCCL test skipped: " << gpus << " distinct GPUs for " << dpmlp_test::size() << " ranks");
      return false;
    }
  }
#endif
  return true;
}

}  // namespace

TEST_CASE("MpiCommunicator on the default execution space", "[comm][mpi]") {
  check_mpi_communicator(Kokkos::DefaultExecutionSpace());
}

TEST_CASE("MpiCommunicator on the default host execution space", "[comm][mpi]") {
  check_mpi_communicator(Kokkos::DefaultHostExecutionSpace());
}

TEST_CASE("default_communicator_t works on the default execution space", "[comm]") {
  using Comm = dpmlp::default_communicator_t<Kokkos::DefaultExecutionSpace>;
  if (!runnable<Comm>()) return;
  Comm comm(MPI_COMM_WORLD);
  check_duplicate(comm.mpi_comm());
  check_allreduce<double>(comm, Kokkos::DefaultExecutionSpace(), 1000);
  check_allgather<float>(comm, Kokkos::DefaultExecutionSpace(), 7);
}

namespace {
// Counts the communicators freed that carry the attribute below (MPI calls an attribute's delete function when
// a communicator that has it is freed; MPI_COMM_DUP_FN copies it into every duplicate).
int freed_with_attribute = 0;
int count_free(MPI_Comm, int, void*, void*) {
  ++freed_with_attribute;
  return MPI_SUCCESS;
}
}  // namespace

TEST_CASE("MpiCommunicator frees its duplicate at destruction", "[comm][mpi]") {
  // A base communicator whose duplicates carry a counting attribute: each MpiCommunicator built from it
  // duplicates it once, so destroying n of them must call the delete function exactly n times (a leak
  // calls it fewer times, a double free crashes or calls it more). Counting, because Open MPI's context ids
  // (tens of thousands) would outlast a leak of a few thousand communicators.
  int key = MPI_KEYVAL_INVALID;
  REQUIRE(MPI_Comm_create_keyval(MPI_COMM_DUP_FN, count_free, &key, nullptr) == MPI_SUCCESS);
  MPI_Comm base = MPI_COMM_NULL;
  REQUIRE(MPI_Comm_dup(MPI_COMM_WORLD, &base) == MPI_SUCCESS);
  static int marker = 0;
  REQUIRE(MPI_Comm_set_attr(base, key, &marker) == MPI_SUCCESS);
  const int n = 2100;
  freed_with_attribute = 0;
  bool all_fine = true;
  for (int i = 0; i < n; ++i) {
    dpmlp::MpiCommunicator comm(base);
    all_fine = all_fine && comm.mpi_comm() != MPI_COMM_NULL && comm.mpi_comm() != base;
  }
  CHECK(all_fine);
  CHECK(freed_with_attribute == n);
  {  // moved, not copied: still one free a duplicate
    dpmlp::MpiCommunicator a(base);
    dpmlp::MpiCommunicator b(std::move(a));
    CHECK(b.mpi_comm() != MPI_COMM_NULL);
  }
  CHECK(freed_with_attribute == n + 1);
  MPI_Comm_free(&base);
  CHECK(freed_with_attribute == n + 2);
  MPI_Comm_free_keyval(&key);
  // Still healthy afterwards.
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(sum == dpmlp_test::size());
}

TEST_CASE("MpiCommunicator rejects MPI_COMM_NULL", "[comm][mpi]") {
  CHECK_THROWS_AS(dpmlp::MpiCommunicator(MPI_COMM_NULL), dpmlp::InputError);
}

TEST_CASE("agree: a failure on the last rank makes every rank throw", "[comm][errors]") {
  const int rank = dpmlp_test::rank(), last = dpmlp_test::size() - 1;
  const std::string where = "rank " + std::to_string(last);

  // Nobody failed: nobody throws.
  CHECK(thrown_message<dpmlp::Error>([] { dpmlp::agree(MPI_COMM_WORLD, ""); }) == "<no exception>");

  // Only the last rank has a message: every rank throws InputError naming that rank and the text.
  const std::string mine = rank == last ? "bad shard 7: row 12, column 3 is not a number" : "";
  const std::string got = thrown_message<dpmlp::InputError>([&] { dpmlp::agree(MPI_COMM_WORLD, mine); });
  CHECK(contains(got, where));
  CHECK(contains(got, "bad shard 7: row 12, column 3 is not a number"));

  // The error type is the caller's choice.
  const std::string comm_error =
      thrown_message<dpmlp::CommError>([&] { dpmlp::agree<dpmlp::CommError>(MPI_COMM_WORLD, mine); });
  CHECK(contains(comm_error, where));
  CHECK(contains(comm_error, "bad shard 7"));

  // Several ranks fail: the lowest one's message wins, on every rank.
  const std::string several = (rank == 0 || rank == last) ? "failed on rank " + std::to_string(rank) : "";
  const std::string lowest =
      thrown_message<dpmlp::InputError>([&] { dpmlp::agree(MPI_COMM_WORLD, several); });
  CHECK(contains(lowest, "rank 0: failed on rank 0"));
}

TEST_CASE("all_or_none: an exception on the last rank makes every rank throw", "[comm][errors]") {
  const int rank = dpmlp_test::rank(), last = dpmlp_test::size() - 1;
  const std::string where = "rank " + std::to_string(last);
  int ran = 0;

  CHECK(thrown_message<dpmlp::Error>([&] { dpmlp::all_or_none(MPI_COMM_WORLD, [&] { ++ran; }); }) ==
        "<no exception>");
  CHECK(ran == 1);

  // A std::runtime_error (not a dpmlp::Error) thrown on the last rank only.
  const std::string got = thrown_message<dpmlp::InputError>([&] {
    dpmlp::all_or_none(MPI_COMM_WORLD, [&] {
      ++ran;
      if (rank == last) throw std::runtime_error("cannot open shard_" + std::to_string(rank) + ".bin");
    });
  });
  CHECK(ran == 2);
  CHECK(contains(got, where));
  CHECK(contains(got, "cannot open shard_" + std::to_string(last) + ".bin"));

  // A dpmlp::InputError there, reported as CommError on request.
  const std::string comm_error = thrown_message<dpmlp::CommError>([&] {
    dpmlp::all_or_none<dpmlp::CommError>(MPI_COMM_WORLD, [&] {
      if (rank == last) throw dpmlp::InputError("NaN in column 4");
    });
  });
  CHECK(contains(comm_error, where));
  CHECK(contains(comm_error, "NaN in column 4"));

  // Every rank is still in step: one more collective completes.
  CHECK(dpmlp_test::all(true));
}

#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)

TEST_CASE("NcclCommunicator on Kokkos::Cuda", "[comm][nccl]") {
  if (!runnable<dpmlp::NcclCommunicator>()) return;
  const Kokkos::Cuda space;
  {
    dpmlp::NcclCommunicator comm(MPI_COMM_WORLD);
    CHECK(std::string(comm.name()) == "nccl");
    CHECK(comm.rank() == dpmlp_test::rank());
    CHECK(comm.size() == dpmlp_test::size());
    CHECK(comm.nccl_comm() != nullptr);
    check_duplicate(comm.mpi_comm());
    check_collectives(comm, space);
  }
  check_moves<dpmlp::NcclCommunicator>(space);
}

TEST_CASE("NcclCommunicator is ordered on a non-default Kokkos::Cuda instance's stream", "[comm][nccl]") {
  if (!runnable<dpmlp::NcclCommunicator>()) return;
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  {
    // Copies, collectives and the copy back all go on `stream`, with a host fence only at the very end: if a
    // collective ran on another stream, it would race with the copies around it.
    const Kokkos::Cuda space(stream);
    dpmlp::NcclCommunicator comm(MPI_COMM_WORLD);
    check_many_allreduces<float>(comm, space);
    check_allreduce<double>(comm, space, std::size_t(1) << 22);
    check_allgather<double>(comm, space, 100000);
    check_broadcast<std::int64_t>(comm, space, 100000, comm.size() - 1);
  }
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("NcclCommunicator: repeated construction and destruction", "[comm][nccl]") {
  if (!runnable<dpmlp::NcclCommunicator>()) return;
  for (int i = 0; i < 3; ++i) {
    dpmlp::NcclCommunicator comm(MPI_COMM_WORLD);
    check_allreduce<float>(comm, Kokkos::Cuda(), 100);
  }
}

TEST_CASE("NcclCommunicator: ranks sharing a GPU throw on every rank instead of hanging", "[comm][nccl]") {
  const int gpus = dpmlp::count_physical_devices<Kokkos::Cuda>(MPI_COMM_WORLD, false, Kokkos::Cuda());
  if (gpus == dpmlp_test::size()) return;  // one GPU per rank: nothing to refuse
  const std::string got =
      thrown_message<dpmlp::CommError>([] { dpmlp::NcclCommunicator comm(MPI_COMM_WORLD); });
  CHECK(contains(got, "one GPU per rank"));
  CHECK(dpmlp_test::all(true));  // every rank got here
}

#endif  // DPMLP_HAS_NCCL_COMMUNICATOR

TEST_CASE("timed waits sleep at most 0.1 ms between tests for their first 100 ms, then up to 1 ms", "[comm]") {
  // A short wait (the end of a training call: an epoch of a small model takes a few milliseconds) must end
  // soon after its event; sleeps of up to 1 ms from the start made it end up to 1 ms late.
  using us = std::chrono::microseconds;
  us pause{20};
  for (int i = 0; i < 20; ++i) {
    pause = dpmlp::detail::next_pause(pause, std::chrono::milliseconds(50));
    CHECK(pause <= us(100));
  }
  CHECK(pause == us(100));
  for (int i = 0; i < 20; ++i) pause = dpmlp::detail::next_pause(pause, std::chrono::milliseconds(150));
  CHECK(pause == us(1000));
  CHECK(dpmlp::detail::next_pause(us(20), std::chrono::milliseconds(3)) == us(40));
}
