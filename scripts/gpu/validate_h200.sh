#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Hardware validation on the 2xH200 machine, with binaries built elsewhere (scripts/gpu/prepare_carry.sh).
# Runs from the repository root there; writes logs under $OUT. Every step has a time limit; a failing
# step is recorded and the script goes on.
#   scripts/gpu/validate_h200.sh [steps...]   steps: info example refuse ctest sanitize portable (default all),
#                                             or, on a machine with one GPU: info single single-sanitize refuse
set -uo pipefail
root="$(pwd)"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# The CTest files name the build and source folders of the build machine.
rm -rf /tmp/build-cuda /tmp/build-port /tmp/build-cuda2
if [ -f .carry/builds.tar.xz ] && [ ! -d .carry/build-cuda ]; then tar -xJf .carry/builds.tar.xz -C .carry; fi
cp -r .carry/build-cuda /tmp/build-cuda
ln -sfn /tmp/build-cuda /tmp/build-cuda2  # a build configured as /tmp/build-cuda2 names that folder
[ -d .carry/build-port ] && cp -r .carry/build-port /tmp/build-port
ln -sfn "$root" /tmp/dpmlp-snap
ln -sfn "$root" /tmp/dpmlp-snap2
# The CTest files call the build machine's /usr/bin/cmake (the example digest test is a CMake script).
[ -x /usr/bin/cmake ] || ln -sfn "$(command -v cmake)" /usr/bin/cmake
[ -e /work/main ] || ln -sfn "$root" /work/main
steps="${*:-info example refuse ctest sanitize portable}"
B=/tmp/build-cuda
# The tests read the reference data from the folder their build was configured with (DPMLP_REFERENCE_DIR, by
# default <source>/tests/data). Where that folder is not on this machine, it becomes a link to this
# checkout's tests/data.
for dir in $B /tmp/build-port; do
  ref=$(sed -n 's/^DPMLP_REFERENCE_DIR:PATH=//p' "$dir/CMakeCache.txt" 2>/dev/null)
  if [ -n "$ref" ] && [ ! -e "$ref" ]; then mkdir -p "$(dirname "$ref")" && ln -sfn "$root/tests/data" "$ref"; fi
