// SPDX-License-Identifier: BSD-3-Clause
// A host model of what dpmlp's wgmma 3xTF32 kernels (include/dpmlp/backend/cuda/wgmma_3xtf32_kernels.hpp) use
// of CUDA, so that test_wgmma_emulated runs the kernels' own code on a CPU:
//   - a CTA is 128 std::threads (one warpgroup), __syncthreads a barrier of the 128, CTAs one after another;
//   - dynamic shared memory is one buffer at a shared address that is not 1024-byte aligned (the kernels
//     align their tiles themselves), filled with NaN before each CTA so a read of anything unstored shows;
//   - wgmma.mma_async.m64nNk8.f32.tf32 with both operands in shared memory: the descriptor decoded (K-major,
//     128-byte swizzle: element (row, k) of a k-step at start + (row / 8) SBO + (row % 8) 128 + 4 k bytes,
//     address bits 4-6 XOR bits 7-9), each operand cut to its top 19 bits (TF32), each MMA's sum cut toward
//     zero as an H200 cuts it (accumulate()), the thread's accumulator registers mapped as CuTe's
//     CLayout_64xN maps them (not as the kernels' own wgmma_layout.hpp does, so a wrong map there shows);
//   - asynchrony: an MMA runs when the wait_group that retires it is reached (the latest the hardware may read
//     its operands) or, in the other mode, when it is issued (the earliest); a kernel whose stores race with
//     its MMAs' reads gives different results in the two modes, or a data race under ThreadSanitizer.
//   - the async proxy: a wgmma issued after a barrier that some thread reached with shared-memory stores it had
//     not fenced (fence.proxy.async) is an error; so is one before the thread's first wgmma.fence.
// Not modelled: register fences beyond that first wgmma.fence, whether all 128 threads issue the same MMAs
// (.aligned), timing.
#pragma once

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __shared__
#define __launch_bounds__(...)
#define __forceinline__

typedef int cudaError_t;
typedef void* cudaStream_t;
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorInvalidValue = 1;
inline const char* cudaGetErrorString(cudaError_t) { return "emulated CUDA error"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
[[noreturn]] inline void __trap() {
  std::fprintf(stderr, "emulation: __trap()\n");
  std::abort();
}

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct EmulatedIndex {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmulatedIndex threadIdx, blockIdx;

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize, cudaFuncAttributePreferredSharedMemoryCarveout };
constexpr int cudaSharedmemCarveoutMaxShared = 100;
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int bytes) {
  return bytes <= 227 * 1024 ? cudaSuccess : cudaErrorInvalidValue;  // an H100/H200 CTA's most
}

namespace emulation {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "emulation: %s\n", what);
  std::abort();
}

// Shared memory: `smem` is at shared address `smem_base`, misaligned by 16 bytes from 1024.
inline constexpr unsigned smem_base = 1024 + 16;
alignas(4096) inline char window[smem_base + 232 * 1024];
inline char* const smem = window + smem_base;
inline unsigned shared_address(const void* p) {
  const char* c = static_cast<const char*>(p);
  if (c < window || c >= window + sizeof(window)) fail("a shared address of memory that is not shared");
  return static_cast<unsigned>(c - window);
}

// Whether this thread stored to shared memory (the kernels' store_split) since its last fence.proxy.async.
inline thread_local bool unfenced_stores = false;

// The CTA barrier. It also carries the async-proxy rule: shared memory that a thread stored is visible to
// wgmma (the async proxy) after that thread's fence.proxy.async and then a barrier; unfenced() says whether
// some thread arrived at the last barrier with stores it had not fenced.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait(bool unfenced) {
    std::unique_lock<std::mutex> lock(mutex_);
    const long long phase = phase_;
    any_unfenced_ = any_unfenced_ || unfenced;
    if (++arrived_ == count_) {
      arrived_ = 0;
      unfenced_ = any_unfenced_;
      any_unfenced_ = false;
      ++phase_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return phase_ != phase; });
    }
  }
  bool unfenced() const { return unfenced_; }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_, arrived_ = 0;
  long long phase_ = 0;
  bool any_unfenced_ = false;
  std::atomic<bool> unfenced_{false};
};
inline Barrier* cta_barrier = nullptr;

// What the test chooses: MMAs run at the wait that retires them (true) or when issued.
inline bool run_at_wait = true;
inline std::atomic<long long> mma_count{0};

struct Mma {
  float* d;
  int regs;
  std::uint64_t da, db;
  int scale_d;
};
struct Warpgroup {
  std::vector<Mma> open;
  std::deque<std::vector<Mma>> committed;
  bool fenced = false;  // a wgmma.fence since the thread began (PTX: required before its first wgmma)
};
inline thread_local Warpgroup warpgroup;
inline std::size_t smem_bytes = 0;  // the launch's dynamic shared memory

// Element (row, k) of the 8-wide k-step a descriptor names, as the tensor cores read it (its top 19 bits).
inline float operand(std::uint64_t desc, int row, int k) {
  const unsigned start = unsigned(desc & 0x3FFF) << 4, sbo = unsigned((desc >> 32) & 0x3FFF) << 4;
  const unsigned lbo = unsigned((desc >> 16) & 0x3FFF), base_offset = unsigned(desc >> 49) & 7;
  const unsigned layout = unsigned(desc >> 62);
  // The leading byte offset is unused with a swizzle and assumed 1 (CuTe's GmmaDescriptor).
  if (layout != 1 || base_offset != 0 || lbo != 1) fail("a descriptor of another than the 128-byte swizzle form");
  unsigned b = start + (row / 8) * sbo + (row % 8) * 128 + k * 4;
  b ^= ((b >> 7) & 7) << 4;
  if (b < smem_base || b + 4 > smem_base + smem_bytes) fail("a descriptor reads outside the CTA's shared memory");
  unsigned u;
  std::memcpy(&u, window + b, 4);
  return __uint_as_float(u & 0xffffe000u);
}

