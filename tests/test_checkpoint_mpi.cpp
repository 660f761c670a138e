// SPDX-License-Identifier: BSD-3-Clause
// Checkpoints (dpmlp/checkpoint.hpp), at 1, 2 and 3 ranks:
//   - a run resumed from step k ends at step n with BITWISE the parameters (and optimizer state) of a run
//     that was never interrupted, for Sgd, Sgd with momentum and Adam (whose state matters), in float32 and
//     float64, and a checkpoint written at N ranks resumes on one rank with the same bits;
//   - the file is the documented format (decoded here independently of the library);
//   - every bad file (truncated, flipped byte, wrong version/magic/scalar type, another model or optimizer,
//     missing) and every unwritable path throws InputError on EVERY rank, with the same message, and leaves
//     the trainer's parameters, optimizer state and step count unchanged.
// Only rank 0 touches files; the other ranks learn the outcome from the library (that is what is tested).
#include <catch2/catch.hpp>

#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <dpmlp/checkpoint.hpp>
#include <dpmlp/dpmlp.hpp>

#include "mpi_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using ExecSpace = Kokkos::DefaultExecutionSpace;
using Memory = ExecSpace::memory_space;
using Comm = dpmlp::MpiCommunicator;
template <class Opt, class Scalar = float>
using Trainer = dpmlp::DataParallelTrainer<ExecSpace, Comm, Opt, Scalar>;

constexpr std::int64_t kRows = 257;  // not a multiple of the block: the last block is short
const std::vector<int> kWidths = {8, 16, 1};

dpmlp::TrainerOptions small_blocks() {
  dpmlp::TrainerOptions o;
  o.block_rows = 16;  // 17 blocks: every rank count here gets several blocks
  return o;
}

// One trainer on a synthetic regression problem: x ~ N(0, 1), y ~ N(0, 1), each rank drawing only its own
// rows (random::normal range draws), so the global data set is the same at any rank count.
template <class Opt, class Scalar = float>
struct Run {
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, Memory>;
  using flat = Kokkos::View<Scalar*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  Run(const Opt& opt, std::uint64_t init_seed = 1, std::vector<int> widths = kWidths,
      dpmlp::Activation act = dpmlp::Activation::relu, MPI_Comm comm = MPI_COMM_WORLD)
      : model(init(widths, act, init_seed)), trainer(comm, model, kRows, opt, small_blocks()) {
    const dpmlp::Shard s = trainer.shard();
    const int in = widths.front(), out = widths.back();
    x = matrix("x", s.rows(), in);
    y = matrix("y", s.rows(), out);
    const auto keys = dpmlp::random::split(dpmlp::random::PRNGKey(7), 2);
    ExecSpace space;
    dpmlp::random::normal(space, keys[0], flat(x.data(), x.span()), std::uint64_t(s.first_row * in));
    dpmlp::random::normal(space, keys[1], flat(y.data(), y.span()), std::uint64_t(s.first_row * out));
    dpmlp::compat::fence(space, "test_checkpoint: data");
    trainer.set_data(x, y);
  }

  static dpmlp::Mlp<Scalar, Memory> init(const std::vector<int>& widths, dpmlp::Activation act,
                                         std::uint64_t seed) {
    dpmlp::Mlp<Scalar, Memory> m(widths, act);
    m.init_jax(dpmlp::random::PRNGKey(seed), Scalar(0.3));
    return m;
  }

  dpmlp::Mlp<Scalar, Memory> model;
  Trainer<Opt, Scalar> trainer;
  matrix x, y;
};

template <class View>
std::vector<unsigned char> bytes_of(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  const auto* p = reinterpret_cast<const unsigned char*>(h.data());
  return std::vector<unsigned char>(p, p + h.span() * sizeof(typename View::non_const_value_type));
}

// Everything a checkpoint restores.
struct Snapshot {
  std::vector<unsigned char> params, state;
  std::int64_t steps = -1;
  bool operator==(const Snapshot& o) const {
    return params == o.params && state == o.state && steps == o.steps;
  }
};

template <class T>
Snapshot snapshot(const T& t) {
  return Snapshot{bytes_of(t.model().params()), bytes_of(t.optimizer_state()), t.steps_done()};
}

