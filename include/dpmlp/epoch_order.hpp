// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/epoch_order.hpp: the order in which a mini-batch epoch visits the rows (DataParallelTrainer::
// train_epochs), as a keyed permutation of [0, rows) that any thread can evaluate for one row, in either
// direction, in O(1): no sort, no table, nothing shared between threads or ranks.
//
// The permutation is a balanced Feistel network over the smallest even number of bits that holds `rows`
// (six rounds, each a 32-bit integer hash of the half and that round's key), restricted to [0, rows) by cycle
// walking: a value that lands outside is permuted again until it lands inside. Both are bijections, so every
// row gets exactly one position. The round keys are drawn once from (seed, epoch) with JAX's threefry
// (random.hpp), so the order depends on the seed, the epoch and the row count alone, never on the rank count.
// A domain is at most four times `rows`, so a row takes fewer than four walks on average.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/random.hpp"

namespace dpmlp {

class EpochOrder {
 public:
  static constexpr int rounds = 6;

  EpochOrder() = default;
  EpochOrder(std::uint64_t seed, std::int64_t epoch, std::int64_t rows) : rows_(rows) {
    if (rows <= 0 || rows > (std::int64_t(1) << 62)) throw std::invalid_argument("dpmlp::EpochOrder: bad row count");
    int bits = 2;
    while ((std::int64_t(1) << bits) < rows) bits += 2;
    half_ = bits / 2;
    mask_ = half_ >= 32 ? 0xffffffffu : (std::uint32_t(1) << half_) - 1u;
    const random::Key key = random::fold_in(random::PRNGKey(seed), static_cast<std::uint32_t>(epoch));
    for (int r = 0; r < rounds; ++r) keys_[r] = random::bits(key, static_cast<std::uint64_t>(r));
  }

  KOKKOS_INLINE_FUNCTION std::int64_t rows() const { return rows_; }

  // The position of row `row` in the epoch (row in [0, rows)).
  KOKKOS_INLINE_FUNCTION std::int64_t position(std::int64_t row) const {
    std::uint64_t v = static_cast<std::uint64_t>(row);
    do {
      v = forward(v);
    } while (v >= static_cast<std::uint64_t>(rows_));
    return static_cast<std::int64_t>(v);
  }

  // The row at position `pos` (the inverse of position()).
  KOKKOS_INLINE_FUNCTION std::int64_t row(std::int64_t pos) const {
    std::uint64_t v = static_cast<std::uint64_t>(pos);
    do {
      v = backward(v);
    } while (v >= static_cast<std::uint64_t>(rows_));
    return static_cast<std::int64_t>(v);
  }

 private:
  // A 32-bit integer hash with good avalanche (every input bit flips each output bit with probability ~1/2).
  KOKKOS_INLINE_FUNCTION static std::uint32_t mix(std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
  }
  KOKKOS_INLINE_FUNCTION std::uint32_t f(int r, std::uint32_t half) const { return mix(half ^ keys_[r]) & mask_; }

  KOKKOS_INLINE_FUNCTION std::uint64_t forward(std::uint64_t v) const {
    std::uint32_t l = static_cast<std::uint32_t>(v >> half_) & mask_, r = static_cast<std::uint32_t>(v) & mask_;
    for (int i = 0; i < rounds; ++i) {
      const std::uint32_t t = l ^ f(i, r);
      l = r;
      r = t;
    }
    return (static_cast<std::uint64_t>(l) << half_) | r;
  }
  KOKKOS_INLINE_FUNCTION std::uint64_t backward(std::uint64_t v) const {
    std::uint32_t l = static_cast<std::uint32_t>(v >> half_) & mask_, r = static_cast<std::uint32_t>(v) & mask_;
    for (int i = rounds - 1; i >= 0; --i) {
      const std::uint32_t t = r ^ f(i, l);
      r = l;
      l = t;
    }
    return (static_cast<std::uint64_t>(l) << half_) | r;
  }

  std::int64_t rows_ = 1;
  int half_ = 1;
  std::uint32_t mask_ = 1;
  std::uint32_t keys_[rounds] = {};
};

// Each row's position in epoch `epoch` (EpochOrder(seed, epoch, rows).position(r) for every r), on the host:
// for tests and for programs that want to see the order.
inline std::vector<std::int64_t> epoch_positions(std::uint64_t seed, std::int64_t epoch, std::int64_t rows) {
  const EpochOrder order(seed, epoch, rows);
  std::vector<std::int64_t> position(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) position[static_cast<std::size_t>(r)] = order.position(r);
  return position;
}

}  // namespace dpmlp
