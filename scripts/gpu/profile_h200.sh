#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Where a training step's time goes on the GPU machine: train_bench at the sizes (fused and layered
# engines, 1 and 2 GPUs) and, when Nsight Systems is installed, a per-kernel time table of one seed-size run
# and one 1Mx256 run. Development aid, not the benchmark of record (that is benchmarks/run_h200.sh, which
# also runs the anchors). Run from the repository root there, after scripts/gpu/validate_h200.sh has put
# the carried build at /tmp/build-cuda. Writes under $OUT.
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
for np in 2 1; do
  bench $np --rows 20000 --hidden 32 --graph
  bench $np --rows 20000 --hidden 32 --graph --reduction fast
  bench $np --rows 20000 --hidden 32 --graph --engine layered
  bench $np --rows 1048576 --hidden 32 --graph --repeats 3
  bench $np --rows 1048576 --hidden 256 --graph --repeats 3
  bench $np --rows 4194304 --hidden 256 --graph --repeats 3
done
if command -v nsys >/dev/null; then
  for cfg in "20000 32" "1048576 256"; do
    set -- $cfg
    echo "\$ nsys profile --stats=true train_bench --rows $1 --hidden $2 --graph --repeats 1 --no-check"
    timeout 200 nsys profile --cuda-graph-trace=node --stats=true -f true -o "$OUT/nsys-$1-$2" \
      "$B/benchmarks/train_bench" --rows "$1" --hidden "$2" --graph --repeats 1 --no-check --allow-cpu-devices \
      > "$OUT/nsys-$1-$2.txt" 2>&1
    grep -A25 "cuda_gpu_kern_sum" "$OUT/nsys-$1-$2.txt" | head -30
  done
else
  echo "nsys: not installed"
fi
