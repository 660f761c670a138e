// SPDX-License-Identifier: BSD-3-Clause
// The block-scaled 3xFP16 GEMM kernels (backend/cuda/gemm_f16x3_kernels.hpp), run on any CPU: their own code
// (emulated_f16x3.hpp, generated from the library's headers by generate.py) on the host model of the CUDA they
// use (f16x3_model.hpp over ../wgmma_emulation/emulation.hpp). Checks, for every operand layout, both tile
// shapes, each fused epilogue, alpha/beta, batches of blocks at odd offsets and shapes no tile divides: C
// against fp64 within fp32 accuracy, nothing written outside C; the same bits from both tiles; a row's bits
// independent of m; op(B) split beforehand (split_b, as with a workspace) giving the same bits as split in
// every CTA; and rows and columns of very different magnitudes (the scales). The model completes each
// cp.async only at the wait that retires it, so a ring slot read before its wait, or refilled while in use,
// shows. The wgmma form (gemm_wgmma) must give gemm()'s bits on every GEMM it takes, with its MMAs run at the
// wait that retires them (a stage overwritten while MMAs may read it shows) and when issued (one read before
// its split's stores shows): the model sums an FP16 wgmma's products as it sums mma.sync's, so equal bits say
// the two forms multiply the same parts in the same order and scale and add the same chains. Its
// warp-specialized kernel (rows x weights, op(B) split beforehand, large tile) hands stages over through
// mbarriers, whose model stalls a thread after each arrival: a stage released before its last reader is done
// shows as wrong bits, one handed over without fence.proxy.async fails. A GPU run
// (test_mlp's "cutlass" cases with BatchedGemm::f16x3) remains the check that the model is the hardware.
#include <catch2/catch.hpp>

#include "emulated_f16x3.hpp"
#include "gemm_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

