#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs what is missing, builds dpmlp, and runs the main example, multi_gpu_train, on 2 ranks.
# On a CUDA build it runs on the GPUs (with fewer than two visible, the example says so and exits 77). On a
# host build it runs the CPU exercise with --allow-cpu-devices, which checks the program but is NOT a
# hardware pass.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$DPMLP_ROOT"

dpmlp_install_packages
dpmlp_configure_and_build "$BUILD_DIR" -DDPMLP_BUILD_EXAMPLES=ON -DDPMLP_BUILD_TESTS=OFF -DDPMLP_BUILD_BENCHMARKS=OFF

example="$BUILD_DIR/examples/multi_gpu_train"
[ -x "$example" ] || die "$example was not built"

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
# CMakeLists.txt caches DPMLP_CUDA_BUILD; without it the script could not tell a CUDA build from a host one.
grep -q '^DPMLP_CUDA_BUILD:INTERNAL=' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null \
  || die "$BUILD_DIR/CMakeCache.txt does not say whether this is a CUDA build (no DPMLP_CUDA_BUILD)"
cuda_build=$(grep -c '^DPMLP_CUDA_BUILD:INTERNAL=ON$' "$BUILD_DIR/CMakeCache.txt" || true)
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
if [ "$cuda_build" != "0" ] && [ "$gpus" -ge 2 ]; then
  log "running on $gpus GPUs: mpirun -np 2 $example"
  mpirun -np 2 -x NCCL_NVLS_ENABLE "$example" "$@"
elif [ "$cuda_build" != "0" ]; then
  # A CUDA build never counts CPU devices: with fewer than two GPUs the example says so and exits 77.
  log "a CUDA build, but $gpus GPU(s) here: multi_gpu_train needs two and will say so (exit 77)"
  mpirun -np 2 -x NCCL_NVLS_ENABLE "$example" "$@"
else
  log "no CUDA build with two GPUs here: running the CPU exercise (2 MPI ranks, --allow-cpu-devices)."
  echo "    This checks the program end to end on CPU devices. It is NOT a hardware pass."
  mpirun -np 2 "$example" --allow-cpu-devices "$@"
fi
