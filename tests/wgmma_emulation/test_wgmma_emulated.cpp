// SPDX-License-Identifier: BSD-3-Clause
// The Hopper wgmma 3xTF32 kernels (backend/cuda/wgmma_3xtf32_kernels.hpp), run on any CPU: their own code
// (emulated_kernels.hpp, generated from the library's headers by generate.py) on the host model of the CUDA
// they use (emulation.hpp), called as the library calls them, through cutlass_3xtf32's takes() and
// wgmma_gemm(). Checks, for every operand layout, both tile widths, each fused epilogue, alpha/beta, batches
// of blocks at odd offsets and shapes no tile divides: C against fp64 within fp32 accuracy, nothing written
// outside C, nothing read outside A and B (the sanitizer build), the same results whether the MMAs read their
// shared memory when issued or when retired (the two-stage pipeline's stores never overwrite a stage in use),
// and a row's bits independent of m. A GPU run (test_mlp's "cutlass" cases) remains the check that the model
// is the hardware.
#include <catch2/catch.hpp>

#include "emulated_kernels.hpp"
#include "gemm_reference.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using dpmlp::Activation;
using dpmlp::linalg::Op;
namespace cu = dpmlp::linalg::cutlass_3xtf32;

using Case = dpmlp_test::EpilogueGemm;

using dpmlp_test::Buffer;
using dpmlp_test::Result;

// Runs case t on data drawn from `seed` (one generator an array, so a GEMM of fewer rows gets a prefix of the
// same row-major A, Y and C).
Result run(const Case& t, unsigned seed) {
  const bool at = t.op_a == Op::T, bt = t.op_b == Op::T;
  const std::int64_t sa = std::int64_t(t.m) * t.k, sb = std::int64_t(t.k) * t.n;
  const std::int64_t sc = std::int64_t(t.m) * t.n + (at ? 3 : 0);  // blocks' C at odd offsets
  const std::int64_t c_size = sc * t.batch + 8;
  Buffer a(sa * t.batch), b(sb * t.batch), bias((t.n + 3) / 4 * 4), y(c_size), c(c_size);
  std::mt19937 ga(seed * 8), gb(seed * 8 + 1), gbias(seed * 8 + 2), gy(seed * 8 + 3), gc(seed * 8 + 4);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (std::int64_t i = 0; i < sa * t.batch; ++i) a.p[i] = normal(ga);
  for (std::int64_t i = 0; i < sb * t.batch; ++i) b.p[i] = normal(gb);
  for (int i = 0; i < t.n; ++i) bias.p[i] = normal(gbias);
  for (std::int64_t i = 0; i < c_size; ++i) y.p[i] = unit(gy);  // activations in [0, 1)
  // With beta 0 the old C is NaN: C is written, never read (BLAS's rule).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t i = 0; i < c_size; ++i) c.p[i] = t.beta != 0.0f ? normal(gc) : nan;
  const std::vector<float> c_old(c.p, c.p + c_size);
  const std::int64_t off = at ? 1 : 0;

  dpmlp::linalg::BatchedGemm<float> g;
  g.op_a = t.op_a, g.op_b = t.op_b, g.m = t.m, g.n = t.n, g.k = t.k;
  g.a = a.p, g.lda = at ? t.m : t.k, g.stride_a = sa;
  g.b = b.p, g.ldb = bt ? t.k : t.n, g.stride_b = sb;
  g.c = c.p + off, g.ldc = t.n, g.stride_c = sc;
  g.alpha = t.alpha, g.beta = t.beta, g.batch = t.batch, g.blocks = at;  // op T A: per-block weight gradients
  cu::Epilogue e;
  if (t.epilogue == 1) e.kind = cu::detail::Epi::bias_activation, e.src = bias.p, e.act = t.act;
  if (t.epilogue == 2) e.kind = cu::detail::Epi::activation_grad, e.src = y.p, e.ld = t.n, e.act = t.act;
  REQUIRE(cu::takes(g, e));
  cu::detail::wgmma_gemm(emulation::Space(), g, e);

  return dpmlp_test::result_of(t, {a.p, b.p, bias.p, y.p, c_old.data(), c.p, sa, sb, sc, off}, c_size);
}

const char* name(Op op) { return op == Op::T ? "T" : "N"; }

