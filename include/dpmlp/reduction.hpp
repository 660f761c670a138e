// SPDX-License-Identifier: BSD-3-Clause
// dpmlp/reduction.hpp: sums over rows whose bits do not depend on how the rows are split over ranks.
//
// The shape of every row reduction is a function of the global row index alone:
//   1. rows are cut into blocks of `block` rows (the last block may be short); each block is reduced in
//      increasing row order, wherever it lives;
//   2. blocks are combined in one fixed binary tree over block indices: node (lo, level) covers blocks
//      [lo, lo + 2^level) and is left + right, or just left where the right child lies past the last block;
//   3. a rank owns a contiguous range of whole blocks. It reduces the largest complete subtrees inside its
//      range (O(log blocks) of them), and the ranks exchange only those subtree sums (one allgather);
//   4. every rank finishes the tree with the same program, so every rank gets the same bits, and the bits
//      are those of a single rank that holds every block.
// docs/design.md explains the choice. Reduction::fast replaces 3-4 by one sum-allreduce of each rank's
// local total: cheaper, but the bits then depend on the rank count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpmlp/detail/async_copy.hpp"
#include "dpmlp/detail/tree_order.hpp"
#include "dpmlp/errors.hpp"
#include "dpmlp/kokkos_compat.hpp"

namespace dpmlp {

enum class Reduction { reproducible, fast };

inline const char* reduction_name(Reduction r) { return r == Reduction::reproducible ? "reproducible" : "fast"; }

// Rows per block when the caller does not choose: 64, doubled until there are at most `most_blocks` blocks
// (4096; the engine plan asks for 2048 where the register-resident tensor kernel runs at every block count:
// engine/plan.hpp) and at most 2^24 per-block partial sums in all (blocks x width, width: the sums a block
// produces, the parameters and the loss), so the partial sums stay small at millions of rows and for wide
// models. A function of the global row count and the model only (never of the rank count). Short blocks keep
// each block's in-order sums short: on a GPU those sums are chains of dependent loads. The second cap matters
// from ~1900 sums a block (hidden 256 of the seed's model: 8706 sums; at 1M rows 1024 blocks instead of 4096),
// where the partial sums and their tree would otherwise take a large share of a step.
inline std::int64_t default_block_rows(std::int64_t global_rows, std::int64_t width = 0,
                                       std::int64_t most_blocks = 4096) {
  constexpr std::int64_t most_sums = std::int64_t(1) << 24;
  std::int64_t block = 64;
  auto blocks = [&] { return (global_rows + block - 1) / block; };
  while (blocks() > most_blocks || (width > 0 && blocks() > 1 && blocks() * width > most_sums)) block *= 2;
  return block;
}

// Which rows a rank owns: whole blocks, as evenly as possible (ranks differ by at most one block).
struct Shard {
  std::int64_t global_rows = 0, block_rows = 1, blocks = 0;
  std::int64_t first_block = 0, end_block = 0;
  std::int64_t first_row = 0, end_row = 0;
  std::int64_t rows() const { return end_row - first_row; }
  std::int64_t local_blocks() const { return end_block - first_block; }
};

inline Shard make_shard(std::int64_t global_rows, std::int64_t block_rows, int rank, int size) {
  if (global_rows <= 0) throw InputError("dpmlp: zero rows");
  if (block_rows <= 0) throw InputError("dpmlp: block_rows must be positive");
  if (size <= 0 || rank < 0 || rank >= size) throw InputError("dpmlp: bad rank/size for a shard");
  Shard s;
  s.global_rows = global_rows;
  s.block_rows = block_rows;
  s.blocks = (global_rows + block_rows - 1) / block_rows;
  const std::int64_t base = s.blocks / size, extra = s.blocks % size;
  s.first_block = rank * base + std::min<std::int64_t>(rank, extra);
  s.end_block = s.first_block + base + (rank < extra ? 1 : 0);
  s.first_row = std::min(s.first_block * block_rows, global_rows);
  s.end_row = std::min(s.end_block * block_rows, global_rows);
  return s;
}

// The host-side plan of the block tree for one shard layout. Every rank builds the same plan (it needs no
// communication: shards are a function of rows, block size and rank count).
class BlockTreePlan {
 public:
  struct Node {
    std::int64_t lo;  // first block
    int level;        // covers blocks [lo, lo + 2^level) clipped to the block count
  };
  // One step of the combine program: value[dst] = value[a] + value[b] (b < 0: value[dst] = value[a]).
  struct Op {
    int dst, a, b;
  };