// True on every rank when every rank passes the same text (compared by digest).
bool same_on_all_ranks(const std::string& text) {
  const std::uint64_t h = dpmlp::fnv1a64(text.data(), text.size());
  std::uint64_t lo = h, hi = h;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

bool same_on_all_ranks(const std::vector<unsigned char>& bytes) {
  return same_on_all_ranks(std::string(bytes.begin(), bytes.end()));
}

// A directory for this test case's files: rank 0 makes it and tells the others its name (only rank 0 uses
// it, but the paths passed to the collective calls are the same everywhere); removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string name;
    if (dpmlp_test::rank() == 0) {
      const char* base = std::getenv("TMPDIR");
      std::string pattern = std::string(base && *base ? base : "/tmp") + "/dpmlp_ckpt_" +
                            std::to_string(static_cast<long long>(::getpid())) + "_XXXXXX";
      if (::mkdtemp(&pattern[0])) name = pattern;
    }
    int length = static_cast<int>(name.size());
    MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
    name.resize(static_cast<std::size_t>(length));
    MPI_Bcast(&name[0], length, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ignored;
    if (dpmlp_test::rank() == 0 && !path_.empty()) fs::remove_all(path_, ignored);
  }
  bool ok() const { return !path_.empty(); }
  std::string file(const std::string& leaf) const { return path_ + "/" + leaf; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<unsigned char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Rank 0: a copy of `from` changed by `edit`, written to `to`.
template <class F>
void rank0_edit(const std::string& from, const std::string& to, F&& edit) {
  if (dpmlp_test::rank() != 0) return;
  auto bytes = read_all(from);
  edit(bytes);
  write_all(to, bytes);
}

// The temporary files save_checkpoint may leave behind (it must leave none).
int leftover_tmp_files(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  }
  return n;
}

struct Outcome {
  bool input_error = false;
  std::string message, other;
};

template <class F>
Outcome outcome_of(F&& f) {
  Outcome o;
  try {
    f();
  } catch (const dpmlp::InputError& e) {
    o.input_error = true;
    o.message = e.what();
  } catch (const std::exception& e) {
    o.other = e.what();
  }
  return o;
}

// The library must refuse on EVERY rank, with one message (agree() carries rank 0's reason to all).
void check_refused_everywhere(const Outcome& o, const std::vector<std::string>& needles) {
  INFO("message: " << o.message);
  CHECK(o.other.empty());
  CHECK(o.input_error);
  for (const auto& n : needles) CHECK_THAT(o.message, Catch::Contains(n));
  const bool everywhere = dpmlp_test::all(o.input_error);
  CHECK(everywhere);
  const bool same = same_on_all_ranks(o.message);
  CHECK(same);
}

template <class Opt, class Scalar = float>
void check_bitwise_resume(const Opt& opt, const TempDir& dir, const std::string& leaf) {
  constexpr int n = 12, k = 5;
  const std::string path = dir.file(leaf);

  Run<Opt, Scalar> whole(opt);
  whole.trainer.train(n);
  const Snapshot end = snapshot(whole.trainer);
  CHECK(end.steps == n);

  Run<Opt, Scalar> first(opt);
  first.trainer.train(k);
  dpmlp::save_checkpoint(first.trainer, path);
  const Snapshot at_k = snapshot(first.trainer);

  // A trainer that starts elsewhere (another initialization, another step count) is fully overwritten.
  Run<Opt, Scalar> resumed(opt, /*init_seed=*/99);
  resumed.trainer.train(1);
  dpmlp::load_checkpoint(resumed.trainer, path);
  CHECK(snapshot(resumed.trainer) == at_k);
  CHECK(resumed.trainer.steps_done() == k);
  resumed.trainer.train(3);  // the rest in two calls: train() boundaries must not matter either
  resumed.trainer.train(n - k - 3);
  const Snapshot after = snapshot(resumed.trainer);
  CHECK(after.steps == n);
  CHECK((after.params == end.params));  // bitwise
  CHECK((after.state == end.state));
  CHECK(dpmlp::params_digest(resumed.trainer) == dpmlp::params_digest(whole.trainer));
  const bool replicas_agree = same_on_all_ranks(after.params);
  CHECK(replicas_agree);

  // The test can tell: resuming the parameters without the optimizer state (or the step count, which Adam's
  // bias correction uses) ends elsewhere.
  if (!at_k.state.empty()) {
    Run<Opt, Scalar> stateless(opt, 99);
    dpmlp::load_checkpoint(stateless.trainer, path);
    Kokkos::deep_copy(stateless.trainer.optimizer_state(), Scalar(0));
    stateless.trainer.train(n - k);
    CHECK((snapshot(stateless.trainer).params != end.params));
  }
}

}  // namespace

