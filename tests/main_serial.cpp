// SPDX-License-Identifier: BSD-3-Clause
// Catch2 main for single-process tests: Kokkos is initialized around the session; no MPI.
#include <dpmlp/kokkos_compat.hpp>

#include "catch_session.hpp"

int main(int argc, char* argv[]) {
  dpmlp::compat::initialize();
  const int result = dpmlp_test::run_catch_session(argc, argv);
  Kokkos::finalize();
  return result;
}
