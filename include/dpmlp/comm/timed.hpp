// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/comm/timed.hpp: MPI collectives that give up after a timeout instead of waiting forever.
//
// Every host-side collective dpmlp calls (agree(), MpiCommunicator, the trainer's own, checkpoints, the
// standardizer) is the nonblocking MPI call (MPI_Iallreduce, ...) followed by wait(): MPI_Test in a loop,
// first spinning (a collective whose ranks are all there costs what the blocking call costs), then, after
// kSpin, with sleeps growing to 1 ms (next_pause), so a rank that waits long does not keep a core busy. A
// wait that passes the communicator's timeout (collective_timeout(comm): TrainerOptions::collective_timeout_s
// on a trainer's communicator; set_collective_timeout for any other; default_collective_timeout_s otherwise) throws
// CollectiveTimeout (a CommError) on every rank that can still act, naming the operation and the ranks that did
// not arrive:
//
//   roll call: the rank that timed out sends, point to point on the same communicator with tag kRollCallTag,
//   the index of the collective it waits in (each rank counts the dpmlp collectives it entered on the
//   communicator) to every other rank, and listens for up to roll_call_s(timeout) for theirs. A rank that
//   waits in a dpmlp collective sees the message within a poll and answers the same way, so every waiting
//   rank learns who is waiting where. A rank whose answer is missing, or names an earlier collective, did not
//   arrive. A rank that arrives later finds the message when it enters its next collective and throws too.
//
// After a timeout the communicator is abandoned: its collective requests stay pending (MPI cannot cancel a
// collective) and every later dpmlp collective on it throws CollectiveTimeout at once. The parameters are those after
// the last step whose collectives completed on that rank (a rank that arrives late can complete the
// abandoned collective, and so one more step, before it learns of the timeout at its next collective). The
// buffers of an abandoned request are kept for the rest of the process, so a late completion writes only into
// memory nobody else uses. A program should end (MPI_Abort, or return non-zero from every rank that can).
//
// The tag is reserved on every communicator dpmlp's collectives use: a caller's point-to-point messages on
// such a communicator must not use kRollCallTag.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dpmlp/exceptions.hpp"

namespace dpmlp {

// The default of TrainerOptions::collective_timeout_s and of every communicator nobody set one for.
inline constexpr double default_collective_timeout_s = 300;

namespace detail {

// MPI guarantees tags up to 32767.
constexpr int kRollCallTag = 32321;
// A wait spins this long before it starts to sleep between tests.
constexpr std::chrono::microseconds kSpin{2000};
// The sleep after `pause` in a wait that has lasted `waited`: doubling from 20 us, up to 100 us for the first
// kPatient, then up to 1 ms. A wait of a few milliseconds (a training call's end: an epoch of a small model)
// then ends within ~0.1 ms of its event; with sleeps of up to 1 ms from the start it ended up to 1 ms late, a
// quarter of such an epoch. A long wait still keeps its core idle.
constexpr std::chrono::milliseconds kPatient{100};
template <class Duration>
std::chrono::microseconds next_pause(std::chrono::microseconds pause, Duration waited) {
  const auto cap = std::chrono::microseconds(waited < kPatient ? 100 : 1000);
  return std::min(pause * 2, cap);
}

// What dpmlp keeps about a communicator: an MPI attribute, deleted with the communicator (after a timeout it
// is kept: pending sends read `note`). A duplicate (MPI_Comm_dup) inherits the timeout only.
struct CommWatch {
  double timeout_s = default_collective_timeout_s;
  std::int64_t entered = 0;  // dpmlp collectives this rank entered on the communicator
  std::string abandoned;     // why, after a timeout; empty while the communicator is usable
  std::int64_t note = 0;     // the roll call's send buffer
  std::vector<std::shared_ptr<void>> graveyard;  // the buffers of abandoned requests (detail::timed)
};

inline int watch_copy(MPI_Comm, int, void*, void* in, void* out, int* flag) {
  auto* copy = new CommWatch;
  copy->timeout_s = static_cast<CommWatch*>(in)->timeout_s;
  *static_cast<void**>(out) = copy;
  *flag = 1;
  return MPI_SUCCESS;
}

inline int watch_delete(MPI_Comm, int, void* attr, void*) {
  auto* w = static_cast<CommWatch*>(attr);
  if (w->abandoned.empty()) delete w;
  return MPI_SUCCESS;
}

inline int watch_keyval() {
  static const int key = [] {
    int k = MPI_KEYVAL_INVALID;
    check_mpi(MPI_Comm_create_keyval(watch_copy, watch_delete, &k, nullptr), "MPI_Comm_create_keyval");
    return k;
  }();
  return key;
}

inline CommWatch& watch(MPI_Comm comm) {
  void* value = nullptr;
  int found = 0;
  check_mpi(MPI_Comm_get_attr(comm, watch_keyval(), &value, &found), "MPI_Comm_get_attr");
  if (found) return *static_cast<CommWatch*>(value);
  auto* w = new CommWatch;
  const int code = MPI_Comm_set_attr(comm, watch_keyval(), w);
  if (code != MPI_SUCCESS) delete w;
  check_mpi(code, "MPI_Comm_set_attr");
  return *w;
}

// How long a rank that gave up listens for the others' answers.
inline double roll_call_s(double timeout_s) { return std::min(timeout_s, 2.0); }

inline std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g s", s);
  return text;
}

inline std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.empty()) return "every rank answered (a failure inside MPI?)";
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  const std::size_t shown = std::min<std::size_t>(ranks.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (shown < ranks.size()) s += ", ... (" + std::to_string(ranks.size()) + " in all)";
  return s + " did not arrive";
}

