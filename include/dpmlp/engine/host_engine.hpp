// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/engine/host_engine.hpp: the host engine (Engine::host): a step's per-block gradient sums for an MLP of
// any depth on a host execution space (Serial, OpenMP), in one pass over each block.
//
// A worker (a thread of the space) takes a contiguous range of blocks. For a block it runs the block's rows in
// chunks of up to 32 through the whole model, forward then backward, in its own scratch (the chunk's
// activations and deltas stay in cache), and accumulates the block's weight and bias gradients in a padded
// buffer, which it writes as the block's row of partial sums at the end. The weights are packed once a step
// (each layer's W and its transpose, rows padded to 64 bytes with zeros), so every product is a register-tiled
// loop over padded rows: broadcast one operand, load a vector of the other, fused multiply-add. The bias,
// the activation and its derivative happen in those loops' epilogues.
//
// The order of every sum is fixed by the block's rows alone: each element of a layer's output is
// fma(a_k, w_k, ...) chained from the bias over k = 0, 1, ...; each gradient element is chained from zero over
// the block's rows in order (chunk after chunk); the delta of a layer is chained from zero over the next
// layer's outputs in order; the loss is summed row by row. Vectors hold different elements' chains, never
// parts of one (a one-output layer's dot product excepted: its fixed lanes and their fixed pairwise sum, the
// same in every kernel), so neither the vector width nor the tile shape nor the thread changes a bit: the AVX-512,
// AVX2 and portable kernels (chosen at run time by what the CPU has) give the same partial sums, and so do 1
// or many threads and any rank count.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpmlp/activation.hpp"
#include "dpmlp/engine/row_window.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

// The AVX-512 and AVX2 kernels: x86-64 with GCC or Clang, compiled as host code (not by nvcc or hipcc, whose
// host passes need not accept per-function target options); elsewhere the portable kernel alone.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__HIPCC__) && !defined(__INTEL_LLVM_COMPILER)
#define DPMLP_HOST_X86_KERNELS 1
#include <immintrin.h>
#else
#define DPMLP_HOST_X86_KERNELS 0
#endif

