// SPDX-License-Identifier: BSD-3-Clause
// A host model of what dpmlp's block-scaled 3xFP16 kernels (include/dpmlp/backend/cuda/gemm_f16x3_kernels.hpp)
// use of CUDA beyond the wgmma model's (../wgmma_emulation/emulation.hpp: a CTA as std::threads, __syncthreads,
// the shared-memory window), so that test_f16x3_emulated runs the kernels' own code on a CPU:
//   - warps: lanes 32 consecutive threads; each warp-wide instruction (shuffle, ldmatrix, mma.sync) a barrier
//     of its 32 threads around an exchange of their operands;
//   - ldmatrix.x4 (.trans): lane t's register q holds the two halves at (row t/4, columns 2(t%4), +1) of the
//     8 x 8 matrix whose rows lanes 8q .. 8q+7 point at (as stored), or (rows 2(t%4), +1; column t/4);
//   - mma.sync.m16n8k16.f32.f16: the PTX fragment layouts (A: a0 (row g, k 2t, 2t+1), a1 (g + 8), a2 (k + 8),
//     a3 (both); B: b0 (k 2t, 2t+1; column g), b1 (k + 8); C: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)),
//     each sum of exact products rounded once to fp32 (the hardware's own rounding is not modelled: the test
//     checks accuracy against fp64, not bits against a GPU);
//   - fp16: round-to-nearest-even conversions with subnormals and overflow to infinity;
//   - cp.async: a copy joins the thread's open group, commit closes it, and wait_group N completes the oldest
//     groups until N remain: shared memory changes only then, so a read of a ring slot before its wait sees the
//     NaN it was filled with, and one overwritten too early shows as wrong results. A completed copy is a
//     generic-proxy store of the thread's (for the async-proxy rule below), as the split's stores are
//     (generate.py records those);
//   - wgmma.mma_async.m64nNk16.f32.f16.f16 (the wgmma form; N 64 or 128) with both operands in shared memory:
//     the descriptor decoded (K-major, 64-byte swizzle: element (row, k) of a k16 step at start + (row / 8) SBO
//     + (row % 8) 64 + 2 k bytes, address bits 4-5 XOR bits 7-8; or, both transposed, MN-major with the
//     128-byte swizzle: (row, k) at start + (row / 64) LBO + 2 (row % 64) + 128 (k % 8) + (k / 8) SBO, bits
//     4-6 XOR bits 7-9, where an operand wider than 64 needs an LBO of whole 1024-byte patterns; any other
//     layout type, base offset, leading byte offset or reserved bit fails, as does a read outside the CTA's
//     shared memory), each element's sum
//     as mma16816's (the accumulator, or zero where scale-d is 0, then the 16 exact products in k order,
//     rounded once to fp32: the wgmma form's bits are then comparable with the mma.sync form's), the thread's
//     accumulator registers mapped as CuTe's CLayout_64xN maps them (thread index mod 128: a CTA may hold two
//     warpgroups), independently of the kernel's own register map; asynchrony and the async proxy as
//     emulation.hpp models them for the TF32 wgmma: an MMA runs at the wait_group that retires it or, in the
//     other mode (run_at_wait false), when issued; one before the thread's first wgmma.fence fails, and so does
//     one after a barrier that some thread reached with shared-memory stores it had not fenced
//     (fence.proxy.async); a thread that ends a CTA with MMAs not retired fails;
//   - mbarriers (the warp-specialized wgmma form): init, arrive, expect_tx, waits on a phase's parity, each a
//     state beside the shared memory, keyed by its address; a phase completes when its arrivals and its
//     transaction bytes are all in. They carry the async-proxy rule too: a thread that passes a wait on a phase
//     some thread arrived at with unfenced stores fails at its next wgmma. A bulk copy (cp.async.bulk to
//     shared memory) lands when issued, as an async-proxy write, and completes its bytes on its mbarrier; a
//     wait whose phase has not completed after 300 s is a deadlock (a missing arrival or a parity one phase
//     off) and fails instead of hanging the test; setmaxnreg does nothing.
#pragma once

#include "emulation.hpp"

#include <array>
#include <chrono>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

struct __half {
  std::uint16_t x;
};
struct __half2 {
  std::uint16_t x, y;
};

