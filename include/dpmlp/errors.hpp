// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/errors.hpp: the exceptions dpmlp throws, and how ranks agree on a failure before a collective.
//
// A rank that throws while the others enter a collective leaves them waiting (until the collective timeout,
// comm/timed.hpp). So every check that can fail on one rank only (a bad shard, a file that does not open, an
// allocation) goes through agree(): all ranks learn whether any failed, and all throw the same error, carrying
// the first failing rank's message.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "dpmlp/comm/timed.hpp"
#include "dpmlp/exceptions.hpp"

namespace dpmlp {

// Collective. `message` is empty on a rank that is fine. If any rank has a message, every rank throws
// ErrorT with the lowest failing rank's message (prefixed with that rank), so all stop together.
template <class ErrorT = InputError>
void agree(MPI_Comm comm, const std::string& message) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const int mine = message.empty() ? INT32_MAX : rank;
  int first = INT32_MAX;
  timed_allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, "MPI_Allreduce (dpmlp::agree)");
  if (first == INT32_MAX) return;
  int length = rank == first ? static_cast<int>(message.size()) : 0;
  timed_bcast(&length, 1, MPI_INT, first, comm, "MPI_Bcast (dpmlp::agree)");
  std::vector<char> text(static_cast<std::size_t>(length) + 1, '\0');
  if (rank == first) message.copy(text.data(), message.size());
  timed_bcast(text.data(), length, MPI_CHAR, first, comm, "MPI_Bcast (dpmlp::agree)");
  throw ErrorT("rank " + std::to_string(first) + ": " + std::string(text.data()));
}

// Collective: runs f on every rank; if it throws a dpmlp::Error (or std::exception) on any rank, every rank
// throws the first failing rank's message as ErrorT. Use it around local work that precedes a collective.
template <class ErrorT = InputError, class F>
void all_or_none(MPI_Comm comm, F&& f) {
  std::string message;
  try {
    f();
  } catch (const std::exception& e) {
    message = e.what();
    if (message.empty()) message = "unknown error";
  }
  agree<ErrorT>(comm, message);
}

}  // namespace dpmlp
