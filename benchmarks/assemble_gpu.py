#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Assembles one one-GPU benchmark session (benchmarks/run_gpu.sh) into one JSON file: for each size, dpmlp's
median (train_bench, the kernel its plan chose, its check and params digest), JAX's and PyTorch's medians
(single device), and the ratios; plus every raw run. Prints the markdown table docs/performance.md shows.
Usage: assemble_gpu.py <session dir> <output json>"""
import json
import statistics
import sys

session, out = sys.argv[1], sys.argv[2]
runs = [json.loads(l) for l in open(f"{session}/dpmlp.jsonl") if l.startswith("{")]
jax = json.load(open(f"{session}/jax_ref.json"))
torch = json.load(open(f"{session}/ddp_ref.json"))
date = open(f"{session}/date.txt").read().strip()
gpus = open(f"{session}/gpus.txt").read().strip().splitlines()

results = []
for jb in jax["bench"]:
    rows, hidden = jb["rows"], jb["hidden"]
    entry = {"rows": rows, "hidden": hidden, "jax_ms": statistics.median(jb["single_ms"])}
    tb = next((t for t in torch["bench"] if t["rows"] == rows and t["hidden"] == hidden), None)
    if tb:
        entry["pytorch_ms"] = statistics.median(tb["single_ms"])
    mine = [r for r in runs if r["rows"] == rows and r["hidden"] == hidden and r["ranks"] == 1]
    if mine:
        r = min(mine, key=lambda r: r["median_ms"])
        entry.update(dpmlp_ms=r["median_ms"], dpmlp_kernel=r.get("kernel", r["engine"]), dpmlp_check=r["check"],
                     dpmlp_params_digest=r["params_digest"], dpmlp_graph=r["graph"])
        entry["vs_jax"] = entry["jax_ms"] / entry["dpmlp_ms"]
        if "pytorch_ms" in entry:
            entry["vs_pytorch"] = entry["pytorch_ms"] / entry["dpmlp_ms"]
    results.append(entry)

doc = {"date": date, "machine": "1x " + "; ".join(gpus), "steps": 100,
       "note": "medians of warm repeats of 100 full-batch SGD steps (rate 0.02) of the MLP [32, H, 1]; "
               "dpmlp: benchmarks/train_bench --graph; JAX: benchmarks/anchors/jax_ref.py with "
               "JAX_DEFAULT_MATMUL_PRECISION=highest; PyTorch: benchmarks/anchors/ddp_ref.py (one process, no "
               "DDP); NVIDIA_TF32_OVERRIDE=0 for both anchors; all in one machine session (benchmarks/run_gpu.sh)",
       "jax_version": jax.get("jax"), "torch_version": torch.get("torch"),
       "results": results, "dpmlp_runs": runs,
       "jax_seed": {k: v for k, v in jax.get("seed", {}).items()
                    if k in ("checksum", "first", "last", "cold_ms_single")}}
json.dump(doc, open(out, "w"), indent=1)

print("| rows x hidden | dpmlp | dpmlp plan | JAX | PyTorch | vs JAX | vs PyTorch |")
print("|---|---|---|---|---|---|---|")
for e in results:
    f = lambda k, fmt="{:.2f}": fmt.format(e[k]) if k in e else "-"
    print(f"| {e['rows']} x {e['hidden']} | {f('dpmlp_ms')} | {e.get('dpmlp_kernel', '-')} | {f('jax_ms')} | "
          f"{f('pytorch_ms')} | {f('vs_jax', '{:.1f}x')} | {f('vs_pytorch', '{:.1f}x')} |")
