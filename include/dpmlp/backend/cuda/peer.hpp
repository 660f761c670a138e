// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/backend/cuda/peer.hpp: the block tree's exchange by direct writes into the other GPUs' memory (CUDA
// IPC; peer access over NVLink or PCIe), in one kernel with the local tree, the combine and the update.
//
// Why: at small sizes a reproducible step is a chain of dependent pieces, and each link costs latency, not
// arithmetic: after the engine, the local block tree (a kernel), the collective's allgather of the subtree
// sums (its small-message latency, whatever the protocol) and the combine with the update (a kernel).
// TrainerOptions::peer_exchange replaces those three by one kernel. A team a chunk of columns:
//   1. sums this rank's subtrees of its columns in team scratch (the same pairs in the same order as
//      BlockTreeReducer::reduce_local_in_scratch: the same bits);
//   2. writes the subtree sums straight into every rank's exchange buffer (its own and, through the mapped
//      IPC allocation, the peers'), fences at system scope, and raises its flag for (chunk, step) on every
//      rank;
//   3. waits until every rank's flag for (chunk, step) is up, reads the gathered sums of its columns, runs
//      the combine program (the same additions as combine_apply_in_scratch) and applies f (the update).
// So a step is two kernels, the engine and this one, with no collective call between them.
//
// Ordering. Flags hold step numbers (a per-chunk counter on the device, so a captured CUDA graph replays
// unchanged), and "up" means >= this step. The exchange buffer has two halves, used by odd and even steps:
// a rank writes step s + 2's sums into a peer's half s % 2 only after it saw every rank's flag for step
// s + 1, and a rank raises that flag only after its step-s kernel, the last reader of half s % 2, ended
// (stream order). One half would not do: a fast rank's step s + 1 would overwrite what a slow rank is
// still combining.
//
// No hang: every team runs at once (the grid is at most the teams the SMs hold at once: one an SM, or two
// where registers and shared memory allow; past that a team loops over several chunks), so a wait depends
// only on the other ranks. A wait gives up after TrainerOptions::peer_timeout_s seconds (a rank stuck in host
// code, e.g. a callback writing a checkpoint, keeps its peers waiting in this kernel meanwhile),
// records which rank it waited for, and every later team and step skips its work (so the peers time out in
// turn); the trainer reads the record when the run ends and all ranks throw CommError together.
//
// This file holds the exchange's CUDA code: the IPC set-up, the system-scope flags and the kernel. The trainer
// includes backend/peer_exchange.hpp, which stands in for it on other builds.
#pragma once

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)

#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "dpmlp/backend/cuda/device.hpp"
#include "dpmlp/detail/tree_order.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"
#include "dpmlp/reduction.hpp"

