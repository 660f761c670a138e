// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/engine/row_window.hpp: which of a shard's rows a step learns from.
#pragma once

#include <cstdint>

#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {
namespace detail {

// All of the shard's rows (position == nullptr), or those whose position in the epoch's order (one int64 a
// shard row) falls in [lo, hi): a mini-batch. A row outside contributes exact zeros (its residual is not
// computed), so a batch's sums have the shape of the full batch's.
struct RowWindow {
  const std::int64_t* position = nullptr;
  std::int64_t lo = 0, hi = 0;
  KOKKOS_INLINE_FUNCTION bool contains(std::int64_t r) const {
    return position == nullptr || (position[r] >= lo && position[r] < hi);
  }
};

}  // namespace detail
}  // namespace dpmlp
