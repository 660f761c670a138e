// SPDX-License-Identifier: BSD-3-Clause
// A consumer of the installed / added dpmlp: includes the umbrella header and runs one small thing on one rank.
#include <dpmlp/dpmlp.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  dpmlp::initialize_kokkos_for_rank(MPI_COMM_WORLD);
  int status = 0;
  {
    std::printf("dpmlp %s on %s\n", DPMLP_VERSION_STRING, Kokkos::DefaultExecutionSpace::name());
    status = dpmlp::local_rank(MPI_COMM_WORLD) == 0 ? 0 : 1;
  }
  Kokkos::finalize();
  MPI_Finalize();
  return status;
}