  BlockTreePlan() = default;
  BlockTreePlan(std::int64_t global_rows, std::int64_t block_rows, int rank, int size)
      : shard_(make_shard(global_rows, block_rows, rank, size)), rank_(rank), size_(size) {
    blocks_ = shard_.blocks;
    top_ = 0;
    while ((std::int64_t(1) << top_) < blocks_) ++top_;
    slots_ = 0;
    std::vector<std::vector<Node>> all(size);
    for (int r = 0; r < size; ++r) {
      const Shard s = make_shard(global_rows, block_rows, r, size);
      all[r] = decompose(s.first_block, s.end_block);
      slots_ = std::max<int>(slots_, static_cast<int>(all[r].size()));
    }
    local_nodes_ = all[rank];
    build_program(all);
  }

  const Shard& shard() const { return shard_; }
  std::int64_t blocks() const { return blocks_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Subtree sums each rank sends (the allgather's per-rank count, in nodes); ranks with fewer pad.
  int slots() const { return slots_; }
  const std::vector<Node>& local_nodes() const { return local_nodes_; }
  // The combine program over values [0, size*slots) (gathered) and [size*slots, values()) (temporaries).
  const std::vector<Op>& program() const { return program_; }
  int values() const { return values_; }
  int root() const { return root_; }

 private:
  // The aligned dyadic nodes that exactly cover [first, end); the rank that holds the last block also
  // covers the empty tail up to 2^top, so that its top node can be a whole clipped subtree.
  std::vector<Node> decompose(std::int64_t first, std::int64_t end) const {
    std::vector<Node> nodes;
    if (first >= end) return nodes;
    const std::int64_t limit = end == blocks_ ? (std::int64_t(1) << top_) : end;
    std::int64_t lo = first;
    while (lo < limit && lo < blocks_) {
      int level = 0;
      // Grow while the node stays aligned and inside [lo, limit).
      while (level < top_ && (lo % (std::int64_t(2) << level)) == 0 && lo + (std::int64_t(2) << level) <= limit) {
        ++level;
      }
      nodes.push_back({lo, level});
      lo += std::int64_t(1) << level;
    }
    return nodes;
  }

  void build_program(const std::vector<std::vector<Node>>& all) {
    // Map each gathered node to its value slot.
    std::vector<std::pair<std::pair<std::int64_t, int>, int>> where;
    for (int r = 0; r < size_; ++r) {
      for (std::size_t i = 0; i < all[r].size(); ++i) {
        where.push_back({{all[r][i].lo, all[r][i].level}, r * slots_ + static_cast<int>(i)});
      }
    }
    std::sort(where.begin(), where.end());
    values_ = size_ * slots_;
    program_.clear();
    root_ = emit(0, top_, where);
  }

  // Returns the value index that holds node (lo, level), emitting the additions that make it.
  int emit(std::int64_t lo, int level,
           const std::vector<std::pair<std::pair<std::int64_t, int>, int>>& where) {
    const auto it = std::lower_bound(where.begin(), where.end(), std::make_pair(std::make_pair(lo, level), -1));
    if (it != where.end() && it->first.first == lo && it->first.second == level) return it->second;
    if (level == 0) throw std::logic_error("dpmlp::BlockTreePlan: a block is owned by no rank");
    const std::int64_t half = std::int64_t(1) << (level - 1);
    const int a = emit(lo, level - 1, where);
    if (lo + half >= blocks_) return a;  // the right subtree is empty: the node is its left child
    const int b = emit(lo + half, level - 1, where);
    program_.push_back({values_, a, b});
    return values_++;
  }

  Shard shard_;
  int rank_ = 0, size_ = 1;
  std::int64_t blocks_ = 0;
  int top_ = 0, slots_ = 0, values_ = 0, root_ = 0;
  std::vector<Node> local_nodes_;
  std::vector<Op> program_;
};

// A one-rank plan never communicates; this stands in for a communicator there (single-device users).
struct NoCommunicator {
  template <class... A>
  void allreduce_sum(A&&...) const {}
  template <class... A>
  void allgather(A&&...) const {}
};

// The device side: reduces per-block partial sums (local_blocks x width, LayoutRight) to the global total
// (width), identical on every rank. Holds its buffers, so a training loop allocates nothing per step.
template <class ExecSpace, class Scalar>
class BlockTreeReducer {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using vector = Kokkos::View<Scalar*, memory_space>;

  BlockTreeReducer() = default;
  BlockTreeReducer(const BlockTreePlan& plan, std::int64_t width, Reduction mode)
      : plan_(plan), width_(width), mode_(mode) {
    const int slots = mode == Reduction::reproducible ? plan.slots() : 1;
    send_ = matrix("dpmlp::tree_send", std::max(slots, 1), width);  // zeroed: unused slots stay zero
    if (plan.size() > 1 && mode == Reduction::reproducible) {
      values_ = matrix("dpmlp::tree_values", plan.values(), width);
      gathered_ = vector(values_.data(), std::int64_t(plan.size()) * slots * width);
    }
    const auto& nodes = plan.local_nodes();
    // The widest subtree this rank sums (fast mode: all its blocks), and how many columns of it a team can
    // hold in scratch (0: too wide; the in-place path runs).
    const std::int64_t local_blocks = plan.shard().local_blocks();
    std::int64_t widest = mode == Reduction::fast ? local_blocks : 0;
    for (const auto& n : nodes) {
      const std::int64_t lo = n.lo - plan.shard().first_block;
      widest = std::max(widest, std::min(std::int64_t(1) << n.level, local_blocks - lo));
    }
    const auto most = static_cast<std::int64_t>(Kokkos::TeamPolicy<ExecSpace>::scratch_size_max(0));
    if (widest > 0) {
      const std::int64_t fit = most / (widest * std::int64_t(sizeof(Scalar)));
      scratch_cols_ = 0;
      for (int c = 32; c >= 1; c /= 2) {  // a power of two: the kernel's lanes are 256 / columns
        if (c <= fit) {
          scratch_cols_ = c;
          break;
        }
      }
      // Wider teams (up to 256 columns, a lane each) where the columns still make some 1024 teams, a GPU's
      // worth: a team's time is mostly its loads' latency and its levels' barriers, so fewer teams in fewer
      // waves finish sooner (many short subtrees over a wide model: the blocks of a mini-batch). The levels'
      // pairs are the same whatever the lanes, so the bits are too.
      for (int c = 256; c > scratch_cols_; c /= 2) {
        if (c <= fit && (width + c - 1) / c >= 1024) {
          scratch_cols_ = c;
          break;
        }
      }
      scratch_rows_ = widest;
    }
    // The combine's columns a team holds in scratch: every value of the program (gathered and temporary)
    // for each, and the program itself (0: too many values; the combine then runs in global memory).
    if (plan.size() > 1 && mode == Reduction::reproducible) {
      for (int c = 256; c >= 32 && combine_cols_ == 0; c /= 2) {
        if (static_cast<std::int64_t>(combine_scratch_bytes(c)) <= most) combine_cols_ = c;
      }
    }
    node_lo_ = Kokkos::View<std::int64_t*, memory_space>("dpmlp::tree_node_lo", nodes.size());
    node_level_ = Kokkos::View<int*, memory_space>("dpmlp::tree_node_level", nodes.size());
    auto hlo = Kokkos::create_mirror_view(node_lo_);
    auto hlevel = Kokkos::create_mirror_view(node_level_);
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      hlo(i) = nodes[i].lo - plan.shard().first_block;  // local block index
      hlevel(i) = nodes[i].level;
    }
    Kokkos::deep_copy(node_lo_, hlo);
    Kokkos::deep_copy(node_level_, hlevel);
    const auto& prog = plan.program();
    program_ = Kokkos::View<int* [3], memory_space>("dpmlp::tree_program", prog.size());
    auto hp = Kokkos::create_mirror_view(program_);
    for (std::size_t i = 0; i < prog.size(); ++i) {
      hp(i, 0) = prog[i].dst;
      hp(i, 1) = prog[i].a;
      hp(i, 2) = prog[i].b;
    }
    Kokkos::deep_copy(program_, hp);
  }

  const BlockTreePlan& plan() const { return plan_; }
  std::int64_t width() const { return width_; }
  Reduction mode() const { return mode_; }
  // The device copies of this rank's subtrees (first local block, level) and of the combine program (the
  // peer exchange, backend/cuda/peer.hpp, runs the same tree from them).
  const Kokkos::View<std::int64_t*, memory_space>& node_lo() const { return node_lo_; }
  const Kokkos::View<int*, memory_space>& node_level() const { return node_level_; }
  const Kokkos::View<int* [3], memory_space>& program() const { return program_; }
  // The longest local subtree, in blocks (reproducible mode; 0 without local blocks): the tree's levels run
  // while a pair of it is left.
  std::int64_t widest_subtree() const { return scratch_rows_; }

  // partials: this rank's blocks (local_blocks x width); destroyed (reduced in place). Returns a View that
  // holds the global total once the work enqueued on `space` (and, for a stream-ordered communicator, the
  // collective) has run. With a host-synchronous communicator the collective has completed on return.
  template <class Comm>
  vector reduce(const ExecSpace& space, const matrix& partials, const Comm& comm) const {
    reduce_apply(space, partials, comm, NoApply{});
    return uses_tree() ? Kokkos::subview(values_, plan_.root(), Kokkos::ALL) : Kokkos::subview(send_, 0, Kokkos::ALL);
  }

  // As reduce, then f(p, total_p) for every column p, in the same kernel as the tree's last combine (one
  // launch fewer a step: the trainer applies its optimizer update here). f is a device functor.
  template <class Comm, class F>
  void reduce_apply(const ExecSpace& space, const matrix& partials, const Comm& comm, const F& f) const {
    if (plan_.size() == 1 && local_subtrees() == 1) {
      // One rank, one tree: its root is the total, and f runs where the tree ends (one launch fewer).
      switch (local_kernel()) {
        case LocalKernel::held: return reduce_local_held(space, partials, f);
        case LocalKernel::in_scratch: return reduce_local_in_scratch(space, partials, f);
        case LocalKernel::in_place: break;  // takes no f: the combine applies it
      }
    }
    reduce_local(space, partials);
    if (uses_tree()) {
      comm.allgather(space, vector(send_.data(), send_.span()), gathered_);
    } else if (plan_.size() > 1) {
      comm.allreduce_sum(space, vector(Kokkos::subview(send_, 0, Kokkos::ALL)));
    }
    combine_apply(space, f);
  }

  bool uses_tree() const { return plan_.size() > 1 && mode_ == Reduction::reproducible; }
  // The subtrees this rank sums: its local nodes; fast mode sums all local blocks as one tree into slot 0.
  int local_subtrees() const {
    if (mode_ == Reduction::fast) return plan_.shard().local_blocks() > 0 ? 1 : 0;
    return static_cast<int>(plan_.local_nodes().size());
  }
  // What reduce_local staged for the collective: this rank's subtree sums, one slot a row.
  const matrix& staged() const { return send_; }

  struct NoApply {
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t, Scalar) const {}
  };