namespace dpmlp {
namespace detail {

// Which kernel the host engine runs: the widest the CPU has, unless a test asks for a narrower one.
enum class HostIsa { portable = 0, avx2 = 1, avx512 = 2 };

inline const char* host_isa_name(HostIsa i) {
  return i == HostIsa::avx512 ? "avx512" : i == HostIsa::avx2 ? "avx2" : "portable";
}

inline HostIsa host_isa_available() {
#if DPMLP_HOST_X86_KERNELS
  static const HostIsa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return HostIsa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return HostIsa::avx2;
    return HostIsa::portable;
  }();
  return best;
#else
  return HostIsa::portable;
#endif
}

// The most a test lets the host engine use (the kernels give the same bits; tests compare them).
inline HostIsa& host_isa_limit() {
  static HostIsa limit = HostIsa::avx512;
  return limit;
}

inline HostIsa host_isa() {
  const HostIsa a = host_isa_available(), l = host_isa_limit();
  return static_cast<int>(a) < static_cast<int>(l) ? a : l;
}

// Rows a chunk: a chunk's activations of a 256-wide layer (32 KiB in float) stay in a core's L1/L2.
constexpr int host_chunk_rows = 32;
// Every padded row is a multiple of 64 bytes: whole vectors for every kernel.
constexpr int host_pad_bytes = 64;

// The lanes of a one-output layer's dot product (Vec::dot): a padded row's 64 bytes.
template <class S>
constexpr int host_dot_lanes() {
  return host_pad_bytes / static_cast<int>(sizeof(S));
}

template <class S>
constexpr int host_pad(int n) {
  constexpr int q = host_pad_bytes / static_cast<int>(sizeof(S));
  return (n + q - 1) / q * q;
}

// One layer as the kernels see it: the packed weights (W rows padded to pout, W's transpose rows padded to
// pin, the bias padded to pout) and where its gradient goes in the scratch buffer and in a partial-sum row.
template <class S>
struct HostLayer {
  int n_in = 0, n_out = 0, pin = 0, pout = 0;
  const S* w = nullptr;     // n_in x pout
  const S* wt = nullptr;    // n_out x pin
  const S* bias = nullptr;  // pout
  std::int64_t gw = 0, gb = 0;      // the weight and bias gradient's offsets in the worker's gradient buffer
  std::int64_t woff = 0, boff = 0;  // and in a row of partial sums (the parameter layout)
};

template <class S>
struct HostProblem {
  int layers = 0;
  const HostLayer<S>* layer = nullptr;
  Activation act = Activation::relu;  // the hidden layers'
  const S* x = nullptr;
  const S* y = nullptr;
  std::int64_t ldx = 0, ldy = 0, rows = 0, block = 0;
  int chunk = host_chunk_rows;
  S scale = S(1);
  RowWindow window;
  S* partials = nullptr;
  std::int64_t ld_partials = 0;
  const std::int64_t* act_off = nullptr;  // layers + 1 offsets into a worker's scratch
  std::int64_t delta_off[2] = {0, 0};
  std::int64_t grad_off = 0, grad_size = 0;
  std::int64_t blocks = 0;
  int group = 1, group_levels = 0;  // blocks a row of partial sums (a power of two), and its log2
  std::int64_t rows_off = 0;        // group > 1: group_levels + 1 rows of partial sums in a worker's scratch
};

// A worker's scratch, as pointers.
template <class S>
struct HostScratch {
  S* base;
  const HostProblem<S>& p;
  S* grad;
  HostScratch(const HostProblem<S>& problem, S* scratch) : base(scratch), p(problem), grad(scratch + problem.grad_off) {}
  S* act(int l) const { return base + p.act_off[l]; }
  S* delta(int i) const { return base + p.delta_off[i]; }
};

// Where a tile's accumulators start, and what happens to them before the store.
enum class HostInit { zero, bias, load };
enum class HostOp { none, activation, activation_grad };

template <class S>
struct HostEpilogue {
  HostInit init = HostInit::zero;
  const S* bias = nullptr;
  HostOp op = HostOp::none;
  Activation act = Activation::identity;
  const S* aux = nullptr;  // activation_grad: the activations the derivative is taken at
  std::int64_t ld_aux = 0;
};

#if defined(__GNUC__)
#define DPMLP_HOST_NOINLINE __attribute__((noinline))
#else
#define DPMLP_HOST_NOINLINE
#endif

// One row's output delta (the loss term's gradient, loss.hpp) into d, zero padded to pout, and the sum of the
// row's loss terms. One out-of-line function for every instruction set's kernel, defined outside their target
// regions and never inlined into them: a compiler allowed to contract a * b + c into a fused multiply-add then
// contracts it the same way (or not at all) for all of them, so the kernels keep the same bits.
template <class S, class Term>
DPMLP_HOST_NOINLINE S host_output_delta(const Term& term, const S* pred, const S* y, S* d, int n_out, int pout,
                                        S scale, bool in) {
  S sum = S(0);
  for (int j = 0; j < n_out; ++j) {
    const S res = in ? pred[j] - y[j] : S(0);
    sum += term.value(res, j);
    d[j] = term.grad(res, j, scale);
  }
  for (int j = n_out; j < pout; ++j) d[j] = S(0);
  return sum;
}

namespace host_portable {
// One lane: what every vector kernel does per lane.
template <class S>
struct Vec {
  using type = S;
  static constexpr int width = 1, nr = 4, acc = 16;
  static S zero() { return S(0); }
  static S load(const S* p) { return *p; }
  static void store(S* p, S v) { *p = v; }
  static S set1(S s) { return s; }
  static S fma(S a, S b, S c) { return std::fma(a, b, c); }
  static S activate(Activation act, S z) {
    if (act == Activation::relu) return z > S(0) ? z : S(0);  // NaN and -0 -> +0
    if (act == Activation::tanh) return std::tanh(z);
    return z;
  }
  // d * act'(a), act' written in terms of the activation's output a.
  static S times_grad(Activation act, S d, S a) {
    if (act == Activation::relu) return a > S(0) ? d : S(0);
    if (act == Activation::tanh) return d * std::fma(-a, a, S(1));
    return d;
  }
  // sum over k < n of a[k] * w[k], n a multiple of the lanes: host_dot_lanes<S> chains (lane l: k = l, l +
  // lanes, ... in order, fma from zero), then the lanes halved pairwise: l + (l + lanes / 2), and so on.
  static S dot(const S* a, const S* w, int n) {
    constexpr int lanes = host_dot_lanes<S>();
    S s[lanes];
    for (int l = 0; l < lanes; ++l) s[l] = S(0);
    for (int k = 0; k < n; k += lanes) {
      for (int l = 0; l < lanes; ++l) s[l] = std::fma(a[k + l], w[k + l], s[l]);
    }
    for (int h = lanes / 2; h >= 1; h /= 2) {
      for (int l = 0; l < h; ++l) s[l] = s[l] + s[l + h];
    }
    return s[0];
  }
};
#include "dpmlp/engine/host_kernels.inc"
}  // namespace host_portable

#if DPMLP_HOST_X86_KERNELS
// Vectors whose lanes need a scalar function (tanh) go through memory lane by lane: the same function, so the
// same bits as the portable kernel.
#define DPMLP_HOST_LANES(V, v, f)                      \
  do {                                                 \
    alignas(64) typename V::scalar lanes_[V::width];   \
    V::store(lanes_, v);                               \
    for (int i_ = 0; i_ < V::width; ++i_) f;           \
    v = V::load(lanes_);                               \
  } while (0)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace host_avx2 {
template <class S>
struct Vec;
template <>
struct Vec<float> {
  using scalar = float;
  using type = __m256;
  static constexpr int width = 8, nr = 2, acc = 8;
  static type zero() { return _mm256_setzero_ps(); }
  static type load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, type v) { _mm256_storeu_ps(p, v); }
  static type set1(float s) { return _mm256_set1_ps(s); }
  static type fma(type a, type b, type c) { return _mm256_fmadd_ps(a, b, c); }
  static type activate(Activation act, type v) {
    if (act == Activation::relu) return _mm256_max_ps(v, zero());  // NaN and -0 -> +0, as z > 0 ? z : 0
    if (act == Activation::tanh) DPMLP_HOST_LANES(Vec, v, lanes_[i_] = std::tanh(lanes_[i_]));
    return v;
  }
  static type times_grad(Activation act, type d, type a) {
    if (act == Activation::relu) return _mm256_and_ps(_mm256_cmp_ps(a, zero(), _CMP_GT_OQ), d);
    if (act == Activation::tanh) return _mm256_mul_ps(d, _mm256_fnmadd_ps(a, a, _mm256_set1_ps(1.0f)));
    return d;
  }
  // The portable Vec::dot's 16 lanes as two registers, then its pairs: l + (l + 8), l + (l + 4), ...
  static float dot(const float* a, const float* w, int n) {
    __m256 lo = zero(), hi = zero();
    for (int k = 0; k < n; k += 16) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(w + k), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(w + k + 8), hi);
    }
    return half8(_mm256_add_ps(lo, hi));
  }
  static float half8(__m256 h) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 e = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(e, _mm_shuffle_ps(e, e, 1)));
  }
};
template <>
struct Vec<double> {
  using scalar = double;
  using type = __m256d;
  static constexpr int width = 4, nr = 2, acc = 8;
  static type zero() { return _mm256_setzero_pd(); }
  static type load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, type v) { _mm256_storeu_pd(p, v); }
  static type set1(double s) { return _mm256_set1_pd(s); }
  static type fma(type a, type b, type c) { return _mm256_fmadd_pd(a, b, c); }
  static type activate(Activation act, type v) {
    if (act == Activation::relu) return _mm256_max_pd(v, zero());
    if (act == Activation::tanh) DPMLP_HOST_LANES(Vec, v, lanes_[i_] = std::tanh(lanes_[i_]));
    return v;
  }
  static type times_grad(Activation act, type d, type a) {
    if (act == Activation::relu) return _mm256_and_pd(_mm256_cmp_pd(a, zero(), _CMP_GT_OQ), d);
    if (act == Activation::tanh) return _mm256_mul_pd(d, _mm256_fnmadd_pd(a, a, _mm256_set1_pd(1.0)));
    return d;
  }
  // The portable Vec::dot's 8 lanes as two registers, then its pairs.
  static double dot(const double* a, const double* w, int n) {
    __m256d lo = zero(), hi = zero();
    for (int k = 0; k < n; k += 8) {
      lo = _mm256_fmadd_pd(_mm256_loadu_pd(a + k), _mm256_loadu_pd(w + k), lo);
      hi = _mm256_fmadd_pd(_mm256_loadu_pd(a + k + 4), _mm256_loadu_pd(w + k + 4), hi);
    }
    return half4(_mm256_add_pd(lo, hi));
  }
  static double half4(__m256d h) {
    const __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    return _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
  }
};
#include "dpmlp/engine/host_kernels.inc"
}  // namespace host_avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
// GCC 12's AVX-512 max intrinsics start from an undefined vector it then warns about.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace host_avx512 {
template <class S>
struct Vec;
template <>
struct Vec<float> {
  using scalar = float;
  using type = __m512;
  static constexpr int width = 16, nr = 4, acc = 16;
  static type zero() { return _mm512_setzero_ps(); }
  static type load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, type v) { _mm512_storeu_ps(p, v); }
  static type set1(float s) { return _mm512_set1_ps(s); }
  static type fma(type a, type b, type c) { return _mm512_fmadd_ps(a, b, c); }
  static type activate(Activation act, type v) {
    if (act == Activation::relu) return _mm512_max_ps(v, zero());
    if (act == Activation::tanh) DPMLP_HOST_LANES(Vec, v, lanes_[i_] = std::tanh(lanes_[i_]));
    return v;
  }
  static type times_grad(Activation act, type d, type a) {
    if (act == Activation::relu) return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, zero(), _CMP_GT_OQ), d);
    if (act == Activation::tanh) return _mm512_mul_ps(d, _mm512_fnmadd_ps(a, a, _mm512_set1_ps(1.0f)));
    return d;
  }
  // The portable Vec::dot's 16 lanes in one register, then its pairs (the upper half onto the lower first).
  static float dot(const float* a, const float* w, int n) {
    type s = zero();
    for (int k = 0; k < n; k += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(w + k), s);
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return host_avx2::Vec<float>::half8(h);
  }
};
template <>
struct Vec<double> {
  using scalar = double;
  using type = __m512d;
  static constexpr int width = 8, nr = 4, acc = 16;
  static type zero() { return _mm512_setzero_pd(); }
  static type load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, type v) { _mm512_storeu_pd(p, v); }
  static type set1(double s) { return _mm512_set1_pd(s); }
  static type fma(type a, type b, type c) { return _mm512_fmadd_pd(a, b, c); }
  static type activate(Activation act, type v) {
    if (act == Activation::relu) return _mm512_max_pd(v, zero());
    if (act == Activation::tanh) DPMLP_HOST_LANES(Vec, v, lanes_[i_] = std::tanh(lanes_[i_]));
    return v;
  }
  static type times_grad(Activation act, type d, type a) {
    if (act == Activation::relu) return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(a, zero(), _CMP_GT_OQ), d);
    if (act == Activation::tanh) return _mm512_mul_pd(d, _mm512_fnmadd_pd(a, a, _mm512_set1_pd(1.0)));
    return d;
  }
  // The portable Vec::dot's 8 lanes in one register, then its pairs.
  static double dot(const double* a, const double* w, int n) {
    type s = zero();
    for (int k = 0; k < n; k += 8) s = _mm512_fmadd_pd(_mm512_loadu_pd(a + k), _mm512_loadu_pd(w + k), s);
    return host_avx2::Vec<double>::half4(_mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1)));
  }
};
#include "dpmlp/engine/host_kernels.inc"
}  // namespace host_avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#undef DPMLP_HOST_LANES
#endif  // DPMLP_HOST_X86_KERNELS