namespace {

using dpmlp::Activation;
using dpmlp::linalg::Op;
namespace f = dpmlp::linalg::gemm_f16x3;

using Case = dpmlp_test::EpilogueGemm;

using dpmlp_test::Buffer;
using dpmlp_test::Result;

std::int64_t backend_split_bytes(const Case& t) { return dpmlp::backend::f16x3_layout::split_b_bytes(t.n, t.k); }

// Case t on data drawn from `seed` (one generator an array, so a GEMM of fewer rows gets a prefix of the same
// row-major A, Y and C), on the large tiles or the small ones; rows x weights (op(A) N) with one B for the
// whole batch (batch stride 0), as the layered engine runs them, split beforehand by split_b where pre_b.
// `row_scale`, `col_scale`: op(A)'s row i times 2^row_scale(i), op(B)'s column j times 2^col_scale(j).
// `wgmma`: on the wgmma form (gemm_wgmma: rows x weights, op(B) N only split beforehand; T N).
template <class RowScale, class ColScale>
Result run(const Case& t, unsigned seed, bool large, bool pre_b, RowScale row_scale, ColScale col_scale,
           bool wgmma = false) {
  const bool at = t.op_a == Op::T, bt = t.op_b == Op::T;
  const std::int64_t sa = std::int64_t(t.m) * t.k, sb = std::int64_t(t.k) * t.n;
  const std::int64_t sc = std::int64_t(t.m) * t.n + (at ? 3 : 0);  // blocks' C at odd offsets
  const std::int64_t c_size = sc * t.batch + 8;
  Buffer a(sa * t.batch), b(sb * t.batch), bias((t.n + 3) / 4 * 4), y(c_size), c(c_size);
  std::mt19937 ga(seed * 8), gb(seed * 8 + 1), gbias(seed * 8 + 2), gy(seed * 8 + 3), gc(seed * 8 + 4);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (std::int64_t e = 0; e < t.batch; ++e) {
    for (int i = 0; i < t.m; ++i) {  // row-major op(A) order, whatever the storage
      for (int p = 0; p < t.k; ++p) {
        a.p[e * sa + (at ? std::int64_t(p) * t.m + i : std::int64_t(i) * t.k + p)] =
            std::ldexp(normal(ga), row_scale(i));
      }
    }
    if (!at && e > 0) {  // B shared: entry 0's again
      std::memcpy(b.p + e * sb, b.p, sizeof(float) * sb);
      continue;
    }
    for (int p = 0; p < t.k; ++p) {
      for (int j = 0; j < t.n; ++j) {
        b.p[e * sb + (bt ? std::int64_t(j) * t.k + p : std::int64_t(p) * t.n + j)] =
            std::ldexp(normal(gb), col_scale(j));
      }
    }
  }
  for (int i = 0; i < t.n; ++i) bias.p[i] = normal(gbias);
  for (std::int64_t i = 0; i < c_size; ++i) y.p[i] = unit(gy);  // activations in [0, 1)
  // With beta 0 the old C is NaN: C is written, never read (BLAS's rule).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t i = 0; i < c_size; ++i) c.p[i] = t.beta != 0.0f ? normal(gc) : nan;
  const std::vector<float> c_old(c.p, c.p + c_size);
  const std::int64_t off = at ? 1 : 0;

  // As cutlass_3xtf32's f16x3_gemm() fills it.
  f::Params p;
  p.m = t.m, p.n = t.n, p.k = t.k;
  p.a = a.p, p.lda = at ? t.m : t.k, p.stride_a = sa;
  p.b = b.p, p.ldb = bt ? t.k : t.n, p.stride_b = at ? sb : 0;
  p.c = c.p + off, p.ldc = t.n, p.stride_c = sc;
  p.alpha = t.alpha, p.beta = t.beta;
  p.pairs = !at && t.n % 2 == 0;  // blocks' C element by element
  f::Out out = f::Out::linear;
  if (t.epilogue == 1) out = f::Out::bias_activation, p.src = bias.p, p.act = t.act;
  if (t.epilogue == 2) out = f::Out::activation_grad, p.src = y.p, p.src_ld = t.n, p.act = t.act;
  Buffer split(pre_b ? backend_split_bytes(t) / 4 : 1);
  if (pre_b) {
    REQUIRE(!at);
    // Where split_b does not write, NaN (as the workspace's garbage would be): a read of it shows in C.
    const std::int64_t words = backend_split_bytes(t) / 4;
    for (std::int64_t i = 0; i < words; ++i) split.p[i] = std::numeric_limits<float>::quiet_NaN();
    REQUIRE(f::split_b(nullptr, p.b, p.ldb, t.n, t.k, bt, reinterpret_cast<unsigned char*>(split.p)) == cudaSuccess);
    p.b_split = reinterpret_cast<const unsigned char*>(split.p);
  }
  // T N: B's column sums too (the bias gradients beside a block's weight gradient), laid out as C's first row
  // would be; NaN elsewhere, so a sum not written, or one written astray, shows.
  Buffer sums(at ? c_size : 1);
  for (std::int64_t i = 0; i < (at ? c_size : 1); ++i) sums.p[i] = nan;
  if (at) p.colsum = sums.p + off;
  if (wgmma) {
    REQUIRE(f::gemm_wgmma(nullptr, p, t.batch, !at, bt, out, large) == cudaSuccess);
  } else {
    REQUIRE(f::gemm(nullptr, p, t.batch, !at, bt, out, large) == cudaSuccess);
  }

  Result r = dpmlp_test::result_of(t, {a.p, b.p, bias.p, y.p, c_old.data(), c.p, sa, sb, sc, off}, c_size);
  if (at) r.sums_wrong = dpmlp_test::column_sums_wrong(t, b.p, sb, sums.p, sc, off, c_size);
  return r;
}
Result run(const Case& t, unsigned seed, bool large, bool pre_b = false, bool wgmma = false) {
  const auto one = [](int) { return 0; };
  return run(t, seed, large, pre_b, one, one, wgmma);
}

const char* name(Op op) { return op == Op::T ? "T" : "N"; }

// Case t on both tiles: fp32 accuracy, nothing written outside C, the same bits; for rows x weights, the same
// bits again with op(B) split beforehand, on the small tiles (and the large ones where `pre_b_large`).
void check_both_tiles(const Case& t, unsigned seed, bool pre_b_large = false) {
  INFO("op " << name(t.op_a) << name(t.op_b) << ", " << t.m << " x " << t.n << " x " << t.k << ", batch " << t.batch
             << ", epilogue " << t.epilogue);
  const Result small = run(t, seed, false), large = run(t, seed, true);
  INFO("max error / sum |terms|: small tiles " << small.worst << ", large " << large.worst);
  CHECK(small.worst <= 2e-6);
  CHECK(small.stray == 0);
  CHECK(large.stray == 0);
  CHECK(small.sums_wrong == 0);
  CHECK(large.sums_wrong == 0);
  CHECK(std::memcmp(small.c.data(), large.c.data(), small.c.size() * sizeof(float)) == 0);
  if (t.op_a == Op::T) return;
  for (const bool tile : {false, true}) {
    if (tile && !pre_b_large) continue;
    const Result pre = run(t, seed, tile, true);
    INFO("op(B) split beforehand, " << (tile ? "large" : "small") << " tiles");
    CHECK(pre.stray == 0);
    CHECK(std::memcmp(small.c.data(), pre.c.data(), small.c.size() * sizeof(float)) == 0);
  }
}

// Case t on the wgmma form: every way it takes t (rows x weights, op(B) N: split beforehand; op T: split
// beforehand or in every CTA; T N), on the tiles `tiles` lists, with its
// MMAs run at their wait and when issued; each fp32-accurate, nothing written outside C, and the bits of gemm()
// (the mma.sync form, small tiles, op(B) split in every CTA: the bits the tests above hold every other way to)
// on the same data.
void check_wgmma(const Case& t, unsigned seed, std::initializer_list<bool> tiles = {false, true}) {
  INFO("op " << name(t.op_a) << name(t.op_b) << ", " << t.m << " x " << t.n << " x " << t.k << ", batch " << t.batch
             << ", epilogue " << t.epilogue);
  const Result want = run(t, seed, false);
  for (const bool pre_b : {true, false}) {
    if (t.op_a == Op::T ? pre_b : !pre_b && t.op_b == Op::N) continue;
    for (const bool large : tiles) {
      for (const bool at_wait : {true, false}) {
        emulation::run_at_wait = at_wait;
        const long long before = emulation::wgmma16::count, waits = emulation::mbar::waits;
        const Result r = run(t, seed, large, pre_b, true);
        emulation::run_at_wait = true;
        INFO("wgmma form: " << (large ? "large" : "small") << " tiles" << (pre_b ? ", op(B) split beforehand" : "")
                            << ", MMAs run " << (at_wait ? "at their wait" : "when issued")
                            << ": max error / sum |terms| " << r.worst);
        CHECK(emulation::wgmma16::count > before);
        // Rows x weights with op(B) split beforehand on the large tile: the warp-specialized form.
        CHECK((emulation::mbar::waits > waits) == (large && pre_b && t.op_a == Op::N));
        CHECK(r.worst <= 2e-6);
        CHECK(r.stray == 0);
        CHECK(r.sums_wrong == 0);
        CHECK(std::memcmp(want.c.data(), r.c.data(), want.c.size() * sizeof(float)) == 0);
      }
    }
  }
}

// Every layout and epilogue: rows x weights and per-block weight gradients, k in whole, partial and single
// k-tiles, alpha and beta, batches.
const std::vector<Case>& layout_cases() {
  static const std::vector<Case> cases = {
      {Op::N, Op::N, 200, 136, 100, 1, 1, Activation::relu, 1.0f, 0.0f},     // k: three k-tiles and a part
      {Op::N, Op::N, 70, 64, 36, 1, 1, Activation::tanh, 1.0f, 0.0f},
      {Op::N, Op::N, 65, 132, 4, 1, 0, Activation::identity, -1.5f, 0.25f},  // one partial k-tile
      {Op::N, Op::T, 130, 72, 200, 1, 2, Activation::tanh, 1.0f, 0.0f},
      {Op::N, Op::T, 63, 136, 36, 1, 2, Activation::relu, 1.0f, 0.0f},
      {Op::N, Op::T, 64, 68, 32, 1, 0, Activation::identity, 2.0f, -1.0f},
      {Op::T, Op::N, 36, 132, 100, 2, 0, Activation::identity, 1.0f, 0.0f},  // blocks at odd offsets
      {Op::T, Op::N, 132, 64, 63, 1, 0, Activation::identity, 1.0f, 0.0f},
      {Op::N, Op::N, 70, 64, 36, 2, 0, Activation::identity, 1.0f, 0.5f},    // a batch of whole GEMMs
  };
  return cases;
}

}  // namespace

