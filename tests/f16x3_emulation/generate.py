# SPDX-License-Identifier: BSD-3-Clause
"""Writes emulated_f16x3.hpp for test_f16x3_emulated: the block-scaled 3xFP16 GEMM kernels' own source text,
taken from the library's headers (gemm_f16x3_kernels.hpp, and the f16x3 helpers of mma_ops.hpp), with only
what a host cannot compile put in the terms of f16x3_model.hpp: the inline-PTX primitives (cp.async, ldmatrix,
mma.sync; the wgmma form's fences, commit, wait and MMAs), the dynamic shared memory and the triple-chevron
launches. The wgmma form's primitives are compared with the text the model stands for (whitespace and
comments aside): its MMAs' shapes, operand order and immediates are the model's assumptions. A piece of text
this script cannot find is an error, so the test cannot drift from the kernels unnoticed.

usage: generate.py <include dir> <output file>
"""
import os
import re
import sys

# The generators' shared extraction helpers live beside the wgmma generator.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "wgmma_emulation"))
from extract import between, replace  # noqa: E402


def wgmma_f16(n):
    """The header's wgmma_f16<Trans> for m64n<n>k16 (n / 2 accumulator registers a thread), as the model reads
    it: scale-d from the predicate scale_d != 0, scale-a and scale-b 1, both operands K-major (Trans 0) or both
    transposed, MN-major (Trans 1)."""
    r = n // 2
    regs = ", ".join(f"%{i}" for i in range(r))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(r))
    return (f"template <int Trans>\n"
            f"__device__ __forceinline__ void wgmma_f16(float (&d)[{r}], std::uint64_t da, std::uint64_t db, "
            f"int scale_d) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\n" "setp.ne.b32 p, %{r + 2}, 0;\\n" '
            f'"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{" "{regs}" '
            f'"}}, %{r}, %{r + 1}, p, 1, 1, %{r + 3}, %{r + 3};\\n}}\\n" : {outs} : "l"(da), "l"(db), '
            f'"r"(scale_d), "n"(Trans));\n}}\n')


# The wgmma form's primitives as f16x3_model.hpp models them.
WGMMA_PRIMITIVES = (
    '__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\\n" ::: '
    '"memory"); }\n'
    '__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory"); }\n'
    '__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: '
    '"memory"); }\n'
    "template <int Pending>\n"
    "__device__ __forceinline__ void wgmma_wait() {\n"
    '  asm volatile("wgmma.wait_group.sync.aligned %0;\\n" ::"n"(Pending) : "memory");\n}\n'
    "template <int R>\n"
    "__device__ __forceinline__ void fence_registers(float (&d)[R]) {\n"
    "#pragma unroll\n"
    '  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");\n}\n'
    + wgmma_f16(64) + wgmma_f16(128) +
    # The warp-specialized form's.
    "__device__ __forceinline__ void mbarrier_expect_tx(std::uint64_t* bar, unsigned bytes) {\n"
    '  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(backend::shared_address(bar)), '
    '"r"(bytes) : "memory");\n}\n'
    "__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, std::uint64_t* bar) {\n"
    '  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" '
    '::"r"(dst), "l"(src), "r"(bytes), "r"(backend::shared_address(bar)) : "memory");\n}\n'
    '__device__ __forceinline__ void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" '
    '::: "memory"); }\n'
    '__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }\n'
    "template <int Regs>\n"
    "__device__ __forceinline__ void setmaxnreg_inc() {\n"
    '  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\\n" ::"n"(Regs));\n}\n'
    "template <int Regs>\n"
    "__device__ __forceinline__ void setmaxnreg_dec() {\n"
    '  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\\n" ::"n"(Regs));\n}\n')

# Their stand-ins.
WGMMA_MODEL = """inline void fence_proxy_async() { emulation::fence_proxy_async(); }
inline void wgmma_fence() { emulation::wgmma16::fence(); }
inline void wgmma_commit() { emulation::wgmma16::commit(); }
template <int Pending>
inline void wgmma_wait() {
  emulation::wgmma16::wait<Pending>();
}
template <int R>
inline void fence_registers(float (&)[R]) {}
template <int Trans>
inline void wgmma_f16(float (&d)[32], std::uint64_t da, std::uint64_t db, int scale_d) {
  emulation::wgmma16::mma(d, da, db, scale_d, Trans != 0);
}
template <int Trans>
inline void wgmma_f16(float (&d)[64], std::uint64_t da, std::uint64_t db, int scale_d) {
  emulation::wgmma16::mma(d, da, db, scale_d, Trans != 0);
}
inline void mbarrier_expect_tx(std::uint64_t* bar, unsigned bytes) {
  emulation::mbar::expect_tx(emulation::shared_address(bar), bytes);
}
inline void bulk_copy(unsigned dst, const void* src, unsigned bytes, std::uint64_t* bar) {
  emulation::mbar::bulk_copy(dst, src, bytes, emulation::shared_address(bar));
}
inline void fence_mbarrier_init() {}
inline void prefetch_l2(const void*) {}
template <int Regs>
inline void setmaxnreg_inc() {}
template <int Regs>
inline void setmaxnreg_dec() {}
"""


