#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The two anchors at fp32-level precision, one after the other: jax_ref.py (JAX at `highest` matmul precision)
# and ddp_ref.py under torchrun on <gpus> processes, TF32 off for both (NVIDIA_TF32_OVERRIDE=0). Writes
# jax_ref.json, ddp_ref.json and their logs into $OUT (the scripts write there), and echoes each log's tail.
# Used by benchmarks/run_gpu.sh (one GPU) and run_h200.sh (two).   Usage: OUT=<dir> run.sh <gpus>
set -uo pipefail
gpus="${1:?usage: run.sh <gpus>}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${OUT:?OUT must name the output folder}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)" && export OUT  # absolute: the anchors run from inside it
(cd "$OUT" && JAX_DEFAULT_MATMUL_PRECISION=highest NVIDIA_TF32_OVERRIDE=0 \
  timeout 300 python3 "$here/jax_ref.py" > "$OUT/jax_ref.log" 2>&1; echo "jax_ref exit $?")
tail -6 "$OUT/jax_ref.log"
(cd "$OUT" && NVIDIA_TF32_OVERRIDE=0 \
  timeout 300 torchrun --nproc_per_node="$gpus" "$here/ddp_ref.py" > "$OUT/ddp_ref.log" 2>&1; echo "ddp_ref exit $?")
tail -8 "$OUT/ddp_ref.log"