TEST_CASE("a resumed run is bitwise the uninterrupted run (Sgd, Sgd+momentum, Adam; f32, f64)",
          "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  SECTION("sgd") { check_bitwise_resume(dpmlp::Sgd(0.05), dir, "sgd.ckpt"); }
  SECTION("sgd with momentum") { check_bitwise_resume(dpmlp::Sgd(0.02, 0.9), dir, "momentum.ckpt"); }
  SECTION("adam") { check_bitwise_resume(dpmlp::Adam(0.01), dir, "adam.ckpt"); }
  SECTION("sgd with momentum, float64") {
    check_bitwise_resume<dpmlp::Sgd, double>(dpmlp::Sgd(0.02, 0.9), dir, "momentum64.ckpt");
  }
  SECTION("adam, float64") {
    check_bitwise_resume<dpmlp::Adam, double>(dpmlp::Adam(0.01), dir, "adam64.ckpt");
  }
  CHECK((dpmlp_test::rank() != 0 || leftover_tmp_files(dir.path()) == 0));
}

TEST_CASE("a checkpoint written at N ranks resumes on one rank with the same bits", "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  const dpmlp::Adam opt(0.01);
  constexpr int n = 10, k = 4;
  Run<dpmlp::Adam> whole(opt);
  whole.trainer.train(n);
  const Snapshot end = snapshot(whole.trainer);
  Run<dpmlp::Adam> first(opt);
  first.trainer.train(k);
  dpmlp::save_checkpoint(first.trainer, dir.file("adam.ckpt"));

  // Rank 0 alone (MPI_COMM_SELF: the shard is every row) loads the N-rank checkpoint and finishes the run.
  // Reproducible reductions make the bits independent of the rank count, so it must end where the N-rank
  // run ended. Nothing here may throw past the other ranks, so failures are recorded, then checked.
  std::string error;
  bool same = true;
  if (dpmlp_test::rank() == 0) {
    try {
      Run<dpmlp::Adam> alone(opt, 99, kWidths, dpmlp::Activation::relu, MPI_COMM_SELF);
      dpmlp::load_checkpoint(alone.trainer, dir.file("adam.ckpt"));
      alone.trainer.train(n - k);
      same = snapshot(alone.trainer) == end;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  CHECK(error.empty());
  CHECK(same);
  CHECK(dpmlp_test::all(same && error.empty()));
}

TEST_CASE("after a TrainingError, loading the last checkpoint resumes bitwise", "[mpi][checkpoint]") {
  // The recovery docs/reliability.md describes: a run diverges, the job reloads its last checkpoint and goes
  // on. Adam, because its update depends on the step number, which the failed call must not leave skewed.
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  const dpmlp::Adam opt(0.01);
  constexpr int n = 10, k = 4;
  Run<dpmlp::Adam> whole(opt);
  whole.trainer.train(n);
  const Snapshot end = snapshot(whole.trainer);

  Run<dpmlp::Adam> run(opt);
  run.trainer.train(k);
  const std::string path = dir.file("last_good.ckpt");
  dpmlp::save_checkpoint(run.trainer, path);
  // A fault: the output bias (used by every prediction) becomes NaN on every replica.
  const auto params = run.model.params();
  Kokkos::deep_copy(Kokkos::subview(params, params.extent(0) - 1), std::numeric_limits<float>::quiet_NaN());
  std::string kind;
  try {
    run.trainer.train(3);
  } catch (const dpmlp::TrainingError&) {
    kind = "TrainingError";
  } catch (const std::exception& e) {
    kind = e.what();
  }
  CHECK(kind == "TrainingError");
  dpmlp::load_checkpoint(run.trainer, path);
  CHECK(run.trainer.steps_done() == k);
  run.trainer.train(n - k);
  const Snapshot after = snapshot(run.trainer);
  CHECK(after.steps == n);
  CHECK((after.params == end.params));
  CHECK((after.state == end.state));
}

TEST_CASE("the file is the documented format", "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  Run<dpmlp::Sgd> run(dpmlp::Sgd(0.02, 0.9));
  run.trainer.train(3);
  const std::string path = dir.file("format.ckpt");
  dpmlp::save_checkpoint(run.trainer, path);
  if (dpmlp_test::rank() != 0) return;  // rank 0 reads the file; no collectives below

  const auto file = read_all(path);
  const std::size_t P = run.model.num_params(), S = run.trainer.optimizer_state().extent(0);
  CHECK(P == 8 * 16 + 16 + 16 * 1 + 1);
  CHECK(S == P);
  const std::size_t header = 8 + 4 + 4 + 4 + 4 * kWidths.size() + 4 + 4 + 3 + 8 + 8 + 8;
  REQUIRE(file.size() == header + (P + S) * sizeof(float) + 8);
  std::size_t at = 0;
  auto le = [&](int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t(file[at + i]) << (8 * i);
    at += bytes;
    return v;
  };
  CHECK(std::string(file.begin(), file.begin() + 8) == "DPMLPCK1");
  at = 8;
  CHECK(le(4) == 1);  // version
  CHECK(le(4) == 4);  // float32
  CHECK(le(4) == kWidths.size());
  for (int w : kWidths) CHECK(le(4) == std::uint64_t(w));
  CHECK(le(4) == 0);  // relu
  CHECK(le(4) == 3);
  CHECK(std::string(file.begin() + at, file.begin() + at + 3) == "sgd");
  at += 3;
  CHECK(le(8) == S);
  CHECK(le(8) == P);
  CHECK(le(8) == 3);  // steps
  CHECK(at == header);
  const auto params = bytes_of(run.model.params()), state = bytes_of(run.trainer.optimizer_state());
  CHECK(std::equal(params.begin(), params.end(), file.begin() + header));  // little-endian host
  CHECK(std::equal(state.begin(), state.end(), file.begin() + header + params.size()));
  at = file.size() - 8;
  CHECK(le(8) == dpmlp::fnv1a64(file.data(), file.size() - 8));
  CHECK(leftover_tmp_files(dir.path()) == 0);
}

TEST_CASE("load refuses a bad file on every rank and leaves the trainer unchanged", "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  const std::string good = dir.file("good.ckpt"), bad = dir.file("bad.ckpt");
  Run<dpmlp::Sgd> source(dpmlp::Sgd(0.05));
  source.trainer.train(3);
  dpmlp::save_checkpoint(source.trainer, good);
  const std::size_t P = source.model.num_params();
  // Where the parameters start: the file is header + P floats + no state (plain Sgd) + 8 checksum bytes.
  std::size_t header = 0;
  if (dpmlp_test::rank() == 0) header = read_all(good).size() - P * sizeof(float) - 8;

  // The target has other parameters and another step count, which must survive every refusal.
  Run<dpmlp::Sgd> target(dpmlp::Sgd(0.05), 99);
  target.trainer.train(1);
  const Snapshot before = snapshot(target.trainer);
  auto refused = [&](const std::string& path, const std::vector<std::string>& needles) {
    check_refused_everywhere(outcome_of([&] { dpmlp::load_checkpoint(target.trainer, path); }), needles);
    CHECK(snapshot(target.trainer) == before);
  };

  SECTION("truncated in the parameters") {
    rank0_edit(good, bad, [](std::vector<unsigned char>& b) { b.resize(b.size() - 10); });
    refused(bad, {"rank 0: ", "bad.ckpt", "truncated: it is 709 bytes, its header says 719"});
  }
  SECTION("truncated in the header") {
    rank0_edit(good, bad, [](std::vector<unsigned char>& b) { b.resize(30); });
    refused(bad, {"truncated"});
  }
  SECTION("empty file") {
    rank0_edit(good, bad, [](std::vector<unsigned char>& b) { b.clear(); });
    refused(bad, {"not a dpmlp checkpoint"});
  }
  SECTION("one flipped byte in the parameters") {
    rank0_edit(good, bad, [&](std::vector<unsigned char>& b) { b[header + 10] ^= 0x01; });
    refused(bad, {"corrupted", "checksum"});
  }
  SECTION("one flipped byte in the header's widths") {
    rank0_edit(good, bad, [&](std::vector<unsigned char>& b) { b[24] ^= 0x01; });  // width 1: 16 -> 17
    refused(bad, {"corrupted"});  // the checksum is checked before the widths are compared
  }
  SECTION("one flipped byte in the checksum") {
    rank0_edit(good, bad, [](std::vector<unsigned char>& b) { b.back() ^= 0x80; });
    refused(bad, {"corrupted"});
  }
  SECTION("trailing bytes") {
    rank0_edit(good, bad, [](std::vector<unsigned char>& b) { b.push_back(0); });
    refused(bad, {"corrupted"});
  }
  SECTION("wrong version") {
    rank0_edit(good, bad, [](std::vector<unsigned char>& b) { b[8] = 2; });
    refused(bad, {"format version 2", "reads version 1"});
  }
  SECTION("wrong magic") {
    rank0_edit(good, bad, [](std::vector<unsigned char>& b) { b[0] = 'X'; });
    refused(bad, {"not a dpmlp checkpoint"});
  }
  SECTION("not a checkpoint at all") {
    rank0_edit(good, bad, [](std::vector<unsigned char>& b) {
      const std::string text = "widths,activation\n8-16-1,relu\n";
      b.assign(text.begin(), text.end());
    });
    refused(bad, {"not a dpmlp checkpoint"});
  }
  SECTION("missing file") { refused(dir.file("no_such.ckpt"), {"no_such.ckpt", "cannot open"}); }
  SECTION("a directory") { refused(dir.path(), {"is a directory"}); }
}

TEST_CASE("load refuses a checkpoint of another model or optimizer, on every rank", "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  const std::string sgd_path = dir.file("sgd.ckpt");
  {
    Run<dpmlp::Sgd> source(dpmlp::Sgd(0.05));
    source.trainer.train(2);
    dpmlp::save_checkpoint(source.trainer, sgd_path);
  }
  auto refused_by = [&](auto& target, const std::vector<std::string>& needles) {
    target.trainer.train(1);
    const Snapshot before = snapshot(target.trainer);
    check_refused_everywhere(outcome_of([&] { dpmlp::load_checkpoint(target.trainer, sgd_path); }), needles);
    CHECK(snapshot(target.trainer) == before);
  };

  SECTION("other widths") {
    Run<dpmlp::Sgd> target(dpmlp::Sgd(0.05), 1, {8, 32, 1});
    refused_by(target, {"checkpoint is for widths 8-16-1, model is 8-32-1"});
  }
  SECTION("other depth") {
    Run<dpmlp::Sgd> target(dpmlp::Sgd(0.05), 1, {8, 16, 16, 1});
    refused_by(target, {"checkpoint is for widths 8-16-1, model is 8-16-16-1"});
  }
  SECTION("other activation") {
    Run<dpmlp::Sgd> target(dpmlp::Sgd(0.05), 1, kWidths, dpmlp::Activation::tanh);
    refused_by(target, {"activation relu", "tanh"});
  }
  SECTION("other optimizer") {
    Run<dpmlp::Adam> target(dpmlp::Adam(0.01));
    refused_by(target, {"checkpoint is for optimizer sgd, the trainer uses adam"});
  }
  SECTION("other optimizer state size (momentum)") {
    Run<dpmlp::Sgd> target(dpmlp::Sgd(0.05, 0.9));
    refused_by(target, {"optimizer state of 0 values", "has 161"});
  }
  SECTION("other scalar type") {
    Run<dpmlp::Sgd, double> target(dpmlp::Sgd(0.05));
    refused_by(target, {"holds float32 values", "model is float64"});
  }
}

TEST_CASE("save refuses an unwritable path on every rank and leaves nothing behind", "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  Run<dpmlp::Sgd> run(dpmlp::Sgd(0.05));
  run.trainer.train(1);
  const Snapshot before = snapshot(run.trainer);
  auto refused = [&](const std::string& path, const std::vector<std::string>& needles) {
    check_refused_everywhere(outcome_of([&] { dpmlp::save_checkpoint(run.trainer, path); }), needles);
    CHECK(snapshot(run.trainer) == before);
    CHECK((dpmlp_test::rank() != 0 || leftover_tmp_files(dir.path()) == 0));
  };

  SECTION("a directory that does not exist") {
    refused(dir.file("no/such/dir/run.ckpt"), {"rank 0: ", "cannot create", "No such file or directory"});
  }
  SECTION("a directory without write permission") {
    // root writes anyway, so this case needs an ordinary user (the CI container runs as root).
    const bool root = dpmlp_test::all(::geteuid() == 0);
    if (root) {
      SUCCEED("running as root: permissions do not stop root; covered by the other sections");
    } else {
      const std::string locked = dir.file("locked");
      if (dpmlp_test::rank() == 0) {
        fs::create_directory(locked);
        fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
      }
      refused(locked + "/run.ckpt", {"cannot create", "Permission denied"});
      if (dpmlp_test::rank() == 0) fs::permissions(locked, fs::perms::owner_all);
    }
  }
  SECTION("the path is a directory (refused before a temporary file is made)") {
    if (dpmlp_test::rank() == 0) fs::create_directory(dir.file("taken"));
    refused(dir.file("taken"), {"rank 0: ", "taken' is a directory, not a regular file"});
  }
  SECTION("an empty path") { refused("", {"empty"}); }
  SECTION("a save over an existing checkpoint replaces it") {
    const std::string path = dir.file("run.ckpt");
    dpmlp::save_checkpoint(run.trainer, path);
    run.trainer.train(2);
    dpmlp::save_checkpoint(run.trainer, path);
    const Snapshot latest = snapshot(run.trainer);
    Run<dpmlp::Sgd> other(dpmlp::Sgd(0.05), 99);
    dpmlp::load_checkpoint(other.trainer, path);
    CHECK(snapshot(other.trainer) == latest);
    CHECK((dpmlp_test::rank() != 0 || leftover_tmp_files(dir.path()) == 0));
  }
}

// ---- crafted headers: every field range-checked before it is cast or computed with

namespace {

// Offsets in a checkpoint of kWidths {8, 16, 1} with the optimizer "sgd" (the documented format).
constexpr std::size_t kWidth1At = 24, kNameLengthAt = 36, kStateSizeAt = 43, kNumParamsAt = 51, kStepsAt = 59,
                      kHeaderBytes = 67;

void put_le(std::vector<unsigned char>& b, std::size_t at, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) b[at + i] = static_cast<unsigned char>(value >> (8 * i));
}

// Recomputes the trailing FNV-1a 64 checksum, so that a crafted header is not refused for its checksum.
void reseal(std::vector<unsigned char>& b) {
  put_le(b, b.size() - 8, dpmlp::fnv1a64(b.data(), b.size() - 8), 8);
}

}  // namespace

TEST_CASE("load refuses crafted header fields (checksum recomputed) naming the field; nothing overflows",
          "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  const std::string good = dir.file("good.ckpt"), bad = dir.file("bad.ckpt");
  Run<dpmlp::Sgd> source(dpmlp::Sgd(0.05));
  source.trainer.train(3);
  dpmlp::save_checkpoint(source.trainer, good);
  if (dpmlp_test::rank() == 0) {
    const auto b = read_all(good);
    REQUIRE(b.size() == kHeaderBytes + source.model.num_params() * sizeof(float) + 8);
  }
  Run<dpmlp::Sgd> target(dpmlp::Sgd(0.05), 99);
  target.trainer.train(1);
  const Snapshot before = snapshot(target.trainer);
  // Refused on every rank with the needles, the trainer unchanged, the file not modified.
  auto crafted = [&](const std::function<void(std::vector<unsigned char>&)>& edit,
                     const std::vector<std::string>& needles) {
    std::vector<unsigned char> file;
    if (dpmlp_test::rank() == 0) {
      file = read_all(good);
      edit(file);
      reseal(file);
      write_all(bad, file);
    }
    check_refused_everywhere(outcome_of([&] { dpmlp::load_checkpoint(target.trainer, bad); }), needles);
    CHECK(snapshot(target.trainer) == before);
    CHECK((dpmlp_test::rank() != 0 || read_all(bad) == file));
  };
  const std::string limit = std::to_string(dpmlp::max_steps_done);

  SECTION("step count INT64_MAX") {
    crafted([](auto& b) { put_le(b, kStepsAt, std::uint64_t(INT64_MAX), 8); },
            {"rank 0: ", "bad.ckpt' is corrupted: the step count is 9223372036854775807, not in [0, " + limit + "]"});
  }
  SECTION("step count one above the limit") {
    crafted([](auto& b) { put_le(b, kStepsAt, std::uint64_t(dpmlp::max_steps_done) + 1, 8); },
            {"bad.ckpt", "the step count is " + std::to_string(dpmlp::max_steps_done + 1)});
  }
  SECTION("a negative step count (the sign bit)") {
    crafted([](auto& b) { put_le(b, kStepsAt, std::uint64_t(1) << 63, 8); },
            {"bad.ckpt", "the step count is 9223372036854775808"});
  }
  SECTION("a width above INT32_MAX") {
    crafted([](auto& b) { put_le(b, kWidth1At, 0xffffffffu, 4); },
            {"bad.ckpt", "the width 1 is 4294967295, not in [0, 2147483647]"});
  }
  SECTION("an optimizer name length far beyond any name") {
    crafted([](auto& b) { put_le(b, kNameLengthAt, 0x80000003u, 4); },
            {"bad.ckpt", "the optimizer name length is 2147483651, not in [0, 255]"});
  }
  SECTION("parameter and state counts whose byte size overflows 64 bits") {
    crafted(
        [](auto& b) {
          put_le(b, kStateSizeAt, ~std::uint64_t(0), 8);
          put_le(b, kNumParamsAt, ~std::uint64_t(0), 8);
        },
        {"bad.ckpt", "is truncated: it is 719 bytes, its header says more than 18446744073709551615 "
         "(18446744073709551615 parameters and 18446744073709551615 optimizer state values)"});
  }
  SECTION("every bit of the optimizer name length flipped (the later fields shift onto other bytes)") {
    // Flipping bit 4 (3 -> 19) reads the first parameters' float bits as the parameter count, near 2^62:
    // its byte size used to overflow a float-to-integer cast.
    for (int bit = 0; bit < 32; ++bit) {
      INFO("bit " << bit);
      crafted([&](auto& b) { b[kNameLengthAt + bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8)); },
              {"bad.ckpt"});
    }
  }
}

