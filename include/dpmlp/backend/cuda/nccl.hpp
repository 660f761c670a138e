// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/nccl.hpp: the NCCL communicator (Kokkos::Cuda).
//
// NcclCommunicator has MpiCommunicator's interface, but its collectives are stream-ordered: each one is
// enqueued on the Kokkos execution space's CUDA stream and the call returns at once, before any data moved.
// Kernels enqueued before it on that stream produce its input, kernels enqueued after it see its output, and
// the host never waits. So a training loop can enqueue 100 steps (forward, backward, allreduce of the
// gradients, update) with no host synchronization at all, and fence once when it wants a number. The price:
// the data is only valid on the host after a fence of that space (stream_ordered tells generic code so).
//
// Bootstrap goes through MPI: rank 0 of a private duplicate of the given MPI_Comm makes the ncclUniqueId,
// MPI_Bcast hands it to the others, and every rank joins with ncclCommInitRank on the CUDA device Kokkos
// drives. NCCL needs one GPU per rank: the constructor checks that first (GPU UUIDs), and every rank throws
// CommError when two ranks share a GPU, rather than hanging in ncclCommInitRank.
//
// Timeouts (comm/timed.hpp): the communicator is made non-blocking (ncclConfig_t::blocking = 0), so
// ncclCommInitRank and a collective's enqueue return at once and are polled (ncclCommGetAsyncError) against the
// collective timeout of the MPI communicator (TrainerOptions::collective_timeout_s on a trainer's). The trainer
// waits for its space with wait(), not a fence: it polls the stream and NCCL's asynchronous error, and counts
// progress by marks (CUDA events) recorded after every 8th step it enqueues; with no mark passed for the timeout, or
// when another rank gave up (the roll call over MPI), it aborts the NCCL communicator (ncclCommAbort: the
// kernels waiting for the missing rank return) and throws CollectiveTimeout naming the ranks that did not answer.
// The communicator is then unusable; every later collective throws.
//
// Teardown: a CUDA graph that captured NCCL collectives must be destroyed (cudaGraphExecDestroy and
// cudaGraphDestroy) before the communicator is; otherwise ncclCommDestroy can wait forever for work the graph
// still references.
//
// Include dpmlp/comm/communicator.hpp rather than this header: this one is empty unless KOKKOS_ENABLE_CUDA and
// DPMLP_HAVE_NCCL are both defined (CMake defines the latter when it finds NCCL), and then defines
// DPMLP_HAS_NCCL_COMMUNICATOR.
#pragma once

#include <type_traits>

#include "dpmlp/comm/mpi.hpp"
#include "dpmlp/comm/timed.hpp"
#include "dpmlp/devices.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_NCCL)

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>
#include <stdexcept>
#include <string>
#include <utility>

#define DPMLP_HAS_NCCL_COMMUNICATOR 1

namespace dpmlp {

namespace detail {

inline void check_nccl(ncclResult_t result, const char* what, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return;
  std::string message = std::string("dpmlp: ") + what + " failed: " + ncclGetErrorString(result);
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  // The detail behind the code ("Duplicate GPU detected", a socket error, ...).
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && detail[0] != '\0') message += std::string(" (") + detail + ")";
#else
  (void)comm;
#endif
  throw CommError(message);
}

inline void check_cuda(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    throw CommError(std::string("dpmlp: ") + what + " failed: " + cudaGetErrorName(code) + ": " +
                    cudaGetErrorString(code));
  }
}

template <class T>
constexpr bool has_nccl_type() {
  return std::is_same<T, float>::value || std::is_same<T, double>::value ||
         std::is_same<T, std::int32_t>::value || std::is_same<T, std::int64_t>::value ||
         std::is_same<T, std::uint8_t>::value || std::is_same<T, std::int8_t>::value ||
         std::is_same<T, std::uint32_t>::value || std::is_same<T, std::uint64_t>::value;
}