  // Where this rank's subtrees lie among its blocks, for the local kernels (copied into them by value):
  // subtree i covers blocks [first(i), first(i) + blocks(i)). Fast mode: one subtree of all local blocks.
  struct Subtrees {
    Kokkos::View<std::int64_t*, memory_space> lo;
    Kokkos::View<int*, memory_space> level;
    std::int64_t local_blocks = 0;
    bool fast = false;
    int count = 0;
    KOKKOS_INLINE_FUNCTION std::int64_t first(int i) const { return fast ? 0 : lo(i); }
    KOKKOS_INLINE_FUNCTION std::int64_t blocks(int i) const {
      const std::int64_t l = first(i), span = fast ? local_blocks : (std::int64_t(1) << level(i));
      return l + span < local_blocks ? span : local_blocks - l;
    }
  };
  Subtrees subtrees() const {
    return Subtrees{node_lo_, node_level_, plan_.shard().local_blocks(), mode_ == Reduction::fast, local_subtrees()};
  }

  // The most blocks a subtree may have for reduce_local_held: one thread holds them all in registers.
  static constexpr int held_blocks = 16;

  // Which kernel sums the local subtrees on a device space (host spaces run reduce_local_host, which
  // reduce_local_in_scratch also redirects to): in registers where every subtree fits, else in team scratch
  // where a team's scratch holds a subtree's columns, else in place.
  enum class LocalKernel { held, in_scratch, in_place };
  LocalKernel local_kernel() const {
    if (!is_host_space<ExecSpace>() && scratch_rows_ <= held_blocks) return LocalKernel::held;
    return scratch_cols_ > 0 ? LocalKernel::in_scratch : LocalKernel::in_place;
  }