done
run() {  # run <label> <timeout s> <command...>: echo the exact command, its output and exit code
  local label="$1" limit="$2"; shift 2
  echo
  echo "### $label"
  echo "\$ $*"
  timeout "$limit" "$@" 2>&1
  local rc=$?
  echo "[exit code $rc]"
}
for step in $steps; do
  case "$step" in
    info)
      run "date" 10 date -u
      run "GPUs" 20 nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id,uuid --format=csv
      run "topology" 20 nvidia-smi topo -m
      run "CUDA" 10 nvcc --version
      run "OpenMPI" 10 mpirun --version
      run "NCCL" 10 bash -c "grep -E '#define NCCL_(MAJOR|MINOR|PATCH) ' /usr/include/nccl.h"
      run "Kokkos (from the build)" 10 grep -E "^Kokkos_DIR|^CMAKE_CXX_COMPILER:" $B/CMakeCache.txt
      ;;
    example)
      run "multi_gpu_train, 2 GPUs, NCCL (default)" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE $B/examples/multi_gpu_train
      run "multi_gpu_train, 2 GPUs, NCCL, CUDA graph" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE $B/examples/multi_gpu_train --graph
      run "multi_gpu_train, 2 GPUs, MPI communicator" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE $B/examples/multi_gpu_train --comm mpi
      run "multi_gpu_train, 2 GPUs, fast reduction" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE $B/examples/multi_gpu_train --reduction fast
      # At the seed size Engine::automatic picks the register-resident tensor kernel (since 26edb9c); the
      # warp-matrix one forced:
      run "multi_gpu_train, 2 GPUs, NCCL, warp-matrix tensor kernel" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE \
        $B/examples/multi_gpu_train --tensor-kernel warp-matrix
      # The peer exchange (TrainerOptions::peer_exchange): the same digest, plain and graphed, either communicator.
      run "multi_gpu_train, 2 GPUs, peer exchange" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE $B/examples/multi_gpu_train --peer
      run "multi_gpu_train, 2 GPUs, peer exchange, CUDA graph" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE \
        $B/examples/multi_gpu_train --peer --graph
      run "multi_gpu_train, 2 GPUs, MPI communicator, peer exchange" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE \
        $B/examples/multi_gpu_train --comm mpi --peer
      # The exchange behind the warp-matrix kernel too:
      run "multi_gpu_train, 2 GPUs, peer exchange, CUDA graph, warp-matrix tensor kernel" 300 mpirun -np 2 \
        -x NCCL_NVLS_ENABLE $B/examples/multi_gpu_train --peer --graph --tensor-kernel warp-matrix
      ;;
    single)
      # One GPU: every test at one rank (the examples need two GPUs, the consumer projects the build machine's
      # paths, the command-line checks several ranks of a CPU build), then the trainer's tests at two ranks
      # sharing the GPU (the MPI communicator: NCCL refuses two ranks on one GPU; the peer exchange's tests
      # skip there).
      run "ctest, one GPU: every test at one rank" 580 \
        bash -c "cd $B && ctest --output-on-failure -LE 'consumer|example' -E '_np[234]\$|^cli_|^tcp_transport' --timeout 240"
      run "test_trainer_mpi, 2 ranks sharing the GPU" 400 mpirun -np 2 $B/tests/test_trainer_mpi
      ;;
    single-sanitize)
      run "compute-sanitizer memcheck: test_trainer_mpi [fused] (fused engine and every tensor kernel)" 300 \
        mpirun -np 1 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_trainer_mpi "[fused]"
      run "compute-sanitizer racecheck: test_trainer_mpi [fused] (fused engine and every tensor kernel)" 300 \
        mpirun -np 1 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_trainer_mpi "[fused]"
      ;;
    refuse)
      run "multi_gpu_train with one visible GPU (expect the refusal, exit 77)" 120 \
        mpirun -np 2 -x CUDA_VISIBLE_DEVICES=0 -x NCCL_NVLS_ENABLE $B/examples/multi_gpu_train
      ;;
    ctest)
      # CTEST_REGEX limits the run to the tests whose executables were built and carried.
      run "ctest, CUDA build (consumer projects excluded: they re-run CMake against the build machine's paths)" 580 \
        bash -c "cd $B && ctest --output-on-failure -LE consumer --timeout 240 ${CTEST_REGEX:+-R \"$CTEST_REGEX\"}"
      ;;
    sanitize)
      # NCCL's own initialization (ncclCommInitRank) probes kernel images with cudaFuncGetAttributes and
      # gets error 209 for those not built for sm_90: API errors inside libnccl, not memory errors. The
      # NCCL run therefore reports memory errors only; the MPI run reports API errors too.
      run "compute-sanitizer memcheck: multi_gpu_train, MPI communicator (10 steps)" 300 mpirun -np 2 \
        compute-sanitizer --tool memcheck --error-exitcode 9 $B/examples/multi_gpu_train --comm mpi --steps 10 --warmup 1
      for tool in memcheck racecheck; do
        # A sanitized rank can be far slower than its peer: the exchange's waits get 600 s instead of 60.
        run "compute-sanitizer $tool: multi_gpu_train, peer exchange (10 steps)" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE \
          compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 $B/examples/multi_gpu_train \
          --steps 10 --warmup 1 --peer --peer-timeout 600
        run "compute-sanitizer $tool: multi_gpu_train, NCCL (10 steps)" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE \
          compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 $B/examples/multi_gpu_train \
          --steps 10 --warmup 1
        run "compute-sanitizer $tool: test_trainer_mpi (two test cases)" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE \
          compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_trainer_mpi \
          "*deeper models*"
        # The fused and tensor kernels share a block's shared memory across several barriers a chunk; the
        # [fused] tests run every tensor kernel that takes their shapes.
        run "compute-sanitizer $tool: test_trainer_mpi [fused] (fused engine and every tensor kernel, 1 GPU)" \
          300 mpirun -np 1 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_trainer_mpi "[fused]"
        for t in test_comm_mpi test_evaluator; do
          for dir in $B /tmp/build-port; do
            if [ -x $dir/tests/$t ]; then
              run "compute-sanitizer $tool: $t ($dir)" 300 mpirun -np 2 -x NCCL_NVLS_ENABLE \
                compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 $dir/tests/$t
              break
            fi
          done
        done
      done
      ;;
    portable)
      if [ -d /tmp/build-port ]; then
        P=/tmp/build-port
        run "portable path (cuBLAS and NCCL off): build configuration" 10 grep -E "DPMLP_ENABLE_(CUBLAS|NCCL)" $P/CMakeCache.txt
        run "portable path: multi_gpu_train, 2 GPUs" 300 mpirun -np 2 $P/examples/multi_gpu_train
        run "portable path: test_trainer_mpi, 2 ranks" 300 mpirun -np 2 $P/tests/test_trainer_mpi
        run "portable path: test_comm_mpi, 2 ranks" 300 mpirun -np 2 $P/tests/test_comm_mpi
      fi
      ;;
  esac
done