template <class T>
ncclDataType_t nccl_type() {
  static_assert(
      has_nccl_type<T>(),
      "dpmlp::NcclCommunicator: the scalar type must be float, double, [u]int8, [u]int32 or [u]int64");
  if (std::is_same<T, float>::value) return ncclFloat32;
  if (std::is_same<T, double>::value) return ncclFloat64;
  if (std::is_same<T, std::int32_t>::value) return ncclInt32;
  if (std::is_same<T, std::int64_t>::value) return ncclInt64;
  if (std::is_same<T, std::uint32_t>::value) return ncclUint32;
  if (std::is_same<T, std::uint64_t>::value) return ncclUint64;
  if (std::is_same<T, std::int8_t>::value) return ncclInt8;
  return ncclUint8;
}

}  // namespace detail

class NcclCommunicator {
 public:
  static constexpr const char* name() { return "nccl"; }
  // Collectives are enqueued on the execution space's stream and return before the data moved: fence the
  // space before the host reads the result.
  static constexpr bool stream_ordered = true;

  // Collective over `comm`. Kokkos must be initialized (it chose this rank's device).
  explicit NcclCommunicator(MPI_Comm comm) : comm_(comm) {
    // Kokkos has already made its device current on this thread; say so again in case other code changed it,
    // because ncclCommInitRank binds the communicator to the current device.
    detail::check_cuda(cudaSetDevice(Kokkos::Cuda().cuda_device()), "cudaSetDevice");

    // Two ranks on one GPU hang ncclCommInitRank (more ranks than GPUs never return from it). One
    // allgather of the GPU UUIDs turns that into an error that every rank throws.
    const int gpus = count_physical_devices<Kokkos::Cuda>(comm_.get(), false, Kokkos::Cuda());
    if (gpus != size()) {
      throw CommError("dpmlp::NcclCommunicator: NCCL needs one GPU per rank, but the " +
                      std::to_string(size()) + " ranks drive " + std::to_string(gpus) +
                      " distinct GPUs; use MpiCommunicator, or one rank per GPU");
    }

    // A failure on rank 0 alone would leave the others in MPI_Bcast forever: agree on it first.
    ncclUniqueId id{};
    std::string failure;
    if (rank() == 0) {
      const ncclResult_t result = ncclGetUniqueId(&id);
      if (result != ncclSuccess) {
        failure = std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(result);
      }
    }
    agree<CommError>(comm_.get(), failure);
    timed_bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, comm_.get(),
                "MPI_Bcast (NcclCommunicator: the unique id)");