 // Public only because CUDA's extended lambdas may not live in private member functions.
  // Sums each local subtree in the canonical shape, in place, then stages the subtree sums in send_ (unused
  // slots zero). Fast mode sums all local blocks into slot 0.
  void reduce_local(const ExecSpace& space, const matrix& partials) const {
    if constexpr (is_host_space<ExecSpace>()) {
      reduce_local_host(space, partials);
      return;
    }
    switch (local_kernel()) {
      case LocalKernel::held: reduce_local_held(space, partials); break;
      case LocalKernel::in_scratch: reduce_local_in_scratch(space, partials); break;
      case LocalKernel::in_place: reduce_local_in_place(space, partials); break;
    }
  }

  // Subtrees of at most held_blocks blocks (the blocks of a mini-batch, or of a rank's share of one): a thread
  // a column holds each subtree's values in registers, every load in flight at once, and sums them pairwise
  // there (detail::tree::sum_held: the levels' pairs in the same order as reduce_local_in_place, so the same
  // bits), with no scratch and no barriers. With f, as reduce_local_in_scratch. Any space (the trainer takes
  // it on device spaces; host spaces run reduce_local_host).
  template <class F = NoApply>
  void reduce_local_held(const ExecSpace& space, const matrix& partials, const F& f = F()) const {
    const Subtrees st = subtrees();
    if (st.count == 0) return;  // unused slots were zeroed once, at construction
    if (scratch_rows_ > held_blocks) throw std::logic_error("dpmlp::BlockTreeReducer: a subtree too wide to hold");
    const auto P = partials;
    const auto send = send_;
    Kokkos::parallel_for(
        "dpmlp::tree_reduce_local_held", compat::light_weight(Kokkos::RangePolicy<ExecSpace>(space, 0, width_)),
        KOKKOS_LAMBDA(const std::int64_t c) {
          for (int i = 0; i < st.count; ++i) {
            const std::int64_t lo = st.first(i);
            const int n = static_cast<int>(st.blocks(i));
            Scalar v[held_blocks];
            DPMLP_TREE_UNROLL
            for (int b = 0; b < held_blocks; ++b) v[b] = b < n ? P(lo + b, c) : Scalar(0);
            if (n == held_blocks) {
              detail::tree::sum_held<true>(v, n);
            } else {
              detail::tree::sum_held<false>(v, n);
            }
            send(i, c) = v[0];
            f(c, v[0]);
          }
        });
  }