namespace dpmlp {
namespace backend {

// What a team of the exchange kernel needs (trivially copyable, captured by the kernel).
struct PeerLinks {
  char* const* bases = nullptr;  // device array [size]: rank q's exchange allocation, mapped here (ours at rank)
  std::size_t counters_offset = 0, error_offset = 0, data_offset = 0;  // bytes from a base; flags at 0
  int rank = 0, size = 1;
  int chunks = 0, columns = 0, sms = 0;  // columns a chunk (a power of two); the device's multiprocessors
  long long timeout_ns = 0;
};

// System-scope relaxed store (after a fence: a release) and acquire load of a flag; the GPU's global
// nanosecond timer.
KOKKOS_INLINE_FUNCTION void peer_store_relaxed(unsigned long long* p, unsigned long long v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  (void)p, (void)v;
#endif
}
KOKKOS_INLINE_FUNCTION unsigned long long peer_load_acquire(const unsigned long long* p) {
#if defined(__CUDA_ARCH__)
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return *p;
#endif
}
KOKKOS_INLINE_FUNCTION long long peer_clock_ns() {
#if defined(__CUDA_ARCH__)
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return static_cast<long long>(t);
#else
  return 0;
#endif
}
KOKKOS_INLINE_FUNCTION void peer_fence_system() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#endif
}
// A load from L2, past this SM's L1 (which is not coherent with the peers' writes).
template <class T>
KOKKOS_INLINE_FUNCTION T peer_load_l2(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *p;
#endif
}

// Why the exchange cannot run for this trainer's types, or "" (the trainer also needs one GPU per rank).
template <class ExecSpace, class Scalar>
std::string peer_exchange_unsupported() {
  if (!std::is_same<ExecSpace, Kokkos::Cuda>::value) return "it needs the Kokkos::Cuda execution space";
  if (!std::is_same<Scalar, float>::value && !std::is_same<Scalar, double>::value) return "it needs float or double";
  return {};
}

// The exchange's memory on this rank and the peers' mapped into it. Collective to build (MPI), not copyable.
class PeerExchange {
 public:
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  // `data_bytes`: both halves of the exchange buffer; `chunks` x `size` flags. Collective over comm; a failure
  // on any rank throws CommError on every rank (nothing is left allocated or mapped).
  PeerExchange(MPI_Comm comm, std::size_t data_bytes, int chunks, int columns, int sms, long long timeout_ns)
      : comm_(comm) {
    MPI_Comm_rank(comm, &links_.rank);
    MPI_Comm_size(comm, &links_.size);
    links_.chunks = chunks;
    links_.columns = columns;
    links_.sms = sms;
    links_.timeout_ns = timeout_ns;
    const auto align = [](std::size_t n) { return (n + 255) / 256 * 256; };
    links_.counters_offset = align(std::size_t(chunks) * links_.size * sizeof(unsigned long long));
    links_.error_offset = links_.counters_offset + align(std::size_t(chunks) * sizeof(unsigned long long));
    links_.data_offset = links_.error_offset + 256;
    bytes_ = links_.data_offset + data_bytes;
    const int size = links_.size;

    // 1. Our allocation (raw cudaMalloc: IPC handles need it; a stream-ordered pool allocation has none),
    //    zeroed, and its handle.
    std::string problem;
    cudaIpcMemHandle_t mine{};
    if (cudaMalloc(&own_, bytes_) != cudaSuccess) {
      own_ = nullptr;
      problem = "cudaMalloc of " + std::to_string(bytes_) + " bytes";
    } else if (cudaMemset(own_, 0, bytes_) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      problem = "cudaMemset";
    } else if (cudaIpcGetMemHandle(&mine, own_) != cudaSuccess) {
      problem = "cudaIpcGetMemHandle";
    }
    cudaGetLastError();  // a failure above is reported below, not left for the next CUDA call
    agree_or_release(problem);

    // 2. Every rank's handle; map the peers'.
    std::vector<cudaIpcMemHandle_t> all(size);
    timed_allgather(&mine, sizeof(mine), MPI_BYTE, all.data(), sizeof(mine), MPI_BYTE, comm,
                    "MPI_Allgather (peer exchange set-up: the IPC handles)");
    std::vector<char*> bases(size, nullptr);
    mapped_.assign(size, nullptr);
    for (int q = 0; q < size && problem.empty(); ++q) {
      if (q == links_.rank) {
        bases[q] = static_cast<char*>(own_);
        continue;
      }
      const cudaError_t e = cudaIpcOpenMemHandle(&mapped_[q], all[q], cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        mapped_[q] = nullptr;
        problem = "cudaIpcOpenMemHandle of rank " + std::to_string(q) + "'s buffer: " + cudaGetErrorString(e) +
                  " (the GPUs of the two ranks need peer access: NVLink or PCIe P2P)";
        cudaGetLastError();
      }
      bases[q] = static_cast<char*>(mapped_[q]);
    }
    if (problem.empty()) {
      if (cudaMalloc(&bases_dev_, size * sizeof(char*)) != cudaSuccess ||
          cudaMemcpy(bases_dev_, bases.data(), size * sizeof(char*), cudaMemcpyHostToDevice) != cudaSuccess) {
        problem = "cudaMalloc / cudaMemcpy of the peer table";
        cudaGetLastError();
      }
    }
    agree_or_release(problem);
    links_.bases = static_cast<char* const*>(bases_dev_);
    // 3. No rank writes into a peer before that peer's buffer is zeroed and every map is in place.
    timed_barrier(comm, "MPI_Barrier (peer exchange set-up)");
  }

  // A rank's buffer may be freed only when no peer can still write into it (CUDA IPC: freeing memory a peer
  // has mapped and writes is undefined). That holds once a run ended on every rank (each fenced its work before
  // the run's closing agreement): the trainer then calls quiet(). A trainer destroyed in the middle of a run
  // (a rank that left train() by an exception while its peers go on) leaves its buffer and maps allocated on
  // purpose, until the process ends.
  ~PeerExchange() {
    if (quiet_) release();
  }
  void busy() { quiet_ = false; }
  void quiet() { quiet_ = true; }

  const PeerLinks& links() const { return links_; }