TEST_CASE("every single-bit flip of the header with the checksum recomputed: refused, or a valid checkpoint",
          "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  const std::string good = dir.file("good.ckpt"), bad = dir.file("bad.ckpt");
  Run<dpmlp::Sgd> source(dpmlp::Sgd(0.05));
  source.trainer.train(3);
  dpmlp::save_checkpoint(source.trainer, good);
  Run<dpmlp::Sgd> target(dpmlp::Sgd(0.05), 99);
  int refused = 0, accepted = 0;
  for (std::size_t bit = 8 * 8; bit < 8 * kHeaderBytes; ++bit) {  // after the magic
    INFO("byte " << bit / 8 << " bit " << bit % 8);
    if (dpmlp_test::rank() == 0) {
      auto b = read_all(good);
      b[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
      reseal(b);
      write_all(bad, b);
    }
    const Snapshot before = snapshot(target.trainer);
    const Outcome o = outcome_of([&] { dpmlp::load_checkpoint(target.trainer, bad); });
    CHECK(o.other.empty());
    const bool refused_everywhere = dpmlp_test::all(o.input_error), accepted_everywhere = dpmlp_test::all(!o.input_error);
    CHECK((refused_everywhere || accepted_everywhere));
    if (o.input_error) {
      ++refused;
      CHECK_THAT(o.message, Catch::Contains("bad.ckpt"));
      CHECK(snapshot(target.trainer) == before);
    } else {
      // Only the step count's bits can change and still fit this trainer; the count stays in range.
      ++accepted;
      CHECK(bit / 8 >= kStepsAt);
      CHECK(target.trainer.steps_done() >= 0);
      CHECK(target.trainer.steps_done() <= dpmlp::max_steps_done);
    }
  }
  CHECK(refused > 0);
  CHECK(accepted > 0);
}

TEST_CASE("at the step count limit a run is refused on every rank before any step; below it, no overflow",
          "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  const std::string good = dir.file("good.ckpt"), near = dir.file("near_limit.ckpt");
  Run<dpmlp::Adam> source(dpmlp::Adam(0.01));
  source.trainer.train(3);
  dpmlp::save_checkpoint(source.trainer, good);
  // Adam: its update uses the step number t itself (bias correction), the deepest use of the count.
  rank0_edit(good, near, [](std::vector<unsigned char>& b) {
    // "adam" is one byte longer than "sgd": the step count is one byte later.
    put_le(b, kStepsAt + 1, std::uint64_t(dpmlp::max_steps_done) - 4, 8);
    reseal(b);
  });
  Run<dpmlp::Adam> run(dpmlp::Adam(0.01), 99);
  dpmlp::load_checkpoint(run.trainer, near);
  CHECK(run.trainer.steps_done() == dpmlp::max_steps_done - 4);
  dpmlp::LossHistory history;
  dpmlp::ProgressBar quiet(nullptr);
  const auto r = run.trainer.train(4, history, quiet);
  CHECK(r.steps == 4);
  REQUIRE(history.size() == 4);
  CHECK(history.steps().back() == dpmlp::max_steps_done);
  CHECK(run.trainer.steps_done() == dpmlp::max_steps_done);
  const Snapshot at_limit = snapshot(run.trainer);
  // One more step would pass the limit: refused on every rank, nothing changed.
  check_refused_everywhere(outcome_of([&] { run.trainer.train(1); }), {"would pass the step count limit"});
  check_refused_everywhere(outcome_of([&] { run.trainer.train(3, history); }), {"would pass the step count limit"});
  CHECK(snapshot(run.trainer) == at_limit);
  // set_steps_done refuses what a checkpoint would (local, so every rank throws by itself here).
  for (const std::int64_t steps : {std::int64_t(-1), dpmlp::max_steps_done + 1, std::int64_t(INT64_MAX)}) {
    const Outcome o = outcome_of([&] { run.trainer.set_steps_done(steps); });
    CHECK(o.input_error);
    CHECK_THAT(o.message, Catch::Contains("step count must be in [0, "));
  }
  CHECK(run.trainer.steps_done() == dpmlp::max_steps_done);
  // ProgressBar's total (steps before + steps) saturates for callers other than a trainer.
  dpmlp::ProgressBar bar(nullptr);
  bar.begin_training(dpmlp::TrainInfo{10, INT64_MAX, 0, 1});
}

// ---- replacing a checkpoint: permission bits kept, killed writers' temporary files removed

TEST_CASE("a save keeps the replaced checkpoint's permission bits", "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  const std::string path = dir.file("private.ckpt");
  Run<dpmlp::Sgd> run(dpmlp::Sgd(0.05));
  run.trainer.train(1);
  dpmlp::save_checkpoint(run.trainer, path);
  auto mode_of = [](const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
  };
  for (const int mode : {0600, 0640, 0400}) {
    INFO("mode " << std::oct << mode);
    if (dpmlp_test::rank() == 0) REQUIRE(::chmod(path.c_str(), static_cast<mode_t>(mode)) == 0);
    run.trainer.train(1);
    dpmlp::save_checkpoint(run.trainer, path);
    CHECK((dpmlp_test::rank() != 0 || mode_of(path) == mode));
    Run<dpmlp::Sgd> other(dpmlp::Sgd(0.05), 99);
    dpmlp::load_checkpoint(other.trainer, path);  // and it is the new checkpoint
    CHECK(snapshot(other.trainer) == snapshot(run.trainer));
  }
  CHECK((dpmlp_test::rank() != 0 || leftover_tmp_files(dir.path()) == 0));
}

namespace {
// The id of a process that has exited and been reaped (a killed writer's, for the test's purpose).
long long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return static_cast<long long>(child);
}
}  // namespace