  // One team per (subtree, chunk of columns): the team copies the subtree's rows of its columns into team
  // scratch with every load in flight at once, sums them level by level there (the same pairs, in the same
  // order, as reduce_local_in_place: the same bits), and writes the sum to its slot. On a GPU the levels'
  // barriers then wait on shared memory instead of on global memory.
  // With f (one rank, one subtree: reduce_apply), f(p, total_p) for every column as the sums are written.
  template <class F = NoApply>
  void reduce_local_in_scratch(const ExecSpace& space, const matrix& partials, const F& f = F()) const {
    if constexpr (is_host_space<ExecSpace>()) return reduce_local_host(space, partials, f);
    if (scratch_cols_ == 0) return reduce_local_in_place(space, partials);  // wider than a team's scratch
    using policy = Kokkos::TeamPolicy<ExecSpace>;
    using member = typename policy::member_type;
    const auto P = partials;
    const auto send = send_;
    const Subtrees st = subtrees();
    const int nodes = st.count;
    const std::int64_t W = width_;
    const int cw_max = scratch_cols_;
    const std::int64_t chunks = (W + cw_max - 1) / cw_max;
    const std::size_t bytes = static_cast<std::size_t>(scratch_rows_) * cw_max * sizeof(Scalar);
    // Unused slots (fewer subtrees than the widest rank has) were zeroed once, at construction.
    if (nodes == 0) return;
    // A team is lanes x cw_max threads: thread (lane, c) owns column c0 + c and every lanes-th row, so no
    // index needs a division (cw_max is a power of two; a 64-bit division costs ~100 GPU instructions).
    const int team_size = is_host_space<ExecSpace>() ? 1 : 256;
    // Light-weight: with f (the trainer's update) the functor passes 512 bytes (compat::light_weight).
    auto pol = compat::light_weight(policy(space, static_cast<int>(nodes * chunks), team_size));
    pol.set_scratch_size(0, Kokkos::PerTeam(bytes));
    Kokkos::parallel_for(
        "dpmlp::tree_reduce_local", pol, KOKKOS_LAMBDA(const member& team) {
          const int i = static_cast<int>(team.league_rank() / chunks);
          const std::int64_t c0 = (team.league_rank() % chunks) * cw_max;
          const int cw = W - c0 < cw_max ? static_cast<int>(W - c0) : cw_max;
          const std::int64_t lo = st.first(i);
          const int n = static_cast<int>(st.blocks(i));
          Scalar* sh = static_cast<Scalar*>(team.team_scratch(0).get_shmem(bytes));
          // Logical threads (lane, c), cw_max of them a lane; a short team loops over them. A thread's copies
          // are all in flight at once (detail::async_copy: cp.async on GPUs that have it): loads into
          // registers then stores were interleaved by ptxas, one memory latency every few values.
          const int lanes = 256 / cw_max;
          for (int t = team.team_rank(); t < 256; t += team.team_size()) {
            const int c = t & (cw_max - 1), lane = t / cw_max;
            if (c >= cw) continue;
            for (int b = lane; b < n; b += lanes) detail::async_copy(&sh[b * cw_max + c], &P(lo + b, c0 + c));
          }
          detail::async_copy_wait();
          team.team_barrier();
          for (int stride = 1; stride < n; stride *= 2) {
            for (int t = team.team_rank(); t < 256; t += team.team_size()) {
              const int c = t & (cw_max - 1), lane = t / cw_max;
              if (c >= cw) continue;
              detail::tree::level(n, stride, lane, lanes, [&](int g) -> Scalar& { return sh[g * cw_max + c]; });
            }
            team.team_barrier();
          }
          for (int c = team.team_rank(); c < cw; c += team.team_size()) {
            send(i, c0 + c) = sh[c];
            f(c0 + c, sh[c]);
          }
        });
  }

