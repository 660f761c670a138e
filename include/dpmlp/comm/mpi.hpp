// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/comm/mpi.hpp: the MPI communicator, the portable one.
//
// A Communicator is a policy type of DataParallelTrainer (see comm/communicator.hpp for the concept). This
// one owns a duplicate of the MPI_Comm it is given, so dpmlp's messages never mix with the caller's. Its
// collectives give up after the duplicate's collective timeout (comm/timed.hpp) with CommError.
//
// Device data: when the View lives where the host can read it, or MPI is CUDA-aware, MPI gets the View's
// pointer. Otherwise the data is staged through a host mirror: fence the space, copy down, MPI, copy up.
// That host synchronization per collective is the price of the portable path; NcclCommunicator
// (backend/cuda/nccl.hpp) enqueues on the stream instead.
#pragma once

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "dpmlp/comm/timed.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {

template <class T>
MPI_Datatype mpi_type() {
  if (std::is_same<T, float>::value) return MPI_FLOAT;
  if (std::is_same<T, double>::value) return MPI_DOUBLE;
  if (std::is_same<T, std::int32_t>::value) return MPI_INT32_T;
  if (std::is_same<T, std::int64_t>::value) return MPI_INT64_T;
  if (std::is_same<T, std::uint32_t>::value) return MPI_UINT32_T;
  if (std::is_same<T, std::uint64_t>::value) return MPI_UINT64_T;
  if (std::is_same<T, unsigned char>::value) return MPI_UINT8_T;
  throw std::invalid_argument("dpmlp: no MPI datatype for this scalar type");
}

// Whether this MPI library can read device memory directly (OpenMPI's MPIX_Query_cuda_support).
inline bool mpi_is_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

// Owns an MPI_Comm (a duplicate, or nothing when moved from). Shared by the communicators.
class OwnedComm {
 public:
  OwnedComm() = default;
  explicit OwnedComm(MPI_Comm comm) {
    if (comm == MPI_COMM_NULL) throw InputError("dpmlp: the communicator is MPI_COMM_NULL");
    comm_ = timed_dup(comm, "MPI_Comm_idup (a dpmlp communicator's duplicate)");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  OwnedComm(OwnedComm&& o) noexcept { *this = std::move(o); }
  OwnedComm& operator=(OwnedComm&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
    }
    return *this;
  }
  ~OwnedComm() { release(); }

  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  void release() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // An abandoned communicator (a collective timed out) still has requests pending that MPI cannot cancel:
    // it is left to MPI's teardown rather than freed under them.
    if (comm_ != MPI_COMM_NULL && !finalized && !collective_abandoned(comm_)) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

class MpiCommunicator {
 public:
  static constexpr const char* name() { return "mpi"; }
  // Collectives return with the result in place: the host waits for each one.
  static constexpr bool stream_ordered = false;

  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {}

  MPI_Comm mpi_comm() const { return comm_.get(); }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  // data <- sum over ranks of data (a contiguous rank-1 View).
  template <class ExecSpace, class View>
  void allreduce_sum(const ExecSpace& space, const View& data) const {
    using T = typename View::non_const_value_type;
    with_host_data(space, data, true, [&](T* p, const auto& owner) {
      detail::timed(
          comm_.get(), "MPI_Allreduce (dpmlp::MpiCommunicator::allreduce_sum)",
          [&](MPI_Request* r) {
            return MPI_Iallreduce(MPI_IN_PLACE, p, count(data), mpi_type<T>(), MPI_SUM, comm_.get(), r);
          },
          owner);
    });
  }

  // recv <- the concatenation, in rank order, of every rank's send (all of the same size).
  template <class ExecSpace, class SendView, class RecvView>
  void allgather(const ExecSpace& space, const SendView& send, const RecvView& recv) const {
    if (recv.span() != send.span() * static_cast<std::size_t>(size())) {
      throw std::invalid_argument("dpmlp::MpiCommunicator::allgather: recv must hold size() * send.span()");
    }
    if (direct(recv)) {
      compat::fence(space, "dpmlp::MpiCommunicator::allgather");
      gather(send, recv);
      return;
    }
    auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), send);
    auto hr = compat::mirror_view_no_init(recv);
    gather(hs, hr);
    Kokkos::deep_copy(space, recv, hr);
  }

  template <class ExecSpace, class View>
  void broadcast(const ExecSpace& space, const View& data, int root) const {
    using T = typename View::non_const_value_type;
    with_host_data(space, data, rank() == root, [&](T* p, const auto& owner) {
      detail::timed(
          comm_.get(), "MPI_Bcast (dpmlp::MpiCommunicator::broadcast)",
          [&](MPI_Request* r) { return MPI_Ibcast(p, count(data), mpi_type<T>(), root, comm_.get(), r); }, owner);
    });
  }

 private:
  // MPI_Allgather of Views MPI can read; an abandoned request keeps them (comm/timed.hpp).
  template <class SendView, class RecvView>
  void gather(const SendView& send, const RecvView& recv) const {
    using T = typename RecvView::non_const_value_type;
    detail::timed(
        comm_.get(), "MPI_Allgather (dpmlp::MpiCommunicator::allgather)",
        [&](MPI_Request* r) {
          return MPI_Iallgather(send.data(), count(send), mpi_type<T>(), recv.data(), count(send), mpi_type<T>(),
                                comm_.get(), r);
        },
        send, recv);
  }

  template <class View>
  static int count(const View& v) {
    if (v.span() > static_cast<std::size_t>(INT32_MAX)) {
      throw std::invalid_argument("dpmlp::MpiCommunicator: more than 2^31 elements in one collective");
    }
    return static_cast<int>(v.span());
  }

  template <class View>
  static bool direct(const View&) {
    using Mem = typename View::memory_space;
    if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible) return true;
#if defined(KOKKOS_ENABLE_CUDA)
    // CUDA-awareness says nothing about other devices' memory (a HIP build may link a CUDA-aware MPI).
    if (std::is_same<typename Mem::execution_space, Kokkos::Cuda>::value) return mpi_is_cuda_aware();
#endif
    return false;
  }

  // Runs f(pointer, owner) on a host-visible pointer to data and the View that owns it: the View itself where
  // MPI can read it, else a mirror that is filled (when `down`) before and copied back after.
  template <class ExecSpace, class View, class F>
  static void with_host_data(const ExecSpace& space, const View& data, bool down, F&& f) {
    if (!data.span_is_contiguous()) throw std::invalid_argument("dpmlp::MpiCommunicator: View not contiguous");
    compat::fence(space, "dpmlp::MpiCommunicator");
    if (direct(data)) {
      f(data.data(), data);
      return;
    }
    auto host = compat::mirror_view_no_init(data);
    if (down) Kokkos::deep_copy(host, data);
    f(host.data(), host);
    Kokkos::deep_copy(space, data, host);
  }

  OwnedComm comm_;
};

}  // namespace dpmlp
