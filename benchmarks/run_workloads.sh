#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The workload suite (issue 37) on ONE GPU in one call: for each row, dpmlp (benchmarks/workload_bench) and
# the two anchors with every variant (benchmarks/anchors/workload_jax.py: scan, loop; workload_torch.py:
# eager, compile), one after the other, so every ratio comes from one machine session. Run from the
# repository root with dpmlp's CUDA build at $B (default build-cuda; workload_bench built), jax (with its
# CUDA plugin) and torch importable by $PYTHON (default python3; $JAX_PYTHON and $TORCH_PYTHON override it).
#
#   bash benchmarks/run_workloads.sh [--quick] [--no-fast] [--list] [SUBSET|ROW]...
#   bash benchmarks/run_workloads.sh --cpu [--quick] [ROW]...        (the CPU rows, on this machine's cores)
#
# --cpu: the CPU rows (cpu_*; --list names them) at each thread count in $THREADS (default "1 2"): dpmlp as
# that many MPI ranks of one thread each ($B: a CPU build, Serial or OpenMP with one thread a rank), and, where
# $B_OMP names a build on an OpenMP Kokkos, as one rank of that many OpenMP threads; JAX on the CPU with XLA's
# intra-op threads and affinity set to that many cores; PyTorch on the CPU with torch.set_num_threads. The deep
# and million-row rows run fewer than 100 steps (their lines give ms per 100 steps). $BUDGET_S defaults to
# 3600 there. Then: python3 benchmarks/assemble_cpu_workloads.py $OUT benchmarks/results/<name>.json
#
# SUBSET: all (the default), seed, deep, epoch, goals; ROW: a row's name (--list prints them); ROWS="a b"
# in the environment does the same. --quick: one timed repeat a run instead of three. Each GPU row also runs
# dpmlp with `--reduction fast` (tool dpmlp_fast: one allreduce, bits that depend on the rank count), the
# baseline of issue 37's "the default is never more than 10% slower than Reduction::fast"; --no-fast skips it.
#
# Writes under $OUT (default ./out): workloads.jsonl (one JSON line a run and variant, each tagged with
# "row" and "tool"; a run that timed out, failed without a line, or was skipped for want of time gets a line
# with "error"), workloads.log (every command and its stderr), date.txt, gpus.txt, versions.txt,
# command.txt. Then: python3 benchmarks/assemble_workloads.py $OUT benchmarks/results/<name>.json
#
# Time: the machine gives a command at most 10 minutes, so the suite keeps to $BUDGET_S seconds (default
# 540): every run is under `timeout`, its limit cut to what is left, and a run that would start with less
# than 20 s left is skipped (and recorded as such). Rows run cheapest first. dpmlp's limit (40 s) is some ten
# times what a row takes at the issue's goals, start-up included: a run far off them times out rather than
# eat the anchors' time (the deep rows, before the deep engines meet the goals).
# The first torch.compile of the session is the slowest (inductor's start-up, then its cache in /tmp).
#
# Precision: fp32 level everywhere. dpmlp is fp32 or 3xTF32 by construction; JAX runs at `highest` matmul
# precision (JAX_DEFAULT_MATMUL_PRECISION, and the anchor sets it too); TF32 is off for every cuBLAS call of
# the anchors (NVIDIA_TF32_OVERRIDE=0; workload_torch.py also turns PyTorch's TF32 flags off).
set -uo pipefail