  // Host spaces: in place, a thread a chunk of columns, each level's pairs row by row, so that the adds run
  // along a row's contiguous columns (vectorized) and a chunk of every block's row stays in cache. The same
  // pairs in the same order as the kernels above, so the same bits. With f, as reduce_local_in_scratch.
  template <class F = NoApply>
  void reduce_local_host(const ExecSpace& space, const matrix& partials, const F& f = F()) const {
    const auto P = partials;
    const auto send = send_;
    const Subtrees st = subtrees();
    const int nodes = st.count;
    const int slots = static_cast<int>(send_.extent(0));
    const std::int64_t W = width_;
    constexpr std::int64_t chunk = 512;
    const std::int64_t chunks = (W + chunk - 1) / chunk;
    Kokkos::parallel_for(
        "dpmlp::tree_reduce_local_host", Kokkos::RangePolicy<ExecSpace>(space, 0, chunks), [=](const std::int64_t k) {
          const std::int64_t c0 = k * chunk, c1 = c0 + chunk < W ? c0 + chunk : W;
          for (int i = 0; i < nodes; ++i) {
            const std::int64_t lo = st.first(i), n = st.blocks(i);
            for (std::int64_t stride = 1; stride < n; stride *= 2) {
              for (std::int64_t g = 0; g + stride < n; g += 2 * stride) {
                Scalar* dst = &P(lo + g, 0);
                const Scalar* src = &P(lo + g + stride, 0);
                for (std::int64_t c = c0; c < c1; ++c) dst[c] += src[c];
              }
            }
            for (std::int64_t c = c0; c < c1; ++c) {
              send(i, c) = P(lo, c);
              f(c, P(lo, c));
            }
          }
          for (int sl = nodes; sl < slots; ++sl) {
            for (std::int64_t c = c0; c < c1; ++c) send(sl, c) = Scalar(0);
          }
        });
  }

