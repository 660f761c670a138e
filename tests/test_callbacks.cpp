// SPDX-License-Identifier: BSD-3-Clause
// The ready-made callbacks (callbacks.hpp) driven by hand with TrainInfo / StepInfo, no trainer: the
// ProgressBar's output in both modes and on other ranks, EarlyStopping's rule, LossHistory. The same
// callbacks inside a real trainer are in test_callbacks_mpi.cpp.
#include <catch2/catch.hpp>

#include <dpmlp/callbacks.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "check_util.hpp"

namespace {

// Everything written to a FILE* (a tmpfile: not a terminal).
struct Capture {
  std::FILE* f = std::tmpfile();
  ~Capture() {
    if (f) std::fclose(f);
  }
  std::string text() const { return dpmlp_test::file_text(f); }
};

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

// Drives a callback through a run of `losses.size()` steps (of `asked` asked), through the trainer's own
// hook dispatch (which skips the hooks a callback lacks); returns the number of steps taken.
template <class C>
int drive(C& cb, const std::vector<double>& losses, int asked, int rank = 0, std::int64_t before = 0) {
  dpmlp::detail::call_begin(dpmlp::TrainInfo{asked, before, rank, 2}, cb);
  int done = 0;
  bool stop = false;
  while (done < asked && done < static_cast<int>(losses.size()) && !stop) {
    ++done;
    stop = dpmlp::detail::call_end_step(dpmlp::StepInfo{before + done, done, losses[done - 1], 2.0}, cb);
  }
  dpmlp::TrainResult r;
  r.steps = done;
  r.first_loss = losses.front();
  r.last_loss = losses[done - 1];
  dpmlp::detail::call_end(r, cb);
  return done;
}

}  // namespace

TEST_CASE("ProgressBar on a file: plain lines every N steps and at the last step", "[callbacks]") {
  Capture cap;
  dpmlp::ProgressBar bar(cap.f, 4);
  const std::vector<double> losses{1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1};
  drive(bar, losses, 10);
  CHECK_FALSE(bar.terminal());
  const auto lines = lines_of(cap.text());
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == "step 4/10 loss 0.7 ms/step 2.000 eta_s 0.012");
  CHECK(lines[1] == "step 8/10 loss 0.3 ms/step 2.000 eta_s 0.004");
  CHECK(lines[2] == "step 10/10 loss 0.1 ms/step 2.000 eta_s 0.000");
  CHECK(lines[3] == "done 10 steps loss 1 -> 0.1 in 0.020 s");
  CHECK(cap.text().find('\r') == std::string::npos);
}

TEST_CASE("ProgressBar: every = 0 gives about ten lines; steps continue a resumed run", "[callbacks]") {
  Capture cap;
  dpmlp::ProgressBar bar(cap.f);
  drive(bar, std::vector<double>(100, 0.5), 100, 0, 200);
  const auto lines = lines_of(cap.text());
  REQUIRE(lines.size() == 11);
  CHECK(lines[0].rfind("step 210/300 loss 0.5 ", 0) == 0);
  CHECK(lines[9].rfind("step 300/300 loss 0.5 ", 0) == 0);
  CHECK(lines[10].rfind("done 100 steps", 0) == 0);
}

TEST_CASE("ProgressBar prints nothing on ranks other than 0", "[callbacks]") {
  Capture cap;
  dpmlp::ProgressBar bar(cap.f, 1);
  drive(bar, {1.0, 0.5, 0.25}, 3, /*rank*/ 1);
  CHECK(cap.text().empty());
}

TEST_CASE("ProgressBar in terminal mode: one line rewritten in place, with the ETA", "[callbacks]") {
  Capture cap;
  dpmlp::ProgressBar bar(cap.f, 0, dpmlp::ProgressBar::Mode::terminal);
  bar.set_min_redraw_ms(0);  // redraw every step
  drive(bar, {1.0, 0.5, 0.25}, 3);
  CHECK(bar.terminal());
  const std::string s = cap.text();
  CHECK(s.find("\rstep 1/3  loss 1  2.000 ms/step  ETA 0.0 s\033[K") != std::string::npos);
  CHECK(s.find("\rstep 3/3  loss 0.25  2.000 ms/step  ETA 0.0 s\033[K\n") != std::string::npos);
  const auto lines = lines_of(s);
  REQUIRE(lines.size() == 2);  // the live line, then the summary
  CHECK(lines[1] == "done 3 steps loss 1 -> 0.25 in 0.006 s");
}

