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
#include "dpmlp/devices.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_NCCL)

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
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
    detail::check_mpi(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, comm_.get()), "MPI_Bcast");

    // ncclCommInitRank blocks until every rank joined. If it fails everywhere (a configuration problem, the
    // usual case), all ranks agree and throw together; ranks that did get a communicator free it first.
    ncclComm_t nccl = nullptr;
    const ncclResult_t result = ncclCommInitRank(&nccl, size(), id, rank());
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
      if (nccl != nullptr) (void)ncclCommDestroy(nccl);
      throw;
    }
    nccl_ = nccl;
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  NcclCommunicator(NcclCommunicator&& o) noexcept
      : comm_(std::move(o.comm_)), nccl_(std::exchange(o.nccl_, nullptr)) {}
  NcclCommunicator& operator=(NcclCommunicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::move(o.comm_);
      nccl_ = std::exchange(o.nccl_, nullptr);
    }
    return *this;
  }
  ~NcclCommunicator() { release(); }

  MPI_Comm mpi_comm() const { return comm_.get(); }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  // The NCCL communicator, for code that wants to call NCCL itself (grouped calls, say).
  ncclComm_t nccl_comm() const { return nccl_; }

  // data <- sum over ranks of data (a contiguous rank-1 View in device memory), in place, enqueued on space.
  template <class ExecSpace, class View>
  void allreduce_sum(const ExecSpace& space, const View& data) const {
    using T = typename View::non_const_value_type;
    check_args<ExecSpace, View>(data, "allreduce_sum");
    if (data.span() == 0) return;
    detail::check_nccl(ncclAllReduce(data.data(), data.data(), data.span(), detail::nccl_type<T>(), ncclSum,
                                     live(), space.cuda_stream()),
                       "ncclAllReduce", nccl_);
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
    detail::check_nccl(ncclAllGather(send.data(), recv.data(), send.span(), detail::nccl_type<T>(), live(),
                                     space.cuda_stream()),
                       "ncclAllGather", nccl_);
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
    detail::check_nccl(ncclBroadcast(data.data(), data.data(), data.span(), detail::nccl_type<T>(), root,
                                     live(), space.cuda_stream()),
                       "ncclBroadcast", nccl_);
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
    if (nccl_ == nullptr) throw std::logic_error("dpmlp::NcclCommunicator: used after being moved from");
    return nccl_;
  }

  // ncclCommDestroy waits for the collectives still in flight (it finalizes the communicator first), so no
  // fence is needed. It is skipped once Kokkos is finalized: the CUDA context may be going away, and a leak
  // at exit is better than a crash or a hang there. Never throws.
  void release() noexcept {
    if (nccl_ != nullptr && Kokkos::is_initialized()) (void)ncclCommDestroy(nccl_);
    nccl_ = nullptr;
  }

  OwnedComm comm_;
  ncclComm_t nccl_ = nullptr;
};

}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA && DPMLP_HAVE_NCCL