namespace emulation {
namespace f16 {

// fp32 -> fp16, to nearest even.
inline std::uint16_t encode(float f) {
  const std::uint32_t u = __float_as_uint(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return sign | 0x7e00u;  // NaN
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0) return sign;
  const int e = std::ilogb(a);
  const double q = std::ldexp(1.0, e < -14 ? -24 : e - 10);
  const double r = std::nearbyint(a / q) * q;  // the default rounding mode: to nearest even
  if (r >= 65520.0 || au == 0x7f800000u) return sign | 0x7c00u;
  if (r < std::ldexp(1.0, -14)) return sign | static_cast<std::uint16_t>(r / std::ldexp(1.0, -24));
  const int er = std::ilogb(r);
  const int mant = static_cast<int>(r / std::ldexp(1.0, er - 10)) - 1024;
  return sign | static_cast<std::uint16_t>(((er + 15) << 10) | mant);
}
inline float decode(std::uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 31, mant = h & 1023;
  double v;
  if (exp == 31) {
    v = mant ? std::nan("") : INFINITY;
  } else if (exp == 0) {
    v = std::ldexp(double(mant), -24);
  } else {
    v = std::ldexp(double(1024 + mant), exp - 25);
  }
  return static_cast<float>(sign ? -v : v);
}

}  // namespace f16

// A warp's exchange: each lane's operands, then a barrier; every lane reads what it needs; a barrier again.
struct Warp {
  Barrier barrier{32};
  std::array<std::array<std::uint32_t, 6>, 32> slot{};
};
inline std::vector<std::unique_ptr<Warp>> warps;
inline void make_warps(unsigned threads) {
  warps.clear();
  for (unsigned w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<Warp>());
}
inline Warp& my_warp() { return *warps[threadIdx.x / 32]; }
inline int my_lane() { return static_cast<int>(threadIdx.x % 32); }
template <class Read>
inline void exchange(const std::array<std::uint32_t, 6>& mine, Read&& read) {
  Warp& w = my_warp();
  w.slot[my_lane()] = mine;
  w.barrier.arrive_and_wait(false);
  read(w.slot);
  w.barrier.arrive_and_wait(false);
}

inline std::uint16_t shared_half(unsigned address) {
  if (address % 2 != 0 || address < smem_base || address + 2 > smem_base + smem_bytes) {
    fail("a shared-memory half outside the CTA's shared memory or misaligned");
  }
  std::uint16_t h;
  std::memcpy(&h, window + address, 2);
  return h;
}

template <bool Trans>
inline void ldsm4(std::uint32_t (&r)[4], unsigned addr) {
  if (addr % 16 != 0) fail("ldmatrix: a row address not 16-byte aligned");
  const int t = my_lane();
  exchange({addr, 0, 0, 0, 0, 0}, [&](const auto& s) {
    for (int q = 0; q < 4; ++q) {
      std::uint32_t lo, hi;
      if (Trans) {
        lo = shared_half(s[8 * q + 2 * (t % 4)][0] + 2 * (t / 4));
        hi = shared_half(s[8 * q + 2 * (t % 4) + 1][0] + 2 * (t / 4));
      } else {
        lo = shared_half(s[8 * q + t / 4][0] + 2 * (2 * (t % 4)));
        hi = shared_half(s[8 * q + t / 4][0] + 2 * (2 * (t % 4) + 1));
      }
      r[q] = lo | (hi << 16);
    }
  });
}

inline float half_of(std::uint32_t reg, int which) {
  return f16::decode(static_cast<std::uint16_t>(which ? reg >> 16 : reg & 0xffffu));
}

// d = a b + c for the calling lane's four outputs.
inline void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                     const float (&c)[4]) {
  const int lane = my_lane(), g = lane / 4, t = lane % 4;
  exchange({a[0], a[1], a[2], a[3], b0, b1}, [&](const auto& s) {
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + (e % 2);
      double sum = c[e];
      for (int k = 0; k < 16; ++k) {
        const std::uint32_t areg = s[(row % 8) * 4 + (k % 8) / 2][(row / 8) + 2 * (k / 8)];
        const std::uint32_t breg = s[col * 4 + (k % 8) / 2][4 + k / 8];
        sum += double(half_of(areg, k % 2)) * double(half_of(breg, k % 2));
      }
      d[e] = static_cast<float>(sum);
    }
  });
}

