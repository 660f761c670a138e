#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The one-GPU benchmark: dpmlp (train_bench) and the two anchors (JAX, PyTorch) at the seed's model shape,
# one after the other in one machine session, so every ratio comes from one run. Run from the repository root
# on a machine with an NVIDIA GPU, with dpmlp's CUDA build at $B (default build-cuda). Writes under $OUT:
# dpmlp.jsonl (one train_bench line a run), jax_ref.json, ddp_ref.json, their logs, date.txt and gpus.txt.
# Then: python3 benchmarks/assemble_gpu.py $OUT benchmarks/results/<name>.json
#
# Precision: every side computes at fp32 level. dpmlp's tensor engine is fp32-equivalent by construction
# (3xTF32); JAX is asked for `highest` matmul precision (JAX_DEFAULT_MATMUL_PRECISION), and TF32 is turned
# off for every cuBLAS call of the anchors (NVIDIA_TF32_OVERRIDE=0; PyTorch's own default is off too).
set -uo pipefail
OUT="${OUT:-$PWD/out}"
B="${B:-build-cuda}"
ANCHORS="${ANCHORS:-benchmarks/anchors}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
bench() {  # bench <limit s> <train_bench args...>
  local limit="$1"; shift
  echo "\$ mpirun -np 1 train_bench $*" | tee -a "$OUT/dpmlp.log"
  timeout "$limit" mpirun -np 1 -x NCCL_NVLS_ENABLE "$B/benchmarks/train_bench" "$@" 2>>"$OUT/dpmlp.log" \
    | tee -a "$OUT/dpmlp.jsonl"
}
date -u +"%Y-%m-%dT%H:%M:%SZ" | tee "$OUT/date.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
bench 120 --rows 20000 --hidden 32 --graph
bench 120 --rows 1048576 --hidden 32 --graph
bench 150 --rows 1048576 --hidden 256 --graph --repeats 3
bench 200 --rows 4194304 --hidden 256 --graph --repeats 3
OUT="$OUT" bash "$ANCHORS/run.sh" 1
