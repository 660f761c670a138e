// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/step_graph.hpp: capturing one training step and replaying it, where the space can.
//
// At small sizes a step is a dozen short kernels plus a collective, and launch latency, not arithmetic,
// sets the time. Captured once (the kernels and a stream-ordered collective all go to the execution space's
// stream) and replayed, a step costs one launch. Only stream-ordered communicators can be captured: MPI blocks
// the host inside the step.
//
// StepGraph<ExecSpace> is a no-op type for every space but Kokkos::Cuda (backend/cuda/graph.hpp), so the
// trainer needs no #ifdef.
#pragma once

#include <string>

#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {
namespace backend {

template <class ExecSpace>
class StepGraph {
 public:
  static constexpr bool supported = false;
  bool ready() const { return false; }
  template <class F>
  std::string capture(const ExecSpace&, F&&) {
    return "CUDA graphs need Kokkos::Cuda";
  }
  void launch(const ExecSpace&) const {}
};

}  // namespace backend
}  // namespace dpmlp

#include "dpmlp/backend/cuda/graph.hpp"
