// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/cublaslt.hpp: the pinned cuBLASLt backend of dpmlp::linalg::gemm (Kokkos::Cuda only).
//
// Why pinned: cuBLAS picks its kernel from the whole problem, the batch count and the free dimension
// included, so another rank count (another share of the rows) may get another kernel, split-K included, and
// other bits. Here each GEMM's algorithm is chosen once per "kind" (the ops, the fixed dimensions, the
// leading dimensions, the epilogue, the alignment), by cuBLASLt's heuristic at a canonical size of the free
// dimension (the rows of the layer, or the batch count of the per-block weight gradients), restricted to
// algorithms without split-K and without workspace, and then used for every size. Such a kernel computes each
// output element with the same loop over k whatever the free dimension, so a row's bits (a block's, for the
// weight gradients) do not depend on how many rows or blocks a rank has. It is plain FP32 (CUBLAS_COMPUTE_32F,
// no TF32), so the results are as accurate as the portable kernel's.
//
// Alignment: an operand is taken as 16-byte aligned (the faster kernels' vector loads) where its leading
// dimension and batch stride are multiples of 16 bytes and its pointer is 16-byte aligned, else as aligned to
// its element; the alignment is part of the kind. The pointers that make the choice are the same on every rank
// (the model's parameters, dpmlp's own buffers; the trainer refuses an unaligned x), except those of the
// per-block weight gradients, which are written into rows of the partial sums at a rank's own offsets: their
// C is always taken as element-aligned.
//
// Include dpmlp/linalg/gemm.hpp rather than this header.
#pragma once

#include "dpmlp/kokkos_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

// gemm.hpp includes this header in its middle and calls cublaslt::gemm; declared first, so that this header
// may also be included on its own (see cublas.hpp).
namespace dpmlp {
namespace linalg {
template <class Scalar>
struct BatchedGemm;
namespace cublaslt {
// What the GEMM's epilogue adds to alpha * op(A) op(B): nothing, a bias per output column (row-major C), or
// the bias and then relu.
enum class Epilogue { none, bias, relu_bias };
template <class Scalar>
void gemm(const Kokkos::Cuda& space, const BatchedGemm<Scalar>& g, Epilogue epilogue = Epilogue::none,
          const Scalar* bias = nullptr);
}  // namespace cublaslt
}  // namespace linalg
}  // namespace dpmlp

#include "dpmlp/backend/cuda/cublas.hpp"
#include "dpmlp/errors.hpp"

