// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/kernel_gemm.hpp: what a call passes to dpmlp's own GEMM kernels behind the cutlass backend
// (the wgmma 3xTF32 ones, wgmma_3xtf32.hpp, and the block-scaled 3xFP16 ones, gemm_f16x3_kernels.hpp): plain
// C++, no CUDA, so the emulated tests compile it too.
#pragma once

#include <cstdint>

#include "dpmlp/activation.hpp"

namespace dpmlp {
namespace linalg {
namespace kernel_gemm {

// What C gets (cutlass_3xtf32's detail::Epi): alpha acc (+ beta C); activate(act, acc + bias[column]);
// acc * activate_grad_from_output(act, Y[row][column]). The fused forms are one GEMM, alpha 1, no old C.
enum class Out { linear, bias_activation, activation_grad };

struct Params {
  int m = 0, n = 0, k = 0;
  const float* a = nullptr;
  std::int64_t lda = 0, stride_a = 0;
  const float* b = nullptr;
  std::int64_t ldb = 0, stride_b = 0;
  float* c = nullptr;
  std::int64_t ldc = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* src = nullptr;  // the bias (bias_activation) or Y (activation_grad)
  std::int64_t src_ld = 0;
  Activation act = Activation::identity;
  bool pairs = false;  // C's rows take 8-byte stores (ldc and the batch stride even, c 8-byte aligned)
  // 3xFP16 kernels: op(B) already split (gemm_f16x3::split_b), shared by every batch entry; null: split in
  // the kernel.
  const unsigned char* b_split = nullptr;
  // 3xFP16 kernels, T N: where set, also each batch entry's column sums of op(B) over k, at colsum + entry *
  // stride_c (gemm_f16x3_kernels.hpp's ColumnSums gives their order); null: none.
  float* colsum = nullptr;
};

}  // namespace kernel_gemm
}  // namespace linalg
}  // namespace dpmlp