usage() { sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# name | the options all three programs take | dpmlp's own | dpmlp's limit s | each anchor's limit s
ALL_ROWS=(
  "seed20k|--widths 32,32,1 --rows 20000|--graph|40|120"
  "seed1m|--widths 32,32,1 --rows 1048576|--graph|40|120"
  "epoch_32|--widths 32,32,1 --rows 1048576 --mode epoch --batch 4096|--graph|40|120"
  "epoch_256|--widths 32,256,1 --rows 1048576 --mode epoch --batch 4096|--graph|40|120"
  "wide4m|--widths 32,256,1 --rows 4194304|--graph|40|150"
  "deep64|--widths 32,64,64,64,1 --rows 1048576|--graph|40|150"
  "deep64_f64|--widths 32,64,64,64,1 --rows 1048576 --precision double|--graph|45|150"
  "deep128x4_4out|--widths 32,128,128,128,128,4 --rows 1048576|--graph|40|150"
  "deep256|--widths 32,256,256,256,1 --rows 1048576|--graph|40|150"
  "deep256_adam|--widths 32,256,256,256,1 --rows 1048576 --optimizer adam|--graph|40|150"
  "epoch_deep256|--widths 32,256,256,256,1 --rows 1048576 --mode epoch --batch 4096|--graph|40|150"
  "epoch_deep64|--widths 32,64,64,64,1 --rows 1048576 --mode epoch --batch 4096|--graph|40|150"
)
# The CPU rows (--cpu): name | the options all three programs take | dpmlp's own | dpmlp's limit s | each anchor's
CPU_ROWS=(
  "cpu_seed20k|--widths 32,32,1 --rows 20000||60|180"
  "cpu_seed1m|--widths 32,32,1 --rows 1048576 --steps 10||120|300"
  "cpu_deep64|--widths 32,64,64,64,1 --rows 100000 --steps 10||120|300"
  "cpu_deep256|--widths 32,256,256,256,1 --rows 100000 --steps 5||180|400"
  "cpu_epoch_32|--widths 32,32,1 --rows 1048576 --mode epoch --batch 4096||120|300"
)
declare -A SUBSETS=(
  [all]="seed20k seed1m epoch_32 epoch_256 wide4m deep64 deep64_f64 deep128x4_4out deep256 deep256_adam epoch_deep256 epoch_deep64"
  [seed]="seed20k seed1m wide4m"
  [deep]="deep64 deep64_f64 deep128x4_4out deep256 deep256_adam"
  [epoch]="epoch_32 epoch_256 epoch_deep256 epoch_deep64"
  [goals]="seed20k wide4m deep64 deep256 deep256_adam epoch_32 epoch_deep256"
)

REPEATS=3
FAST=1
CPU=0
for arg in "$@"; do [ "$arg" = --cpu ] && CPU=1; done
if [ $CPU = 1 ]; then ALL_ROWS=("${CPU_ROWS[@]}"); SUBSETS=([all]="cpu_seed20k cpu_seed1m cpu_deep64 cpu_deep256 cpu_epoch_32"); fi
wanted=()
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --cpu) ;;
    --quick) REPEATS=1 ;;
    --no-fast) FAST=0 ;;
    --list) for r in "${ALL_ROWS[@]}"; do IFS='|' read -r n c d _ _ <<<"$r"; echo "$n: $c ${d:+(dpmlp: $d)}"; done
            for s in "${!SUBSETS[@]}"; do echo "subset $s: ${SUBSETS[$s]}"; done; exit 0 ;;
    -*) echo "run_workloads.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
    *) if [ -n "${SUBSETS[$arg]:-}" ]; then read -ra more <<<"${SUBSETS[$arg]}"; wanted+=("${more[@]}")
       else wanted+=("$arg"); fi ;;
  esac
