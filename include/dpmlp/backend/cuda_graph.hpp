// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda_graph.hpp: capturing one training step as a CUDA graph and replaying it.
//
// At small sizes a step is a dozen short kernels plus a collective, and launch latency, not arithmetic,
// sets the time. Captured once (the Kokkos kernels and the NCCL collective all go to the execution space's
// stream) and replayed, a step costs one graph launch. Only stream-ordered communicators can be captured:
// MPI blocks the host inside the step.
//
// StepGraph<ExecSpace> is a no-op type for every space but Kokkos::Cuda, so the trainer needs no #ifdef.
#pragma once

#include <string>
#include <utility>

#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

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

#if defined(KOKKOS_ENABLE_CUDA)
template <>
class StepGraph<Kokkos::Cuda> {
 public:
  static constexpr bool supported = true;
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  StepGraph(StepGraph&& o) noexcept { *this = std::move(o); }
  StepGraph& operator=(StepGraph&& o) noexcept {
    if (this != &o) {
      reset();
      graph_ = std::exchange(o.graph_, nullptr);
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }
  // Destroyed before the communicator it captured (NCCL teardown hung when a graph outlived its comm).
  ~StepGraph() { reset(); }

  bool ready() const { return exec_ != nullptr; }

  // Records what `enqueue` puts on the space's stream (nothing runs). Returns "" or why it failed; on
  // failure nothing is kept and the stream is usable again.
  template <class F>
  std::string capture(const Kokkos::Cuda& space, F&& enqueue) {
    reset();
    cudaStream_t stream = space.cuda_stream();
    cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) return std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(err);
    std::string failure;
    try {
      enqueue();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    cudaGraph_t graph = nullptr;
    err = cudaStreamEndCapture(stream, &graph);
    if (failure.empty() && err != cudaSuccess) failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(err);
    if (failure.empty()) {
      err = cudaGraphInstantiate(&exec_, graph, 0);
      if (err != cudaSuccess) failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(err);
    }
    graph_ = graph;
    if (!failure.empty()) {
      reset();
      (void)cudaGetLastError();  // a failed capture leaves a sticky-free error behind; clear it
    }
    return failure;
  }

  void launch(const Kokkos::Cuda& space) const {
    const cudaError_t err = cudaGraphLaunch(exec_, space.cuda_stream());
    if (err != cudaSuccess) throw CommError(std::string("dpmlp: cudaGraphLaunch: ") + cudaGetErrorString(err));
  }

 private:
  void reset() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};
#endif

}  // namespace backend
}  // namespace dpmlp
