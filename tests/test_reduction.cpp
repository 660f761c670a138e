// SPDX-License-Identifier: BSD-3-Clause
// The block tree: for every block count and rank count, simulating the ranks on one process, the
// subtree sums the ranks would exchange, finished with the combine program, give bitwise the one-rank sum.
#include <catch2/catch.hpp>

#include <dpmlp/reduction.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace {

// The canonical tree sum of blocks [lo, lo + 2^level) clipped to n, written as the definition says.
float tree_sum(const std::vector<float>& v, std::int64_t lo, int level, std::int64_t n) {
  if (level == 0) return v[lo];
  const std::int64_t half = std::int64_t(1) << (level - 1);
  const float a = tree_sum(v, lo, level - 1, n);
  if (lo + half >= n) return a;
  return a + tree_sum(v, lo + half, level - 1, n);
}

// What the ranks compute, simulated: each rank's local subtree sums (as BlockTreeReducer::reduce_local
// does, in place), gathered in rank order, then the combine program.
template <class T>
T simulate(const std::vector<T>& blocks, std::int64_t rows, std::int64_t block_rows, int size) {
  std::vector<T> values;
  int slots = 0;
  std::vector<dpmlp::BlockTreePlan> plans;
  for (int r = 0; r < size; ++r) plans.emplace_back(rows, block_rows, r, size);
  slots = plans[0].slots();
  values.assign(plans[0].values(), T(0));
  for (int r = 0; r < size; ++r) {
    const auto& plan = plans[r];
    REQUIRE(plan.slots() == slots);
    std::vector<T> local(blocks.begin() + plan.shard().first_block, blocks.begin() + plan.shard().end_block);
    const std::int64_t nl = static_cast<std::int64_t>(local.size());
    int i = 0;
    for (const auto& node : plan.local_nodes()) {
      const std::int64_t lo = node.lo - plan.shard().first_block;
      const std::int64_t hi = std::min(lo + (std::int64_t(1) << node.level), nl);
      for (std::int64_t stride = 1; lo + stride < hi; stride *= 2) {
        for (std::int64_t g = lo; g + stride < hi; g += 2 * stride) local[g] += local[g + stride];
      }
      values[r * slots + i++] = local[lo];
    }
  }
  for (const auto& op : plans[0].program()) values[op.dst] = values[op.a] + values[op.b];
  return values[plans[0].root()];
}

}  // namespace

TEST_CASE("the default block size caps the block count and the partial sums", "[reduction]") {
  using dpmlp::default_block_rows;
  // The seed's model (hidden 32: 1090 sums a block): only the block count binds.
  CHECK(default_block_rows(20000, 1090) == 64);
  CHECK(default_block_rows(20000) == 64);
  CHECK(default_block_rows(1048576, 1090) == 256);  // 4096 blocks
  CHECK(default_block_rows(1048576) == 256);
  // Hidden 256 (8706 sums a block): at most 2^24 sums, so 1024 blocks, not 4096.
  CHECK(default_block_rows(1048576, 8706) == 1024);
  CHECK(default_block_rows(4194304, 8706) == 4096);
  // At most 2048 blocks (the register-resident tensor kernel's default: engine/plan.hpp).
  CHECK(default_block_rows(1048576, 1090, 2048) == 512);
  CHECK(default_block_rows(20000, 1090, 2048) == 64);
  CHECK(default_block_rows(1048576, 8706, 2048) == 1024);
  for (const std::int64_t most : {4096, 2048}) {
    for (const std::int64_t rows : {1, 1000, 20000, 1048576, 4194304, 100000000}) {
      for (const std::int64_t width : {0, 2, 1090, 8706, 1 << 20, (1 << 24) + 1}) {
        const std::int64_t b = default_block_rows(rows, width, most), blocks = (rows + b - 1) / b;
        CHECK(b >= 64);
        CHECK(blocks <= most);
        if (width > 0 && blocks > 1) CHECK(blocks * width <= (std::int64_t(1) << 24));
        // The smallest such size: half of it would break a cap (unless it is the 64-row floor).
        if (b > 64) {
          const std::int64_t more = (rows + b / 2 - 1) / (b / 2);
          CHECK((more > most || (width > 0 && more * width > (std::int64_t(1) << 24))));
        }
      }
    }
  }
}

TEST_CASE("shards are whole blocks, cover every row once, and differ by at most one block", "[reduction]") {
  for (std::int64_t rows : {1, 7, 256, 257, 20000, 100003}) {
    for (std::int64_t block : {1, 3, 16, 256}) {
      for (int size = 1; size <= 8; ++size) {
        std::int64_t next = 0, min_blocks = INT64_MAX, max_blocks = 0;
        for (int r = 0; r < size; ++r) {
          const auto s = dpmlp::make_shard(rows, block, r, size);
          CHECK(s.first_row == next);
          CHECK((s.first_row % block == 0 || s.rows() == 0));
          next = s.end_row;
          min_blocks = std::min(min_blocks, s.local_blocks());
          max_blocks = std::max(max_blocks, s.local_blocks());
        }
        CHECK(next == rows);
        CHECK(max_blocks - min_blocks <= 1);
      }
    }
  }
}