  void reduce_local_in_place(const ExecSpace& space, const matrix& partials) const {
    using policy = Kokkos::TeamPolicy<ExecSpace>;
    using member = typename policy::member_type;
    const auto P = partials;
    const auto send = send_;
    const Subtrees st = subtrees();
    const int nodes = st.count;
    const int slots = static_cast<int>(send_.extent(0));
    const std::int64_t W = width_;
    constexpr int chunk = 32;  // columns a team owns: a warp's worth of consecutive addresses
    // One team per chunk of columns. At each tree level the team's threads share the level's pair sums,
    // then meet at a barrier: the sums are those of the canonical tree whatever the team size, and a level
    // of thousands of blocks runs in parallel instead of as one thread's chain of dependent loads.
    Kokkos::parallel_for(
        "dpmlp::tree_reduce_local", policy(space, static_cast<int>((W + chunk - 1) / chunk), Kokkos::AUTO),
        KOKKOS_LAMBDA(const member& team) {
          const std::int64_t c0 = std::int64_t(team.league_rank()) * chunk;
          const int cw = W - c0 < chunk ? static_cast<int>(W - c0) : chunk;
          const int T = team.team_size(), me = team.team_rank();
          for (int i = 0; i < nodes; ++i) {
            const std::int64_t lo = st.first(i), hi = lo + st.blocks(i);
            for (std::int64_t stride = 1; lo + stride < hi; stride *= 2) {
              const std::int64_t pairs = detail::tree::level_pairs(hi - lo, stride);
              for (std::int64_t w = me; w < pairs * cw; w += T) {
                const std::int64_t g = lo + 2 * stride * (w / cw);
                const std::int64_t c = c0 + w % cw;
                P(g, c) += P(g + stride, c);
              }
              team.team_barrier();
            }
            for (int x = me; x < cw; x += T) send(i, c0 + x) = P(lo, c0 + x);
          }
          for (int s = nodes; s < slots; ++s) {
            for (int x = me; x < cw; x += T) send(s, c0 + x) = Scalar(0);
          }
        });
  }

  // Runs the combine program (the tree above the ranks' subtrees) column by column, then f(p, total_p).
  template <class F>
  void combine_apply(const ExecSpace& space, const F& f) const {
    if (std::is_same<F, NoApply>::value && !uses_tree()) return;
    if (uses_tree() && combine_cols_ > 0) return combine_apply_in_scratch(space, f);
    combine_apply_in_place(space, f);
  }

  // The same, a team a chunk of columns: the program and the chunk's gathered values are staged in team
  // scratch (every load in flight at once), and the program's chain of dependent additions runs there. In
  // global memory each of its steps waits out a load of the step and of its operands. The same additions in
  // the same order: the same bits.
  template <class F>
  void combine_apply_in_scratch(const ExecSpace& space, const F& f) const {
    using policy = Kokkos::TeamPolicy<ExecSpace>;
    using member = typename policy::member_type;
    const auto V = values_;
    const auto prog = program_;
    const int steps = static_cast<int>(program_.extent(0));
    const int gathered = plan_.size() * static_cast<int>(send_.extent(0));
    const int root = plan_.root();
    const int cols = combine_cols_;
    const std::int64_t W = width_;
    const int values = plan_.values();
    const std::size_t bytes = combine_scratch_bytes(cols);
    auto pol = compat::light_weight(policy(space, static_cast<int>((W + cols - 1) / cols),
                                           is_host_space<ExecSpace>() ? 1 : cols));  // f: the update
    pol.set_scratch_size(0, Kokkos::PerTeam(bytes));
    Kokkos::parallel_for(
        "dpmlp::tree_combine", pol, KOKKOS_LAMBDA(const member& team) {
          // The values first: an odd step count would misalign a double placed after the ints.
          char* const raw = static_cast<char*>(team.team_scratch(0).get_shmem(bytes));
          Scalar* const sh = reinterpret_cast<Scalar*>(raw);
          int* const ops = reinterpret_cast<int*>(raw + std::size_t(cols) * values * sizeof(Scalar));
          for (int i = team.team_rank(); i < steps * 3; i += team.team_size()) ops[i] = prog(i / 3, i % 3);
          const std::int64_t p0 = std::int64_t(team.league_rank()) * cols;
          // Column p0 + t's values are sh[v * cols + t]; each thread's columns are its own (no barrier for them).
          for (int t = team.team_rank(); t < cols; t += team.team_size()) {
            if (p0 + t >= W) continue;
            constexpr int batch = 8;
            for (int v0 = 0; v0 < gathered; v0 += batch) {
              Scalar x[batch];
              for (int j = 0; j < batch; ++j) x[j] = v0 + j < gathered ? V(v0 + j, p0 + t) : Scalar(0);
              for (int j = 0; j < batch; ++j) {
                if (v0 + j < gathered) sh[(v0 + j) * cols + t] = x[j];
              }
            }
          }
          team.team_barrier();  // the program is in
          for (int t = team.team_rank(); t < cols; t += team.team_size()) {
            const std::int64_t p = p0 + t;
            if (p >= W) continue;
            detail::tree::run_program([&](int s, int j) { return ops[3 * s + j]; }, steps,
                                      [&](int v) -> Scalar& { return sh[v * cols + t]; });
            const Scalar total = sh[root * cols + t];
            V(root, p) = total;  // reduce() returns the root's row
            f(p, total);
          }
        });
  }

