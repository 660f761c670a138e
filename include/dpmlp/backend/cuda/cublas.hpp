// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/cublas.hpp: the cuBLAS backend of dpmlp::linalg::gemm (Kokkos::Cuda only).
//
// dpmlp's matrices are row-major and cuBLAS is column-major. A row-major m x n matrix with leading dimension
// ld is, read column-major, its n x m transpose with the same ld. So the row-major product
//   C = alpha * op(A) * op(B) + beta * C
// is computed as the column-major product
//   C^T = alpha * op(B)^T * op(A)^T + beta * C^T
// i.e. cublas<t>gemm(handle, opB, opA, n, m, k, alpha, B, ldb, A, lda, beta, C, ldc): no copy, no transpose
// kernel, and the cuBLAS op of each operand is the dpmlp op unchanged.
//
// Include dpmlp/linalg/gemm.hpp rather than this header; this one is empty unless KOKKOS_ENABLE_CUDA and
// DPMLP_HAVE_CUBLAS are both defined (CMake defines the latter when it links CUDA::cublas).
#pragma once

#include "dpmlp/kokkos_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/errors.hpp"

// gemm.hpp includes this header in its middle, after BatchedGemm and before the dispatch that calls
// cublas::gemm. Declaring both here first lets this header also be included on its own, in any order.
namespace dpmlp {
namespace linalg {
template <class Scalar>
struct BatchedGemm;
namespace cublas {
template <class Scalar>
void gemm(const Kokkos::Cuda& space, const BatchedGemm<Scalar>& g);
}  // namespace cublas
}  // namespace linalg
}  // namespace dpmlp

#include "dpmlp/linalg/gemm.hpp"

namespace dpmlp {
namespace linalg {
namespace cublas {
namespace detail {

// cublasGetStatusName only exists from CUDA 11.4 on; this switch works with every toolkit.
inline const char* status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_<unknown>";
  }
}

// cuBLAS failures are backend failures: CommError is dpmlp's error for "MPI, NCCL, CUDA" going wrong.
inline void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw CommError(std::string("dpmlp: ") + what + " failed: " + status_name(status) + " (" +
                    std::to_string(static_cast<int>(status)) + ")");
  }
}

inline void check_cuda(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    throw CommError(std::string("dpmlp: ") + what + " failed: " + cudaGetErrorName(code) + ": " +
                    cudaGetErrorString(code));
  }
}

// Makes `device` current for its lifetime, restoring the previous device after. Does nothing (no CUDA call
// beyond cudaGetDevice) in the usual case where Kokkos' device is already current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      check_cuda(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// One cuBLAS handle per CUDA device, created on first use and kept until Kokkos::finalize.
//
// Why a cache: cublasCreate allocates device workspace and loads kernels (milliseconds, and it may
// synchronize the device), far too slow for every GEMM of a training step. A handle belongs to the device
// that was current when it was created, so the cache is keyed by device.
//
// Why a finalize hook: a handle must be destroyed while its CUDA context is still alive. At static
// destruction the CUDA runtime may already be torn down, so the handles are destroyed from a
// Kokkos::push_finalize_hook (Kokkos 3.4 and 4.x run the hooks before finalizing any execution space), and
// the cache itself is leaked on purpose so that no destructor touches CUDA at exit.
//
// Thread safety: one mutex guards the cache and is held across cublasSetStream + the GEMM call, because the
// stream is a property of the shared handle. That is enough for dpmlp's model (one host thread per rank, each
// rank on its own device); it does not make concurrent GEMMs from many threads fast.
class HandleCache {
 public:
  static HandleCache& instance() {
    static HandleCache* cache = new HandleCache();  // leaked: see above
    return *cache;
  }

  std::mutex& mutex() { return mutex_; }