TEST_CASE("the distributed tree sum is bitwise the one-rank tree sum", "[reduction]") {
  std::mt19937 gen(12345);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::int64_t nblocks : {1, 2, 3, 5, 8, 13, 79, 128, 129, 1000}) {
    std::vector<float> blocks(nblocks);
    for (auto& b : blocks) b = dist(gen) * std::pow(10.0f, static_cast<float>(gen() % 7) - 3.0f);
    int top = 0;
    while ((std::int64_t(1) << top) < nblocks) ++top;
    const float reference = tree_sum(blocks, 0, top, nblocks);
    for (int size = 1; size <= 9; ++size) {
      const float got = simulate(blocks, nblocks * 4, 4, size);
      INFO("blocks " << nblocks << ", ranks " << size);
      CHECK(std::memcmp(&got, &reference, sizeof(float)) == 0);
    }
  }
}

TEST_CASE("each rank exchanges O(log blocks) subtree sums", "[reduction]") {
  for (std::int64_t nblocks : {16, 1000, 4096, 100000}) {
    for (int size : {2, 3, 7, 8}) {
      const dpmlp::BlockTreePlan plan(nblocks, 1, 0, size);
      int log2 = 0;
      while ((std::int64_t(1) << log2) < nblocks) ++log2;
      INFO("blocks " << nblocks << ", ranks " << size << ", slots " << plan.slots());
      CHECK(plan.slots() <= 2 * log2 + 2);
    }
  }
}

TEST_CASE("the device reducer matches the simulation on one rank", "[reduction]") {
  using Space = Kokkos::DefaultExecutionSpace;
  const std::int64_t rows = 1000, block = 7;
  const dpmlp::BlockTreePlan plan(rows, block, 0, 1);
  const std::int64_t nb = plan.shard().local_blocks();
  Kokkos::View<double**, Kokkos::LayoutRight, Space::memory_space> partials("partials", nb, 3);
  auto h = Kokkos::create_mirror_view(partials);
  for (std::int64_t b = 0; b < nb; ++b) {
    for (int p = 0; p < 3; ++p) h(b, p) = std::sin(0.37 * b + p) * (p + 1);
  }
  Kokkos::deep_copy(partials, h);
  // reduce() destroys the partials (on a host space h is the partials themselves): the columns first.
  std::vector<std::vector<double>> cols(3, std::vector<double>(nb));
  for (std::int64_t b = 0; b < nb; ++b) {
    for (int p = 0; p < 3; ++p) cols[p][b] = h(b, p);
  }
  dpmlp::BlockTreeReducer<Space, double> reducer(plan, 3, dpmlp::Reduction::reproducible);
  const dpmlp::NoCommunicator none;
  auto total = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reducer.reduce(Space(), partials, none));
  for (int p = 0; p < 3; ++p) {
    const std::vector<double>& col = cols[p];
    double sequential = 0;
    for (std::int64_t b = 0; b < nb; ++b) sequential += col[b];
    CHECK(total(p) == simulate(col, rows, block, 1));  // the same tree: the same bits
    CHECK(total(p) == Approx(sequential).epsilon(1e-12));
  }
}

TEST_CASE("the local reductions (in team scratch, in place, held in registers) give the same bits", "[reduction]") {
  using Space = Kokkos::DefaultExecutionSpace;
  using Matrix = Kokkos::View<double**, Kokkos::LayoutRight, Space::memory_space>;
  // Narrow partial sums over many blocks, and wide ones over few (the blocks of a mini-batch of a deep model):
  // on a GPU, teams of 32, 64, 128 and 256 columns; and subtrees of at most 16 blocks (held in registers),
  // whole (48 rows: 16 blocks) and ragged (39 rows: 13).
  struct Shape {
    std::int64_t rows, width;
  };
  int held_runs = 0;
  for (const Shape shape : {Shape{10000, 37}, Shape{96, 70000}, Shape{96, 140000}, Shape{60, 262200},
                            Shape{48, 140000}, Shape{39, 1000}}) {
    for (int size : {1, 3}) {
      for (int rank : {0, size - 1}) {
        for (auto mode : {dpmlp::Reduction::reproducible, dpmlp::Reduction::fast}) {
          const dpmlp::BlockTreePlan plan(shape.rows, 3, rank, size);
          const std::int64_t nb = plan.shard().local_blocks(), width = shape.width;
          Matrix a("a", nb, width), b("b", nb, width);
          auto h = Kokkos::create_mirror(a);  // not a view of a, which the first path reduces in place
          for (std::int64_t i = 0; i < nb; ++i) {
            for (std::int64_t p = 0; p < width; ++p) h(i, p) = std::sin(0.37 * i + 1.3 * p) * 1e3 + 1.0 / (1 + i);
          }
          Kokkos::deep_copy(a, h);
          Kokkos::deep_copy(b, h);
          dpmlp::BlockTreeReducer<Space, double> reducer(plan, width, mode);
          // A copy of what a path staged (create_mirror always allocates; a mirror *view* of a host View is
          // that View, so on a host space the second path's sums would overwrite the first's).
          const auto staged = [&reducer] {
            auto copy = Kokkos::create_mirror(Kokkos::HostSpace(), reducer.staged());
            Kokkos::deep_copy(copy, reducer.staged());
            return copy;
          };
          reducer.reduce_local_in_place(Space(), a);
          const auto in_place = staged();
          reducer.reduce_local_in_scratch(Space(), b);
          const auto in_scratch = staged();
          INFO("rank " << rank << " of " << size << ", " << (mode == dpmlp::Reduction::fast ? "fast" : "reproducible")
                       << ", " << plan.local_nodes().size() << " subtrees, width " << width);
          REQUIRE(in_place.extent(0) == in_scratch.extent(0));
          CHECK(std::memcmp(in_place.data(), in_scratch.data(), in_place.span() * sizeof(double)) == 0);
          if (reducer.widest_subtree() <= reducer.held_blocks) {
            Matrix c("c", nb, width);
            Kokkos::deep_copy(c, h);
            reducer.reduce_local_held(Space(), c);
            const auto held = staged();
            CHECK(std::memcmp(in_place.data(), held.data(), in_place.span() * sizeof(double)) == 0);
            ++held_runs;
          }
        }
      }
    }
  }
  CHECK(held_runs >= 8);  // the held path ran, whole and ragged, on one rank and on three
}

