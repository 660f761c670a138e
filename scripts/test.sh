#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs what is missing, builds dpmlp's tests, examples and benchmarks, and runs every test with ctest.
# Then (unless DPMLP_SANITIZE=OFF) builds the tests again with -fsanitize=address,undefined and runs them,
# and the emulated GEMM tests' small cases (test_wgmma_emulated, test_f16x3_emulated) with -fsanitize=thread.
# Then, when clang++ is there (unless DPMLP_FUZZ=OFF), builds the libFuzzer harnesses alone in their own
# folder and runs each over its seed corpus for DPMLP_FUZZ_SECONDS (default 20) seconds.
# Idempotent: a second run reuses the build folders. Any failure stops it with a non-zero exit.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$DPMLP_ROOT"

started=$(date +%s)
# python3-numpy: the npy_numpy_interop test reads dpmlp's .npy files with numpy.load (and must not skip here).
# libonnx-dev, libprotobuf-dev: the optional ONNX export, dpmlp::onnx, is built and tested here; python3-venv:
# the environment its tests get onnx and onnxruntime in (PyPI packages, not Debian's).
dpmlp_install_packages python3-numpy python3-venv libonnx-dev libprotobuf-dev
export DPMLP_REQUIRE_NUMPY=1
# Tests, examples and benchmarks asked for by name: scripts/demo.sh shares the build folder and turns tests off.
dpmlp_configure_and_build "$BUILD_DIR" -DDPMLP_BUILD_TESTS=ON -DDPMLP_BUILD_EXAMPLES=ON -DDPMLP_BUILD_BENCHMARKS=ON

# onnx and onnxruntime for the ONNX tests (onnx_runtime, example_train_csv_onnx), in a virtual environment in the
# build folder (Debian's python3 refuses pip installs into the system), made once; the tests must not skip here.
onnx_venv="$(cd "$BUILD_DIR" && pwd)/onnx-venv"
if ! "$onnx_venv/bin/python" -c "import numpy, onnx, onnxruntime" 2>/dev/null; then
  log "onnx: pip install onnx onnxruntime numpy into $onnx_venv"
  python3 -m venv "$onnx_venv"
  "$onnx_venv/bin/python" -m pip install --quiet --disable-pip-version-check onnx onnxruntime numpy
fi
export DPMLP_ONNX_PYTHON="$onnx_venv/bin/python" DPMLP_REQUIRE_ONNX=1
log "test: ctest in $BUILD_DIR"
(cd "$BUILD_DIR" && ctest --output-on-failure --no-tests=error -j "$JOBS")
# On an OpenMP Kokkos (Kokkos_ROOT) the run above includes the two-thread tests (label openmp: the host engine's
# tests at two threads a rank, and the params digests at 1 and 2 threads and 1-3 ranks compared).
if (cd "$BUILD_DIR" && ctest -N -L openmp | grep -q "Total Tests: [1-9]"); then
  log "openmp: the two-thread tests ran (ctest -L openmp)"
else
  log "openmp: this Kokkos has no OpenMP backend; Kokkos_ROOT=<an OpenMP Kokkos> runs the two-thread tests too"
fi

if [ "${DPMLP_SANITIZE:-ON}" != "OFF" ]; then
  san_dir="${BUILD_DIR}-sanitize"
  # The benchmarks are built (and compile-checked) once, in the build above; no test runs them. -O1 -g1
  # instead of RelWithDebInfo's -O2 -g: the sanitizers insert the same checks at any optimization level, -O1 is
  # what AddressSanitizer's documentation advises, and line tables alone keep file:line in their reports; the
  # instrumented compile, most of this script's time, costs far less so.
  dpmlp_configure_and_build "$san_dir" -DDPMLP_SANITIZE=address,undefined -DDPMLP_BUILD_BENCHMARKS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  log "test: ctest in $san_dir (AddressSanitizer + UndefinedBehaviorSanitizer, halt_on_error)"
  # OpenMPI's own allocations are not ours to fix: leaks are not reported; every other error halts.
  (cd "$san_dir" && \
    ASAN_OPTIONS="halt_on_error=1:detect_leaks=0:abort_on_error=1" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --output-on-failure --no-tests=error -j "$JOBS" -LE consumer)
fi

# The wgmma kernels' two-stage pipeline and the 3xFP16 kernels' stages under ThreadSanitizer (host builds, where
# their emulated tests exist): a store to a shared-memory stage that an emulated MMA or ldmatrix may still read,
# without a barrier between them, is a race.
if [ "${DPMLP_SANITIZE:-ON}" != "OFF" ] && (cd "$BUILD_DIR" && ctest -N -R '^test_wgmma_emulated$' | grep -q "Total Tests: 1"); then
  tsan_dir="${BUILD_DIR}-tsan"
  for tsan_test in test_wgmma_emulated test_f16x3_emulated; do
    DPMLP_BUILD_TARGET=$tsan_test dpmlp_configure_and_build "$tsan_dir" -DDPMLP_SANITIZE=thread \
      -DDPMLP_BUILD_BENCHMARKS=OFF -DDPMLP_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
    log "test: $tsan_test [races] under ThreadSanitizer"
    tsan_log="$tsan_dir/tsan-$tsan_test.log"
    tsan_run() { TSAN_OPTIONS="halt_on_error=1" "$@" "$tsan_dir/tests/$tsan_test" "[races]" >"$tsan_log" 2>&1; }
    # ThreadSanitizer cannot map its shadow memory under some kernels' address randomization: then again without
    # it (setarch -R); where that is refused too (a container's seccomp profile), the step says so and is skipped.
    tsan_cannot_run() { grep -q -e "ThreadSanitizer: unexpected memory mapping" -e "^setarch: " "$tsan_log"; }
    if tsan_run || { tsan_cannot_run && tsan_run setarch "$(uname -m)" -R; }; then
      tail -n 2 "$tsan_log"
    elif tsan_cannot_run; then
      log "tsan: skipped: ThreadSanitizer cannot run here: $(grep -m1 -e "unexpected memory mapping" -e "^setarch: " "$tsan_log")"
    else
      cat "$tsan_log"
      exit 1
    fi
  done
fi

if [ "${DPMLP_FUZZ:-ON}" != "OFF" ]; then
  if command -v clang++ >/dev/null; then
    fuzz_dir="${BUILD_DIR}-fuzz"
    # The harnesses only: tests, examples and benchmarks are the passes above. The corpus is copied into the
    # build folder by the fuzz tests, so what the fuzzer adds never touches the source tree.
    CXX=clang++ dpmlp_configure_and_build "$fuzz_dir" -DCMAKE_CXX_COMPILER=clang++ -DDPMLP_BUILD_FUZZERS=ON \
      -DDPMLP_BUILD_TESTS=OFF -DDPMLP_BUILD_EXAMPLES=OFF -DDPMLP_BUILD_BENCHMARKS=OFF -DDPMLP_INSTALL=OFF \
      "-DDPMLP_FUZZ_SECONDS=${DPMLP_FUZZ_SECONDS:-20}"
    log "test: fuzz tests in $fuzz_dir (libFuzzer, ${DPMLP_FUZZ_SECONDS:-20} s per harness)"
    (cd "$fuzz_dir" && ctest --output-on-failure --no-tests=error -L fuzz)
  else
    log "fuzz: skipped (no clang++; install Debian's clang to run the libFuzzer harnesses)"
  fi
fi
log "all tests passed in $(( $(date +%s) - started )) s"