namespace dpmlp {
namespace linalg {
namespace cublaslt {

namespace detail {

using cublas::detail::check;
using cublas::detail::check_cuda;

// A layout, a descriptor and a preference, destroyed with their owner.
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType t, std::uint64_t rows, std::uint64_t cols, std::int64_t ld, std::int64_t batch,
         std::int64_t stride) {
    check(cublasLtMatrixLayoutCreate(&h, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
      const int b = static_cast<int>(batch);
      check(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b), "layout batch");
      check(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
            "layout stride");
    }
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  ~Layout() {
    if (h) (void)cublasLtMatrixLayoutDestroy(h);
  }
};

struct Desc {
  cublasLtMatmulDesc_t h = nullptr;
  Desc(cublasComputeType_t compute, cudaDataType scale, cublasOperation_t ta, cublasOperation_t tb, Epilogue e,
       const void* bias) {
    check(cublasLtMatmulDescCreate(&h, compute, scale), "cublasLtMatmulDescCreate");
    check(cublasLtMatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "desc transa");
    check(cublasLtMatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "desc transb");
    if (e != Epilogue::none) {
      const cublasLtEpilogue_t epi = e == Epilogue::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_RELU_BIAS;
      check(cublasLtMatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "desc epilogue");
      check(cublasLtMatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "desc bias");
    }
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (h) (void)cublasLtMatmulDescDestroy(h);
  }
};

// The column-major problem cuBLASLt sees (see cublas.hpp: row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T), with its free dimension: n for a single GEMM, the batch count for a batched one.
struct Problem {
  cublasOperation_t ta, tb;  // of the column-major operands (dpmlp's B, then A)
  std::int64_t m, n, k;      // column-major: C^T is m x n
  std::int64_t lda, ldb, ldc;
  std::int64_t stride_a, stride_b, stride_c;
  std::int64_t batch;  // -1: a single entry of a batch of blocks (the batch count is the free dimension)
  Epilogue epilogue;
  int a_align, b_align, c_align;  // bytes
  // What fixes the algorithm: everything but the free dimension (n for one GEMM, batch for a batch).
  auto kind() const {
    const bool blocks = batch > 1 || batch == -1;
    return std::make_tuple(int(ta), int(tb), m, blocks ? n : std::int64_t(-1), k, lda, ldb, ldc,
                           blocks ? stride_a : 0, blocks ? stride_b : 0, blocks ? stride_c : 0, blocks, int(epilogue),
                           a_align, b_align, c_align);
  }
};

template <class Scalar>
constexpr cudaDataType data_type = std::is_same_v<Scalar, float> ? CUDA_R_32F : CUDA_R_64F;
template <class Scalar>
constexpr cublasComputeType_t compute_type = std::is_same_v<Scalar, float> ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_64F;

// The three layouts of a column-major problem (A and B as stored, before their ops), for `batch` entries.
template <class Scalar>
struct Operands {
  Layout a, b, c;
  Operands(const Problem& p, std::int64_t batch)
      : a(data_type<Scalar>, p.ta == CUBLAS_OP_N ? p.m : p.k, p.ta == CUBLAS_OP_N ? p.k : p.m, p.lda, batch,
          p.stride_a),
        b(data_type<Scalar>, p.tb == CUBLAS_OP_N ? p.k : p.n, p.tb == CUBLAS_OP_N ? p.n : p.k, p.ldb, batch,
          p.stride_b),
        c(data_type<Scalar>, p.m, p.n, p.ldc, batch, p.stride_c) {}
};

class Cache {
 public:
  static Cache& instance() {
    static Cache* cache = new Cache();  // leaked: no destructor may touch CUDA at exit (cublas.hpp)
    return *cache;
  }
  std::mutex& mutex() { return mutex_; }

  cublasLtHandle_t handle(int device) {
    if (static_cast<std::size_t>(device) >= handles_.size()) handles_.resize(device + 1, nullptr);
    if (handles_[device] == nullptr) {
      check(cublasLtCreate(&handles_[device]), "cublasLtCreate");
      if (!hook_) {
        Kokkos::push_finalize_hook([] { Cache::instance().destroy_all(); });
        hook_ = true;
      }
    }
    return handles_[device];
  }

  template <class Scalar>
  const cublasLtMatmulAlgo_t& algo(int device, const Problem& p) {
    const auto key = std::make_tuple(device, int(sizeof(Scalar)), p.kind());
    const auto it = algos_.find(key);
    if (it != algos_.end()) return it->second;
    // The heuristic at a canonical free dimension, so every rank count pins the same algorithm.
    Problem canon = p;
    if (p.batch > 1 || p.batch == -1) {
      canon.batch = 256;
    } else {
      canon.n = 65536;
    }
    return algos_.emplace(key, choose<Scalar>(handle(device), canon)).first->second;
  }

  void destroy_all() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t d = 0; d < handles_.size(); ++d) {
      if (handles_[d] != nullptr && cudaSetDevice(static_cast<int>(d)) == cudaSuccess) (void)cublasLtDestroy(handles_[d]);
      handles_[d] = nullptr;
    }
    algos_.clear();
    (void)cudaGetLastError();
    hook_ = false;
  }

