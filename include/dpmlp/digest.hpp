// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/digest.hpp: a 64-bit FNV-1a hash of bytes, for "are these parameters the same bits" questions
// (the example's params digest, the trainer's start-up agreement check, checkpoints).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {

inline std::uint64_t fnv1a64(const void* data, std::size_t bytes, std::uint64_t hash = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// The digest of a rank-1 View's bytes (copied to the host first when needed).
template <class View>
std::uint64_t digest(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return fnv1a64(h.data(), h.span() * sizeof(typename View::non_const_value_type));
}

inline std::string hex16(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace dpmlp
