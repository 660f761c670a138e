// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/side_stream.hpp: SideStream<Kokkos::Cuda>, a second CUDA stream beside the space's own,
// ordered by events (backend/side_stream.hpp says what for and the protocol).
#pragma once

#include "dpmlp/backend/side_stream.hpp"

#if defined(KOKKOS_ENABLE_CUDA)

#include <initializer_list>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include "dpmlp/errors.hpp"

namespace dpmlp {
namespace backend {

template <>
class SideStream<Kokkos::Cuda> {
 public:
  // No side queue: space(main) is main and the calls do nothing.
  SideStream() = default;
  // A stream of its own on the current device (non-blocking, so the legacy default stream does not order it),
  // owned by its Kokkos instance, and the events that order it against the main stream.
  static SideStream create() {
    SideStream s;
    s.state_ = std::make_shared<State>();
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    s.state_->side = Kokkos::Cuda(stream, Kokkos::Impl::ManageStream::yes);
    for (cudaEvent_t* e : {&s.state_->main_done, &s.state_->side_done}) {
      check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
    return s;
  }
  const Kokkos::Cuda& space(const Kokkos::Cuda& main) const { return state_ ? state_->side : main; }

  void fork(const Kokkos::Cuda& main) const {
    if (!state_) return;
    check(cudaEventRecord(state_->main_done, main.cuda_stream()), "cudaEventRecord");
    check(cudaStreamWaitEvent(state_->side.cuda_stream(), state_->main_done, 0), "cudaStreamWaitEvent");
  }
  void join(const Kokkos::Cuda& main) const {
    if (!state_) return;
    check(cudaEventRecord(state_->side_done, state_->side.cuda_stream()), "cudaEventRecord");
    check(cudaStreamWaitEvent(main.cuda_stream(), state_->side_done, 0), "cudaStreamWaitEvent");
  }

 private:
  struct State {
    Kokkos::Cuda side;
    cudaEvent_t main_done = nullptr, side_done = nullptr;
    State() = default;
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
      for (cudaEvent_t e : {main_done, side_done}) {
        if (e != nullptr) (void)cudaEventDestroy(e);
      }
    }
  };
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(std::string("dpmlp: side stream: ") + what + ": " + cudaGetErrorString(e));
  }

  std::shared_ptr<State> state_;
};

}  // namespace backend
}  // namespace dpmlp

#endif