inline float shfl_xor(float v, int mask) {
  float r = 0;
  exchange({__float_as_uint(v), 0, 0, 0, 0, 0},
           [&](const auto& s) { r = __uint_as_float(s[my_lane() ^ mask][0]); });
  return r;
}

// cp.async, as the header says.
struct Copy {
  unsigned dst;
  const float* src;
  int bytes;
};
struct Copies {
  std::vector<Copy> open;
  std::deque<std::vector<Copy>> committed;
};
inline thread_local Copies copies;
inline void cp_async16(unsigned dst, const float* src, int bytes) {
  if (dst % 16 != 0 || dst < smem_base || dst + 16 > smem_base + smem_bytes) fail("cp.async: a bad shared address");
  if (bytes != 0 && bytes != 16) fail("cp.async: a partial copy");
  if (bytes == 16 && reinterpret_cast<std::uintptr_t>(src) % 16 != 0) fail("cp.async: a misaligned source");
  copies.open.push_back({dst, src, bytes});
}
inline void copy_commit() {
  copies.committed.push_back(std::move(copies.open));
  copies.open.clear();
}
template <int Pending>
inline void copy_wait() {
  while (static_cast<int>(copies.committed.size()) > Pending) {
    if (!copies.committed.front().empty()) note_generic_store();
    for (const Copy& c : copies.committed.front()) {
      if (c.bytes == 16) {
        std::memcpy(window + c.dst, c.src, 16);
      } else {
        std::memset(window + c.dst, 0, 16);
      }
    }
    copies.committed.pop_front();
  }
}
// A CTA's end: copies never waited for are dropped (groups past the last k-tile are empty).
inline void end_copies() {
  for (const auto& g : copies.committed) {
    if (!g.empty()) fail("a thread ended with copies it never waited for");
  }
  if (!copies.open.empty()) fail("a thread ended with uncommitted copies");
  copies = Copies();
}

// The FP16 wgmma, as the header says; a thread's state apart from the TF32 model's (emulation::warpgroup).
// mbarriers, as the header says.
namespace mbar {
struct State {
  int expected = 0, pending = 0;
  long long tx = 0;
  long long phase = 0;          // completed phases
  bool unfenced_now = false;    // the current phase's arrivals: some thread's unfenced stores
  bool unfenced_of[2] = {false, false};  // each parity's last completed phase
};
inline std::mutex mutex;
inline std::condition_variable cv;
inline std::map<unsigned, State> states;
inline thread_local bool passed_unfenced = false;  // a wait passed a phase with unfenced stores
inline std::atomic<long long> waits{0};  // waits passed, for a test to see that the warp-specialized form ran

inline State& at(unsigned address) {
  auto it = states.find(address);
  if (it == states.end()) fail("an mbarrier used before its init");
  return it->second;
}
inline void complete_if_done(State& b) {
  if (b.pending == 0 && b.tx == 0) {
    b.unfenced_of[b.phase & 1] = b.unfenced_now;
    b.unfenced_now = false;
    ++b.phase;
    b.pending = b.expected;
    cv.notify_all();
  }
}
inline void init(unsigned address, unsigned count) {
  if (address % 8 != 0 || address < smem_base || address + 8 > smem_base + smem_bytes) fail("mbarrier: a bad address");
  std::lock_guard<std::mutex> lock(mutex);
  State b;
  b.expected = b.pending = static_cast<int>(count);
  states[address] = b;
}
inline void arrive(unsigned address) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    State& b = at(address);
    if (b.pending == 0) fail("mbarrier: more arrivals than its count");
    b.unfenced_now = b.unfenced_now || unfenced_stores;
    --b.pending;
    complete_if_done(b);
  }
  // The arriving thread stalls, so that the threads its arrival releases run first: what it does after its
  // arrival that it should have done before (a read of what they overwrite) then shows.
  std::this_thread::sleep_for(std::chrono::microseconds(300));
}
inline void expect_tx(unsigned address, unsigned bytes) {
  std::lock_guard<std::mutex> lock(mutex);
  at(address).tx += bytes;
}
inline void wait(unsigned address, unsigned parity) {
  std::unique_lock<std::mutex> lock(mutex);
  State* b = &at(address);
  // The phase of this parity is complete once the current phase's parity differs. A wait that lasts minutes
  // (every test's kernels finish in seconds, under ThreadSanitizer too) is a deadlock: it fails rather than
  // hangs the test.
  if (!cv.wait_for(lock, std::chrono::seconds(300),
                   [&] { return (b->phase & 1) != static_cast<long long>(parity & 1); })) {
    fail("mbarrier: a wait whose phase never completes (a deadlock)");
  }
  if (b->unfenced_of[parity & 1]) passed_unfenced = true;
  ++waits;
}
inline void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  if (dst % 16 != 0 || bytes % 16 != 0 || dst < smem_base || dst + bytes > smem_base + smem_bytes) {
    fail("cp.async.bulk: a bad shared range");
  }
  if (reinterpret_cast<std::uintptr_t>(src) % 16 != 0) fail("cp.async.bulk: a misaligned source");
  std::memcpy(window + dst, src, bytes);
  std::lock_guard<std::mutex> lock(mutex);
  State& b = at(bar);
  b.tx -= bytes;
  if (b.tx < 0) fail("cp.async.bulk: more bytes than the mbarrier expects");
  complete_if_done(b);
}
}  // namespace mbar

