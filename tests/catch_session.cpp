// SPDX-License-Identifier: BSD-3-Clause
// Catch2's implementation, compiled once for both test mains (main_serial.cpp, main_mpi.cpp), which call
// run_catch_session and so need not include Catch themselves.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.hpp"

namespace dpmlp_test {

int run_catch_session(int argc, char* argv[]) {
  Catch::Session session;
  session.configData().useColour = Catch::UseColour::No;
  return session.run(argc, argv);
}

}  // namespace dpmlp_test
