// SPDX-License-Identifier: BSD-3-Clause
// The test mains' entry into Catch2 (catch_session.cpp): runs the tests the command line selects, without colour,
// and returns Catch's exit code (the number of failed assertions, capped).
#pragma once

namespace dpmlp_test {
int run_catch_session(int argc, char* argv[]);
}
