// SPDX-License-Identifier: BSD-3-Clause
// The portable GEMM: the tiled kernel gives, bit for bit, the reference kernel's C (every element summed from
// +0 over k in increasing order, one term at a time), for many shapes, all four op combinations, padded
// leading dimensions, batches with strides (a shared B included), alpha/beta variants and k = 0; and an
// element's bits do not depend on the batch count, its batch index, m or n (the tile shape the kernel
// picks). Runs on the default execution space: Serial in a CPU build (the tiled kernel's host form), the
// GPU in a device build. Also, on any build, the index arithmetic of the Hopper wgmma kernels
// (backend/cuda/wgmma_layout.hpp) against the layout their MMA descriptors describe, and that of the 3xFP16
// kernels (backend/cuda/f16x3_layout.hpp) against ldmatrix's and mma.sync's fragment layouts.
#include <catch2/catch.hpp>

#include <dpmlp/backend/cuda/f16x3_layout.hpp>
#include <dpmlp/backend/cuda/wgmma_layout.hpp>
#include <dpmlp/linalg/gemm.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;
using dpmlp::linalg::BatchedGemm;
using dpmlp::linalg::Op;

const char* op_name(Op op) { return op == Op::N ? "N" : "T"; }

// Values with full mantissas and both signs; with `special`, also zeros of both signs, subnormals and values
// whose products overflow, so the comparison also sees the order of every operation on them.
template <class Scalar>
std::vector<Scalar> random_values(std::size_t count, unsigned seed, bool special) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> pick(0, 63);
  std::vector<Scalar> v(count);
  for (auto& x : v) {
    x = static_cast<Scalar>(normal(gen));
    if (!special) continue;
    switch (pick(gen)) {
      case 0: x = Scalar(0); break;
      case 1: x = -Scalar(0); break;
      case 2: x = std::numeric_limits<Scalar>::denorm_min() * Scalar(3); break;
      case 3: x = -std::numeric_limits<Scalar>::max() / Scalar(4); break;
      default: break;
    }
  }
  return v;
}

template <class Scalar>
Kokkos::View<Scalar*, Memory> device_copy(const std::vector<Scalar>& h, const char* label) {
  Kokkos::View<Scalar*, Memory> d(std::string(label), h.size());
  Kokkos::View<const Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hv(h.data(), h.size());
  Kokkos::deep_copy(d, hv);
  return d;
}

template <class Scalar>
std::vector<Scalar> host_copy(const Kokkos::View<Scalar*, Memory>& d) {
  std::vector<Scalar> h(d.extent(0));
  Kokkos::View<Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hv(h.data(), h.size());
  Kokkos::deep_copy(hv, d);
  return h;
}

