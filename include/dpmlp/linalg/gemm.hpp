// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/linalg/gemm.hpp: the one GEMM entry point of dpmlp, a strided-batched row-major GEMM, and its dispatch.
//
//   C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b]      for b in [0, batch)
//
// All matrices are row-major. op(A) is m x k: with Op::N, A[b] is stored m x k (lda >= k); with Op::T, A[b] is
// stored k x m (lda >= m). Likewise op(B) is k x n. C[b] is m x n (ldc >= n). Element (i, j) of C[b] lives at
// C + b * strideC + i * ldc + j.
//
// Backends:
//   - eigen:    host spaces; Eigen::Map over the Kokkos data, one Eigen product per batch entry.
//   - cublas:   Kokkos::Cuda; cublas<t>gemmStridedBatched on the execution space's stream (backend/cuda/cublas.hpp).
//   - cublaslt: Kokkos::Cuda; cuBLASLt with the algorithm pinned per kind of GEMM (backend/cuda/cublaslt.hpp).
//   - portable: any space; a Kokkos kernel in which each C element is summed over k in increasing order.
// Every backend is deterministic for a fixed (shape, batch) on a fixed machine. The portable and cublaslt
// backends (and eigen, one product per batch entry) give each row of C, and each batch entry, bits that do not
// depend on the number of rows or the batch count, which is what reproducible reductions need; cublas does
// not (docs/design.md).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include <Eigen/Core>

#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {
namespace linalg {

enum class Op { N, T };
enum class Backend { eigen, cublas, portable, cublaslt };

inline const char* backend_name(Backend b) {
  switch (b) {
    case Backend::eigen: return "eigen";
    case Backend::cublas: return "cublas";
    case Backend::portable: return "portable";
    case Backend::cublaslt: return "cublaslt";
  }
  return "?";
}

template <class Scalar>
struct BatchedGemm {
  Op op_a = Op::N, op_b = Op::N;
  int m = 0, n = 0, k = 0;
  Scalar alpha = Scalar(1);
  const Scalar* a = nullptr;
  int lda = 0;
  std::int64_t stride_a = 0;
  const Scalar* b = nullptr;
  int ldb = 0;
  std::int64_t stride_b = 0;
  Scalar beta = Scalar(0);
  Scalar* c = nullptr;
  int ldc = 0;
  std::int64_t stride_c = 0;
  std::int64_t batch = 1;
  // A batch of blocks whose count varies (with the rank count), even when it is 1 here: the backends whose
  // choice of kernel depends on the free dimension (cublaslt) take the batch count as free, not m.
  bool blocks = false;
};

namespace detail {

template <class Scalar>
using RowMajorStrided =
    Eigen::Map<const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
template <class Scalar>
using RowMajorStridedMut =
    Eigen::Map<Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;

template <class ExecSpace, class Scalar>
void gemm_eigen(const ExecSpace& space, const BatchedGemm<Scalar>& g) {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible,
                "the eigen GEMM backend needs an execution space whose memory the host can read");
  const auto G = g;  // captured by value: the lambda may run on other threads
  // One Eigen product per batch entry, batch entries spread over the space's threads. Eigen itself stays
  // single-threaded, so each entry's bits depend only on its own shape.
  Kokkos::parallel_for(
      "dpmlp::gemm_eigen", Kokkos::RangePolicy<ExecSpace>(space, 0, G.batch), [G](const std::int64_t bi) {
        const Scalar* A = G.a + bi * G.stride_a;
        const Scalar* B = G.b + bi * G.stride_b;
        Scalar* C = G.c + bi * G.stride_c;
        const int ar = G.op_a == Op::N ? G.m : G.k, ac = G.op_a == Op::N ? G.k : G.m;
        const int br = G.op_b == Op::N ? G.k : G.n, bc = G.op_b == Op::N ? G.n : G.k;
        RowMajorStrided<Scalar> Am(A, ar, ac, Eigen::OuterStride<>(G.lda));
        RowMajorStrided<Scalar> Bm(B, br, bc, Eigen::OuterStride<>(G.ldb));
        RowMajorStridedMut<Scalar> Cm(C, G.m, G.n, Eigen::OuterStride<>(G.ldc));
        if (G.beta == Scalar(0)) {
          if (G.op_a == Op::N && G.op_b == Op::N) Cm.noalias() = G.alpha * (Am * Bm);
          else if (G.op_a == Op::T && G.op_b == Op::N) Cm.noalias() = G.alpha * (Am.transpose() * Bm);
          else if (G.op_a == Op::N && G.op_b == Op::T) Cm.noalias() = G.alpha * (Am * Bm.transpose());
          else Cm.noalias() = G.alpha * (Am.transpose() * Bm.transpose());
        } else {
          if (G.beta != Scalar(1)) Cm *= G.beta;
          if (G.op_a == Op::N && G.op_b == Op::N) Cm.noalias() += G.alpha * (Am * Bm);
          else if (G.op_a == Op::T && G.op_b == Op::N) Cm.noalias() += G.alpha * (Am.transpose() * Bm);
          else if (G.op_a == Op::N && G.op_b == Op::T) Cm.noalias() += G.alpha * (Am * Bm.transpose());
          else Cm.noalias() += G.alpha * (Am.transpose() * Bm.transpose());
        }
      });
}

// The portable kernel: one thread per C element, k summed in increasing order with plain multiply-adds.
// Simple on purpose: it is the reference every other backend is tested against, the HIP path, and the
// reproducible path on GPUs.
template <class ExecSpace, class Scalar>
void gemm_portable(const ExecSpace& space, const BatchedGemm<Scalar>& g) {
  const auto G = g;
  const std::int64_t per = std::int64_t(G.m) * G.n;
  Kokkos::parallel_for(
      "dpmlp::gemm_portable", Kokkos::RangePolicy<ExecSpace>(space, 0, per * G.batch),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t bi = idx / per;
        const int i = static_cast<int>((idx % per) / G.n), j = static_cast<int>(idx % G.n);
        // Element i of op(A)'s row and element j of op(B)'s column, as a base and a step along k.
        const Scalar* A = G.a + bi * G.stride_a + (G.op_a == Op::N ? std::int64_t(i) * G.lda : i);
        const Scalar* B = G.b + bi * G.stride_b + (G.op_b == Op::N ? j : std::int64_t(j) * G.ldb);
        const std::int64_t sa = G.op_a == Op::N ? 1 : G.lda, sb = G.op_b == Op::N ? G.ldb : 1;
        // Eight loads of each operand in flight before their use (a GPU thread does not reorder loads); the
        // sum is still acc + a0 b0 + a1 b1 + ... in increasing k, so the bits are those of the plain loop.
        Scalar acc = Scalar(0);
        int p = 0;
        for (; p + 8 <= G.k; p += 8) {
          Scalar a[8], b[8];
          for (int u = 0; u < 8; ++u) a[u] = A[(p + u) * sa];
          for (int u = 0; u < 8; ++u) b[u] = B[(p + u) * sb];
          for (int u = 0; u < 8; ++u) acc += a[u] * b[u];
        }
        for (; p < G.k; ++p) acc += A[p * sa] * B[p * sb];
        Scalar* C = G.c + bi * G.stride_c + std::int64_t(i) * G.ldc + j;
        *C = G.beta == Scalar(0) ? G.alpha * acc : G.alpha * acc + G.beta * *C;
      });
}

}  // namespace detail
}  // namespace linalg
}  // namespace dpmlp