namespace wgmma16 {

struct Mma {
  float* d;
  int regs;
  std::uint64_t da, db;
  int scale_d;
  bool transposed;  // both operands MN-major (the T N form's wgmma_f16<1>)
};
struct Warpgroup {
  std::vector<Mma> open;
  std::deque<std::vector<Mma>> committed;
  bool fenced = false;  // a wgmma.fence since the thread began its CTA
};
inline thread_local Warpgroup warpgroup;
inline std::atomic<long long> count{0};  // MMAs issued, for a test to see that the form ran

// Element (row, k) of the 16-wide k step a descriptor names: K-major (64-byte swizzle) or, transposed,
// MN-major with the 128-byte swizzle, ((8, 8, m), (8, k)) : ((1, 8, LBO), (64, SBO)) in halves (CuTe's canonical
// layout: eight 16-byte chunks of eight free indices a 128-byte row of one k, eight k an atom, atoms LBO apart
// along the free index), the address's bits 4-6 XOR bits 7-9.
inline float operand(std::uint64_t desc, int row, int k, bool transposed = false) {
  // The fields: start address (bits 0-13), leading byte offset (16-29), stride byte offset (32-45), both in 16
  // bytes; base offset (49-51); layout type (62-63). The rest is reserved (zero).
  constexpr std::uint64_t fields = 0x3FFFull | (0x3FFFull << 16) | (0x3FFFull << 32) | (7ull << 49) | (3ull << 62);
  const unsigned start = unsigned(desc & 0x3FFF) << 4, sbo = unsigned((desc >> 32) & 0x3FFF) << 4;
  const unsigned lbo = unsigned((desc >> 16) & 0x3FFF), base_offset = unsigned(desc >> 49) & 7;
  const unsigned layout = unsigned(desc >> 62);
  // Layout type 2: the 64-byte swizzle (type 1, the 128-byte one, transposed). The leading byte offset is unused
  // K-major with a swizzle and assumed 1 (CuTe's GmmaDescriptor); transposed, it is 1 or whole 1024-byte
  // patterns (1 where the operand is one atom wide: past row 63 that fails below). A base offset other than 0
  // would shift the swizzle's pattern, which is not modelled.
  const bool lbo_ok = lbo == 1 || (transposed && lbo % 64 == 0);
  if (layout != (transposed ? 1u : 2u) || base_offset != 0 || !lbo_ok || (desc & ~fields) != 0) {
    fail(transposed ? "a transposed FP16 wgmma descriptor of another than the MN-major 128-byte swizzle form"
                    : "an FP16 wgmma descriptor of another than the 64-byte swizzle form");
  }
  unsigned b;
  if (transposed) {
    if (row >= 64 && lbo == 1) fail("a transposed FP16 wgmma over more than 64 free indices with no atom stride");
    b = start + (row / 64) * (lbo << 4) + 2 * (row % 8) + 16 * ((row / 8) % 8) + 128 * (k % 8) + (k / 8) * sbo;
    b ^= ((b >> 7) & 7) << 4;
  } else {
    b = start + (row / 8) * sbo + (row % 8) * 64 + k * 2;
    b ^= ((b >> 7) & 3) << 4;
  }
  if (b < smem_base || b + 2 > smem_base + smem_bytes) fail("an FP16 wgmma descriptor reads outside shared memory");
  std::uint16_t h;
  std::memcpy(&h, window + b, 2);
  return f16::decode(h);
}

// The calling thread's part of one MMA: accumulator register v of thread t (of its warpgroup) is element (m, n)
// of the 64 x N tile, m + 64 n = CuTe's CLayout_64xN: thread (4,8,4):(128,1,16), value (2,2,N/8):(64,8,512).
inline void execute(const Mma& op) {
  const int t = static_cast<int>(threadIdx.x % 128);
  for (int v = 0; v < op.regs; ++v) {
    const int idx = 128 * (t % 4) + (t / 4) % 8 + 16 * (t / 32) + 64 * (v % 2) + 8 * ((v / 2) % 2) + 512 * (v / 4);
    const int m = idx % 64, n = idx / 64;
    double sum = op.scale_d ? op.d[v] : 0.0;
    for (int k = 0; k < 16; ++k) {
      sum += double(operand(op.da, m, k, op.transposed)) * double(operand(op.db, n, k, op.transposed));
    }
    op.d[v] = static_cast<float>(sum);
  }
}

inline void fence() { warpgroup.fenced = true; }
inline void commit() {
  warpgroup.committed.push_back(std::move(warpgroup.open));
  warpgroup.open.clear();
}
template <int Pending>
inline void wait() {
  while (static_cast<int>(warpgroup.committed.size()) > Pending) {
    for (const Mma& op : warpgroup.committed.front()) execute(op);
    warpgroup.committed.pop_front();
  }
}
template <int R>
inline void mma(float (&d)[R], std::uint64_t da, std::uint64_t db, int scale_d, bool transposed = false) {
  static_assert(R == 32 || R == 64, "m64n64k16 or m64n128k16");
  if (!warpgroup.fenced) fail("an FP16 wgmma before any wgmma.fence");
  if (cta_barrier->unfenced()) {
    fail("an FP16 wgmma after a barrier some thread reached with unfenced shared-memory stores");
  }
  if (mbar::passed_unfenced) fail("an FP16 wgmma after an mbarrier phase some thread arrived at with unfenced stores");
  ++count;
  const Mma op{d, R, da, db, scale_d, transposed};
  if (run_at_wait) {
    warpgroup.open.push_back(op);
  } else {
    execute(op);
  }
}
inline void end() {
  if (!warpgroup.open.empty() || !warpgroup.committed.empty()) fail("a thread ended with FP16 wgmma MMAs pending");
  warpgroup = Warpgroup();
}

}  // namespace wgmma16