// Groups of blocks [g0, g1) of problem p with one worker's scratch, on the kernel `isa`.
template <class S, class Term>
void host_run_blocks(HostIsa isa, const HostProblem<S>& p, const Term& term, std::int64_t b0, std::int64_t b1,
                     S* scratch) {
#if DPMLP_HOST_X86_KERNELS
  if (isa == HostIsa::avx512) return host_avx512::run_blocks<S, Term>(p, term, b0, b1, scratch);
  if (isa == HostIsa::avx2) return host_avx2::run_blocks<S, Term>(p, term, b0, b1, scratch);
#endif
  (void)isa;
  host_portable::run_blocks<S, Term>(p, term, b0, b1, scratch);
}

// The host engine's buffers for one model and shard: the packed weights (refreshed each step), the layer
// table, and every worker's scratch. Host spaces only.
template <class ExecSpace, class S>
class HostEngine {
 public:
  HostEngine() = default;
  // group: blocks a row of partial sums sums (a power of two, at most 128).
  HostEngine(const std::vector<int>& widths, const std::vector<std::size_t>& woff, const std::vector<std::size_t>& boff,
             std::int64_t rows, std::int64_t block, int group = 1)
      : widths_(widths), rows_(rows), block_(block), group_(group) {
    if (group < 1 || group > 128 || (group & (group - 1)) != 0) {
      throw InputError("dpmlp: the host engine's leaf group must be a power of two up to 128");
    }
    while ((1 << group_levels_) < group) ++group_levels_;
    const int L = static_cast<int>(widths.size()) - 1;
    layers_.resize(L);
    std::int64_t packed = 0, grad = 0;
    int widest = 0;
    for (int l = 0; l < L; ++l) {
      HostLayer<S>& ly = layers_[l];
      ly.n_in = widths[l];
      ly.n_out = widths[l + 1];
      ly.pin = host_pad<S>(ly.n_in);
      ly.pout = host_pad<S>(ly.n_out);
      ly.woff = static_cast<std::int64_t>(woff[l]);
      ly.boff = static_cast<std::int64_t>(boff[l]);
      packed += std::int64_t(ly.n_in) * ly.pout + std::int64_t(ly.n_out) * ly.pin + ly.pout;
      ly.gw = grad;
      grad += ly.n_out == 1 ? ly.pin : std::int64_t(ly.n_in) * ly.pout;
      ly.gb = grad;
      grad += ly.pout;
      widest = ly.pin > widest ? ly.pin : widest;
      widest = ly.pout > widest ? ly.pout : widest;
    }
    packed_ = std::vector<S>(static_cast<std::size_t>(packed), S(0));
    act_off_.resize(L + 1);
    const std::int64_t R = host_chunk_rows;
    std::int64_t off = 0;
    for (int l = 0; l <= L; ++l) {
      act_off_[l] = off;
      off += R * (l < L ? layers_[l].pin : layers_[L - 1].pout);
    }
    delta_off_[0] = off;
    delta_off_[1] = off + R * widest;
    grad_off_ = off + 2 * R * widest;
    grad_size_ = grad;
    const std::int64_t q = host_pad<S>(1);
    rows_off_ = (grad_off_ + grad_size_ + q - 1) / q * q;
    width_ = std::int64_t(woff.empty() ? 0 : boff.back() + widths.back()) + 1;  // the parameters and the loss
    per_worker_ = rows_off_ + (group > 1 ? (group_levels_ + 1) * width_ : 0);
    per_worker_ = (per_worker_ + q - 1) / q * q;
    const std::int64_t blocks = (rows + block - 1) / block, groups = (blocks + group - 1) / group;
    const std::int64_t conc = ExecSpace().concurrency();
    workers_ = groups < conc ? groups : conc;
    if (workers_ < 1) workers_ = 1;
    scratch_ = Kokkos::View<S*, typename ExecSpace::memory_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "dpmlp::host_engine_scratch"), workers_ * per_worker_);
  }

  // Fills `partials` (blocks x ld_partials) for rows x, y of this shard: per block, the gradient of
  // scale * the loss's terms (term: the loss's Term, loss.hpp) in the parameter layout and, in the last column,
  // the plain sum of the terms.
  template <class Term>
  void compute(const ExecSpace& space, Activation act, const S* params, const S* x, std::int64_t ldx, const S* y,
               std::int64_t ldy, S scale, const RowWindow& window, S* partials, std::int64_t ld_partials,
               const Term& term) const {
    pack(params);
    HostProblem<S> p;
    p.layers = static_cast<int>(layers_.size());
    p.layer = layers_.data();
    p.act = act;
    p.x = x;
    p.y = y;
    p.ldx = ldx;
    p.ldy = ldy;
    p.rows = rows_;
    p.block = block_;
    p.scale = scale;
    p.window = window;
    p.partials = partials;
    p.ld_partials = ld_partials;
    p.act_off = act_off_.data();
    p.delta_off[0] = delta_off_[0];
    p.delta_off[1] = delta_off_[1];
    p.grad_off = grad_off_;
    p.grad_size = grad_size_;
    p.blocks = (rows_ + block_ - 1) / block_;
    p.group = group_;
    p.group_levels = group_levels_;
    p.rows_off = rows_off_;
    if (ld_partials != width_) throw std::logic_error("dpmlp::HostEngine: partial sums of another width");
    const HostIsa isa = host_isa();
    const std::int64_t blocks = (p.blocks + group_ - 1) / group_, workers = workers_, per = per_worker_;
    S* scratch = scratch_.data();
    // Worker t takes groups [t * groups / workers, (t + 1) * groups / workers) (`blocks` counts groups here):
    // threads split blocks, never a block's sums. A plain lambda: host code only.
    Kokkos::parallel_for("dpmlp::host_engine", Kokkos::RangePolicy<ExecSpace>(space, 0, workers),
                         [=](const std::int64_t t) {
                           host_run_blocks<S, Term>(isa, p, term, t * blocks / workers, (t + 1) * blocks / workers,
                                              scratch + t * per);
                         });
    compat::fence(space, "dpmlp::host_engine");  // p points into this object's vectors
  }

 private:
  // W_l (n_in x n_out) -> w (n_in x pout) and wt (n_out x pin), the bias -> pout, zero padded.
  void pack(const S* params) const {
    S* dst = packed_.data();
    for (HostLayer<S>& ly : layers_) {
      const S* w = params + ly.woff;
      for (int i = 0; i < ly.n_in; ++i) {
        for (int j = 0; j < ly.n_out; ++j) {
          dst[std::int64_t(i) * ly.pout + j] = w[std::int64_t(i) * ly.n_out + j];
          dst[std::int64_t(ly.n_in) * ly.pout + std::int64_t(j) * ly.pin + i] = w[std::int64_t(i) * ly.n_out + j];
        }
      }
      ly.w = dst;
      ly.wt = dst + std::int64_t(ly.n_in) * ly.pout;
      ly.bias = ly.wt + std::int64_t(ly.n_out) * ly.pin;
      for (int j = 0; j < ly.n_out; ++j) dst[std::int64_t(ly.n_in) * ly.pout + std::int64_t(ly.n_out) * ly.pin + j] = params[ly.boff + j];
      dst += std::int64_t(ly.n_in) * ly.pout + std::int64_t(ly.n_out) * ly.pin + ly.pout;
    }
  }

  std::vector<int> widths_;
  std::int64_t rows_ = 0, block_ = 1, workers_ = 1, per_worker_ = 0, rows_off_ = 0, width_ = 0;
  int group_ = 1, group_levels_ = 0;
  mutable std::vector<HostLayer<S>> layers_;
  mutable std::vector<S> packed_;
  std::vector<std::int64_t> act_off_;
  std::int64_t delta_off_[2] = {0, 0};
  std::int64_t grad_off_ = 0, grad_size_ = 0;
  Kokkos::View<S*, typename ExecSpace::memory_space> scratch_;
};

}  // namespace detail
}  // namespace dpmlp