  // combine_apply_in_scratch's team scratch for `cols` columns: every value of the program for each (first,
  // so doubles stay aligned), then the program's steps (three ints each).
  std::size_t combine_scratch_bytes(int cols) const {
    return std::size_t(cols) * plan_.values() * sizeof(Scalar) + plan_.program().size() * 3 * sizeof(int);
  }

  template <class F>
  void combine_apply_in_place(const ExecSpace& space, const F& f) const {
    const auto V = values_;
    const auto prog = program_;
    const auto send = send_;
    const bool tree = uses_tree();
    const int steps = tree ? static_cast<int>(program_.extent(0)) : 0;
    const int root = plan_.root();
    Kokkos::parallel_for(
        "dpmlp::tree_combine", compat::light_weight(Kokkos::RangePolicy<ExecSpace>(space, 0, width_)),
        KOKKOS_LAMBDA(const std::int64_t p) {
          detail::tree::run_program(prog, steps, [&](int v) -> Scalar& { return V(v, p); });
          f(p, tree ? V(root, p) : send(0, p));
        });
  }

 private:
  BlockTreePlan plan_;
  std::int64_t width_ = 0;
  Reduction mode_ = Reduction::reproducible;
  int scratch_cols_ = 0;          // columns a team of reduce_local_in_scratch holds (0: in place)
  int combine_cols_ = 0;          // columns a team of combine_apply_in_scratch holds (0: in global memory)
  std::int64_t scratch_rows_ = 0;  // the widest subtree, in blocks
  matrix send_, values_;
  vector gathered_;
  Kokkos::View<std::int64_t*, memory_space> node_lo_;
  Kokkos::View<int*, memory_space> node_level_;
  Kokkos::View<int* [3], memory_space> program_;
};

namespace detail {
template <class V>
KOKKOS_INLINE_FUNCTION std::enable_if_t<V::rank == 1, double> row_value(const V& v, std::int64_t r, std::int64_t) {
  return static_cast<double>(v(r));
}
template <class V>
KOKKOS_INLINE_FUNCTION std::enable_if_t<V::rank == 2, double> row_value(const V& v, std::int64_t r, std::int64_t p) {
  return static_cast<double>(v(r, p));
}
}  // namespace detail

// The reproducible sum over all ranks' rows of row_values (this rank's shard rows x width, or rank 1: one
// value a row), returned on the host. Collective. Used for the Standardizer checksum.
template <class ExecSpace, class Comm, class Values>
std::vector<double> reproducible_row_sum(const ExecSpace& space, const Comm& comm, const BlockTreePlan& plan,
                                         const Values& row_values) {
  using memory_space = typename ExecSpace::memory_space;
  const std::int64_t rows = plan.shard().rows(), block = plan.shard().block_rows;
  if (static_cast<std::int64_t>(row_values.extent(0)) != rows) {
    throw InputError("dpmlp::reproducible_row_sum: " + std::to_string(row_values.extent(0)) +
                     " row values for a shard of " + std::to_string(rows) + " rows");
  }
  const std::int64_t width = Values::rank == 1 ? 1 : static_cast<std::int64_t>(row_values.extent(1));
  Kokkos::View<double**, Kokkos::LayoutRight, memory_space> partials("dpmlp::row_sum_partials",
                                                                      plan.shard().local_blocks(), width);
  const auto v = row_values;
  Kokkos::parallel_for(
      "dpmlp::row_sum_blocks", Kokkos::RangePolicy<ExecSpace>(space, 0, plan.shard().local_blocks() * width),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t b = idx / width, p = idx % width;
        const std::int64_t end = (b + 1) * block < rows ? (b + 1) * block : rows;
        double acc = 0.0;
        for (std::int64_t r = b * block; r < end; ++r) acc += detail::row_value(v, r, p);
        partials(b, p) = acc;
      });
  BlockTreeReducer<ExecSpace, double> reducer(plan, width, Reduction::reproducible);
  const auto total = reducer.reduce(space, partials, comm);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), total);
  return std::vector<double>(host.data(), host.data() + width);
}

}  // namespace dpmlp