// Case t with the MMAs run at their wait and at issue: fp32 accuracy, nothing written outside C, and the same C
// either way (the two-stage pipeline's stores never overwrite a stage in use).
void check_both_timings(const Case& t, unsigned seed) {
  INFO("op " << name(t.op_a) << name(t.op_b) << ", " << t.m << " x " << t.n << " x " << t.k << ", batch " << t.batch
             << ", epilogue " << t.epilogue);
  emulation::run_at_wait = true;
  const Result late = run(t, seed);
  emulation::run_at_wait = false;
  const Result early = run(t, seed);
  emulation::run_at_wait = true;
  INFO("MMAs at their wait: max error / sum |terms| " << late.worst);
  CHECK(late.worst <= 2e-6);
  CHECK(late.stray == 0);
  CHECK(std::memcmp(late.c.data(), early.c.data(), late.c.size() * sizeof(float)) == 0);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // test_mlp's GPU cases that run on the wgmma kernels (n >= 64)
      {Op::N, Op::N, 1000, 200, 36, 1, 1, Activation::relu, 1.0f, 0.0f},
      {Op::N, Op::N, 997, 64, 260, 1, 1, Activation::tanh, 1.0f, 0.0f},
      {Op::N, Op::N, 4096, 256, 256, 1, 0, Activation::identity, 0.5f, 2.0f},
      {Op::N, Op::T, 1000, 72, 200, 1, 2, Activation::tanh, 1.0f, 0.0f},
      {Op::N, Op::T, 777, 136, 36, 1, 2, Activation::relu, 1.0f, 0.0f},
      {Op::T, Op::N, 36, 200, 100, 3, 0, Activation::identity, 1.0f, 0.0f},
      {Op::T, Op::N, 256, 256, 1000, 2, 0, Activation::identity, 1.0f, 0.0f},
      // one row; k of one k-step; n just over a tile; alpha and beta on every layout; the widest layers
      {Op::N, Op::N, 1, 64, 4, 1, 0, Activation::identity, 1.0f, 0.0f},
      {Op::N, Op::N, 65, 132, 4, 1, 0, Activation::identity, -1.5f, 0.25f},
      {Op::N, Op::T, 63, 68, 32, 1, 0, Activation::identity, 1.0f, 1.0f},
      {Op::N, Op::T, 130, 260, 68, 1, 0, Activation::identity, 2.0f, -1.0f},
      {Op::T, Op::N, 4, 64, 1, 1, 0, Activation::identity, 1.0f, 0.0f},
      {Op::T, Op::N, 132, 132, 33, 2, 0, Activation::identity, 1.0f, 0.0f},
      {Op::T, Op::N, 64, 128, 63, 1, 0, Activation::identity, 1.0f, 0.0f},
      {Op::T, Op::N, 68, 72, 40, 2, 0, Activation::identity, -1.0f, 1.0f},
      {Op::N, Op::N, 70, 64, 36, 2, 0, Activation::identity, 1.0f, 0.5f},  // a batch of whole GEMMs
      {Op::N, Op::N, 128, 512, 512, 1, 1, Activation::relu, 1.0f, 0.0f},
      {Op::N, Op::T, 100, 512, 512, 1, 2, Activation::identity, 1.0f, 0.0f},
  };
  return all;
}

}  // namespace

TEST_CASE("wgmma kernels (emulated): every layout and epilogue at fp32 accuracy, the same whenever MMAs read",
          "[wgmma]") {
  for (const Case& t : cases()) check_both_timings(t, 1);
  CHECK(emulation::mma_count > 0);
}

// What an H200 gave for single-element GEMMs through these kernels (TF32-exact inputs, so only the hi * hi
// MMAs add anything): each MMA's sum cut toward zero, the products' bits below 2^-25 of the largest term
// dropped. The model must give the same.
TEST_CASE("wgmma model: one MMA's sum as an H200 gives it", "[wgmma]") {
  const double u = std::ldexp(1.0, -23);  // the ulp of 1
  const auto mma = [](double acc, std::vector<double> products) {
    double terms[9] = {acc};
    for (std::size_t q = 0; q < products.size(); ++q) terms[q + 1] = products[q];
    return double(emulation::accumulate(terms));
  };
  const double q25 = std::ldexp(1.0, -25), q24 = std::ldexp(1.0, -24);
  CHECK(mma(0, {1, q25, q25, q25, q25, q25, q25, q25}) == 1 + u);          // exact 1 + 1.75 ulp
  CHECK(mma(0, {1, q24, q24, q24, q24, q24, q24, q24}) == 1 + 3 * u);      // exact 1 + 3.5 ulp
  CHECK(mma(0, {1, 1.5 * q24}) == 1);                                       // exact 1 + 0.75 ulp
  CHECK(mma(1, {0.75 * u}) == 1);
  CHECK(mma(1, {0.5 * u}) == 1);
  CHECK(mma(1, {-0.25 * u}) == 1 - q24);                                    // exact 1 - 0.5 ulp below 1
  CHECK(mma(1, {-0.75 * u}) == 1 - 2 * q24);                                // exact 1 - 1.5 ulp below 1
  CHECK(mma(1.5 * q24, {1}) == 1);
}