constexpr const char* kAbandonedAdvice =
    "; the communicator is abandoned (the parameters are those after the last completed step): end the program";

// The roll call (see the top of this file). Returns the ranks that did not arrive at this rank's current
// collective: no answer, or an answer naming an earlier one.
inline std::vector<int> roll_call(MPI_Comm comm, CommWatch& w) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  w.note = w.entered;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    // A small message: sent eagerly, so it completes whether or not the receiver ever runs again.
    if (MPI_Isend(&w.note, 1, MPI_INT64_T, r, kRollCallTag, comm, &request) == MPI_SUCCESS) {
      MPI_Request_free(&request);
    }
  }
  std::vector<std::int64_t> at(static_cast<std::size_t>(size), -1);
  at[static_cast<std::size_t>(rank)] = w.entered;
  int heard = 1;
  using clock = std::chrono::steady_clock;
  const auto until = clock::now() + std::chrono::duration<double>(roll_call_s(w.timeout_s));
  while (heard < size && clock::now() < until) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kRollCallTag, comm, &flag, &status) != MPI_SUCCESS) break;
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    std::int64_t theirs = -1;
    MPI_Recv(&theirs, 1, MPI_INT64_T, status.MPI_SOURCE, kRollCallTag, comm, MPI_STATUS_IGNORE);
    auto& slot = at[static_cast<std::size_t>(status.MPI_SOURCE)];
    if (slot < 0) ++heard;
    slot = std::max(slot, theirs);
  }
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (at[static_cast<std::size_t>(r)] < w.entered) missing.push_back(r);
  }
  return missing;
}

// Before a collective: refuses an abandoned communicator, and one on which another rank gave up (this rank
// is late: it must not post a collective the others will never complete), then counts the collective.
inline CommWatch& enter(MPI_Comm comm, const char* what) {
  CommWatch& w = watch(comm);
  if (w.abandoned.empty()) {
    int flag = 0;
    MPI_Status status;
    // Twice: an MPI may progress in a probe but match only in the next (Open MPI's ob1 does). A roll call
    // still in flight is not seen; the collective posted then fails at the next poll or collective instead.
    for (int i = 0; i < 2 && !flag; ++i) {
      check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kRollCallTag, comm, &flag, &status), "MPI_Iprobe");
    }
    if (flag) {
      int rank = 0;
      MPI_Comm_rank(comm, &rank);
      std::int64_t theirs = -1;
      MPI_Recv(&theirs, 1, MPI_INT64_T, status.MPI_SOURCE, kRollCallTag, comm, MPI_STATUS_IGNORE);
      w.abandoned = std::string("dpmlp: ") + what + ": rank " + std::to_string(rank) + " arrived after rank " +
                    std::to_string(status.MPI_SOURCE) + " gave up waiting for it (collective timeout " +
                    seconds_text(w.timeout_s) + ")" + kAbandonedAdvice;
      throw CollectiveTimeout(w.abandoned);
    }
  }
  if (!w.abandoned.empty()) {
    throw CollectiveTimeout(std::string("dpmlp: ") + what + ": refused, an earlier collective failed: " +
                            w.abandoned);
  }
  ++w.entered;
  return w;
}