def normalized(code):
    """Code without comments, whitespace, or the seams of adjacent string literals."""
    code = re.sub(r"//[^\n]*", "", code)
    return re.sub(r"\s+", "", code).replace('""', "")


def main():
    inc, out = sys.argv[1] + "/dpmlp/backend/cuda/", sys.argv[2]
    kernels, ops = open(inc + "gemm_f16x3_kernels.hpp").read(), open(inc + "mma_ops.hpp").read()

    abs_max = between(ops, "__device__ inline float abs_max(", "\n", "mma_ops.hpp: abs_max", True)
    scale_for = between(ops, "__device__ inline void scale_for(", "\n}\n", "mma_ops.hpp: scale_for", True)
    split2_each = between(ops, "__device__ inline void split2_each(", "\n}\n", "mma_ops.hpp: split2_each", True)
    split2 = between(ops, "__device__ inline void split2(", "\n}\n", "mma_ops.hpp: split2", True)
    mma3 = between(ops, "template <int N, bool Init = false>\n__device__ inline void mma3(", "\n}\n",
                   "mma_ops.hpp: mma3", True)

    body = between(kernels, "using Out = kernel_gemm::Out;", "}  // namespace gemm_f16x3", "gemm_f16x3_kernels.hpp")
    body = replace(body, 'asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), '
                         '"r"(bytes) : "memory");', "emulation::cp_async16(dst, src, bytes);", "cp_async16")
    body = replace(body, 'asm volatile("cp.async.commit_group;" ::: "memory");', "emulation::copy_commit();",
                   "copy_commit")
    body = replace(body, 'asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");',
                   "emulation::copy_wait<Pending>();", "copy_wait")
    body = replace(body, "extern __shared__ __align__(16) unsigned char smem_raw[];",
                   "unsigned char* const smem_raw = reinterpret_cast<unsigned char*>(emulation::smem);", "smem")
    # The split's stores are the kernels' only generic-proxy writes to shared memory besides the copies (which
    # the model records itself): recorded, for the model's fence.proxy.async rule (the wgmma form's).
    body, n_store = re.subn(r"(__device__ __forceinline__ void store_region\(.*?\) \{)",
                            r"\1\n  emulation::note_generic_store();", body, flags=re.DOTALL)
    if n_store != 1:
        sys.exit("generate.py: store_region's definition not found: update generate.py")

    # The wgmma form: the macro that compiles it (defined for sm_90a) defined; its primitives checked against the
    # text the model stands for, then replaced by calls into the model; gemm_wgmma() (compiled only where
    # DPMLP_WGMMA_KERNELS_HERE is defined: src/cuda_f16x3_wgmma.cu) defined here, this test being its one
    # translation unit.
    body = replace(body, "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n#define DPMLP_F16X3_WGMMA 1\n#endif\n",
                   "#define DPMLP_F16X3_WGMMA 1  // the host model's wgmma\n", "DPMLP_F16X3_WGMMA")
    region = between(body, "#if defined(DPMLP_F16X3_WGMMA)\n", "#endif  // DPMLP_F16X3_WGMMA\n",
                     "the wgmma primitives", True)
    inner = region[len("#if defined(DPMLP_F16X3_WGMMA)\n"):-len("#endif  // DPMLP_F16X3_WGMMA\n")]
    if normalized(inner) != normalized(WGMMA_PRIMITIVES):
        sys.exit("generate.py: the wgmma primitives (#if defined(DPMLP_F16X3_WGMMA)) are not those f16x3_model.hpp "
                 "models: update the model, then WGMMA_PRIMITIVES and WGMMA_MODEL in generate.py")
    body = body.replace(region, WGMMA_MODEL)
    if "wgmma_kernel(const Params p) {\n#if defined(DPMLP_F16X3_WGMMA)\n" not in body:
        sys.exit("generate.py: wgmma_kernel's guard (#if defined(DPMLP_F16X3_WGMMA)) not found: update generate.py")
    body = replace(body, "#if defined(DPMLP_WGMMA_KERNELS_HERE)\ncudaError_t gemm_wgmma(",
                   "#if 1  // DPMLP_WGMMA_KERNELS_HERE\ncudaError_t gemm_wgmma(", "gemm_wgmma()")
    body = replace(body, "extern __shared__ __align__(16) unsigned char smem_dyn[];",
                   "unsigned char* const smem_dyn = reinterpret_cast<unsigned char*>(emulation::smem);", "smem_dyn")

    body, n = re.subn(r"(gemm_kernel<T, AK, BK_, O, PreB>)<<<(dim3\(.*?\)), T::threads,\s*S::bytes, stream>>>\(p\);",
                      r"emulation::launch_warps(\1, \2, T::threads, S::bytes, stream, p);", body,
                      flags=re.DOTALL)
    body, n_wgmma = re.subn(r"(wgmma_kernel<T, AK, BK_, O, PreB>)<<<(dim3\(.*?\)), T::threads,\s*S::bytes, stream>>>"
                            r"\(p\);", r"emulation::launch_warps(\1, \2, T::threads, S::bytes, stream, p);", body,
                            flags=re.DOTALL)
    body, n_ws = re.subn(r"(wgmma_ws_kernel<T, O, Act>)<<<(dim3\(.*?\)), T::threads \+ 128,\s*S::bytes, stream>>>\(w\);",
                         r"emulation::launch_warps(\1, \2, T::threads + 128, S::bytes, stream, w);", body,
                         flags=re.DOTALL)
    body, n_split = re.subn(r"(detail::split_b_kernel<(?:true|false)>)<<<grid, 128, 0, stream>>>\((.*?)\);",
                            r"emulation::launch_serial(\1, grid, 128, stream, \2);", body)
    body, n_jobs = re.subn(r"(detail::split_b_jobs_kernel<backend::f16x3_layout::SplitBJob>)<<<grid, 128, 0, stream>>>\((.*?)\);",
                           r"emulation::launch_serial(\1, grid, 128, stream, \2);", body)
    if n != 1 or n_wgmma != 1 or n_ws != 1 or n_split != 2 or n_jobs != 1 or "<<<" in body or "asm" in body:
        sys.exit("generate.py: a kernel launch, or inline PTX, left in the kernels' text")

    text = f"""// Generated by tests/f16x3_emulation/generate.py from the library's headers; do not edit.
#pragma once
#include "f16x3_model.hpp"

#include "dpmlp/activation.hpp"
#include "dpmlp/backend/cuda/f16x3_layout.hpp"
#include "dpmlp/backend/cuda/kernel_gemm.hpp"

constexpr cudaError_t cudaErrorInvalidConfiguration = 9;
constexpr cudaError_t cudaErrorNotSupported = 801;
// A GPU of three SMs: the warp-specialized kernel's CTAs (one an SM) then take several tiles each.
enum cudaDeviceAttr {{ cudaDevAttrMultiProcessorCount = 16 }};
inline cudaError_t cudaGetDevice(int* dev) {{
  *dev = 0;
  return cudaSuccess;
}}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {{
  *value = attr == cudaDevAttrMultiProcessorCount ? 3 : 0;
  return cudaSuccess;
}}

namespace dpmlp {{
namespace backend {{
inline unsigned shared_address(const void* p) {{ return emulation::shared_address(p); }}
inline void mbarrier_init(std::uint64_t* bar, unsigned count) {{ emulation::mbar::init(shared_address(bar), count); }}
inline void mbarrier_arrive(std::uint64_t* bar) {{ emulation::mbar::arrive(shared_address(bar)); }}
inline void mbarrier_wait(std::uint64_t* bar, unsigned parity) {{ emulation::mbar::wait(shared_address(bar), parity); }}
namespace f16x3 {{
{abs_max}
{scale_for}
{split2_each}
{split2}
inline void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {{
  emulation::mma16816(d, a, b0, b1, d);
}}
inline void mma_zero(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {{
  const float zero[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  emulation::mma16816(d, a, b0, b1, zero);
}}
template <bool Trans>
inline void ldsm4(std::uint32_t (&r)[4], unsigned addr) {{
  emulation::ldsm4<Trans>(r, addr);
}}
{mma3}
}}  // namespace f16x3
}}  // namespace backend
namespace linalg {{
namespace gemm_f16x3 {{
{body}
}}  // namespace gemm_f16x3
}}  // namespace linalg
}}  // namespace dpmlp
"""
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