TEST_CASE("3xFP16 kernels (emulated): every layout and epilogue at fp32 accuracy, the same bits on both tiles",
          "[f16x3]") {
  const std::vector<Case>& cases = layout_cases();
  for (std::size_t i = 0; i < cases.size(); ++i) check_both_tiles(cases[i], 1, i == 0 || i == 3);
}

TEST_CASE("3xFP16 wgmma form (emulated): gemm()'s bits on every GEMM it takes, both tiles, whenever its MMAs read",
          "[f16x3][wgmma]") {
  for (const Case& t : layout_cases()) check_wgmma(t, 1);
}

TEST_CASE("3xFP16 wgmma form: the GEMMs it does not take", "[f16x3][wgmma]") {
  // Rows x weights: its descriptors name K-major planes, which op(B) N's are only when split beforehand; T N:
  // linear, op(B) split in the CTA (per block); no T T; of the fused epilogues, only its layout's
  // (bias_activation N N, activation_grad N T).
  f::Params p;
  p.m = p.n = p.k = 64;
  CHECK(f::gemm_wgmma(nullptr, p, 1, true, false, f::Out::linear, false) == cudaErrorNotSupported);
  CHECK(f::gemm_wgmma(nullptr, p, 1, false, true, f::Out::linear, false) == cudaErrorNotSupported);  // T T
  CHECK(f::gemm_wgmma(nullptr, p, 1, false, false, f::Out::bias_activation, false) == cudaErrorNotSupported);
  float split = 0;
  p.b_split = reinterpret_cast<const unsigned char*>(&split);
  CHECK(f::gemm_wgmma(nullptr, p, 1, true, false, f::Out::activation_grad, false) == cudaErrorNotSupported);
  CHECK(f::gemm_wgmma(nullptr, p, 1, true, true, f::Out::bias_activation, false) == cudaErrorNotSupported);
}