// Waits for `request` (a collective on comm that this rank entered with enter()), or throws CommError once
// the communicator's timeout passed or another rank gave up.
inline void wait(MPI_Comm comm, CommWatch& w, MPI_Request& request, const char* what) {
  int done = 0;
  check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
  if (done) return;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration<double>(w.timeout_s);
  std::chrono::microseconds pause{20};
  for (;;) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    const auto now = clock::now();
    if (now - start < kSpin) continue;
    int rank = 0;
    int other = 0;
    MPI_Status status;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kRollCallTag, comm, &other, &status), "MPI_Iprobe");
    if (other || now >= deadline) {
      MPI_Comm_rank(comm, &rank);
      const int source = other ? status.MPI_SOURCE : rank;
      const std::vector<int> missing = roll_call(comm, w);
      const double waited = std::chrono::duration<double>(now - start).count();
      if (other) {
        w.abandoned = std::string("dpmlp: ") + what + ": rank " + std::to_string(rank) + " gave up after " +
                      seconds_text(waited) + ", as rank " + std::to_string(source) +
                      " did at the collective timeout (" + seconds_text(w.timeout_s) + "): " + ranks_text(missing) +
                      kAbandonedAdvice;
      } else {
        w.abandoned = std::string("dpmlp: ") + what + ": rank " + std::to_string(rank) + " waited " +
                      seconds_text(waited) + " (the collective timeout) and gave up: " + ranks_text(missing) +
                      kAbandonedAdvice;
      }
      throw CollectiveTimeout(w.abandoned);
    }
    std::this_thread::sleep_for(pause);
    pause = next_pause(pause, now - start);
  }
}

}  // namespace detail

// The timeout of dpmlp's collectives on `comm`, in seconds (local, not collective). Every rank should set the
// same. Duplicates made afterwards (a trainer's, a communicator's) inherit it. Refuses a value that is not
// positive and finite with InputError.
inline void set_collective_timeout(MPI_Comm comm, double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    throw InputError("dpmlp::set_collective_timeout: the timeout must be positive and finite, got " +
                     std::to_string(seconds));
  }
  detail::watch(comm).timeout_s = seconds;
}

inline double collective_timeout(MPI_Comm comm) { return detail::watch(comm).timeout_s; }

// Whether a collective on `comm` timed out (on this rank, or another rank gave up and this one learned it):
// then every dpmlp collective on it throws CommError.
inline bool collective_abandoned(MPI_Comm comm) { return !detail::watch(comm).abandoned.empty(); }

namespace detail {

// Starts a nonblocking collective (start(&request) returns the MPI code), waits for it, and on a timeout
// keeps `keep...` (what owns the buffers: Views, staging vectors) alive for the rest of the process: MPI cannot
// cancel the abandoned request, and a rank that arrives late can still complete it and write into them.
template <class Start, class... Keep>
void timed(MPI_Comm comm, const char* what, Start&& start, const Keep&... keep) {
  CommWatch& w = enter(comm, what);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(start(&request), what);
  try {
    wait(comm, w, request, what);
  } catch (...) {
    if (!w.abandoned.empty()) w.graveyard.push_back(std::make_shared<std::tuple<Keep...>>(keep...));
    throw;
  }
}

using Bytes = std::shared_ptr<std::vector<unsigned char>>;

inline std::size_t type_bytes(MPI_Datatype type, std::int64_t count) {
  int size = 0;
  check_mpi(MPI_Type_size(type, &size), "MPI_Type_size");
  return static_cast<std::size_t>(size) * static_cast<std::size_t>(count);
}

inline Bytes staged(const void* from, std::size_t bytes, std::size_t capacity) {
  auto b = std::make_shared<std::vector<unsigned char>>(std::max<std::size_t>(capacity, 1));
  if (from != nullptr && bytes > 0) std::memcpy(b->data(), from, bytes);
  return b;
}

}  // namespace detail

// The blocking MPI collectives, with the timeout (this file's top). `what` names the operation in the
// CommError. Buffers, counts and types as for the MPI call (basic types); the data goes through buffers of
// dpmlp's own (one copy each way), so that an abandoned request never writes into the caller's memory: for
// control messages and other small data. MpiCommunicator moves large data with detail::timed, keeping the
// Views alive instead.
inline void timed_allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                            const char* what = "MPI_Allreduce") {
  const std::size_t bytes = detail::type_bytes(type, count);
  const detail::Bytes b = detail::staged(send == MPI_IN_PLACE ? recv : send, bytes, bytes);
  detail::timed(
      comm, what, [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, b->data(), count, type, op, comm, r); },
      b);
  if (bytes > 0) std::memcpy(recv, b->data(), bytes);
}

