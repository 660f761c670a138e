#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Where a training step's time goes on the GPU machine: train_bench --breakdown (microseconds per call of
# each piece of a step) at the sizes, fused and layered engines, 1 and 2 GPUs; and, when Nsight
# Compute (ncu) or Nsight Systems (nsys) is installed, per-kernel GPU times of a seed-size run.
# Development aid, not the benchmark of record (that is benchmarks/run_h200.sh, which also runs the
# anchors). Run from the repository root there, after scripts/gpu/validate_h200.sh has put the carried
# build at /tmp/build-cuda. Writes under $OUT.
set -uo pipefail
OUT="${OUT:-$PWD/out}"
B="${B:-/tmp/build-cuda}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bench() {  # bench <ranks> <args...>
  local np="$1"; shift
  echo "\$ mpirun -np $np train_bench $*"
  timeout 150 mpirun -np "$np" -x NCCL_NVLS_ENABLE "$B/benchmarks/train_bench" "$@" 2>&1 | tee -a "$OUT/profile.jsonl"
}
for cfg in "20000 32" "1048576 32" "1048576 256" "4194304 256"; do
  set -- $cfg
  bench 2 --rows "$1" --hidden "$2" --breakdown
done
bench 2 --rows 20000 --hidden 32 --breakdown --reduction fast
bench 1 --rows 20000 --hidden 32 --breakdown
# Per-kernel GPU time, where a profiler is installed.
tool=""
for t in ncu nsys; do
  for d in "" /usr/local/cuda/bin/ /opt/nvidia/nsight-compute/*/ /opt/nvidia/nsight-systems/*/bin/; do
    if [ -x "$d$t" ] || command -v "$d$t" >/dev/null 2>&1; then tool="$d$t"; break 2; fi
  done
done
echo "profiler: ${tool:-none found}"
args=(--rows 20000 --hidden 32 --steps 3 --repeats 1 --warmup 0 --no-check --allow-cpu-devices)
case "$tool" in
  *ncu)
    timeout 200 "$tool" -c 24 --metrics gpu__time_duration.sum "$B/benchmarks/train_bench" "${args[@]}" \
      > "$OUT/ncu-seed.txt" 2>&1
    grep -E "gpu__time_duration|Fused|tree_reduce|combine" "$OUT/ncu-seed.txt" | sed -E 's/void Kokkos::cuda_parallel_launch_local_memory<Kokkos::Parallel(For|Reduce)<//' | cut -c1-140 | tail -24
    # Why the fused kernel takes what it takes: occupancy, throughput, warp stalls.
    for k in FusedOneHidden tree_reduce_local; do
      timeout 200 "$tool" --kernel-name-base demangled -k "regex:$k" -c 1 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        --section InstructionStats --section MemoryWorkloadAnalysis "$B/benchmarks/train_bench" "${args[@]}" \
        > "$OUT/ncu-$k.txt" 2>&1
      grep -vE "^==|^\{" "$OUT/ncu-$k.txt" | grep -E "[0-9]" | cut -c1-120 | head -70
    done ;;
  *nsys)
    timeout 200 "$tool" profile --stats=true -f true -o "$OUT/nsys-seed" "$B/benchmarks/train_bench" "${args[@]}" \
      > "$OUT/nsys-seed.txt" 2>&1
    grep -A25 "cuda_gpu_kern_sum" "$OUT/nsys-seed.txt" | head -30 ;;
esac