  // After the work on the trainer's space has ended: "" or what went wrong (a wait that timed out).
  std::string failure() const {
    int word[2] = {0, 0};
    if (cudaMemcpy(word, static_cast<char*>(own_) + links_.error_offset, sizeof(word), cudaMemcpyDeviceToHost) !=
        cudaSuccess) {
      cudaGetLastError();
      return "dpmlp: peer exchange: its error word could not be read";
    }
    if (word[0] == 0) return {};
    return "dpmlp: peer exchange: rank " + std::to_string(links_.rank) + " waited more than " +
           std::to_string(links_.timeout_ns / 1000000000LL) + " s (TrainerOptions::peer_timeout_s) for rank " +
           std::to_string(word[0] - 1) + "'s subtree sums of its exchange step " + std::to_string(word[1]) +
           " (a rank stopped or fell behind); the steps from there on were skipped, and that step may have "
           "updated part of the parameters";
  }

 private:
  void release() {
    for (void* p : mapped_) {
      if (p != nullptr) cudaIpcCloseMemHandle(p);
    }
    mapped_.clear();
    if (bases_dev_ != nullptr) cudaFree(bases_dev_);
    if (own_ != nullptr) cudaFree(own_);
    bases_dev_ = own_ = nullptr;
  }
  void agree_or_release(const std::string& problem) {
    int bad = problem.empty() ? 0 : 1, any = 0;
    timed_allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm_, "MPI_Allreduce (peer exchange set-up)");
    if (any != 0) {
      // Unmap before anyone frees: a rank frees only after every rank has closed its maps of it.
      for (void*& p : mapped_) {
        if (p != nullptr) cudaIpcCloseMemHandle(p);
        p = nullptr;
      }
      timed_barrier(comm_, "MPI_Barrier (peer exchange set-up: unmapped)");
      release();
      agree<CommError>(comm_, problem.empty() ? problem : "dpmlp: peer exchange set-up: " + problem);
    }
  }

  MPI_Comm comm_;
  PeerLinks links_;
  std::size_t bytes_ = 0;
  void* own_ = nullptr;
  void* bases_dev_ = nullptr;
  std::vector<void*> mapped_;
  bool quiet_ = true;  // no step of this exchange is in flight on any rank
};

// Team scratch of the exchange kernel for `cols` columns: two 8-byte control words, the node table (first
// block and length of each local subtree), the rank's blocks (`rows`) and every value of the combine program
// for each column, then the program (3 ints a step).
template <class Scalar>
std::size_t peer_scratch_bytes(const BlockTreePlan& plan, std::int64_t rows, int cols) {
  return 16 + plan.local_nodes().size() * 16 + (std::size_t(rows) + plan.values()) * cols * sizeof(Scalar) +
         plan.program().size() * 3 * sizeof(int);
}

// Builds the exchange for a reducer (collective over comm); a wait gives up after timeout_s seconds. Throws
// InputError on every rank when a rank's blocks do not fit a team's scratch even one column at a time.
template <class ExecSpace, class Scalar>
std::shared_ptr<PeerExchange> make_peer_exchange(MPI_Comm comm, const BlockTreeReducer<ExecSpace, Scalar>& r,
                                                 double timeout_s) {
  const BlockTreePlan& plan = r.plan();
  const std::int64_t local_blocks = plan.shard().local_blocks();
  const auto most = static_cast<std::size_t>(Kokkos::TeamPolicy<ExecSpace>::scratch_size_max(0));
  int cols = 0;
  for (int c = 32; c >= 1 && cols == 0; c /= 2) {  // a power of two: a team's lanes are 256 / columns
    if (peer_scratch_bytes<Scalar>(plan, local_blocks, c) <= most) cols = c;
  }
  // Narrower chunks while there are no more of them than SMs: a chunk's tree, combine and update are chains
  // of shared-memory steps, so more, narrower chunks on more SMs end sooner, and each thread stages fewer
  // rows; more chunks than SMs would put two teams on an SM, which was slower.
  const int sms = std::max(1, cuda_device().sms);
  const auto chunks_of = [&](int c) { return (r.width() + c - 1) / c; };
  while (cols > 1 && chunks_of(cols / 2) <= sms) cols /= 2;
  // Every rank must cut the columns alike (flags are per chunk): the fewest any rank takes.
  int fewest = cols;
  timed_allreduce(&cols, &fewest, 1, MPI_INT, MPI_MIN, comm, "MPI_Allreduce (peer exchange: the column chunks)");
  agree(comm, fewest > 0 ? std::string()
                         : "dpmlp: peer exchange: a rank's " + std::to_string(local_blocks) +
                               " blocks of partial sums do not fit a team's scratch even a column at a time; use "
                               "larger block_rows or no peer_exchange");
  const int chunks = static_cast<int>(chunks_of(fewest));  // fewest > 0: agree threw otherwise
  const std::size_t data = 2 * std::size_t(plan.size()) * plan.slots() * r.width() * sizeof(Scalar);
  return std::make_shared<PeerExchange>(comm, data, chunks, fewest, sms, static_cast<long long>(timeout_s * 1e9));
}