done
[ ${#wanted[@]} -eq 0 ] && read -ra wanted <<<"${ROWS:-${SUBSETS[all]}}"
for w in "${wanted[@]}"; do
  found=0
  for r in "${ALL_ROWS[@]}"; do [ "${r%%|*}" = "$w" ] && found=1; done
  [ $found = 1 ] || { echo "run_workloads.sh: no row or subset named '$w' (try --list)" >&2; exit 2; }
done

OUT="${OUT:-$PWD/out}"
B="${B:-build-cuda}"
ANCHORS="${ANCHORS:-benchmarks/anchors}"
PYTHON="${PYTHON:-python3}"
JAX_PYTHON="${JAX_PYTHON:-$PYTHON}"
TORCH_PYTHON="${TORCH_PYTHON:-$PYTHON}"
if [ $CPU = 1 ]; then BUDGET_S="${BUDGET_S:-3600}"; else BUDGET_S="${BUDGET_S:-540}"; fi
THREADS="${THREADS:-1 2}"
B_OMP="${B_OMP:-}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
if [ -f .carry/builds.tar.xz ] && [ ! -d .carry/build-cuda ]; then tar -xJf .carry/builds.tar.xz -C .carry; fi
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
JSONL="$OUT/workloads.jsonl" LOG="$OUT/workloads.log"
: >"$JSONL"
: >"$LOG"
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
echo "$0 $*" >"$OUT/command.txt"
date -u +"%Y-%m-%dT%H:%M:%SZ" | tee "$OUT/date.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpus.txt"
if [ $CPU = 1 ]; then
  { lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|L1d|L2|L3|Flags)" | sed 's/^Flags:.*avx512f.*/Flags: (avx512f present)/'
    echo "load at start: $(cat /proc/loadavg)"; } | tee "$OUT/cpu.txt"
fi

# An error line for a run that left none: {"row", "tool", "error", ...} (python3 writes the JSON, so any
# message is escaped).
note() {  # note <row> <tool> <error> [key=value...]
  python3 - "$@" >>"$JSONL" <<'EOF'
import json, os, sys
row, tool, error, *extra = sys.argv[1:]
d = {"row": row, "tool": tool, "check": "fail", "error": error, "options": os.environ.get("ROW_OPTIONS", "")}
for kv in extra:
    k, v = kv.split("=", 1)
    try:
        d[k] = json.loads(v)  # numbers and booleans as such
    except ValueError:
        d[k] = v
print(json.dumps(d))
EOF
}

# run <row> <tool> <limit s> <command...>: runs it under timeout (cut to the budget left), tags each JSON line
# it prints with the row and the tool, and records an error line where it timed out or printed none.
run() {
  local row="$1" tool="$2" limit="$3"; shift 3
  local left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 20 ]; then
    echo "# $row $tool: skipped, ${left}s of the budget left" | tee -a "$LOG"
    note "$row" "$tool" "skipped: the suite's time budget (${BUDGET_S}s) was spent" skipped=true
    return
  fi
  [ "$limit" -gt $((left - 5)) ] && limit=$((left - 5))
  echo "\$ [$row, ${limit}s] $*" | tee -a "$LOG"
  local tmp t0 rc
  tmp="$(mktemp)"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$tmp" 2>>"$LOG"
  rc=$?
  grep -v '^{' "$tmp" >>"$LOG"
  grep '^{' "$tmp" | sed "s/^{/{\"row\": \"$row\", \"tool\": \"$tool\", \"rc\": $rc, /" | tee -a "$JSONL" | cut -c1-400
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    note "$row" "$tool" "timeout after ${limit}s" timeout_s="$limit"
  elif ! grep -q '^{' "$tmp"; then
    note "$row" "$tool" "exit $rc without a result: $(tail -n 3 "$LOG" | tr '\n' ' ' | cut -c1-600)"
  fi
  echo "# $row $tool: exit $rc after $(($(date +%s) - t0))s" | tee -a "$LOG"
  rm -f "$tmp"
}

# What runs here, once: a tool that is missing is recorded for every row rather than failing each time.
have_dpmlp=1 have_jax=1 have_torch=1
[ -x "$B/benchmarks/workload_bench" ] || { have_dpmlp=0; echo "no $B/benchmarks/workload_bench: build it first" | tee -a "$LOG"; }
{
  echo "dpmlp: $(git log -1 --format='%h %s' 2>/dev/null)"
  "$JAX_PYTHON" -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1 | tail -1 || true
  "$TORCH_PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1 || true
} 2>&1 | tee "$OUT/versions.txt"
"$JAX_PYTHON" -c 'import jax' 2>/dev/null || have_jax=0
"$TORCH_PYTHON" -c 'import torch' 2>/dev/null || have_torch=0

