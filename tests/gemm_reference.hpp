// SPDX-License-Identifier: BSD-3-Clause
// The fp64 reference of one batched GEMM with dpmlp's fused epilogues, for the tests of the GPU GEMM kernels:
// test_mlp's cutlass cases (on the GPU), test_wgmma_emulated and test_f16x3_emulated (dpmlp's kernels on a host
// model); and, for the emulated tests, exact-size host buffers and what a run gives.
#pragma once

#include <dpmlp/activation.hpp>
#include <dpmlp/linalg/gemm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

namespace dpmlp_test {

// C = alpha op(A) op(B) (+ beta C), or with the bias-and-activation or activation-gradient epilogue.
struct EpilogueGemm {
  dpmlp::linalg::Op op_a, op_b;
  int m, n, k, batch;
  int epilogue;  // 0 none, 1 bias and activation, 2 activation gradient
  dpmlp::Activation act;
  float alpha, beta;
};

// Host copies of the operands: batch entry e's A at a + e sa (m x k, or k x m for op T), B at b + e sb (k x n,
// or n x k for op T), element (i, j) of C at c[off + e sc + i n + j], of the old C at c_old[the same], of Y
// (the activation gradient's source) at y[e sc + i n + j].
struct EpilogueGemmData {
  const float *a, *b, *bias, *y, *c_old, *c;
  std::int64_t sa, sb, sc, off;
};

// The largest |C - exact| / (the sum of |terms|) over every element, infinity where C is NaN: fp32 arithmetic
// allows a few ulps of it. The activation gradient's derivative may carry its own float rounding on top (1 -
// y * y, its product fused into the subtraction or not, is within 2^-24 of the exact value; near |y| = 1
// that is far more, relative to the derivative, than the GEMM may err): only the sum is held to fp64.
// `inside`, if given (sized like C's buffer), gets a 1 at each element of C.
inline double epilogue_gemm_error(const EpilogueGemm& t, const EpilogueGemmData& d,
                                  std::vector<char>* inside = nullptr) {
  using dpmlp::linalg::Op;
  const bool at = t.op_a == Op::T, bt = t.op_b == Op::T;
  double worst = 0;
  for (int e = 0; e < t.batch; ++e) {
    for (int i = 0; i < t.m; ++i) {
      for (int j = 0; j < t.n; ++j) {
        double s = 0, mag = 0;
        for (int p = 0; p < t.k; ++p) {
          const double x = d.a[e * d.sa + (at ? std::int64_t(p) * t.m + i : std::int64_t(i) * t.k + p)];
          const double w = d.b[e * d.sb + (bt ? std::int64_t(j) * t.k + p : std::int64_t(p) * t.n + j)];
          s += x * w, mag += std::abs(x * w);
        }
        const std::int64_t at_c = d.off + e * d.sc + std::int64_t(i) * t.n + j;
        if (inside != nullptr) (*inside)[at_c] = 1;
        double want = t.alpha * s;
        mag *= std::abs(t.alpha);
        if (t.epilogue == 0 && t.beta != 0.0f) {
          want += t.beta * double(d.c_old[at_c]);
          mag += std::abs(t.beta * double(d.c_old[at_c]));
        }
        if (t.epilogue == 1) {
          want = double(dpmlp::detail::activate(t.act, float(want + d.bias[j])));  // the activation of the fp32 sum
          mag += std::abs(d.bias[j]);
        }
        double slack = 0;
        if (t.epilogue == 2) {
          const double yv = d.y[e * d.sc + std::int64_t(i) * t.n + j];
          const double g = dpmlp::detail::activate_grad_from_output(t.act, yv);
          slack = std::ldexp(std::abs(want), -23);
          want *= g, mag *= std::abs(g);
        }
        const double err = std::max(0.0, std::abs(double(d.c[at_c]) - want) - slack) / std::max(mag, 1e-30);
        worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : std::max(worst, err);
      }
    }
  }
  return worst;
}

// Exactly `count` floats, 64-byte aligned: an address sanitizer sees any read past the end.
struct Buffer {
  float* p = nullptr;
  explicit Buffer(std::int64_t count) {
    if (posix_memalign(reinterpret_cast<void**>(&p), 64, static_cast<std::size_t>(count) * sizeof(float)) != 0) {
      throw std::bad_alloc();
    }
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// Column j of B's (k x n, row-major, leading dimension ld) sum over its k rows in the order of the 3xFP16
// kernels' ColumnSums (a T N GEMM's bias gradients): eight chains, chain g the rows r = g (mod 8) in row order
// from +0 (zeros past k up to the last 32-row k-tile's end), combined ((c0 + c1) + (c2 + c3)) + ((c4 + c5) +
// (c6 + c7)).
inline float f16x3_column_sum(const float* b, std::int64_t ld, int k, int j) {
  const int rows = (k + 31) / 32 * 32;
  float chain[8];
  for (int g = 0; g < 8; ++g) {
    chain[g] = 0.0f;
    for (int r = g; r < rows; r += 8) chain[g] += r < k ? b[std::int64_t(r) * ld + j] : 0.0f;
  }
  return ((chain[0] + chain[1]) + (chain[2] + chain[3])) + ((chain[4] + chain[5]) + (chain[6] + chain[7]));
}

// The T N kernels' column sums of each batch entry's B (k x n, row-major, entries sb apart) at sums + e * sc +
// off + j against f16x3_column_sum, bit for bit, plus the elements of the `size`-float buffer outside them
// that are not NaN (written astray): the count of both.
inline int column_sums_wrong(const EpilogueGemm& t, const float* b, std::int64_t sb, const float* sums,
                             std::int64_t sc, std::int64_t off, std::int64_t size) {
  int wrong = 0;
  std::vector<char> inside(size, 0);
  for (std::int64_t e = 0; e < t.batch; ++e) {
    for (int j = 0; j < t.n; ++j) {
      const float want = f16x3_column_sum(b + e * sb, t.n, t.k, j);
      const std::int64_t at = e * sc + off + j;
      inside[at] = 1;
      if (std::memcmp(&sums[at], &want, sizeof(float)) != 0) ++wrong;
    }
  }
  for (std::int64_t i = 0; i < size; ++i) {
    if (!inside[i] && !std::isnan(sums[i])) ++wrong;
  }
  return wrong;
}

// A run of one GEMM: its error (epilogue_gemm_error), the elements of C's buffer (c_size floats from d.c)
// outside C that changed, and C (batch entry 0).
struct Result {
  double worst = 0;      // max |C - exact| / sum |terms|
  int stray = 0;         // elements outside C that changed
  std::vector<float> c;  // C (batch entry 0)
  int sums_wrong = 0;    // T N with column sums (the 3xFP16 kernels'): sums not the reference's bits, or strays
};
inline Result result_of(const EpilogueGemm& t, const EpilogueGemmData& d, std::int64_t c_size) {
  Result r;
  std::vector<char> inside(c_size, 0);
  r.worst = epilogue_gemm_error(t, d, &inside);
  for (std::int64_t i = 0; i < c_size; ++i) {
    if (!inside[i] && std::memcmp(&d.c[i], &d.c_old[i], sizeof(float)) != 0) ++r.stray;
  }
  r.c.assign(d.c + d.off, d.c + d.off + std::int64_t(t.m) * t.n);
  return r;
}

}  // namespace dpmlp_test