// kernel<<<grid, threads, bytes, stream>>>(p) with warps.
template <class Kernel, class P>
void launch_warps(Kernel kernel, dim3 grid, unsigned threads, std::size_t bytes, cudaStream_t stream, const P& p) {
  make_warps(threads);
  cta_begin = [] {
    copies = Copies();
    wgmma16::warpgroup = wgmma16::Warpgroup();
    mbar::passed_unfenced = false;  // (a CTA's mbarriers are its own: thread 0 inits them before its barrier)
  };
  cta_end = [] {
    end_copies();
    wgmma16::end();
  };
  launch_threads(kernel, grid, threads, bytes, stream, p);
  cta_begin = cta_end = nullptr;
}

// kernel<<<grid, threads, 0, stream>>>(args...) for a kernel whose threads share nothing (no shared memory, no
// warp instruction, no barrier): every thread of every CTA in turn, on the calling thread.
template <class Kernel, class... Args>
void launch_serial(Kernel kernel, dim3 grid, unsigned threads, cudaStream_t, const Args&... args) {
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        for (unsigned t = 0; t < threads; ++t) {
          blockIdx.x = x, blockIdx.y = y, blockIdx.z = z, threadIdx.x = t;
          kernel(args...);
        }
      }
    }
  }
}

}  // namespace emulation

inline __half2 __floats2half2_rn(float a, float b) { return {emulation::f16::encode(a), emulation::f16::encode(b)}; }
inline float2 __half22float2(__half2 h) { return {emulation::f16::decode(h.x), emulation::f16::decode(h.y)}; }
inline __half __float2half_rn(float v) { return {emulation::f16::encode(v)}; }
inline float __half2float(__half h) { return emulation::f16::decode(h.x); }
inline float __shfl_xor_sync(unsigned, float v, int mask) { return emulation::shfl_xor(v, mask); }