inline void timed_bcast(void* data, int count, MPI_Datatype type, int root, MPI_Comm comm,
                        const char* what = "MPI_Bcast") {
  const std::size_t bytes = detail::type_bytes(type, count);
  const detail::Bytes b = detail::staged(data, bytes, bytes);
  detail::timed(comm, what, [&](MPI_Request* r) { return MPI_Ibcast(b->data(), count, type, root, comm, r); }, b);
  if (bytes > 0) std::memcpy(data, b->data(), bytes);
}

inline void timed_allgather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                            MPI_Datatype recv_type, MPI_Comm comm, const char* what = "MPI_Allgather") {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const std::size_t in = detail::type_bytes(send_type, send_count);
  const std::size_t out = detail::type_bytes(recv_type, std::int64_t(recv_count) * size);
  const detail::Bytes s = detail::staged(send, in, in), g = detail::staged(nullptr, 0, out);
  detail::timed(
      comm, what,
      [&](MPI_Request* r) {
        return MPI_Iallgather(s->data(), send_count, send_type, g->data(), recv_count, recv_type, comm, r);
      },
      s, g);
  if (out > 0) std::memcpy(recv, g->data(), out);
}

inline void timed_gather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                         MPI_Datatype recv_type, int root, MPI_Comm comm, const char* what = "MPI_Gather") {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const std::size_t in = detail::type_bytes(send_type, send_count);
  const std::size_t out = rank == root ? detail::type_bytes(recv_type, std::int64_t(recv_count) * size) : 0;
  const detail::Bytes s = detail::staged(send, in, in), g = detail::staged(nullptr, 0, out);
  detail::timed(
      comm, what,
      [&](MPI_Request* r) {
        return MPI_Igather(s->data(), send_count, send_type, g->data(), recv_count, recv_type, root, comm, r);
      },
      s, g);
  if (out > 0) std::memcpy(recv, g->data(), out);
}

inline void timed_alltoall(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                           MPI_Datatype recv_type, MPI_Comm comm, const char* what = "MPI_Alltoall") {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const std::size_t in = detail::type_bytes(send_type, std::int64_t(send_count) * size);
  const std::size_t out = detail::type_bytes(recv_type, std::int64_t(recv_count) * size);
  const detail::Bytes s = detail::staged(send, in, in), g = detail::staged(nullptr, 0, out);
  detail::timed(
      comm, what,
      [&](MPI_Request* r) {
        return MPI_Ialltoall(s->data(), send_count, send_type, g->data(), recv_count, recv_type, comm, r);
      },
      s, g);
  if (out > 0) std::memcpy(recv, g->data(), out);
}

// On the root, send_counts and displs (in elements of send_type) describe the pieces of `send`; elsewhere they
// are not read.
inline void timed_scatterv(const void* send, const int* send_counts, const int* displs, MPI_Datatype send_type,
                           void* recv, int recv_count, MPI_Datatype recv_type, int root, MPI_Comm comm,
                           const char* what = "MPI_Scatterv") {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  auto arrays = std::make_shared<std::vector<int>>(2 * static_cast<std::size_t>(size), 0);
  std::int64_t extent = 0;
  if (rank == root) {
    for (int r = 0; r < size; ++r) {
      (*arrays)[r] = send_counts[r];
      (*arrays)[size + r] = displs[r];
      extent = std::max<std::int64_t>(extent, std::int64_t(displs[r]) + send_counts[r]);
    }
  }
  const std::size_t in = detail::type_bytes(send_type, extent), out = detail::type_bytes(recv_type, recv_count);
  const detail::Bytes s = detail::staged(send, in, in), g = detail::staged(nullptr, 0, out);
  detail::timed(
      comm, what,
      [&](MPI_Request* r) {
        return MPI_Iscatterv(s->data(), arrays->data(), arrays->data() + size, send_type, g->data(), recv_count,
                             recv_type, root, comm, r);
      },
      s, g, arrays);
  if (out > 0) std::memcpy(recv, g->data(), out);
}

inline void timed_barrier(MPI_Comm comm, const char* what = "MPI_Barrier") {
  detail::timed(comm, what, [&](MPI_Request* r) { return MPI_Ibarrier(comm, r); });
}

// MPI_Comm_dup with the timeout of `comm` (MPI_Comm_idup): the duplicate inherits it.
inline MPI_Comm timed_dup(MPI_Comm comm, const char* what = "MPI_Comm_dup") {
  auto dup = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  detail::timed(comm, what, [&](MPI_Request* r) { return MPI_Comm_idup(comm, dup.get(), r); }, dup);
  return *dup;
}

}  // namespace dpmlp