    // ncclCommInitRank waits until every rank joined: non-blocking, it is polled against the collective
    // timeout, and aborted past it. If it fails everywhere (a configuration problem, the usual case), all ranks
    // agree and throw together; ranks that did get a communicator free it first.
    ncclComm_t nccl = nullptr;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t result = ncclCommInitRankConfig(&nccl, size(), id, rank(), &config);
    if (nccl != nullptr && (result == ncclSuccess || result == ncclInProgress)) {
      result = poll_async(nccl, "ncclCommInitRank");
    }
#else
    const ncclResult_t result = ncclCommInitRank(&nccl, size(), id, rank());
#endif
    failure.clear();
    if (result != ncclSuccess) {
      try {
        detail::check_nccl(result, "ncclCommInitRank", nccl);
      } catch (const CommError& e) {
        failure = e.what();
      }
    }
    try {
      agree<CommError>(comm_.get(), failure);
    } catch (...) {
      if (nccl != nullptr) (void)(result == ncclSuccess ? ncclCommDestroy(nccl) : ncclCommAbort(nccl));
      throw;
    }
    nccl_ = nccl;
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  NcclCommunicator(NcclCommunicator&& o) noexcept
      : comm_(std::move(o.comm_)),
        nccl_(std::exchange(o.nccl_, nullptr)),
        marks_(std::move(o.marks_)),
        spare_(std::move(o.spare_)) {}
  NcclCommunicator& operator=(NcclCommunicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::move(o.comm_);
      nccl_ = std::exchange(o.nccl_, nullptr);
      marks_ = std::move(o.marks_);
      spare_ = std::move(o.spare_);
    }
    return *this;
  }
  ~NcclCommunicator() { release(); }

  MPI_Comm mpi_comm() const { return comm_.get(); }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  // The NCCL communicator, for code that wants to call NCCL itself (grouped calls, say). It is non-blocking
  // (NCCL 2.14 and later): a call may return ncclInProgress, to be polled with ncclCommGetAsyncError.
  ncclComm_t nccl_comm() const { return nccl_; }

  // data <- sum over ranks of data (a contiguous rank-1 View in device memory), in place, enqueued on space.
  template <class ExecSpace, class View>
  void allreduce_sum(const ExecSpace& space, const View& data) const {
    using T = typename View::non_const_value_type;
    check_args<ExecSpace, View>(data, "allreduce_sum");
    if (data.span() == 0) return;
    settle(ncclAllReduce(data.data(), data.data(), data.span(), detail::nccl_type<T>(), ncclSum, live(),
                         space.cuda_stream()),
           "ncclAllReduce");
  }

  // recv <- the concatenation, in rank order, of every rank's send (all of the same size), enqueued on space.
  template <class ExecSpace, class SendView, class RecvView>
  void allgather(const ExecSpace& space, const SendView& send, const RecvView& recv) const {
    using T = typename RecvView::non_const_value_type;
    static_assert(std::is_same<typename SendView::non_const_value_type, T>::value,
                  "dpmlp::NcclCommunicator::allgather: send and recv must hold the same scalar type");
    check_args<ExecSpace, SendView>(send, "allgather");
    check_args<ExecSpace, RecvView>(recv, "allgather");
    if (recv.span() != send.span() * static_cast<std::size_t>(size())) {
      throw std::invalid_argument("dpmlp::NcclCommunicator::allgather: recv must hold size() * send.span()");
    }
    if (send.span() == 0) return;
    settle(ncclAllGather(send.data(), recv.data(), send.span(), detail::nccl_type<T>(), live(), space.cuda_stream()),
           "ncclAllGather");
  }

  // data <- root's data on every rank, in place, enqueued on space.
  template <class ExecSpace, class View>
  void broadcast(const ExecSpace& space, const View& data, int root) const {
    using T = typename View::non_const_value_type;
    check_args<ExecSpace, View>(data, "broadcast");
    if (root < 0 || root >= size()) {
      throw std::invalid_argument("dpmlp::NcclCommunicator::broadcast: root " + std::to_string(root) +
                                  " is not a rank of the communicator");
    }
    if (data.span() == 0) return;
    settle(ncclBroadcast(data.data(), data.data(), data.span(), detail::nccl_type<T>(), root, live(),
                         space.cuda_stream()),
           "ncclBroadcast");
  }

  // A progress mark on the space's stream after every kMarkEvery calls (a CUDA event; skipped during a stream
  // capture): wait() counts the timeout from the last mark that passed. Marks are recycled once passed; the
  // stream's launch queue bounds how many can be pending.
  void mark(const Kokkos::Cuda& space) const {
    constexpr int kMarkEvery = 8;
    if (nccl_ == nullptr || ++unmarked_ < kMarkEvery) return;
    unmarked_ = 0;
    while (marks_.size() >= 1024 && cudaEventQuery(marks_.front()) == cudaSuccess) {
      spare_.push_back(marks_.front());
      marks_.pop_front();
    }
    if (marks_.size() >= 1024) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(space.cuda_stream(), &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone) {
      return;
    }
    cudaEvent_t event = nullptr;
    if (!spare_.empty()) {
      event = spare_.back();
      spare_.pop_back();
    } else if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      return;
    }
    if (cudaEventRecord(event, space.cuda_stream()) != cudaSuccess) {
      spare_.push_back(event);
      return;
    }
    marks_.push_back(event);
  }

  // Waits for everything enqueued on the space (a fence, with the timeout): CollectiveTimeout when no progress
  // mark passed for the collective timeout, or another rank gave up; CommError on an asynchronous NCCL error.
  // Either way the NCCL communicator is aborted first.
  void wait(const Kokkos::Cuda& space, const char* what) const {
    using clock = std::chrono::steady_clock;
    detail::CommWatch& w = detail::watch(comm_.get());
    const auto timeout = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(w.timeout_s));
    const auto start = clock::now();
    auto progress = start;
    std::chrono::microseconds pause{20};
    for (;;) {
      const cudaError_t done = cudaStreamQuery(space.cuda_stream());
      if (done == cudaSuccess) {
        spare_.insert(spare_.end(), marks_.begin(), marks_.end());
        marks_.clear();
        return;
      }
      if (done != cudaErrorNotReady) detail::check_cuda(done, what);
      const auto now = clock::now();
      if (now - start < detail::kSpin) continue;
      if (nccl_ != nullptr) {
        ncclResult_t async = ncclSuccess;
        const ncclResult_t got = ncclCommGetAsyncError(nccl_, &async);
        if (got != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
          const ncclResult_t bad = got != ncclSuccess ? got : async;
          abort_nccl();
          detail::check_nccl(bad, what);
        }
      }
      while (!marks_.empty() && cudaEventQuery(marks_.front()) == cudaSuccess) {
        spare_.push_back(marks_.front());
        marks_.pop_front();
        progress = now;
      }
      int other = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, detail::kRollCallTag, comm_.get(), &other, &status);
      if (other || now - progress >= timeout) give_up(what, now - progress, other != 0);
      std::this_thread::sleep_for(pause);
      pause = detail::next_pause(pause, now - start);
    }
  }

 private:
  template <class ExecSpace, class View>
  static void check_args(const View& v, const char* what) {
    static_assert(std::is_same<ExecSpace, Kokkos::Cuda>::value,
                  "dpmlp::NcclCommunicator: the execution space must be Kokkos::Cuda");
    static_assert(Kokkos::SpaceAccessibility<Kokkos::Cuda, typename View::memory_space>::accessible,
                  "dpmlp::NcclCommunicator: the View must live in CUDA device memory");
    static_assert(
        detail::has_nccl_type<typename View::non_const_value_type>(),
        "dpmlp::NcclCommunicator: the scalar type must be float, double, [u]int8, [u]int32 or [u]int64");
    if (!v.span_is_contiguous()) {
      throw std::invalid_argument(std::string("dpmlp::NcclCommunicator::") + what + ": View not contiguous");
    }
  }

  ncclComm_t live() const {
    if (nccl_ == nullptr) {
      const detail::CommWatch& w = detail::watch(comm_.get());
      if (!w.abandoned.empty()) throw CollectiveTimeout("dpmlp::NcclCommunicator: aborted after: " + w.abandoned);
      throw std::logic_error("dpmlp::NcclCommunicator: used after being moved from");
    }
    return nccl_;
  }

  // An enqueue's result: ncclInProgress (a non-blocking communicator still connecting) is polled until it
  // settles, with the timeout.
  void settle(ncclResult_t result, const char* what) const {
    if (result == ncclInProgress) result = poll_async(nccl_, what);
    detail::check_nccl(result, what, nccl_);
  }

  // Polls ncclCommGetAsyncError until it is not ncclInProgress; past the collective timeout, gives up
  // (CollectiveTimeout, after ncclCommAbort).
  ncclResult_t poll_async(ncclComm_t nccl, const char* what) const {
    using clock = std::chrono::steady_clock;
    const double timeout_s = detail::watch(comm_.get()).timeout_s;
    const auto start = clock::now();
    std::chrono::microseconds pause{20};
    for (;;) {
      ncclResult_t async = ncclInProgress;
      const ncclResult_t got = ncclCommGetAsyncError(nccl, &async);
      if (got != ncclSuccess) return got;
      if (async != ncclInProgress) return async;
      const auto waited = clock::now() - start;
      if (waited >= std::chrono::duration<double>(timeout_s)) {
        (void)ncclCommAbort(nccl);
        if (nccl == nccl_) nccl_ = nullptr;
        give_up(what, waited, false);
      }
      std::this_thread::sleep_for(pause);
      pause = detail::next_pause(pause, waited);
    }
  }

  // The roll call over MPI (comm/timed.hpp), then ncclCommAbort, then CollectiveTimeout.
  [[noreturn]] void give_up(const char* what, std::chrono::steady_clock::duration waited, bool other) const {
    detail::CommWatch& w = detail::watch(comm_.get());
    const std::vector<int> missing = detail::roll_call(comm_.get(), w);
    abort_nccl();
    const double s = std::chrono::duration<double>(waited).count();
    w.abandoned = std::string("dpmlp: ") + what + ": rank " + std::to_string(rank()) +
                  (other ? " gave up (another rank timed out) after " : " saw no progress for ") +
                  detail::seconds_text(s) + " (collective timeout " + detail::seconds_text(w.timeout_s) +
                  "; NCCL communicator aborted): " + detail::ranks_text(missing) + detail::kAbandonedAdvice;
    throw CollectiveTimeout(w.abandoned);
  }

  // ncclCommAbort: the kernels waiting for other ranks return, so the stream drains.
  void abort_nccl() const noexcept {
    if (nccl_ != nullptr) (void)ncclCommAbort(nccl_);
    nccl_ = nullptr;
  }

  // Finalizing waits for the collectives still in flight, so no fence is needed. The communicator is
  // non-blocking: ncclCommFinalize is polled until it settles, for at most the collective timeout (a peer that
  // never finishes its part would otherwise hold this destructor forever), then destroyed, or aborted if it did
  // not settle. Skipped once Kokkos is finalized: the CUDA context may be going away, and a leak at exit is
  // better than a crash or a hang there. Never throws.
  void release() noexcept {
    if (nccl_ != nullptr && Kokkos::is_initialized()) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
      double timeout_s = default_collective_timeout_s;
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized && comm_.get() != MPI_COMM_NULL) {
        try {
          timeout_s = detail::watch(comm_.get()).timeout_s;
        } catch (...) {
        }
      }
      ncclResult_t state = ncclCommFinalize(nccl_);
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
      while (state == ncclSuccess || state == ncclInProgress) {
        ncclResult_t async = ncclInProgress;
        if (ncclCommGetAsyncError(nccl_, &async) != ncclSuccess) async = ncclInternalError;
        state = async;
        if (state != ncclInProgress || std::chrono::steady_clock::now() >= until) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      (void)(state == ncclSuccess ? ncclCommDestroy(nccl_) : ncclCommAbort(nccl_));
#else
      (void)ncclCommDestroy(nccl_);
#endif
    }
    nccl_ = nullptr;
    if (Kokkos::is_initialized()) {
      for (cudaEvent_t e : marks_) (void)cudaEventDestroy(e);
      for (cudaEvent_t e : spare_) (void)cudaEventDestroy(e);
    }
    marks_.clear();
    spare_.clear();
  }

  OwnedComm comm_;
  mutable ncclComm_t nccl_ = nullptr;  // null once aborted (after a timeout)
  mutable std::deque<cudaEvent_t> marks_;  // progress marks not yet seen to pass, oldest first
  mutable std::vector<cudaEvent_t> spare_;  // recorded marks that passed, for reuse
  mutable int unmarked_ = 0;                // mark() calls since the last recorded mark
};

}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA && DPMLP_HAVE_NCCL
