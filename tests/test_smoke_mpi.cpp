// SPDX-License-Identifier: BSD-3-Clause
#include <catch2/catch.hpp>

#include <dpmlp/dpmlp.hpp>

#include "mpi_test_util.hpp"

TEST_CASE("every rank sees the communicator and a Kokkos space", "[mpi]") {
  const int size = dpmlp_test::size();
  int sum = 0, one = 1;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(sum == size);
  CHECK(Kokkos::is_initialized());
  CHECK(dpmlp::count_physical_devices<Kokkos::DefaultHostExecutionSpace>(MPI_COMM_WORLD, true) == size);
  CHECK(dpmlp::count_physical_devices<Kokkos::DefaultHostExecutionSpace>(MPI_COMM_WORLD, false) == 0);
}
