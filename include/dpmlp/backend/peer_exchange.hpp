// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/peer_exchange.hpp: TrainerOptions::peer_exchange, the block tree's exchange by direct writes into
// the other GPUs' memory (backend/cuda/peer.hpp). On builds without CUDA this header stands in for it (a reason
// why it cannot run, an empty PeerExchange), so the trainer needs no #ifdef.
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)

#include "dpmlp/backend/cuda/peer.hpp"

#else

#include <mpi.h>

#include <memory>
#include <string>

#include "dpmlp/reduction.hpp"

namespace dpmlp {
namespace backend {

template <class ExecSpace, class Scalar>
std::string peer_exchange_unsupported() {
  return "it needs a CUDA build of Kokkos (Kokkos::Cuda)";
}
class PeerExchange {
 public:
  std::string failure() const { return {}; }
  void busy() {}
  void quiet() {}
};
template <class ExecSpace, class Scalar>
std::shared_ptr<PeerExchange> make_peer_exchange(MPI_Comm, const BlockTreeReducer<ExecSpace, Scalar>&, double) {
  return nullptr;
}
template <class ExecSpace, class Scalar, class F>
void reduce_apply_peer(const ExecSpace&, const BlockTreeReducer<ExecSpace, Scalar>&,
                       const typename BlockTreeReducer<ExecSpace, Scalar>::matrix&, const PeerExchange&, const F&) {}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