namespace {
// Stands in for the ranks' allgather on one process: `gathered` receives every simulated rank's staged
// subtree sums, in rank order, as a communicator's allgather would.
template <class Matrix>
struct SimulatedGather {
  std::vector<Matrix> staged;  // one (slots x width) per rank
  template <class Space, class Send, class Gathered>
  void allgather(const Space& space, const Send&, const Gathered& gathered) const {
    std::size_t at = 0;
    for (const auto& m : staged) {
      const auto flat = Kokkos::View<typename Matrix::value_type*, typename Matrix::memory_space>(m.data(), m.span());
      Kokkos::deep_copy(space, Kokkos::subview(gathered, std::make_pair(at, at + m.span())), flat);
      at += m.span();
    }
  }
  template <class... A>
  void allreduce_sum(A&&...) const {}
};
}  // namespace

// Scalar: float (the trainer) and double (the Standardizer's sums; its scratch layout must align doubles).
TEMPLATE_TEST_CASE("the device combine finishes the tree as the simulation does, on every simulated rank",
                   "[reduction]", float, double) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Matrix = Kokkos::View<TestType**, Kokkos::LayoutRight, Space::memory_space>;
  // 300 columns: more than one team of the combine; 2..5 ranks: programs of different lengths.
  const std::int64_t rows = 5000, block = 7, width = 300;
  const std::int64_t nb = (rows + block - 1) / block;
  std::vector<std::vector<float>> cols(width, std::vector<float>(nb));
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
  for (auto& c : cols) {
    for (auto& v : c) v = dist(gen) * std::pow(2.0f, static_cast<float>(static_cast<int>(gen() % 20)) - 10.0f);
  }
  for (int size : {2, 3, 5}) {
    std::vector<dpmlp::BlockTreeReducer<Space, TestType>> reducers;
    SimulatedGather<Matrix> gather;
    std::vector<Matrix> partials;
    for (int r = 0; r < size; ++r) {
      const dpmlp::BlockTreePlan plan(rows, block, r, size);
      const std::int64_t first = plan.shard().first_block, local = plan.shard().local_blocks();
      Matrix m("partials", local, width);
      auto h = Kokkos::create_mirror_view(m);
      for (std::int64_t b = 0; b < local; ++b) {
        for (std::int64_t p = 0; p < width; ++p) h(b, p) = cols[p][first + b];
      }
      Kokkos::deep_copy(m, h);
      partials.push_back(m);
      reducers.emplace_back(plan, width, dpmlp::Reduction::reproducible);
      Matrix copy = Matrix("staged", reducers.back().staged().extent(0), width);
      reducers.back().reduce_local(Space(), m);
      Kokkos::deep_copy(copy, reducers.back().staged());
      gather.staged.push_back(copy);
    }
    for (int r = 0; r < size; ++r) {
      // The reducer's own staging again (reduce() runs reduce_local first), then the gather and the combine.
      Matrix m("partials_again", partials[r].extent(0), width);
      Kokkos::deep_copy(m, partials[r]);
      auto total = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reducers[r].reduce(Space(), m, gather));
      int mismatches = 0;
      for (std::int64_t p = 0; p < width; ++p) {
        const TestType expect = simulate(std::vector<TestType>(cols[p].begin(), cols[p].end()), rows, block, size);
        if (std::memcmp(&expect, &total(p), sizeof(TestType)) != 0) ++mismatches;
      }
      INFO(size << " ranks, rank " << r);
      CHECK(mismatches == 0);
    }
  }
}