// One MMA's sum for one element: the accumulator and the eight (exact) TF32 products, each cut toward zero
// to a multiple of 2^(e - 23 - guard_bits), e the largest term's exponent, added exactly, and the sum cut
// to fp32 toward zero. An H200's results on crafted inputs fit this with 2 or more guard bits (1 + 7 x 2^-25
// gives 1 + 2^-23; 1, then + 0.75 ulp, gives 1; 1, then - 0.25 ulp, gives 1 - 2^-24).
inline int guard_bits = 2;
inline float accumulate(const double (&terms)[9]) {
  double big = 0;
  for (double x : terms) big = std::max(big, std::fabs(x));
  if (big == 0) return 0.0f;
  const double quantum = std::ldexp(1.0, std::ilogb(big) - 23 - guard_bits);
  double s = 0;
  for (double x : terms) s += std::trunc(x / quantum) * quantum;
  float r = static_cast<float>(s);
  if (std::fabs(double(r)) > std::fabs(s)) r = std::nextafter(r, 0.0f);
  return r;
}

// The calling thread's part of one MMA: accumulator register v of thread t is element (m, n) of the 64 x N
// tile, m + 64 n = CuTe's CLayout_64xN: thread (4,8,4):(128,1,16), value (2,2,N/8):(64,8,512).
inline void execute(const Mma& op) {
  const int t = static_cast<int>(threadIdx.x);
  for (int v = 0; v < op.regs; ++v) {
    const int idx = 128 * (t % 4) + (t / 4) % 8 + 16 * (t / 32) + 64 * (v % 2) + 8 * ((v / 2) % 2) + 512 * (v / 4);
    const int m = idx % 64, n = idx / 64;
    double terms[9];
    terms[0] = op.scale_d ? op.d[v] : 0.0;
    for (int k = 0; k < 8; ++k) terms[k + 1] = double(operand(op.da, m, k)) * double(operand(op.db, n, k));
    op.d[v] = accumulate(terms);
  }
}

inline void fence_proxy_async() { unfenced_stores = false; }
inline void note_generic_store() { unfenced_stores = true; }
inline void wgmma_fence() { warpgroup.fenced = true; }
template <int R>
inline void fence_registers(float (&)[R]) {}
inline void wgmma_commit() {
  warpgroup.committed.push_back(std::move(warpgroup.open));
  warpgroup.open.clear();
}
template <int Pending>
inline void wgmma_wait() {
  while (static_cast<int>(warpgroup.committed.size()) > Pending) {
    for (const Mma& op : warpgroup.committed.front()) execute(op);
    warpgroup.committed.pop_front();
  }
}
template <int R>
inline void mma(float (&d)[R], std::uint64_t da, std::uint64_t db, int scale_d) {
  static_assert(R == 32 || R == 64, "m64n64k8 or m64n128k8");
  if (!warpgroup.fenced) fail("a wgmma before any wgmma.fence");
  if (cta_barrier->unfenced()) fail("a wgmma after a barrier some thread reached with unfenced shared-memory stores");
  ++mma_count;
  const Mma op{d, R, da, db, scale_d};
  if (run_at_wait) {
    warpgroup.open.push_back(op);
  } else {
    execute(op);
  }
}

// What runs when a thread begins and ends a CTA (a model's per-thread state), beside the wgmma model's own.
inline void (*cta_begin)() = nullptr;
inline void (*cta_end)() = nullptr;

// kernel<<<grid, threads, bytes, stream>>>(p): `threads` threads run every CTA of the grid in turn, shared
// memory refilled with NaN between CTAs.
template <class Kernel, class P>
void launch_threads(Kernel kernel, dim3 grid, unsigned thread_count, std::size_t bytes, cudaStream_t, const P& p) {
  if (bytes + smem_base > sizeof(window)) fail("more dynamic shared memory than a CTA has");
  smem_bytes = bytes;
  Barrier barrier(static_cast<int>(thread_count));
  cta_barrier = &barrier;
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < thread_count; ++t) {
    threads.emplace_back([&, t] {
      threadIdx.x = t;
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
          if (t == 0) std::memset(smem, 0xFF, bytes);
          unfenced_stores = false;
          barrier.arrive_and_wait(false);
          blockIdx.x = x, blockIdx.y = y;
          warpgroup = Warpgroup();
          if (cta_begin != nullptr) cta_begin();
          kernel(p);
          if (cta_end != nullptr) cta_end();
          if (!warpgroup.open.empty() || !warpgroup.committed.empty()) fail("a thread ended with MMAs pending");
          barrier.arrive_and_wait(false);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
}
// kernel<<<grid, 128, bytes, stream>>>(p): one warpgroup a CTA.
template <class Kernel, class P>
void launch(Kernel kernel, dim3 grid, std::size_t bytes, cudaStream_t stream, const P& p) {
  launch_threads(kernel, grid, 128, bytes, stream, p);
}

// What the extracted wgmma_gemm() calls its execution space.
struct Space {
  cudaStream_t cuda_stream() const { return nullptr; }
};

}  // namespace emulation

inline void __syncthreads() { emulation::cta_barrier->arrive_and_wait(emulation::unfenced_stores); }