// One step's reduction through the exchange: the local subtrees of `partials` (local_blocks x width, left
// unchanged), the exchange, the combine, then f(p, total_p) for every column p (as reduce_apply). Every rank
// must call it once a step with the same reducer layout.
template <class ExecSpace, class Scalar, class F>
void reduce_apply_peer(const ExecSpace& space, const BlockTreeReducer<ExecSpace, Scalar>& r,
                       const typename BlockTreeReducer<ExecSpace, Scalar>::matrix& partials, const PeerExchange& peer,
                       const F& f) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename policy::member_type;
  const BlockTreePlan& plan = r.plan();
  const PeerLinks L = peer.links();
  const auto P = partials;
  const auto lo_v = r.node_lo();
  const auto level_v = r.node_level();
  const auto prog = r.program();
  const int nodes = static_cast<int>(plan.local_nodes().size());
  const int slots = plan.slots(), steps = static_cast<int>(plan.program().size()), root = plan.root();
  const int values = plan.values(), gathered = plan.size() * slots;
  const std::int64_t W = r.width(), local_blocks = plan.shard().local_blocks();
  const std::int64_t max_span = r.widest_subtree();
  const int cw = L.columns;
  int shift = 0;  // cw = 2^shift: column and lane of a thread by mask and shift (no integer division)
  while ((1 << shift) < cw) ++shift;
  const std::size_t bytes = peer_scratch_bytes<Scalar>(plan, local_blocks, cw);
  const std::int64_t tree_len = local_blocks * cw;
  const auto body = KOKKOS_LAMBDA(const member& team) {
    char* const raw = static_cast<char*>(team.team_scratch(0).get_shmem(bytes));
    unsigned long long* const ctl = reinterpret_cast<unsigned long long*>(raw);  // [step, failed]
    std::int64_t* const node_lo = reinterpret_cast<std::int64_t*>(raw + 16);
    int* const node_n = reinterpret_cast<int*>(node_lo + nodes);
    Scalar* const tree = reinterpret_cast<Scalar*>(node_lo + 2 * nodes);  // node_n padded to 8 bytes a node
    Scalar* const vals = tree + tree_len;
    int* const ops = reinterpret_cast<int*>(vals + std::int64_t(values) * cw);
    const int me = team.team_rank(), T = team.team_size();
    char* const own = L.bases[L.rank];
    unsigned long long* const counters = reinterpret_cast<unsigned long long*>(own + L.counters_offset);
    int* const error = reinterpret_cast<int*>(own + L.error_offset);
    const unsigned long long* const flags = reinterpret_cast<const unsigned long long*>(own);
    // The program and the node table, once (read in the levels' loops, where a global load would wait: the
    // compiler cannot move it above the scratch stores).
    for (int i = me; i < steps * 3; i += T) ops[i] = prog(i / 3, i % 3);
    for (int i = me; i < nodes; i += T) {
      const std::int64_t lo = lo_v(i), span = std::int64_t(1) << level_v(i);
      node_lo[i] = lo;
      node_n[2 * i] = static_cast<int>(lo + span < local_blocks ? span : local_blocks - lo);
    }
    const int lanes = 256 >> shift;
    for (int c = team.league_rank(); c < L.chunks; c += team.league_size()) {
      const std::int64_t c0 = std::int64_t(c) * cw;
      const int cn = W - c0 < cw ? static_cast<int>(W - c0) : cw;
      // This chunk's step number and the error word, in flight while the partial sums load.
      unsigned long long step = 0, failed = 0;
      if (me == 0) {
        step = counters[c] + 1;
        failed = static_cast<unsigned long long>(*reinterpret_cast<volatile int*>(error));
      }
      // 1-2. Every local block's row of these columns into scratch (every load in flight at once; the local
      // subtrees tile the rank's blocks in order), each subtree summed there level by level with the pairs of
      // reduce_local_in_scratch (the same bits).
      for (int t = me; t < 256; t += T) {
        const int col = t & (cw - 1), lane = t >> shift;
        if (col >= cn) continue;
        constexpr int batch = 16;
        for (std::int64_t b0 = lane; b0 < local_blocks; b0 += batch * lanes) {
          Scalar v[batch];
          for (int j = 0; j < batch; ++j) {
            const std::int64_t b = b0 + j * lanes;
            v[j] = b < local_blocks ? P(b, c0 + col) : Scalar(0);
          }
          for (int j = 0; j < batch; ++j) {
            const std::int64_t b = b0 + j * lanes;
            if (b < local_blocks) tree[(b << shift) + col] = v[j];
          }
        }
      }
      if (me == 0) {
        ctl[0] = step;
        ctl[1] = failed;
      }
      team.team_barrier();
      for (int stride = 1; stride < max_span; stride *= 2) {
        for (int t = me; t < 256; t += T) {
          const int col = t & (cw - 1), lane = t >> shift;
          if (col >= cn) continue;
          for (int i = 0; i < nodes; ++i) {
            const std::int64_t lo = node_lo[i];
            const int n = node_n[2 * i];
            detail::tree::level(n, stride, lane, lanes,
                                [&](int g) -> Scalar& { return tree[((lo + g) << shift) + col]; });
          }
        }
        team.team_barrier();
      }
      const unsigned long long s = ctl[0];
      const std::int64_t half = std::int64_t(s & 1) * gathered * W;
      if (ctl[1] == 0) {
        // Each subtree's sum to its slot on every rank.
        for (int t = me; t < cn * nodes * L.size; t += T) {
          const int col = t % cn, i = (t / cn) % nodes, q = t / (cn * nodes);
          Scalar* const dst = reinterpret_cast<Scalar*>(L.bases[q] + L.data_offset) + half;
          dst[std::int64_t(L.rank * slots + i) * W + c0 + col] = tree[(node_lo[i] << shift) + col];
        }
        team.team_barrier();
        // 3. One system-scope fence after the barrier orders every thread's writes above before the flags
        // (fences are cumulative: cheaper than a fence in every thread with release stores), then the wait
        // for every rank's flag.
        if (me == 0) {
          peer_fence_system();
          for (int q = 0; q < L.size; ++q) {
            peer_store_relaxed(reinterpret_cast<unsigned long long*>(L.bases[q]) + std::int64_t(c) * L.size + L.rank,
                               s);
          }
          const long long start = peer_clock_ns();
          for (int q = 0; q < L.size && ctl[1] == 0; ++q) {
            while (peer_load_acquire(flags + std::int64_t(c) * L.size + q) < s) {
              if (peer_clock_ns() - start > L.timeout_ns) {
                if (Kokkos::atomic_compare_exchange(error, 0, q + 1) == 0) error[1] = static_cast<int>(s);
                ctl[1] = 1;
                break;
              }
            }
          }
        }
        team.team_barrier();
      }
      if (ctl[1] == 0) {
        // The gathered sums of these columns (from L2: the peers wrote them), then the program.
        const Scalar* const in = reinterpret_cast<const Scalar*>(own + L.data_offset) + half;
        for (int t = me; t < (gathered << shift); t += T) {
          const int col = t & (cw - 1), v = t >> shift;
          if (col < cn) vals[(v << shift) + col] = peer_load_l2(in + std::int64_t(v) * W + c0 + col);
        }
        team.team_barrier();
        for (int col = me; col < cn; col += T) {
          detail::tree::run_program([&](int k, int j) { return ops[3 * k + j]; }, steps,
                                    [&](int v) -> Scalar& { return vals[(v << shift) + col]; });
          f(c0 + col, vals[(root << shift) + col]);
        }
      }
      if (me == 0) counters[c] = s;
      team.team_barrier();  // the scratch is the next chunk's
    }
  };
  // Every team must run at once (a team's wait depends on the other ranks only): one team a chunk up to as
  // many as the SMs hold, two an SM where the registers (a 512-thread team would fit) and the shared memory
  // allow it, else each team loops over several chunks. The register test is the kernel's, once a process.
  static const bool two_by_registers =
      compat::light_weight(policy(space, 1, 256)).team_size_max(body, Kokkos::ParallelForTag()) >= 512;
  const bool two = two_by_registers && 2 * (bytes + (256 + 2) * sizeof(double) + 8 + 1024) <=
                                           static_cast<std::size_t>(cuda_device().smem_sm);
  const int resident = two ? 2 : 1;
  const int teams = L.chunks < resident * L.sms ? L.chunks : resident * L.sms;
  // Light-weight (compat::light_weight): the functor holds the trainer's update.
  auto grid = compat::light_weight(policy(space, teams, 256));
  grid.set_scratch_size(0, Kokkos::PerTeam(bytes));
  Kokkos::parallel_for("dpmlp::tree_peer_exchange", grid, body);
}

}  // namespace backend
}  // namespace dpmlp

#endif  // KOKKOS_ENABLE_CUDA