TEST_CASE("ProgressBar in terminal mode throttles redraws but always draws the last step", "[callbacks]") {
  Capture cap;
  dpmlp::ProgressBar bar(cap.f, 0, dpmlp::ProgressBar::Mode::terminal);
  bar.set_min_redraw_ms(1e9);
  drive(bar, std::vector<double>(50, 0.5), 50);
  const std::string s = cap.text();
  std::size_t draws = 0;
  for (char c : s) draws += c == '\r';
  CHECK(draws == 2);  // the first step and the last
  CHECK(s.find("\rstep 50/50 ") != std::string::npos);
}

TEST_CASE("ProgressBar's automatic mode sees that a tmpfile is not a terminal", "[callbacks]") {
  Capture cap;
  dpmlp::ProgressBar bar(cap.f, 1, dpmlp::ProgressBar::Mode::automatic);
  drive(bar, {1.0}, 1);
  CHECK_FALSE(bar.terminal());
  CHECK(cap.text().rfind("step 1/1 loss 1 ", 0) == 0);
  CHECK_THROWS_AS(dpmlp::ProgressBar(cap.f, -1), dpmlp::InputError);
}

TEST_CASE("ProgressBar's automatic mode writes no control characters to a file", "[callbacks]") {
  Capture cap;
  dpmlp::ProgressBar bar(cap.f);  // Mode::automatic, about ten lines
  bar.set_min_redraw_ms(0);
  drive(bar, std::vector<double>(40, 0.5), 40);
  CHECK_FALSE(bar.terminal());
  const std::string s = cap.text();
  CHECK(s.find('\033') == std::string::npos);
  CHECK(s.find('\r') == std::string::npos);
  CHECK(lines_of(s).size() == 11);
}

namespace {

// The variables ProgressBar::launched_by_mpi reads, cleared (and one of them set, if asked) for the
// lifetime of this object, then put back as they were.
class LauncherEnvironment {
 public:
  explicit LauncherEnvironment(const char* set = nullptr) {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"}) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::make_pair(true, std::string(v)) : std::make_pair(false, std::string()));
      unsetenv(name);
    }
    if (set) setenv(set, "2", 1);
  }
  ~LauncherEnvironment() {
    for (const auto& s : saved_) {
      if (s.second.first) {
        setenv(s.first.c_str(), s.second.second.c_str(), 1);
      } else {
        unsetenv(s.first.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::pair<bool, std::string>>> saved_;
};

// A pseudo-terminal: `out` writes to its terminal side; read() returns what arrived at the other side.
struct PseudoTerminal {
  int master = -1;
  std::FILE* out = nullptr;
  PseudoTerminal() {
    master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) return;
    const char* name = ptsname(master);
    const int fd = name ? open(name, O_RDWR | O_NOCTTY) : -1;
    if (fd >= 0) out = fdopen(fd, "w");
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
  }
  ~PseudoTerminal() {
    if (out) std::fclose(out);
    if (master >= 0) close(master);
  }
  std::string read() const {
    std::fflush(out);
    std::string s;
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::read(master, buf, sizeof buf)) > 0) s.append(buf, static_cast<std::size_t>(n));
    return s;
  }
};

}  // namespace

