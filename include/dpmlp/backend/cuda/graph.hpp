// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/graph.hpp: a training step captured as a CUDA graph and replayed (StepGraph<Kokkos::Cuda>;
// backend/step_graph.hpp says why).
#pragma once

#include "dpmlp/backend/step_graph.hpp"

#if defined(KOKKOS_ENABLE_CUDA)

#include <exception>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include "dpmlp/errors.hpp"

namespace dpmlp {
namespace backend {

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
  // Destroyed before the communicator it captured: NCCL's teardown can wait forever for a graph that
  // outlives its communicator.
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

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