#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
#include "dpmlp/backend/cuda/cublas.hpp"
#include "dpmlp/backend/cuda/cublaslt.hpp"
#endif

namespace dpmlp {
namespace linalg {

// The backend a space uses by default: eigen on host spaces; on CUDA with cuBLAS the pinned cuBLASLt backend
// (whose rows' bits do not depend on the row or batch count, so it serves the reproducible reduction too);
// else the portable kernel.
template <class ExecSpace>
Backend default_backend(bool reproducible) {
  (void)reproducible;
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible) {
    return Backend::eigen;
  }
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
  if (std::is_same<ExecSpace, Kokkos::Cuda>::value) return Backend::cublaslt;
#endif
  return Backend::portable;
}

template <class ExecSpace, class Scalar>
void gemm(const ExecSpace& space, Backend backend, const BatchedGemm<Scalar>& g) {
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return;
  switch (backend) {
    case Backend::eigen:
      if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible) {
        detail::gemm_eigen(space, g);
        return;
      }
      break;
    case Backend::cublas:
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
      if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
        cublas::gemm(space, g);
        return;
      }
#endif
      break;
    case Backend::portable:
      detail::gemm_portable(space, g);
      return;
    case Backend::cublaslt:
      if (g.k == 0) {  // beta * C: nothing to pin
        detail::gemm_portable(space, g);
        return;
      }
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
      if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
        cublaslt::gemm(space, g);
        return;
      }
#endif
      break;
  }
  throw std::invalid_argument(std::string("dpmlp::linalg::gemm: backend '") + backend_name(backend) +
                              "' is not available for execution space " + ExecSpace::name());
}

// The GEMM, and where the backend can do it in the same pass (cublaslt), the bias (one value per column of C)
// added and, with `relu`, relu applied. Returns whether it did; if not, the caller adds them.
template <class ExecSpace, class Scalar>
bool gemm_with_bias(const ExecSpace& space, Backend backend, const BatchedGemm<Scalar>& g, const Scalar* bias,
                    bool relu) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(DPMLP_HAVE_CUBLAS)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    // The bias pointer's alignment is the model's layout's, the same on every rank.
    if (backend == Backend::cublaslt && g.batch == 1 && !g.blocks && g.k > 0 && g.m > 0 && g.n > 0 &&
        reinterpret_cast<std::uintptr_t>(bias) % 16 == 0) {
      cublaslt::gemm(space, g, relu ? cublaslt::Epilogue::relu_bias : cublaslt::Epilogue::bias, bias);
      return true;
    }
  }
#endif
  (void)bias, (void)relu;
  gemm(space, backend, g);
  return false;
}

}  // namespace linalg
}  // namespace dpmlp