TEST_CASE("a save removes killed writers' temporary files of its checkpoint, and nothing else",
          "[mpi][checkpoint]") {
  const TempDir dir;
  REQUIRE(dpmlp_test::all(dir.ok()));
  const std::string path = dir.file("run.ckpt");
  Run<dpmlp::Sgd> run(dpmlp::Sgd(0.05));
  run.trainer.train(1);
  std::vector<std::string> stale, kept;
  if (dpmlp_test::rank() == 0) {
    const long long dead = dead_pid(), dead2 = dead_pid();
    const long long alive = static_cast<long long>(::getppid());  // the launcher: running
    REQUIRE(::kill(static_cast<pid_t>(alive), 0) == 0);
    const std::string junk(4096, 'x');
    stale = {path + ".tmp." + std::to_string(dead), path + ".tmp." + std::to_string(dead2)};
    kept = {path + ".tmp." + std::to_string(alive),           // a writer that is still running
            dir.file("other.ckpt.tmp." + std::to_string(dead)),  // another checkpoint's
            path + ".tmp." + std::to_string(dead) + ".keep",     // not a bare pid
            path + ".tmp.0" + std::to_string(dead),              // not canonical
            path + ".tmp.x" + std::to_string(dead),
            dir.file("run.ckpt.tmp.")};
    for (const auto& f : stale) write_all(f, std::vector<unsigned char>(junk.begin(), junk.end()));
    for (const auto& f : kept) write_all(f, std::vector<unsigned char>(junk.begin(), junk.end()));
    fs::create_directory(path + ".tmp." + std::to_string(dead_pid()));  // a directory is never removed
  }
  dpmlp::save_checkpoint(run.trainer, path);
  if (dpmlp_test::rank() == 0) {
    for (const auto& f : stale) CHECK_FALSE(fs::exists(f));
    for (const auto& f : kept) CHECK(fs::exists(f));
    int dirs = 0;
    for (const auto& e : fs::directory_iterator(dir.path())) dirs += e.is_directory() ? 1 : 0;
    CHECK(dirs == 1);
  }
  Run<dpmlp::Sgd> other(dpmlp::Sgd(0.05), 99);
  dpmlp::load_checkpoint(other.trainer, path);
  CHECK(snapshot(other.trainer) == snapshot(run.trainer));
}