# One CPU row at every thread count: dpmlp's ranks (and threads, with $B_OMP), then the anchors.
cpu_row() {
  local name="$1" t
  shift
  for t in $THREADS; do
    if [ $have_dpmlp = 1 ]; then
      run "$name" "dpmlp-ranks@$t" "$dlimit" env OMP_NUM_THREADS=1 KOKKOS_NUM_THREADS=1 \
        mpirun -np "$t" --bind-to core -x OMP_NUM_THREADS -x KOKKOS_NUM_THREADS "$B/benchmarks/workload_bench" "$@" \
        --allow-cpu-devices --repeats "$REPEATS"
    fi
    if [ -n "$B_OMP" ] && [ -x "$B_OMP/benchmarks/workload_bench" ]; then
      run "$name" "dpmlp-threads@$t" "$dlimit" env OMP_NUM_THREADS="$t" OMP_PROC_BIND=spread OMP_PLACES=cores \
        mpirun -np 1 --bind-to none -x OMP_NUM_THREADS -x OMP_PROC_BIND -x OMP_PLACES "$B_OMP/benchmarks/workload_bench" \
        "$@" --allow-cpu-devices --repeats "$REPEATS"
    fi
    if [ $have_jax = 1 ]; then
      run "$name" "jax@$t" "$alimit" env JAX_PLATFORMS=cpu "$JAX_PYTHON" "$ANCHORS/workload_jax.py" "$@" --device cpu \
        --threads "$t" --repeats "$REPEATS"
    fi
    if [ $have_torch = 1 ]; then
      run "$name" "torch@$t" "$alimit" "$TORCH_PYTHON" "$ANCHORS/workload_torch.py" "$@" --device cpu --threads "$t" \
        --repeats "$REPEATS"
    fi
  done
}

for w in "${wanted[@]}"; do
  for r in "${ALL_ROWS[@]}"; do
    IFS='|' read -r name common dpmlp_only dlimit alimit <<<"$r"
    [ "$name" = "$w" ] || continue
    read -ra args <<<"$common"
    export ROW_OPTIONS="$common"  # for note()
    read -ra own <<<"$dpmlp_only"
    if [ $CPU = 1 ]; then
      cpu_row "$name" "${args[@]}"
      continue
    fi
    dpmlp=(mpirun -np 1 -x NCCL_NVLS_ENABLE "$B/benchmarks/workload_bench" "${args[@]}" "${own[@]}" --repeats "$REPEATS")
    if [ $have_dpmlp = 1 ]; then
      run "$name" dpmlp "$dlimit" "${dpmlp[@]}"
      [ $FAST = 1 ] && run "$name" dpmlp_fast "$dlimit" "${dpmlp[@]}" --reduction fast
    else
      note "$name" dpmlp "not built: $B/benchmarks/workload_bench"
    fi
    if [ $have_jax = 1 ]; then
      run "$name" jax "$alimit" env JAX_DEFAULT_MATMUL_PRECISION=highest NVIDIA_TF32_OVERRIDE=0 \
        "$JAX_PYTHON" "$ANCHORS/workload_jax.py" "${args[@]}" --repeats "$REPEATS"
    else
      note "$name" jax "jax is not importable by $JAX_PYTHON"
    fi
    if [ $have_torch = 1 ]; then
      run "$name" torch "$alimit" env NVIDIA_TF32_OVERRIDE=0 "$TORCH_PYTHON" "$ANCHORS/workload_torch.py" "${args[@]}" \
        --repeats "$REPEATS"
    else
      note "$name" torch "torch is not importable by $TORCH_PYTHON"
    fi
  done
done
echo "# suite done in $(($(date +%s) - START))s: $(grep -c . "$JSONL") lines in $JSONL" | tee -a "$LOG"
