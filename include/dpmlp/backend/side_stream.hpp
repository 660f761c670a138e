// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/side_stream.hpp: a second queue of work beside the execution space's own, where the space has
// streams and events (SideStream<Kokkos::Cuda>, backend/cuda/side_stream.hpp).
//
// A mini-batch's GEMMs fill a GPU only partly, and a layer's backward holds two independent pieces of work:
// its weight and bias gradients (which read the layer's deltas) and the delta of the layer below (which reads
// the same deltas). The layered engine runs the gradients on the side queue, beside the delta chain on the
// main one. The kernels and their inputs are the same either way, so the bits are too.
//
// The protocol, for work that alternates between the two queues:
//   space(main)  the side queue (`main` itself where there is none)
//   fork(main)   work put on the side queue from now on runs after everything `main` holds now
//   join(main)   `main` waits for everything the side queue holds now
// Host-side enqueue order alone orders the calls, so a step captured as a CUDA graph gets the same edges.
//
// For every other space (and where the engine has no use for it) SideStream<ExecSpace> is one queue: space(main)
// is the main space and the calls do nothing, so the work runs in the order it was enqueued.
#pragma once

#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {
namespace backend {

template <class ExecSpace>
class SideStream {
 public:
  // No side queue (create(): here, none either).
  SideStream() = default;
  static SideStream create() { return SideStream(); }
  const ExecSpace& space(const ExecSpace& main) const { return main; }
  void fork(const ExecSpace&) const {}
  void join(const ExecSpace&) const {}
};

}  // namespace backend
}  // namespace dpmlp

#include "dpmlp/backend/cuda/side_stream.hpp"