 private:
  template <class Scalar>
  static cublasLtMatmulAlgo_t choose(cublasLtHandle_t h, const Problem& p) {
    // A dummy, 16-byte aligned bias pointer: the heuristic reads the epilogue, not the data.
    const void* bias = reinterpret_cast<const void*>(std::uintptr_t(256));
    Desc desc(compute_type<Scalar>, data_type<Scalar>, p.ta, p.tb, p.epilogue, bias);
    const Operands<Scalar> ops(p, p.batch);
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t workspace = 0;
    const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    const std::uint32_t a_align = p.a_align, b_align = p.b_align, c_align = p.c_align;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                            sizeof workspace);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_align, sizeof a_align);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b_align, sizeof b_align);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c_align, sizeof c_align);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c_align, sizeof c_align);
    cublasLtMatmulHeuristicResult_t results[8] = {};
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulAlgoGetHeuristic(h, desc.h, ops.a.h, ops.b.h, ops.c.h, ops.c.h, pref, 8, results, &found);
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    check(s, "cublasLtMatmulAlgoGetHeuristic");
    for (int i = 0; i < found; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize != 0) continue;
      int splits = 1;
      std::size_t written = 0;
      (void)cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                 sizeof splits, &written);
      if (splits <= 1) return results[i].algo;
    }
    throw CommError("dpmlp: cuBLASLt offers no algorithm without split-K and workspace for a " +
                    std::to_string(p.m) + " x " + std::to_string(p.n) + " x " + std::to_string(p.k) + " GEMM");
  }

  Cache() = default;
  std::mutex mutex_;
  std::vector<cublasLtHandle_t> handles_;
  std::map<std::tuple<int, int, decltype(std::declval<Problem>().kind())>, cublasLtMatmulAlgo_t> algos_;
  bool hook_ = false;
};

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace detail

// C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] (row-major, gemm.hpp), then the epilogue (bias: n values,
// one per column of C), enqueued on space's stream, with the algorithm pinned for the GEMM's kind.
template <class Scalar>
void gemm(const Kokkos::Cuda& space, const BatchedGemm<Scalar>& g, Epilogue epilogue, const Scalar* bias) {
  static_assert(std::is_same<Scalar, float>::value || std::is_same<Scalar, double>::value,
                "dpmlp::linalg::cublaslt::gemm supports float and double");
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return;
  if (g.k == 0) throw InputError("dpmlp::linalg::cublaslt::gemm: k must be positive");
  detail::Problem p;
  p.ta = g.op_b == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T;
  p.tb = g.op_a == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T;
  p.m = g.n;
  p.n = g.m;
  p.k = g.k;
  p.lda = g.ldb;
  p.ldb = g.lda;
  p.ldc = g.ldc;
  p.stride_a = g.stride_b;
  p.stride_b = g.stride_a;
  p.stride_c = g.stride_c;
  p.batch = g.blocks && g.batch == 1 ? -1 : g.batch;  // -1: one block of a batch whose count varies
  p.epilogue = epilogue;
  const bool strided = g.batch > 1 || g.blocks;
  auto align = [&](std::int64_t ld, std::int64_t stride, const void* ptr) {
    constexpr std::int64_t v = 16 / sizeof(Scalar);
    return ld % v == 0 && (!strided || stride % v == 0) && detail::aligned16(ptr) ? 16 : int(sizeof(Scalar));
  };
  p.a_align = align(p.lda, p.stride_a, g.b);
  p.b_align = align(p.ldb, p.stride_b, g.a);
  p.c_align = g.blocks ? int(sizeof(Scalar)) : align(p.ldc, p.stride_c, g.c);
  if (epilogue != Epilogue::none && !detail::aligned16(bias)) {
    throw InputError("dpmlp::linalg::cublaslt::gemm: the bias must be 16-byte aligned");
  }

  cublas::detail::DeviceGuard device(space.cuda_device());
  auto& cache = detail::Cache::instance();
  std::lock_guard<std::mutex> lock(cache.mutex());
  cublasLtHandle_t h = cache.handle(space.cuda_device());
  const cublasLtMatmulAlgo_t& algo = cache.algo<Scalar>(space.cuda_device(), p);
  detail::Desc desc(detail::compute_type<Scalar>, detail::data_type<Scalar>, p.ta, p.tb, epilogue, bias);
  const detail::Operands<Scalar> ops(p, g.batch);
  detail::check(cublasLtMatmul(h, desc.h, &g.alpha, g.b, ops.a.h, g.a, ops.b.h, &g.beta, g.c, ops.c.h, g.c, ops.c.h,
                               &algo, nullptr, 0, space.cuda_stream()),
                "cublasLtMatmul (pinned algorithm)");
}

}  // namespace cublaslt
}  // namespace linalg
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA && DPMLP_HAVE_CUBLAS