  // The handle of `device`. The caller holds mutex() and has made `device` current.
  cublasHandle_t get(int device) {
    if (device < 0) throw CommError("dpmlp: cuBLAS: invalid CUDA device " + std::to_string(device));
    if (static_cast<std::size_t>(device) >= handles_.size()) handles_.resize(device + 1, nullptr);
    if (handles_[device] != nullptr) return handles_[device];

    cublasHandle_t handle = nullptr;
    check(cublasCreate(&handle), "cublasCreate");
    // alpha and beta are host scalars (BatchedGemm holds them by value): POINTER_MODE_HOST. This is cuBLAS'
    // default too, but stating it keeps a handle shared with other code from surprising us.
    cublasStatus_t status = cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST);
    // CUBLAS_DEFAULT_MATH: FP32 GEMMs stay FP32. TF32 tensor cores (CUBLAS_TF32_TENSOR_OP_MATH) would round
    // the inputs to a 10-bit mantissa, and dpmlp's results are checked against an FP32 JAX reference to a
    // few ulps; that is not worth the speed-up for MLP-sized matrices.
    if (status == CUBLAS_STATUS_SUCCESS) status = cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
    if (status != CUBLAS_STATUS_SUCCESS) {
      (void)cublasDestroy(handle);
      check(status, "cublasSetPointerMode/cublasSetMathMode");
    }
    if (!hook_registered_) {
      Kokkos::push_finalize_hook([] { HandleCache::instance().destroy_all(); });
      hook_registered_ = true;
    }
    handles_[device] = handle;
    return handle;
  }

  // Destroys every handle (from the Kokkos finalize hook). Never throws: errors at teardown are ignored.
  void destroy_all() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    int previous = -1;
    const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
    for (std::size_t d = 0; d < handles_.size(); ++d) {
      if (handles_[d] == nullptr) continue;
      if (cudaSetDevice(static_cast<int>(d)) == cudaSuccess) (void)cublasDestroy(handles_[d]);
      handles_[d] = nullptr;
    }
    if (have_previous) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
    hook_registered_ = false;  // a later Kokkos::initialize (3.4 allows one) registers it again
  }

 private:
  HandleCache() = default;
  std::mutex mutex_;
  std::vector<cublasHandle_t> handles_;
  bool hook_registered_ = false;
};

inline cublasOperation_t to_cublas(Op op) { return op == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

inline int to_int(std::int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    throw InputError(std::string("dpmlp::linalg::cublas::gemm: ") + what + " out of range");
  }
  return static_cast<int>(v);
}

}  // namespace detail

// C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] (row-major, see gemm.hpp), enqueued on space's stream.
//
// Stream ordering: the handle is bound to space.cuda_stream() before the call, so the GEMM runs after the
// kernels already enqueued on that Kokkos instance and before later ones, with no host synchronization and
// nothing on the legacy default stream (which would serialize against every other stream of the device).
template <class Scalar>
void gemm(const Kokkos::Cuda& space, const BatchedGemm<Scalar>& g) {
  static_assert(std::is_same<Scalar, float>::value || std::is_same<Scalar, double>::value,
                "dpmlp::linalg::cublas::gemm supports float and double");
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return;
  const int batch = detail::to_int(g.batch, "batch");
  // With k == 0 the result is beta * C, but cuBLAS still wants every leading dimension >= 1, even those of
  // the empty A and B (whose dpmlp leading dimension may legitimately be 0).
  const int lda = g.k == 0 && g.lda < 1 ? 1 : g.lda;
  const int ldb = g.k == 0 && g.ldb < 1 ? 1 : g.ldb;
  const cublasOperation_t op_a = detail::to_cublas(g.op_a), op_b = detail::to_cublas(g.op_b);

  detail::DeviceGuard device(space.cuda_device());
  auto& cache = detail::HandleCache::instance();
  std::lock_guard<std::mutex> lock(cache.mutex());
  cublasHandle_t handle = cache.get(space.cuda_device());
  cudaStream_t bound = nullptr;
  detail::check(cublasGetStream(handle, &bound), "cublasGetStream");
  // cublasSetStream also resets the handle's workspace to the default pool, so skip it when already bound.
  if (bound != space.cuda_stream()) {
    detail::check(cublasSetStream(handle, space.cuda_stream()), "cublasSetStream");
  }

  // Column-major C^T = op(B)^T * op(A)^T: B first, A second, dimensions n, m, k.
  if constexpr (std::is_same<Scalar, float>::value) {
    if (batch == 1) {
      detail::check(
          cublasSgemm(handle, op_b, op_a, g.n, g.m, g.k, &g.alpha, g.b, ldb, g.a, lda, &g.beta, g.c, g.ldc),
          "cublasSgemm");
    } else {
      detail::check(
          cublasSgemmStridedBatched(handle, op_b, op_a, g.n, g.m, g.k, &g.alpha, g.b, ldb, g.stride_b, g.a,
                                    lda, g.stride_a, &g.beta, g.c, g.ldc, g.stride_c, batch),
          "cublasSgemmStridedBatched");
    }
  } else {
    if (batch == 1) {
      detail::check(
          cublasDgemm(handle, op_b, op_a, g.n, g.m, g.k, &g.alpha, g.b, ldb, g.a, lda, &g.beta, g.c, g.ldc),
          "cublasDgemm");
    } else {
      detail::check(
          cublasDgemmStridedBatched(handle, op_b, op_a, g.n, g.m, g.k, &g.alpha, g.b, ldb, g.stride_b, g.a,
                                    lda, g.stride_a, &g.beta, g.c, g.ldc, g.stride_c, batch),
          "cublasDgemmStridedBatched");
    }
  }
}

}  // namespace cublas
}  // namespace linalg
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA && DPMLP_HAVE_CUBLAS
