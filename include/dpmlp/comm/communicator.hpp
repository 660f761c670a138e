// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/comm/communicator.hpp: the Communicator concept, its implementations, and the default per space.
//
// A Communicator is a policy type of DataParallelTrainer. It is constructible from an MPI_Comm (which it
// duplicates and owns), and provides, for contiguous rank-1 Views in the execution space's memory:
//   static constexpr const char* name();     "mpi", "nccl"
//   static constexpr bool stream_ordered;     true: collectives are enqueued on the space, the host does
//                                             not wait (NCCL); false: the host waits for each (MPI)
//   MPI_Comm mpi_comm() const; int rank() const; int size() const;
//   void allreduce_sum(const ExecSpace&, const View& data) const;           in place
//   void allgather(const ExecSpace&, const View& send, const View& recv) const;
//   void broadcast(const ExecSpace&, const View& data, int root) const;
// A stream-ordered communicator may also provide
//   void mark(const ExecSpace&) const;                   a progress mark after each step the trainer enqueues
//   void wait(const ExecSpace&, const char* what) const; wait for the space, giving up after the collective
//                                                        timeout without progress (CollectiveTimeout)
// which the trainer then uses instead of fences (detail::has_stream_wait).
// Host-side agreement on errors always goes over MPI (errors.hpp), whatever the communicator.
#pragma once

#include <type_traits>
#include <utility>

#include "dpmlp/backend/cuda/nccl.hpp"
#include "dpmlp/comm/mpi.hpp"

namespace dpmlp {

// The communicator dpmlp uses on ExecSpace unless told otherwise: NCCL on CUDA where it was found, MPI
// everywhere else.
#if defined(DPMLP_HAS_NCCL_COMMUNICATOR)
template <class ExecSpace>
using default_communicator_t =
    std::conditional_t<std::is_same<ExecSpace, Kokkos::Cuda>::value, NcclCommunicator, MpiCommunicator>;
#else
template <class ExecSpace>
using default_communicator_t = MpiCommunicator;
#endif

namespace detail {
template <class Comm, class ExecSpace, class = void>
struct has_stream_wait : std::false_type {};
template <class Comm, class ExecSpace>
struct has_stream_wait<Comm, ExecSpace,
                       std::void_t<decltype(std::declval<const Comm&>().wait(std::declval<const ExecSpace&>(), "")),
                                   decltype(std::declval<const Comm&>().mark(std::declval<const ExecSpace&>()))>>
    : std::true_type {};
}  // namespace detail

template <class Comm, class = void>
struct is_communicator : std::false_type {};

template <class Comm>
struct is_communicator<
    Comm, std::void_t<decltype(Comm::name()), decltype(Comm::stream_ordered),
                      decltype(std::declval<const Comm&>().mpi_comm()), decltype(std::declval<const Comm&>().rank()),
                      decltype(std::declval<const Comm&>().size()),
                      std::enable_if_t<std::is_constructible<Comm, MPI_Comm>::value>>> : std::true_type {};

}  // namespace dpmlp
