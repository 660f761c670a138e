// SPDX-License-Identifier: BSD-3-Clause
// libFuzzer harness for the checkpoint reader: the input is written to a scratch file and decoded by
// detail::ckpt::read_file, rank 0's part of load_checkpoint (it reads, range-checks and checksums the
// whole file; load_checkpoint only adds the broadcast). read_file asks its trainer only for the model's
// shape, the optimizer and the host buffers, so a stand-in trainer (below) takes the place of a
// DataParallelTrainer and neither MPI nor a communicator is needed. Two stand-ins, float and double, read
// every input, twice: as it is, and with its last 8 bytes replaced by the FNV-1a checksum of the rest, so
// that mutated inputs also pass the checksum and reach the checks after it (the header's fit to the trainer). A damaged file must end in dpmlp::InputError; a crash, a sanitizer report, any other
// exception or a leak is a finding.
//
// With DPMLP_FUZZ_WRITE_SEED=<path> in the environment the harness instead writes a valid checkpoint of the
// double stand-in through the library's writer (detail::ckpt::write_file) to <path> and exits: that is how
// tests/fuzz/corpus/fuzz_checkpoint/valid_double.ckpt was made.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "dpmlp/checkpoint.hpp"
#include "dpmlp/digest.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/optim.hpp"
#include "fuzz_common.hpp"

namespace {

// Widths 3-4-2 with tanh: 3*4+4 + 4*2+2 = 26 parameters; Adam keeps 2 values per parameter.
template <class Scalar>
struct StandInModel {
  using View = Kokkos::View<Scalar*, Kokkos::HostSpace>;
  std::vector<int> widths_{3, 4, 2};
  View params_{"fuzz::params", 26};
  const std::vector<int>& widths() const { return widths_; }
  dpmlp::Activation activation() const { return dpmlp::Activation::tanh; }
  std::size_t num_params() const { return params_.extent(0); }
  const View& params() const { return params_; }
};

template <class Scalar>
struct StandInTrainer {
  using scalar_type = Scalar;
  using optimizer_type = dpmlp::Adam;
  StandInModel<Scalar> model_;
  typename StandInModel<Scalar>::View state_{"fuzz::state", optimizer_type().state_size(26)};
  const StandInModel<Scalar>& model() const { return model_; }
  const typename StandInModel<Scalar>::View& optimizer_state() const { return state_; }
  std::int64_t steps_done() const { return 7; }
};

template <class Scalar>
void read_as(const std::string& path) {
  using View = typename StandInModel<Scalar>::View;
  static const StandInTrainer<Scalar> trainer;
  // Buffers of exactly the trainer's sizes, as load_checkpoint allocates them: ASan reports a write past them.
  const View params(Kokkos::view_alloc(Kokkos::WithoutInitializing, "fuzz::read_params"), trainer.model().num_params());
  const View state(Kokkos::view_alloc(Kokkos::WithoutInitializing, "fuzz::read_state"), trainer.optimizer_state().extent(0));
  try {
    const std::int64_t steps = dpmlp::detail::ckpt::read_file(trainer, path, params, state);
    if (steps < 0 || steps > dpmlp::max_steps_done) std::abort();
  } catch (const dpmlp::InputError&) {
    // The documented outcome for a damaged or mismatched file.
  }
}

void write_seed(const char* path) {
  StandInTrainer<double> t;
  for (std::size_t i = 0; i < t.model_.params_.extent(0); ++i) t.model_.params_(i) = 0.01 * double(i) - 0.1;
  for (std::size_t i = 0; i < t.state_.extent(0); ++i) t.state_(i) = 1e-3 * double(i);
  dpmlp::detail::ckpt::write_file(t, path);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Kokkos (Serial on the host) lives for the whole process: the Views above need it, and libFuzzer exits
  // without returning to a place where it could be finalized.
  // libFuzzer's flags are not Kokkos': it is initialized with none.
  (void)argc;
  (void)argv;
  Kokkos::initialize(Kokkos::InitArguments());
  if (const char* seed = std::getenv("DPMLP_FUZZ_WRITE_SEED")) {
    write_seed(seed);
    std::printf("wrote %s\n", seed);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dpmlp_fuzz::write_scratch(data, size);
  read_as<double>(path);
  read_as<float>(path);
  if (size >= 8) {
    std::vector<std::uint8_t> summed(data, data + size);
    std::uint64_t sum = dpmlp::fnv1a64(summed.data(), size - 8);
    for (int i = 0; i < 8; ++i, sum >>= 8) summed[size - 8 + i] = static_cast<std::uint8_t>(sum & 0xff);
    dpmlp_fuzz::write_scratch(summed.data(), size);
    read_as<double>(path);
    read_as<float>(path);
  }
  dpmlp_fuzz::remove_scratch();
  return 0;
}