TEST_CASE("3xFP16 kernels (emulated): a row's bits do not depend on how many rows the GEMM has", "[f16x3]") {
  for (const Case& t : {Case{Op::N, Op::N, 200, 136, 100, 1, 1, Activation::tanh, 1.0f, 0.0f},
                        Case{Op::N, Op::T, 150, 72, 68, 1, 2, Activation::relu, 1.0f, 0.0f}}) {
    Case fewer = t;
    fewer.m = 33;
    const Result all = run(t, 7, true), part = run(fewer, 7, false);
    INFO("op " << name(t.op_a) << name(t.op_b) << ", " << t.m << " x " << t.n << " x " << t.k);
    CHECK(std::memcmp(all.c.data(), part.c.data(), part.c.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("3xFP16 kernels (emulated): split_b_jobs writes each job's split_b bytes", "[f16x3]") {
  // Three op(B) of different shapes and both forms in one launch (the grid the largest's, the others' extra
  // threads idle), against split_b of each; every byte of both outputs compared, NaN-filled beforehand.
  struct Shape {
    int n, k;
    bool b_t;
  };
  const Shape shapes[] = {{200, 100, false}, {136, 72, true}, {64, 32, false}};
  std::vector<std::vector<float>> bs, outs, refs;
  std::vector<dpmlp::backend::f16x3_layout::SplitBJob> jobs;
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  int max_n = 0, max_k = 0;
  for (const Shape& s : shapes) {
    std::vector<float> b(static_cast<std::size_t>(s.n) * s.k);
    for (float& v : b) v = normal(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 40) - 20);
    const std::size_t words = static_cast<std::size_t>(dpmlp::backend::f16x3_layout::split_b_bytes(s.n, s.k)) / 4;
    bs.push_back(b);
    outs.emplace_back(words, std::numeric_limits<float>::quiet_NaN());
    refs.emplace_back(words, std::numeric_limits<float>::quiet_NaN());
    max_n = std::max(max_n, s.n), max_k = std::max(max_k, s.k);
  }
  for (std::size_t i = 0; i < bs.size(); ++i) {
    const Shape& s = shapes[i];
    dpmlp::backend::f16x3_layout::SplitBJob j;
    j.b = bs[i].data(), j.ldb = s.b_t ? s.k : s.n, j.n = s.n, j.k = s.k, j.b_t = s.b_t;
    j.out = reinterpret_cast<unsigned char*>(outs[i].data());
    jobs.push_back(j);
    REQUIRE(f::split_b(nullptr, j.b, j.ldb, s.n, s.k, s.b_t, reinterpret_cast<unsigned char*>(refs[i].data())) ==
            cudaSuccess);
  }
  REQUIRE(f::split_b_jobs(nullptr, jobs.data(), static_cast<int>(jobs.size()), max_n, max_k) == cudaSuccess);
  for (std::size_t i = 0; i < bs.size(); ++i) {
    INFO("job " << i);
    CHECK(std::memcmp(outs[i].data(), refs[i].data(), outs[i].size() * sizeof(float)) == 0);
  }
  CHECK(f::split_b_jobs(nullptr, jobs.data(), 0, max_n, max_k) == cudaSuccess);  // none: no launch
}

TEST_CASE("3xFP16 kernels (emulated): rows and columns 2^120 apart keep their own fp32 accuracy", "[f16x3]") {
  // Each row of op(A) and column of op(B) scaled on its own over each 32 k: deltas beside activations.
  const auto rows = [](int i) { return -60 + 15 * (i % 9); };
  const auto cols = [](int j) { return -30 + 10 * (j % 7); };
  for (const Case& t : {Case{Op::N, Op::N, 90, 72, 100, 1, 0, Activation::identity, 1.0f, 0.0f},
                        Case{Op::N, Op::T, 90, 72, 100, 1, 0, Activation::identity, 1.0f, 0.0f},
                        Case{Op::T, Op::N, 72, 64, 100, 1, 0, Activation::identity, 1.0f, 0.0f}}) {
    const Result r = run(t, 9, false, false, rows, cols);
    INFO("op " << name(t.op_a) << name(t.op_b) << ": max error / sum |terms| " << r.worst);
    CHECK(r.worst <= 2e-6);
  }
}

TEST_CASE("3xFP16 model: fp16 conversions round to nearest even, with subnormals and overflow", "[f16x3]") {
  namespace h = emulation::f16;
  CHECK(h::encode(1.0f) == 0x3c00);
  CHECK(h::encode(65504.0f) == 0x7bff);
  CHECK(h::encode(65519.0f) == 0x7bff);
  CHECK(h::encode(65520.0f) == 0x7c00);
  CHECK(h::encode(-std::ldexp(1.0f, -24)) == 0x8001);
  CHECK(h::encode(std::ldexp(1.0f, -25)) == 0x0000);          // a tie: to even (zero)
  CHECK(h::encode(std::ldexp(3.0f, -25)) == 0x0002);          // a tie: to even (2 x 2^-24)
  CHECK(h::encode(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);   // a tie: to even
  CHECK(h::encode(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);
  for (std::uint16_t v : {0x0001, 0x03ff, 0x0400, 0x3555, 0x7bff, 0x8400, 0xfbff}) CHECK(h::encode(h::decode(v)) == v);
}

// Small GEMMs over four k-tiles (the ring refilled, both stages reused), and with op(B) split beforehand over
// six (its ring of four refilled), fast enough for scripts/test.sh to run under ThreadSanitizer, where a split
// store to a stage, or a copy into a ring slot, that another warp may still read, without the barrier between
// them, is a data race.
TEST_CASE("3xFP16 kernels (emulated): small GEMMs of every layout", "[f16x3][races]") {
  for (const Case& t : {Case{Op::N, Op::N, 64, 64, 100, 1, 1, Activation::relu, 1.0f, 0.0f},
                        Case{Op::N, Op::T, 64, 64, 100, 1, 2, Activation::tanh, 1.0f, 0.0f},
                        Case{Op::T, Op::N, 64, 64, 100, 1, 0, Activation::identity, 1.0f, 0.0f},
                        Case{Op::N, Op::N, 64, 64, 196, 1, 0, Activation::identity, 1.0f, 0.0f},
                        Case{Op::N, Op::T, 64, 64, 196, 1, 0, Activation::identity, 1.0f, 0.0f}}) {
    const bool pre_b = t.k > 100;
    const Result r = run(t, 3, false, pre_b);
    INFO("op " << name(t.op_a) << name(t.op_b) << (pre_b ? ", op(B) split beforehand" : "")
               << ": max error / sum |terms| " << r.worst);
    CHECK(r.worst <= 2e-6);
    CHECK(r.stray == 0);
  }
}

// The wgmma form on small GEMMs over seven k-tiles (its three stages and op(B)'s ring of five split k-tiles
// refilled), on one warpgroup and on two (the large tile), fast enough for scripts/test.sh to run under
// ThreadSanitizer, where a split store to a stage, or a copy into a ring slot, that another thread's MMAs may
// still read (with the MMAs run at their wait: up to that thread's wait_group), without the barrier between
// them, is a data race.
TEST_CASE("3xFP16 wgmma form (emulated): small GEMMs in both MMA timings", "[f16x3][wgmma][races]") {
  check_wgmma({Op::N, Op::N, 64, 64, 196, 1, 1, Activation::relu, 1.0f, 0.0f}, 3, {false});
  check_wgmma({Op::N, Op::T, 64, 64, 196, 1, 2, Activation::tanh, 1.0f, 0.0f}, 3, {false});
  check_wgmma({Op::N, Op::T, 128, 128, 196, 1, 0, Activation::identity, 1.0f, 0.0f}, 3, {true});  // two warpgroups
  check_wgmma({Op::T, Op::N, 64, 64, 196, 1, 0, Activation::identity, 1.0f, 0.0f}, 3, {false});
  check_wgmma({Op::T, Op::N, 128, 128, 196, 1, 0, Activation::identity, 1.0f, 0.0f}, 3, {true});  // two atoms
}