bool same_bits(const void* a, const void* b, std::size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// One product's description; its buffers are sized from it.
struct Shape {
  Op op_a = Op::N, op_b = Op::N;
  int m = 1, n = 1, k = 1;
  int pad_a = 0, pad_b = 0, pad_c = 0;  // leading dimensions beyond the natural ones
  std::int64_t batch = 1;
  bool shared_b = false;                     // stride_b = 0
  std::int64_t gap_a = 0, gap_b = 0, gap_c = 0;  // batch strides beyond one stored matrix
  double alpha = 1, beta = 0;

  std::string describe() const {
    return std::string("op ") + op_name(op_a) + op_name(op_b) + " m " + std::to_string(m) + " n " +
           std::to_string(n) + " k " + std::to_string(k) + " pads " + std::to_string(pad_a) + "/" +
           std::to_string(pad_b) + "/" + std::to_string(pad_c) + " batch " + std::to_string(batch) +
           (shared_b ? " shared B" : "") + " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta);
  }
};

// The buffers of one product and the BatchedGemm over them.
template <class Scalar>
struct Problem {
  BatchedGemm<Scalar> g;
  Kokkos::View<Scalar*, Memory> a, b, c;
  std::vector<Scalar> c0;  // C's initial contents (every element, padding included)

  Problem(const Shape& s, unsigned seed, bool special) {
    g.op_a = s.op_a;
    g.op_b = s.op_b;
    g.m = s.m;
    g.n = s.n;
    g.k = s.k;
    g.alpha = static_cast<Scalar>(s.alpha);
    g.beta = static_cast<Scalar>(s.beta);
    g.batch = s.batch;
    // Stored A is m x k (Op::N) or k x m (Op::T), row-major; likewise B; the leading dimension is at least 1.
    const int a_rows = s.op_a == Op::N ? s.m : s.k, a_cols = s.op_a == Op::N ? s.k : s.m;
    const int b_rows = s.op_b == Op::N ? s.k : s.n, b_cols = s.op_b == Op::N ? s.n : s.k;
    g.lda = std::max(1, a_cols + s.pad_a);
    g.ldb = std::max(1, b_cols + s.pad_b);
    g.ldc = s.n + s.pad_c;
    g.stride_a = std::int64_t(a_rows) * g.lda + s.gap_a;
    g.stride_b = s.shared_b ? 0 : std::int64_t(b_rows) * g.ldb + s.gap_b;
    g.stride_c = std::int64_t(s.m) * g.ldc + s.gap_c;
    const std::int64_t na = (s.batch - 1) * g.stride_a + std::int64_t(a_rows) * g.lda;
    const std::int64_t nb = (s.batch - 1) * g.stride_b + std::int64_t(b_rows) * g.ldb;
    const std::int64_t nc = (s.batch - 1) * g.stride_c + std::int64_t(s.m) * g.ldc;
    a = device_copy(random_values<Scalar>(std::max<std::int64_t>(na, 1), seed, special), "a");
    b = device_copy(random_values<Scalar>(std::max<std::int64_t>(nb, 1), seed + 1, special), "b");
    c0 = random_values<Scalar>(nc, seed + 2, special);
    c = device_copy(c0, "c");
    g.a = a.data();
    g.b = b.data();
    g.c = c.data();
  }

  // C after `gemm` runs from C's initial contents: the whole buffer, so writes outside C show too.
  template <class Gemm>
  std::vector<Scalar> run(const Gemm& gemm) {
    Kokkos::View<const Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> init(c0.data(),
                                                                                                  c0.size());
    Kokkos::deep_copy(c, init);
    gemm(g);
    Space().fence();
    return host_copy(c);
  }
};

template <class Scalar>
std::vector<Scalar> reference(Problem<Scalar>& p) {
  return p.run([](const BatchedGemm<Scalar>& g) { dpmlp::linalg::detail::gemm_portable_reference(Space(), g); });
}
template <class Scalar>
std::vector<Scalar> tiled(Problem<Scalar>& p) {
  return p.run([](const BatchedGemm<Scalar>& g) { dpmlp::linalg::detail::gemm_portable_tiled(Space(), g); });
}

// The variants a shape cycles through, so that every one meets many shapes and all four op combinations.
Shape variant(Op oa, Op ob, int m, int n, int k, unsigned v) {
  static const double alphas[] = {1.0, 0.75, 1.0, -1.5, 2.0};
  static const double betas[] = {0.0, 0.0, 1.0, 0.25, -1.0};
  Shape s;
  s.op_a = oa;
  s.op_b = ob;
  s.m = m;
  s.n = n;
  s.k = k;
  s.pad_a = v % 3 == 0 ? 0 : 5;
  s.pad_b = (v / 3) % 3 == 0 ? 0 : 3;
  s.pad_c = (v / 2) % 2 == 0 ? 0 : 7;
  s.batch = v % 2 == 0 ? 1 : 3;
  s.shared_b = s.batch > 1 && v % 4 == 1;
  s.gap_a = v % 5 == 0 ? 0 : 11;
  s.gap_b = (v / 5) % 2 == 0 ? 0 : 2;
  s.gap_c = v % 7 == 0 ? 0 : 13;
  s.alpha = alphas[v % 5];
  s.beta = betas[v % 5];
  return s;
}

template <class Scalar>
void check_tiled_against_reference(const std::vector<int>& mn, const std::vector<int>& ks, bool special) {
  unsigned v = 0;
  for (int m : mn) {
    for (int n : mn) {
      for (int k : ks) {
        for (Op oa : {Op::N, Op::T}) {
          for (Op ob : {Op::N, Op::T}) {
            const Shape s = variant(oa, ob, m, n, k, v++);
            Problem<Scalar> p(s, 1000 + v, special);
            const auto want = reference(p);
            const auto got = tiled(p);
            INFO(s.describe());
            REQUIRE(got.size() == want.size());
            CHECK(same_bits(got.data(), want.data(), got.size() * sizeof(Scalar)));
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("the tiled portable GEMM gives the reference kernel's bits (float)", "[gemm]") {
  check_tiled_against_reference<float>({1, 3, 17, 64, 65, 130, 257}, {0, 1, 3, 17, 64, 65, 130, 257}, false);
}

TEST_CASE("the tiled portable GEMM gives the reference kernel's bits with zeros, subnormals, overflow",
          "[gemm]") {
  check_tiled_against_reference<float>({1, 3, 17, 65, 130}, {0, 1, 17, 65, 130}, true);
}

TEST_CASE("the tiled portable GEMM gives the reference kernel's bits (double)", "[gemm]") {
  check_tiled_against_reference<double>({1, 3, 17, 65, 130}, {0, 1, 17, 65, 130}, false);
}

// Each tile shape on its own, whatever m and n the dispatch would give it.
TEMPLATE_TEST_CASE("every tile shape gives the reference kernel's bits", "[gemm]",
                   dpmlp::linalg::detail::GemmTileLarge, dpmlp::linalg::detail::GemmTileMedium,
                   dpmlp::linalg::detail::GemmTileShort, dpmlp::linalg::detail::GemmTileThin<float>) {
  unsigned v = 7;
  for (int m : {1, 33, 130}) {
    for (int n : {1, 5, 130}) {
      for (int k : {0, 9, 130}) {
        for (Op oa : {Op::N, Op::T}) {
          for (Op ob : {Op::N, Op::T}) {
            const Shape s = variant(oa, ob, m, n, k, v++);
            Problem<float> p(s, 2000 + v, false);
            const auto want = reference(p);
            const auto got = p.run([](const BatchedGemm<float>& g) {
              dpmlp::linalg::detail::gemm_tiled_launch<TestType>(Space(), g);
            });
            INFO(s.describe());
            CHECK(same_bits(got.data(), want.data(), got.size() * sizeof(float)));
          }
        }
      }
    }
  }
}

// An element's bits depend only on its row of op(A), its column of op(B), k, alpha, beta and its old value:
// batch entry e alone (batch 1, the pointers moved to it) gives the bits it gets in a batch of 5; and a
// sub-block of C computed alone (other m and n, so other tile shapes) gives the bits it gets in the whole.
TEST_CASE("the portable GEMM's elements do not depend on the batch count, batch index, m or n", "[gemm]") {
  using Gemm = void (*)(const BatchedGemm<float>&);
  const Gemm kernels[] = {
      [](const BatchedGemm<float>& g) { dpmlp::linalg::detail::gemm_portable_tiled(Space(), g); },
      [](const BatchedGemm<float>& g) { dpmlp::linalg::gemm(Space(), dpmlp::linalg::Backend::portable, g); },
  };
  unsigned v = 3;
  for (const Gemm gemm : kernels) {
    for (Op oa : {Op::N, Op::T}) {
      for (Op ob : {Op::N, Op::T}) {
        for (const auto& mnk : std::vector<std::array<int, 3>>{{256, 256, 32}, {256, 1, 256}, {32, 256, 100},
                                                               {65, 64, 257}}) {
          Shape s = variant(oa, ob, mnk[0], mnk[1], mnk[2], v++);
          s.batch = 5;
          s.shared_b = v % 2 == 0;
          Problem<float> p(s, 3000 + v, false);
          const auto all = p.run(gemm);
          INFO(s.describe());
          for (std::int64_t e = 0; e < 5; ++e) {
            BatchedGemm<float> one = p.g;
            one.batch = 1;
            one.a += e * p.g.stride_a;
            one.b += e * p.g.stride_b;
            one.c += e * p.g.stride_c;
            const auto alone = p.run([&](const BatchedGemm<float>&) { gemm(one); });
            INFO("batch entry " << e);
            const std::size_t at = e * p.g.stride_c, count = std::size_t(s.m - 1) * p.g.ldc + s.n;
            CHECK(same_bits(alone.data() + at, all.data() + at, count * sizeof(float)));
          }
          // Sub-blocks [i0, i0 + mm) x [j0, j0 + nn) of C[0], as products of their own.
          for (const auto& blk : std::vector<std::array<int, 4>>{
                   {0, 0, 1, 1}, {5, 0, 3, mnk[1]}, {0, 0, 17, mnk[1]}, {1, 0, mnk[0] - 1, 1}, {0, 0, 64, 64}}) {
            const int i0 = blk[0], j0 = blk[1];
            const int mm = std::min(blk[2], s.m - i0), nn = std::min(blk[3], s.n - j0);
            if (mm <= 0 || nn <= 0) continue;
            BatchedGemm<float> sub = p.g;
            sub.batch = 1;
            sub.m = mm;
            sub.n = nn;
            sub.a += oa == Op::N ? std::int64_t(i0) * p.g.lda : i0;
            sub.b += ob == Op::N ? j0 : std::int64_t(j0) * p.g.ldb;
            sub.c += std::int64_t(i0) * p.g.ldc + j0;
            const auto part = p.run([&](const BatchedGemm<float>&) { gemm(sub); });
            INFO("rows " << i0 << "+" << mm << " columns " << j0 << "+" << nn);
            bool same = true;
            for (int i = i0; i < i0 + mm; ++i) {
              const std::size_t at = std::size_t(i) * p.g.ldc + j0;
              same = same && same_bits(part.data() + at, all.data() + at, nn * sizeof(float));
            }
            CHECK(same);
          }
        }
      }
    }
  }
}

// The wgmma kernels' index arithmetic (backend/cuda/wgmma_layout.hpp), checked on any build against what the
// hardware reads: for every thread's vectors, the element each one carries lands where the MMA's descriptor
// (decoded field by field) and the canonical K-major 128-byte-swizzled layout put that element, for both
// operand paths and both tile heights; the transposed path's stores are free of bank conflicts; and the
// accumulator's register map is CuTe's CLayout_64xN.
TEST_CASE("wgmma layout: the split stores put every element where the descriptors read it", "[gemm]") {
  namespace w = dpmlp::backend::wgmma;
  const std::uint32_t base = 0x4000;  // a tile's shared address: 1024-byte aligned
  // The hardware's address of element (row, kk) of k-step `step`, from the descriptor's fields: start +
  // (row / 8) SBO + (row % 8) 128 bytes + kk 4 bytes, then the 128-byte swizzle (bits 4-6 ^= bits 7-9).
  std::array<std::uint32_t, 4> start{}, sbo{};
  for (int step = 0; step < 4; ++step) {
    const std::uint64_t d = w::descriptor(base + 32 * step);
    CHECK((d >> 62) == 1);             // 128-byte swizzle
    CHECK(((d >> 49) & 7) == 0);       // base offset
    CHECK(((d >> 16) & 0x3FFF) == 1);  // leading byte offset: unused with a swizzle, 1
    start[step] = static_cast<std::uint32_t>(d & 0x3FFF) << 4;
    sbo[step] = static_cast<std::uint32_t>((d >> 32) & 0x3FFF) << 4;
  }
  const auto read_offset = [&](int step, int row, int kk) {
    std::uint32_t b = start[step] + (row / 8) * sbo[step] + (row % 8) * 128 + kk * 4;
    b ^= ((b >> 7) & 7) << 4;
    return static_cast<int>((b - base) / 4);
  };
  for (int rows : {64, 128}) {
    for (bool kcontig : {true, false}) {
      // Which (row, k) each float of the tile receives from the stores; -1: none.
      std::vector<int> holds(static_cast<std::size_t>(rows) * w::k_tile, -1);
      int clashes = 0;
      const auto put = [&](int off, int row, int k) {
        if (holds[off] != -1) ++clashes;
        holds[off] = row * w::k_tile + k;
      };
      for (int t = 0; t < 128; ++t) {
        if (kcontig) {
          for (int i = 0; i < rows / 16; ++i) {
            const int f = t + 128 * i, r = w::kcontig_row(f), c = w::kcontig_chunk(f);
            for (int e = 0; e < 4; ++e) put(w::swizzled(r, c) + e, r, 4 * c + e);
          }
        } else {
          for (int i = 0; i < rows / 64; ++i) {
            const int u = t + 128 * i, r = 4 * w::block_row(u, rows), c = w::block_chunk(u, rows);
            for (int s = 0; s < 4; ++s) {
              for (int q = 0; q < 4; ++q) put(w::swizzled(r + s, c) + q, r + s, 4 * c + q);
            }
          }
        }
      }
      INFO("rows " << rows << (kcontig ? ", K-contiguous" : ", transposed"));
      CHECK(clashes == 0);
      CHECK(std::count(holds.begin(), holds.end(), -1) == 0);
      int wrong = 0;
      for (int step = 0; step < 4; ++step) {
        for (int row = 0; row < rows; ++row) {
          for (int kk = 0; kk < 8; ++kk) wrong += holds[read_offset(step, row, kk)] != row * w::k_tile + 8 * step + kk;
        }
      }
      CHECK(wrong == 0);
      if (!kcontig) {
        // A store phase: 8 consecutive lanes, the same s; 16-byte stores are conflict-free when the 8 slots
        // (16-byte units mod 128 bytes) differ.
        int worst = 1;
        for (int i = 0; i < rows / 64; ++i) {
          for (int phase = 0; phase < 16; ++phase) {
            for (int s = 0; s < 4; ++s) {
              std::array<int, 8> used{};
              for (int l = 0; l < 8; ++l) {
                const int u = 8 * phase + l + 128 * i;
                const int slot = (w::swizzled(4 * w::block_row(u, rows) + s, w::block_chunk(u, rows)) / 4) % 8;
                worst = std::max(worst, ++used[slot]);
              }
            }
          }
        }
        CHECK(worst == 1);
      }
    }
  }
  // CLayout_64xN: (thread, value) -> m + 64 n with thread (4, 8, 4) : (128, 1, 16), value (2, 2, N / 8) :
  // (64, 8, 512).
  for (int n : {64, 128}) {
    std::vector<int> seen(64 * n, 0);
    int wrong = 0;
    for (int t = 0; t < 128; ++t) {
      for (int v = 0; v < n / 2; ++v) {
        const int idx = 128 * (t % 4) + (t / 4) % 8 + 16 * (t / 32) + 64 * (v % 2) + 8 * ((v / 2) % 2) + 512 * (v / 4);
        wrong += w::acc_row(t, v) != idx % 64 || w::acc_col(t, v) != idx / 64;
        ++seen[w::acc_row(t, v) * n + w::acc_col(t, v)];
      }
    }
    CHECK(wrong == 0);
    CHECK(std::count(seen.begin(), seen.end(), 1) == 64 * n);
  }
}

namespace {

// A model of one operand k-tile in the 3xFP16 kernels' shared memory: every value's (f, k) stored where the
// kernels' split stores put it, then read back as ldmatrix.x4 (.trans for k-major planes) does from the
// addresses the kernels' lanes give: lane t's register q holds quarter q's (row t/4, columns 2(t%4), +1)
// (read as stored) or (rows 2(t%4), +1; column t/4) (transposed), a quarter being the eight rows of eight
// halves that lanes 8q .. 8q+7 point at.
template <bool FreeMajor, int F>
void check_f16x3_tile() {
  namespace l = dpmlp::backend::f16x3_layout;
  constexpr int K = l::k_tile;
  const int none = -1;
  std::vector<int> plane(static_cast<std::size_t>(F * K), none);  // the (f, k) stored there, as f * K + k
  int collisions = 0;
  for (int region = 0; region < F / 16; ++region) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < 4; ++i) {
        const l::Coord e = l::region_element<FreeMajor>(lane, i);
        const int at = l::plane_at<FreeMajor, F>(16 * region + e.f, e.k);
        REQUIRE(at % 4 == 0);  // the kernels store a float4's four halves with one 8-byte store
        for (int c = 0; c < 4; ++c) {  // the four values along the contiguous dimension
          const int f = 16 * region + e.f + (FreeMajor ? 0 : c), k = e.k + (FreeMajor ? c : 0);
          REQUIRE(at + c < F * K);
          collisions += plane[at + c] != none;
          plane[at + c] = f * K + k;
        }
      }
    }
  }
  CHECK(collisions == 0);
  CHECK(std::count(plane.begin(), plane.end(), none) == 0);
  // Each 16 x 16 block, as an A fragment and as two B fragments.
  int wrong = 0, misaligned = 0, conflicts = 0;
  for (int f0 = 0; f0 < F; f0 += 16) {
    for (int k0 = 0; k0 < K; k0 += 16) {
      for (const bool pairs : {false, true}) {
        std::array<int, 32> addr{};
        for (int lane = 0; lane < 32; ++lane) {
          const l::Coord row =
              pairs ? l::ldsm_row<FreeMajor, true>(f0, k0, lane) : l::ldsm_row<FreeMajor, false>(f0, k0, lane);
          addr[lane] = l::plane_at<FreeMajor, F>(row.f, row.k);
          misaligned += addr[lane] % 8 != 0;  // 16 bytes
        }
        for (int q = 0; q < 4; ++q) {  // a quarter's eight rows in eight distinct 16-byte bank groups
          std::array<int, 8> groups{};
          for (int r = 0; r < 8; ++r) groups[r] = (addr[8 * q + r] / 8) % 8;
          std::sort(groups.begin(), groups.end());
          conflicts += std::unique(groups.begin(), groups.end()) != groups.end();
        }
        for (int t = 0; t < 32; ++t) {
          for (int q = 0; q < 4; ++q) {
            for (int h = 0; h < 2; ++h) {
              // What ldmatrix gives lane t in register q, half h.
              const int got = FreeMajor ? plane[addr[8 * q + t / 4] + 2 * (t % 4) + h]
                                        : plane[addr[8 * q + 2 * (t % 4) + h] + t / 4];
              // What the MMA wants there: A (row-major 16 x 16): a0 (row g, k 2t'), a1 (g + 8), a2 (k + 8),
              // a3 (both); B pairs: {b0, b1} of the n-tile f 0-7 (k 2t', k 2t' + 8), then of f 8-15.
              const int g = t / 4, kk = 2 * (t % 4) + h;
              const int f = f0 + g + 8 * (pairs ? (q >> 1) : (q & 1));
              const int k = k0 + kk + 8 * (pairs ? (q & 1) : (q >> 1));
              wrong += got != f * K + k;
            }
          }
        }
      }
    }
  }
  CHECK(wrong == 0);
  CHECK(misaligned == 0);
  CHECK(conflicts == 0);
}

}  // namespace

TEST_CASE("3xFP16 layout: every value stored once, and ldmatrix gives each MMA its fragments", "[gemm]") {
  SECTION("free-major (k contiguous), 64 and 128 rows") {
    check_f16x3_tile<true, 64>();
    check_f16x3_tile<true, 128>();
  }
  SECTION("k-major (the free dimension contiguous), 64 and 128 columns") {
    check_f16x3_tile<false, 64>();
    check_f16x3_tile<false, 128>();
  }
  SECTION("k-major: a 128-wide plane is two 64-wide ones, 4096 bytes apart (wgmma's MN-major atoms)") {
    namespace L = dpmlp::backend::f16x3_layout;
    int bad = 0;
    for (int f = 0; f < 128; ++f) {
      for (int k = 0; k < L::k_tile; ++k) {
        bad += L::plane_at<false, 128>(f, k) != (f / 64) * 2048 + L::plane_at<false, 64>(f % 64, k);
        // An atom's row k: 64 halves (128 bytes) at 64 k, the 16-byte chunk c of eight free values at c ^ (k % 8).
        bad += L::plane_at<false, 64>(f % 64, k) != 64 * k + ((((f % 64) / 8) ^ (k % 8)) * 8) + f % 8;
      }
    }
    CHECK(L::k_major_atom == 2048);
    CHECK(bad == 0);
  }
  SECTION("free-major: a lane's ldmatrix row 16 j further on lies 512 j halves further (the kernels' offsets)") {
    namespace L = dpmlp::backend::f16x3_layout;
    int bad = 0;
    for (int lane = 0; lane < 32; ++lane) {
      for (int f0 : {0, 16, 32, 48, 64}) {
        for (int k0 : {0, 16}) {
          for (bool pairs : {false, true}) {
            const L::Coord r0 = pairs ? L::ldsm_row<true, true>(f0, k0, lane) : L::ldsm_row<true, false>(f0, k0, lane);
            for (int j = 1; f0 + 16 * j < 128; ++j) {
              const L::Coord r = pairs ? L::ldsm_row<true, true>(f0 + 16 * j, k0, lane)
                                       : L::ldsm_row<true, false>(f0 + 16 * j, k0, lane);
              if (L::plane_at<true, 128>(r.f, r.k) != L::plane_at<true, 128>(r0.f, r0.k) + 512 * j) ++bad;
            }
          }
        }
      }
    }
    CHECK(bad == 0);
  }
  SECTION("op(B) split beforehand: a k-tile is two planes and the scales of whole 128-column groups") {
    namespace L = dpmlp::backend::f16x3_layout;
    CHECK(L::split_b_columns(1) == 128);
    CHECK(L::split_b_columns(128) == 128);
    CHECK(L::split_b_columns(129) == 256);
    CHECK(L::split_b_tile_bytes(200) == 256 * (2 * 32 * 2 + 4));
    CHECK(L::split_b_bytes(200, 33) == 2 * L::split_b_tile_bytes(200));
    CHECK(L::split_b_bytes(200, 32) == L::split_b_tile_bytes(200));
  }
}
