// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/kokkos_compat.hpp: the one place that knows the differences between Kokkos 3.4 (Debian 12's
// libtrilinos-kokkos-dev) and Kokkos >= 4. Nothing else in dpmlp tests KOKKOS_VERSION.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <string>

#if !defined(KOKKOS_VERSION) || KOKKOS_VERSION < 30400
#error "dpmlp needs Kokkos 3.4 or newer"
#endif

#if KOKKOS_VERSION >= 40000
#define DPMLP_KOKKOS4 1
#else
#define DPMLP_KOKKOS4 0
#endif

// Debian's Kokkos 3.4 build does not define KOKKOS_CLASS_LAMBDA; [=, *this] is what it expands to on
// host backends. dpmlp itself avoids class lambdas (it copies members into locals first), but examples
// and tests may use this spelling.
#if defined(KOKKOS_CLASS_LAMBDA)
#define DPMLP_CLASS_LAMBDA KOKKOS_CLASS_LAMBDA
#else
#define DPMLP_CLASS_LAMBDA [ =, *this ]
#endif

namespace dpmlp {
namespace compat {

// Math: Kokkos 3.4 keeps these in Kokkos::Experimental, 4.x in Kokkos.
#if DPMLP_KOKKOS4
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif

template <class T>
KOKKOS_INLINE_FUNCTION T sqrt(T x) { return kmath::sqrt(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T log(T x) { return kmath::log(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T fabs(T x) { return kmath::fabs(x); }
template <class T>
KOKKOS_INLINE_FUNCTION bool isfinite(T x) { return kmath::isfinite(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T tanh(T x) { return kmath::tanh(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T pow(T x, T y) { return kmath::pow(x, y); }
template <class T>
KOKKOS_INLINE_FUNCTION T cos(T x) { return kmath::cos(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T floor(T x) { return kmath::floor(x); }
template <class T>
KOKKOS_INLINE_FUNCTION T min(T a, T b) { return b < a ? b : a; }
template <class T>
KOKKOS_INLINE_FUNCTION T max(T a, T b) { return a < b ? b : a; }

// Fences with a label where the version supports one (4.x uses it in tools and profiles).
inline void fence(const std::string& label) {
#if DPMLP_KOKKOS4
  Kokkos::fence(label);
#else
  (void)label;
  Kokkos::fence();
#endif
}

template <class ExecSpace>
void fence(const ExecSpace& space, const std::string& label) {
#if DPMLP_KOKKOS4
  space.fence(label);
#else
  (void)label;
  space.fence();
#endif
}

// A host mirror whose contents are about to be overwritten (4.x can skip the initialization).
template <class View>
typename View::HostMirror mirror_view_no_init(const View& v) {
#if DPMLP_KOKKOS4
  return Kokkos::create_mirror_view(Kokkos::WithoutInitializing, v);
#else
  return Kokkos::create_mirror_view(v);
#endif
}

// Kokkos::initialize with an explicit device id and thread count (-1: leave to Kokkos / the environment).
// 4.x: InitializationSettings; 3.4: InitArguments.
inline void initialize(int device_id = -1, int num_threads = -1) {
#if DPMLP_KOKKOS4
  Kokkos::InitializationSettings settings;
  if (device_id >= 0) settings.set_device_id(device_id);
  if (num_threads > 0) settings.set_num_threads(num_threads);
  Kokkos::initialize(settings);
#else
  Kokkos::InitArguments args;
  if (device_id >= 0) args.device_id = device_id;
  if (num_threads > 0) args.num_threads = num_threads;
  Kokkos::initialize(args);
#endif
}

// `p` with the light-weight hint. On CUDA, Kokkos passes a functor of 512 bytes or more through constant
// memory unless hinted: that launch waits on the host for the previous such launch, and a CUDA graph cannot
// capture it. Hinted, a functor of up to 4 KB is a kernel argument. Kernels that capture the trainer's update
// pass 512 bytes. Other backends ignore the hint. (Kokkos 3.4 and 4.x.)
template <class Policy>
auto light_weight(const Policy& p) {
  return Kokkos::Experimental::require(p, Kokkos::Experimental::WorkItemProperty::HintLightWeight);
}

// The execution space's name, as the example prints it ("Serial", "OpenMP", "Cuda", ...).
template <class ExecSpace>
const char* space_name() {
  return ExecSpace::name();
}

}  // namespace compat

// Whether the host can read the space's memory (Serial, OpenMP, Threads): such a space counts as a CPU
// device, and takes the host code paths (Eigen GEMMs, the layered engine).
template <class ExecSpace>
constexpr bool is_host_space() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
}

}  // namespace dpmlp