TEST_CASE("ProgressBar's automatic mode on a terminal: the live line, unless an MPI launcher started the process",
          "[callbacks]") {
  PseudoTerminal pty;
  if (!pty.out) {
    WARN("no pseudo-terminal here (posix_openpt failed); not checked");
    return;
  }
  REQUIRE(isatty(fileno(pty.out)) == 1);
  SECTION("a plain process: the live line") {
    LauncherEnvironment env;
    CHECK_FALSE(dpmlp::ProgressBar::launched_by_mpi());
    dpmlp::ProgressBar bar(pty.out);
    drive(bar, {1.0, 0.5, 0.25}, 3);
    CHECK(bar.terminal());
    CHECK(pty.read().find("\033[K") != std::string::npos);
  }
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"}) {
    DYNAMIC_SECTION("started by a launcher that sets " << var << ": plain lines") {
      LauncherEnvironment env(var);
      CHECK(dpmlp::ProgressBar::launched_by_mpi());
      dpmlp::ProgressBar bar(pty.out);
      drive(bar, {1.0, 0.5, 0.25}, 3);
      CHECK_FALSE(bar.terminal());
      const std::string s = pty.read();
      CHECK(s.find("step 3/3 loss 0.25 ") != std::string::npos);
      CHECK(s.find('\033') == std::string::npos);
    }
  }
  SECTION("Mode::terminal forces the live line under a launcher") {
    LauncherEnvironment env("OMPI_COMM_WORLD_SIZE");
    dpmlp::ProgressBar bar(pty.out, 0, dpmlp::ProgressBar::Mode::terminal);
    drive(bar, {1.0, 0.5}, 2);
    CHECK(bar.terminal());
    CHECK(pty.read().find("\033[K") != std::string::npos);
  }
}

TEST_CASE("EarlyStopping: stops after `patience` steps without an improvement of more than min_delta",
          "[callbacks]") {
  SECTION("a plateau") {
    dpmlp::EarlyStopping stop(3, 0.0);
    // best 0.5 at step 3; steps 4, 5, 6 do not improve -> stop after step 6.
    const int done = drive(stop, {1.0, 0.8, 0.5, 0.5, 0.6, 0.55, 0.1, 0.1}, 8);
    CHECK(done == 6);
    CHECK(stop.stopped());
    CHECK(stop.stopped_step() == 6);
    CHECK(stop.best_loss() == 0.5);
    CHECK(stop.best_step() == 3);
  }
  SECTION("improvements smaller than min_delta do not count") {
    dpmlp::EarlyStopping stop(2, 0.1);
    // 1.0 best; 0.95 and 0.92 are within 0.1 -> stop after step 3.
    CHECK(drive(stop, {1.0, 0.95, 0.92, 0.5}, 4) == 3);
    CHECK(stop.best_loss() == 1.0);
  }
  SECTION("a loss that keeps falling never stops") {
    dpmlp::EarlyStopping stop(1, 0.01);
    CHECK(drive(stop, {1.0, 0.9, 0.8, 0.7, 0.6}, 5) == 5);
    CHECK_FALSE(stop.stopped());
    CHECK(stop.stopped_step() == 0);
  }
  SECTION("state is reset by each train() call") {
    dpmlp::EarlyStopping stop(2);
    CHECK(drive(stop, {1.0, 1.0, 1.0}, 3) == 3);
    CHECK(stop.stopped());
    CHECK(drive(stop, {5.0, 4.0}, 2, 0, 3) == 2);  // a fresh best of 5, then an improvement
    CHECK_FALSE(stop.stopped());
  }
  SECTION("bad settings") {
    CHECK_THROWS_AS(dpmlp::EarlyStopping(0), dpmlp::InputError);
    CHECK_THROWS_AS(dpmlp::EarlyStopping(3, -1.0), dpmlp::InputError);
  }
}

TEST_CASE("LossHistory records every step, across runs", "[callbacks]") {
  dpmlp::LossHistory h;
  drive(h, {3.0, 2.0, 1.0}, 3);
  drive(h, {0.5, 0.25}, 2, 0, 3);
  CHECK(h.losses() == std::vector<double>{3.0, 2.0, 1.0, 0.5, 0.25});
  CHECK(h.steps() == std::vector<std::int64_t>{1, 2, 3, 4, 5});
  CHECK(h.size() == 5);
  h.clear();
  CHECK(h.size() == 0);
}
