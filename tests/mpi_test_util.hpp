// SPDX-License-Identifier: BSD-3-Clause
// Helpers for tests that run on several ranks.
#pragma once

#include <mpi.h>

namespace dpmlp_test {

// True on every rank when `ok` holds on every rank. Use it to decide collectively before a REQUIRE.
inline bool all(bool ok, MPI_Comm comm = MPI_COMM_WORLD) {
  int mine = ok ? 1 : 0, every = 0;
  MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_MIN, comm);
  return every == 1;
}

inline int rank(MPI_Comm comm = MPI_COMM_WORLD) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

inline int size(MPI_Comm comm = MPI_COMM_WORLD) {
  int s = 1;
  MPI_Comm_size(comm, &s);
  return s;
}

}  // namespace dpmlp_test
