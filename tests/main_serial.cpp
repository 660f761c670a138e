// SPDX-License-Identifier: BSD-3-Clause
// Catch2 main for single-process tests: Kokkos is initialized around the session; no MPI.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <dpmlp/kokkos_compat.hpp>

int main(int argc, char* argv[]) {
  dpmlp::compat::initialize();
  int result = 0;
  {
    Catch::Session session;
    session.configData().useColour = Catch::UseColour::No;
    result = session.run(argc, argv);
  }
  Kokkos::finalize();
  return result;
}