TEST_CASE("wgmma kernels (emulated): a block's bits do not depend on how many blocks the batch has", "[wgmma]") {
  for (const Case& t : {Case{Op::T, Op::N, 36, 200, 100, 3, 0, Activation::identity, 1.0f, 0.0f},
                        Case{Op::T, Op::N, 64, 64, 256, 4, 0, Activation::identity, 1.0f, 0.0f}}) {
    Case one = t;
    one.batch = 1;
    const Result all = run(t, 5), first = run(one, 5);
    INFO("op TN, " << t.m << " x " << t.n << " x " << t.k << ", batch " << t.batch);
    CHECK(std::memcmp(all.c.data(), first.c.data(), first.c.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("wgmma kernels: batches of more than 65535 entries run in launches of at most 65535", "[wgmma]") {
  dpmlp::linalg::BatchedGemm<float> g;
  g.batch = 140000;
  g.a = reinterpret_cast<const float*>(std::uintptr_t(1) << 20), g.stride_a = 16;
  g.b = reinterpret_cast<const float*>(std::uintptr_t(1) << 30), g.stride_b = 32;
  g.c = reinterpret_cast<float*>(std::uintptr_t(1) << 40), g.stride_c = 8;
  std::vector<std::int64_t> firsts, sizes;
  cu::detail::in_launch_chunks(g, [&](const dpmlp::linalg::BatchedGemm<float>& part, std::int64_t first) {
    firsts.push_back(first);
    sizes.push_back(part.batch);
    CHECK(part.a == g.a + first * g.stride_a);
    CHECK(part.b == g.b + first * g.stride_b);
    CHECK(part.c == g.c + first * g.stride_c);
  });
  CHECK(firsts == std::vector<std::int64_t>{0, 65535, 131070});
  CHECK(sizes == std::vector<std::int64_t>{65535, 65535, 8930});
}

TEST_CASE("wgmma kernels (emulated): a row's bits do not depend on how many rows the GEMM has", "[wgmma]") {
  for (const Case& t : {Case{Op::N, Op::N, 200, 136, 100, 1, 1, Activation::tanh, 1.0f, 0.0f},
                        Case{Op::N, Op::T, 200, 72, 68, 1, 2, Activation::relu, 1.0f, 0.0f},
                        Case{Op::N, Op::N, 130, 256, 36, 1, 0, Activation::identity, 0.5f, 2.0f}}) {
    Case fewer = t;
    fewer.m = 33;
    const Result all = run(t, 7), part = run(fewer, 7);
    INFO("op " << name(t.op_a) << name(t.op_b) << ", " << t.m << " x " << t.n << " x " << t.k);
    CHECK(std::memcmp(all.c.data(), part.c.data(), part.c.size() * sizeof(float)) == 0);
  }
}

// Small GEMMs of every kind, each over three or more k-tiles (so both stages are refilled), in both MMA timings:
// fast enough for scripts/test.sh to run under ThreadSanitizer, where a store to a stage that an MMA may still
// read, without the barrier between them, is a data race.
TEST_CASE("wgmma kernels (emulated): small GEMMs of every kind in both MMA timings", "[wgmma][races]") {
  const std::vector<Case> small = {
      {Op::N, Op::N, 70, 136, 100, 1, 1, Activation::relu, 1.0f, 0.0f},
      {Op::N, Op::N, 65, 64, 68, 1, 0, Activation::identity, 0.5f, 2.0f},
      {Op::N, Op::T, 64, 72, 96, 1, 2, Activation::tanh, 1.0f, 0.0f},
      {Op::T, Op::N, 36, 132, 100, 2, 0, Activation::identity, 1.0f, 0.0f},
      {Op::T, Op::N, 64, 64, 63, 1, 0, Activation::identity, 1.0f, 0.0f},
  };
  for (const Case& t : small) check_both_timings(t, 3);
}
