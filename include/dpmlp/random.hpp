// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/random.hpp: JAX's default PRNG (threefry2x32 with jax_threefry_partitionable=True, the default since
// jax 0.5) in C++, usable on the host and inside Kokkos kernels on any execution space.
//
// Why this exists: the seed program draws its data and its initial weights with jax.random, and dpmlp has to
// reproduce those numbers. In partitionable mode every element of a draw depends only on the key and the
// element's flat row-major index, so a rank can draw just its own shard and still get its slice of the full
// draw, bit for bit.
//
// Upstream functions mirrored here (jax-ml/jax jax/_src/prng.py and jax/_src/random.py; openxla/stablehlo):
//   PRNGKey       prng._threefry_seed
//   threefry2x32  prng._threefry2x32_lowering (20 rounds, key schedule with 0x1BD11BDA)
//   split         prng._threefry_split_foldlike with prng.iota_2x32_shape
//   fold_in       prng._threefry_fold_in (threefry_2x32 over threefry_seed(data) = [0, data])
//   bits          prng._threefry_random_bits_partitionable, bit_width 32
//   uniform       random._uniform for float32
//   normal        random._normal_real for float32
//   erfinv        stablehlo/transforms/ChloLegalizeToStablehlo.cpp erfInv32, the expansion of chlo.erf_inv
//                 that lax.erf_inv lowers to (unless jax_accurate_erf_inv is set); XLA's
//                 xla/hlo/builder/lib/math.cc ErfInv32 is the same code.
//
// Measured against the reference files (jax 0.11.2 on an H200): CUDA device code reproduces all of
// seed_raw.f32, seed_y.f32 and init_params bit for bit; host code differs from them in about 0.5% of the
// values, by at most 3 ulp (7.2e-7 absolute), because the host's log1pf and sqrt are not the GPU's.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {
namespace random {

// JAX's raw key data: jax.random.key_data(key) == [k0, k1].
struct Key {
  std::uint32_t k0, k1;
};

KOKKOS_INLINE_FUNCTION bool operator==(Key a, Key b) { return a.k0 == b.k0 && a.k1 == b.k1; }
KOKKOS_INLINE_FUNCTION bool operator!=(Key a, Key b) { return !(a == b); }

namespace detail {

// Unions rather than memcpy or std::bit_cast: they work in nvcc device code and in C++17 host code alike, and
// every compiler Kokkos supports defines this type pun.
union FloatBits {
  std::uint32_t u;
  float f;
};

KOKKOS_INLINE_FUNCTION float float_from_bits(std::uint32_t u) {
  FloatBits fb;
  fb.u = u;
  return fb.f;
}

// r is always in [1, 31] here, so neither shift is by the full width.
KOKKOS_INLINE_FUNCTION std::uint32_t rotate_left(std::uint32_t x, unsigned r) {
  return (x << r) | (x >> (32u - r));
}

// prng.apply_round.
KOKKOS_INLINE_FUNCTION void threefry_round(std::uint32_t& x0, std::uint32_t& x1, unsigned r) {
  x0 += x1;
  x1 = rotate_left(x1, r);
  x1 ^= x0;
}

// The two rotation sets of _threefry2x32_lowering: rotations[0] = 13, 15, 26, 6; rotations[1] = 17, 29,
// 16, 24.
KOKKOS_INLINE_FUNCTION void threefry_rounds_a(std::uint32_t& x0, std::uint32_t& x1) {
  threefry_round(x0, x1, 13);
  threefry_round(x0, x1, 15);
  threefry_round(x0, x1, 26);
  threefry_round(x0, x1, 6);
}

KOKKOS_INLINE_FUNCTION void threefry_rounds_b(std::uint32_t& x0, std::uint32_t& x1) {
  threefry_round(x0, x1, 17);
  threefry_round(x0, x1, 29);
  threefry_round(x0, x1, 16);
  threefry_round(x0, x1, 24);
}

// float32 multiply and add that are never fused into an FMA. XLA emits the multiplies and adds of uniform and
// erf_inv as separate, unfused operations (on the GPU, with an IEEE sqrt, fused Horner steps left 13101
// values of seed_raw.f32 different from JAX's, unfused ones 171), while nvcc and hipcc contract a * b + c by
// default. On the host, keeping them in separate functions stops Clang's default (-ffp-contract=on fuses
// within one expression only), but -ffp-contract=fast (GCC's default under -std=gnu++17) fuses across them on
// FMA-capable targets (-march=native, -mfma): results then still match JAX within 3 ulp, but about 10x more
// values differ in the last bit. Build with -ffp-contract=off where that matters.
KOKKOS_INLINE_FUNCTION float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KOKKOS_INLINE_FUNCTION float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// The square root in erf_inv's w >= 5 branch. XLA's GPU backend lowers a float32 sqrt to PTX sqrt.approx.f32;
// with that instruction (and log1pf, and unfused Horner steps) CUDA device code reproduced all 341056 float32
// values of the GPU-generated reference (seed_raw.f32, seed_y.f32, init_params) bit for bit on an H200, while
// the IEEE sqrt left 171 of them an ulp or three apart. Everywhere else (host, HIP, SYCL) the IEEE sqrt is
// what the platform offers; XLA's CPU backend uses it too.
KOKKOS_INLINE_FUNCTION float erfinv_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("sqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return compat::sqrt(x);
#endif
}

// One Horner step of the erf_inv expansion, p = c + p * w, in that order.
KOKKOS_INLINE_FUNCTION float horner(float p, float w, float c) { return add_rn(c, mul_rn(p, w)); }

KOKKOS_INLINE_FUNCTION std::uint32_t hi32(std::uint64_t i) { return static_cast<std::uint32_t>(i >> 32); }
KOKKOS_INLINE_FUNCTION std::uint32_t lo32(std::uint64_t i) { return static_cast<std::uint32_t>(i); }

// Range draws take rank-1 Views only. Written as a partial specialization so that asking about a non-View
// (overload resolution tries the range-draw templates for uniform(key, i, minval, maxval)) is a plain false.
template <class View, bool = Kokkos::is_view<View>::value>
struct IsRank1View : std::false_type {};
template <class View>
struct IsRank1View<View, true> : std::integral_constant<bool, static_cast<int>(View::rank) == 1> {};

template <class ExecSpace, class View>
using EnableRangeDraw =
    typename std::enable_if<Kokkos::is_execution_space<ExecSpace>::value && IsRank1View<View>::value>::type;

}  // namespace detail

// jax.random.PRNGKey(seed) (prng._threefry_seed): [seed >> 32, seed & 0xffffffff]. JAX turns a Python int
// into int64 first; without jax_enable_x64 that becomes int32 and the high word is 0 (the shift by 32 of a
// 32-bit value is 0 in XLA). Both agree for 0 <= seed < 2^31; past that this follows the x64 behaviour.
KOKKOS_INLINE_FUNCTION Key PRNGKey(std::uint64_t seed) { return Key{detail::hi32(seed), detail::lo32(seed)}; }

// prng._threefry2x32_lowering, unrolled form (the rolled CPU form computes the same thing): Threefry-2x32
// with 20 rounds, as in Salmon et al. 2011 / Random123.
KOKKOS_INLINE_FUNCTION void threefry2x32(Key key, std::uint32_t x0, std::uint32_t x1, std::uint32_t& y0,
                                         std::uint32_t& y1) {
  const std::uint32_t ks0 = key.k0;
  const std::uint32_t ks1 = key.k1;
  const std::uint32_t ks2 = key.k0 ^ key.k1 ^ 0x1BD11BDAu;

  x0 += ks0;
  x1 += ks1;

  detail::threefry_rounds_a(x0, x1);
  x0 += ks1;
  x1 += ks2 + 1u;

  detail::threefry_rounds_b(x0, x1);
  x0 += ks2;
  x1 += ks0 + 2u;

  detail::threefry_rounds_a(x0, x1);
  x0 += ks0;
  x1 += ks1 + 3u;

  detail::threefry_rounds_b(x0, x1);
  x0 += ks1;
  x1 += ks2 + 4u;

  detail::threefry_rounds_a(x0, x1);
  x0 += ks2;
  x1 += ks0 + 5u;

  y0 = x0;
  y1 = x1;
}

// Element i of jax.random.split(key, n) (prng._threefry_split_foldlike): the counter is the 64-bit index i,
// split by iota_2x32_shape into (hi, lo); the new key is the hash pair itself. It does not depend on n.
// Note for callers: an `int` argument picks the std::vector overload below; pass std::uint64_t / std::size_t
// here.
KOKKOS_INLINE_FUNCTION Key split(Key key, std::uint64_t i) {
  Key out;
  threefry2x32(key, detail::hi32(i), detail::lo32(i), out.k0, out.k1);
  return out;
}

// jax.random.split(key, n), host only.
inline std::vector<Key> split(Key key, int n) {
  if (n < 0) throw std::invalid_argument("dpmlp::random::split: n must be >= 0");
  std::vector<Key> keys(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) keys[static_cast<std::size_t>(i)] = split(key, static_cast<std::uint64_t>(i));
  return keys;
}

// jax.random.fold_in(key, data) (prng._threefry_fold_in): threefry_2x32(key, threefry_seed(data)), i.e. the
// count array [0, data], which threefry_2x32 splits into x0 = [0], x1 = [data]. Partitionable mode leaves
// fold_in unchanged.
KOKKOS_INLINE_FUNCTION Key fold_in(Key key, std::uint32_t data) {
  Key out;
  threefry2x32(key, 0u, data, out.k0, out.k1);
  return out;
}

// Element flat_index of jax.random.bits(key, shape, jnp.uint32), for any shape (flat row-major index):
// prng._threefry_random_bits_partitionable hashes the 64-bit iota (hi, lo) and, for 32-bit output, XORs the
// pair.
KOKKOS_INLINE_FUNCTION std::uint32_t bits(Key key, std::uint64_t flat_index) {
  std::uint32_t y0, y1;
  threefry2x32(key, detail::hi32(flat_index), detail::lo32(flat_index), y0, y1);
  return y0 ^ y1;
}

// Element flat_index of jax.random.uniform(key, shape, jnp.float32, minval, maxval) (random._uniform): the
// top 23 bits become the mantissa of a float in [1, 2), minus 1 gives [0, 1), then floats * (maxval - minval)
// + minval and lax.max(minval, .), all in float32 and in JAX's order, so the roundings are the same. The
// select is written so that a NaN value stays NaN, as lax.max propagates NaN.
KOKKOS_INLINE_FUNCTION float uniform(Key key, std::uint64_t flat_index, float minval, float maxval) {
  const std::uint32_t float_bits = (bits(key, flat_index) >> 9) | 0x3F800000u;  // 9 = 32 - nmant(23)
  const float floats = detail::float_from_bits(float_bits) - 1.0f;
  const float value = detail::add_rn(detail::mul_rn(floats, maxval - minval), minval);
  return value < minval ? minval : value;
}

KOKKOS_INLINE_FUNCTION float uniform(Key key, std::uint64_t flat_index) {
  return uniform(key, flat_index, 0.0f, 1.0f);
}

// lax.erf_inv for float32, as chlo.erf_inv is expanded by StableHLO (erfInv32) and XLA (math.cc ErfInv32):
// Giles' single-precision approximation with w = -log1p(-x * x) (the comment above both upstream functions
// still says -log((1 - x) * (1 + x)), but the code uses log1p; jax's opt-in jax_accurate_erf_inv path is the
// one that uses log((1 - x) * (1 + x))). |x| == 1 gives x * inf, as the upstream select does.
KOKKOS_INLINE_FUNCTION float erfinv(float x) {
  float w = -compat::kmath::log1p(x * -x);
  float p;
  if (w < 5.0f) {
    w = w - 2.5f;
    p = 2.81022636e-08f;
    p = detail::horner(p, w, 3.43273939e-07f);
    p = detail::horner(p, w, -3.5233877e-06f);
    p = detail::horner(p, w, -4.39150654e-06f);
    p = detail::horner(p, w, 0.00021858087f);
    p = detail::horner(p, w, -0.00125372503f);
    p = detail::horner(p, w, -0.00417768164f);
    p = detail::horner(p, w, 0.246640727f);
    p = detail::horner(p, w, 1.50140941f);
  } else {
    // NaN x lands here too (w < 5 is false) and stays NaN, as upstream.
    w = detail::erfinv_sqrt(w) - 3.0f;
    p = -0.000200214257f;
    p = detail::horner(p, w, 0.000100950558f);
    p = detail::horner(p, w, 0.00134934322f);
    p = detail::horner(p, w, -0.00367342844f);
    p = detail::horner(p, w, 0.00573950773f);
    p = detail::horner(p, w, -0.0076224613f);
    p = detail::horner(p, w, 0.00943887047f);
    p = detail::horner(p, w, 1.00167406f);
    p = detail::horner(p, w, 2.83297682f);
  }
  // The polynomial is indeterminate at |x| == 1; upstream selects x * inf there.
  if (compat::fabs(x) == 1.0f) return x * detail::float_from_bits(0x7F800000u);
  return p * x;
}

// Element flat_index of jax.random.normal(key, shape, jnp.float32) (random._normal_real): uniform on
// [nextafter(-1, 0), 1) in float32, then np.float32(sqrt(2)) * erf_inv(u). float32(-1 + 2^-24) is
// -0x1.fffffep-1f; float32(1 - lo) rounds to 2.0f, so the scaling is exact.
KOKKOS_INLINE_FUNCTION float normal(Key key, std::uint64_t flat_index) {
  const float lo = -0x1.fffffep-1f;
  const float hi = 1.0f;
  const float u = uniform(key, flat_index, lo, hi);
  const float sqrt2 = 0x1.6a09e6p+0f;  // np.array(np.sqrt(2), np.float32) == 1.41421354f
  return sqrt2 * erfinv(u);
}

// -----------------------------------------------------------------------------------------------------------
// Range draws: out(j) = value of element first + j of the full draw, for j in [0, out.extent(0)). A rank
// passes the flat index of its shard's first element and gets exactly its slice of the global array. They
// enqueue one parallel_for on `space` and do not fence. Float draws are computed in float32 (as JAX does) and
// then converted to the View's value type, so a double View holds the float32 values widened.

template <class ExecSpace, class View>
detail::EnableRangeDraw<ExecSpace, View> normal(const ExecSpace& space, Key key, const View& out,
                                                std::uint64_t first) {
  using value_type = typename View::non_const_value_type;
  using policy = Kokkos::RangePolicy<ExecSpace>;
  using index = typename policy::index_type;
  const View v = out;
  Kokkos::parallel_for(
      "dpmlp::random::normal", policy(space, index(0), static_cast<index>(v.extent(0))),
      KOKKOS_LAMBDA(const index j) {
        v(j) = static_cast<value_type>(normal(key, first + static_cast<std::uint64_t>(j)));
      });
}

template <class ExecSpace, class View>
detail::EnableRangeDraw<ExecSpace, View> uniform(const ExecSpace& space, Key key, const View& out,
                                                 std::uint64_t first, float minval = 0.0f,
                                                 float maxval = 1.0f) {
  using value_type = typename View::non_const_value_type;
  using policy = Kokkos::RangePolicy<ExecSpace>;
  using index = typename policy::index_type;
  const View v = out;
  Kokkos::parallel_for(
      "dpmlp::random::uniform", policy(space, index(0), static_cast<index>(v.extent(0))),
      KOKKOS_LAMBDA(const index j) {
        v(j) = static_cast<value_type>(uniform(key, first + static_cast<std::uint64_t>(j), minval, maxval));
      });
}

template <class ExecSpace, class View>
detail::EnableRangeDraw<ExecSpace, View> bits(const ExecSpace& space, Key key, const View& out,
                                              std::uint64_t first) {
  using value_type = typename View::non_const_value_type;
  static_assert(std::is_integral<value_type>::value && sizeof(value_type) >= 4,
                "dpmlp::random::bits: the View needs an integer type of at least 32 bits");
  using policy = Kokkos::RangePolicy<ExecSpace>;
  using index = typename policy::index_type;
  const View v = out;
  Kokkos::parallel_for(
      "dpmlp::random::bits", policy(space, index(0), static_cast<index>(v.extent(0))),
      KOKKOS_LAMBDA(const index j) {
        v(j) = static_cast<value_type>(bits(key, first + static_cast<std::uint64_t>(j)));
      });
}

}  // namespace random
}  // namespace dpmlp
