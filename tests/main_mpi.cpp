// SPDX-License-Identifier: BSD-3-Clause
// Catch2 main for multi-rank tests.
//
// MPI_Init -> Kokkos init (one device per local rank) -> the Catch session on every rank -> the failure
// counts of all ranks combined with MPI_Allreduce -> Kokkos finalize -> MPI_Finalize.
//
// Only rank 0 writes to stdout (colour off); set DPMLP_TEST_ALL_RANKS=1 to see every rank's report. A test
// must not REQUIRE-fail on one rank before a collective (the other ranks would wait forever): tests use
// CHECK, or agree on a condition first with dpmlp_test::all(...) from mpi_test_util.hpp.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include <dpmlp/devices.hpp>
#include <dpmlp/kokkos_compat.hpp>

#include "catch_session.hpp"

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  const char* all_ranks = std::getenv("DPMLP_TEST_ALL_RANKS");
  const bool quiet = rank > 0 && !(all_ranks && all_ranks[0] == '1');
  if (quiet) {
    if (!std::freopen("/dev/null", "w", stdout)) std::perror("freopen");
  }

  dpmlp::initialize_kokkos_for_rank(MPI_COMM_WORLD);
  const int failures = dpmlp_test::run_catch_session(argc, argv);
  int failed_here = failures != 0 ? 1 : 0, ranks_failed = 0;
  MPI_Allreduce(&failed_here, &ranks_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && ranks_failed > 0) {
    std::printf("dpmlp: %d of %d ranks had failures (DPMLP_TEST_ALL_RANKS=1 shows every rank)\n", ranks_failed,
                size);
  }
  std::fflush(stdout);
  Kokkos::finalize();
  MPI_Finalize();
  return ranks_failed > 0 ? 1 : 0;
}
