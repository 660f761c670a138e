#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The GPU benchmark driver: dpmlp (train_bench) and the two anchors (JAX, PyTorch DDP) in one machine
# session, so every ratio comes from one run. Run from the repository root on the 2xH200 machine, with the
# CUDA build at $B (default /tmp/build-cuda); the anchors are benchmarks/anchors. Writes under $OUT:
#   dpmlp.jsonl (one line per train_bench run), jax_ref.json, ddp_ref.json, and their logs.
# Then: python3 benchmarks/assemble_h200.py $OUT benchmarks/results/h200x2-<date>.json
set -uo pipefail
OUT="${OUT:-$PWD/out}"
B="${B:-/tmp/build-cuda}"
ANCHORS="${ANCHORS:-benchmarks/anchors}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
if [ -f .carry/builds.tar.xz ] && [ ! -d .carry/build-cuda ]; then tar -xJf .carry/builds.tar.xz -C .carry; fi
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
bench() {  # bench <ranks> <limit s> <args...>
  local np="$1" limit="$2"; shift 2
  echo "\$ mpirun -np $np train_bench $*" | tee -a "$OUT/dpmlp.log"
  timeout "$limit" mpirun -np "$np" -x NCCL_NVLS_ENABLE "$B/benchmarks/train_bench" "$@" 2>>"$OUT/dpmlp.log" \
    | tee -a "$OUT/dpmlp.jsonl"
}
date -u | tee "$OUT/date.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
# The peer exchange (TrainerOptions::peer_exchange) on 2 GPUs: the subtree sums written into the other GPU's
# memory instead of NCCL's allgather (one rank: nothing to exchange).
bench 2 120 --rows 20000 --hidden 32 --peer
bench 2 120 --rows 20000 --hidden 32 --peer --graph
bench 2 120 --rows 1048576 --hidden 32 --peer --graph
bench 2 150 --rows 1048576 --hidden 256 --peer --graph --repeats 3
bench 2 200 --rows 4194304 --hidden 256 --peer --graph --repeats 3
for np in 2 1; do
  bench $np 120 --rows 20000 --hidden 32 --graph
  bench $np 120 --rows 20000 --hidden 32
  bench $np 120 --rows 20000 --hidden 32 --reduction fast --graph
  bench $np 120 --rows 1048576 --hidden 32 --graph
  bench $np 150 --rows 1048576 --hidden 256 --graph --repeats 3
  bench $np 200 --rows 4194304 --hidden 256 --graph --repeats 3
done
# The tensor engine's warp-matrix kernel forced (--tensor-kernel warp-matrix), for the kernels side by side;
# its lines are tagged so the assembly tells them apart.
wmma() {  # wmma <limit s> <args...>
  local limit="$1"; shift
  echo "\$ mpirun -np 2 train_bench --tensor-kernel warp-matrix $*" | tee -a "$OUT/dpmlp.log"
  timeout "$limit" mpirun -np 2 -x NCCL_NVLS_ENABLE "$B/benchmarks/train_bench" --tensor-kernel warp-matrix "$@" \
    2>>"$OUT/dpmlp.log" | sed 's/^{/{"tensor_kernel": "wmma", /' | tee -a "$OUT/dpmlp.jsonl"
}
wmma 120 --rows 20000 --hidden 32 --peer --graph
wmma 120 --rows 1048576 --hidden 32 --graph
wmma 150 --rows 1048576 --hidden 256 --graph --repeats 3
wmma 200 --rows 4194304 --hidden 256 --graph --repeats 3
# The layered engine with cuBLAS (Reduction::fast), for comparison at the FMA-bound size.
bench 2 200 --rows 4194304 --hidden 256 --reduction fast --engine layered --repeats 3
OUT="$OUT" bash "$ANCHORS/run.sh" 2
