#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Assembles one GPU benchmark session (benchmarks/run_h200.sh) into benchmarks/results/h200x2-<date>.json:
a list of {rows, hidden, dpmlp_multi_ms, dpmlp_single_ms, jax_multi_ms, jax_single_ms, ddp_multi_ms,
ddp_single_ms} (medians of 100 steps), plus every dpmlp configuration measured, and prints a markdown table.
dpmlp_*_ms is the fastest configuration whose check passed (its name is kept beside it).
Usage: assemble_h200.py <session dir> <output json> [<chart png>]"""
import datetime
import json
import statistics
import sys

session, out = sys.argv[1], sys.argv[2]
chart = sys.argv[3] if len(sys.argv) > 3 else None
runs = [json.loads(l) for l in open(f"{session}/dpmlp.jsonl") if l.startswith("{")]
jax = json.load(open(f"{session}/jax_ref.json"))
ddp = json.load(open(f"{session}/ddp_ref.json"))
date = open(f"{session}/date.txt").read().strip()
gpus = open(f"{session}/gpus.txt").read().strip().splitlines()


def config(r):
    engine = r.get("engine", "layered")
    engine = engine if engine in ("fused", "tensor") else f"layered-{r['gemm']}"
    if r.get("tensor_kernel"):  # a tensor kernel forced by --tensor-kernel
        engine += "-" + r["tensor_kernel"]
    return (f"{r['comm']}/{r['reduction']}/{engine}" + ("/peer" if r.get("peer") else "")
            + ("/graph" if r.get("graph") else ""))


rows_out = []
for jb in jax["bench"]:
    rows, hidden = jb["rows"], jb["hidden"]
    entry = {"rows": rows, "hidden": hidden,
             "jax_multi_ms": statistics.median(jb["multi_ms"]), "jax_single_ms": statistics.median(jb["single_ms"])}
    db = next((d for d in ddp["bench"] if d["rows"] == rows and d["hidden"] == hidden), None)
    if db:
        entry["ddp_multi_ms"] = statistics.median(db["multi_ms"])
        entry["ddp_single_ms"] = statistics.median(db["single_ms"])
    for ranks, key in ((2, "multi"), (1, "single")):
        # Not the runs with a tensor kernel forced by --tensor-kernel (a measurement setting, not an
        # option a user sets): they are there to compare the kernels side by side.
        ok = [r for r in runs if r["rows"] == rows and r["hidden"] == hidden and r["ranks"] == ranks
              and r["check"] == "pass" and not r.get("tensor_kernel")]
        if ok:
            best = min(ok, key=lambda r: r["median_ms"])
            entry[f"dpmlp_{key}_ms"] = best["median_ms"]
            entry[f"dpmlp_{key}_config"] = config(best)
        repro = [r for r in ok if r["reduction"] == "reproducible"]
        if repro:
            entry[f"dpmlp_{key}_reproducible_ms"] = min(r["median_ms"] for r in repro)
    if "dpmlp_multi_ms" in entry:
        entry["speedup_vs_jax_multi"] = entry["jax_multi_ms"] / entry["dpmlp_multi_ms"]
        if "ddp_multi_ms" in entry:
            entry["speedup_vs_ddp_multi"] = entry["ddp_multi_ms"] / entry["dpmlp_multi_ms"]
        if "dpmlp_single_ms" in entry:
            entry["scaling_efficiency_1to2"] = entry["dpmlp_single_ms"] / (2 * entry["dpmlp_multi_ms"])
    rows_out.append(entry)

doc = {"date": date, "machine": "2x NVIDIA H200 (" + "; ".join(gpus) + ")", "steps": 100,
       "note": "medians of warm repeats of 100 SGD steps; dpmlp: train_bench; JAX: jax_ref.py; DDP: ddp_ref.py; "
               "all in one machine session",
       "results": rows_out, "dpmlp_runs": runs,
       "jax": {k: v for k, v in jax.items() if k != "seed"},
       "jax_seed": {k: v for k, v in jax.get("seed", {}).items() if k in ("checksum", "first", "last", "drift",
                                                                           "cold_ms_multi", "cold_ms_single")},
       "ddp": ddp}
json.dump(doc, open(out, "w"), indent=1)

print("| rows x hidden | dpmlp 2 GPU (config) | dpmlp 1 GPU | JAX 2 GPU | JAX 1 GPU | DDP 2 GPU | DDP 1 GPU | vs JAX (2 GPU) | 1->2 GPU efficiency |")
print("|---|---|---|---|---|---|---|---|---|")
for e in rows_out:
    f = lambda k: f"{e[k]:.2f}" if k in e else "-"
    print(f"| {e['rows']}x{e['hidden']} | {f('dpmlp_multi_ms')} ({e.get('dpmlp_multi_config', '-')}) | "
          f"{f('dpmlp_single_ms')} | {f('jax_multi_ms')} | {f('jax_single_ms')} | {f('ddp_multi_ms')} | "
          f"{f('ddp_single_ms')} | {e.get('speedup_vs_jax_multi', 0):.2f}x | "
          f"{100 * e.get('scaling_efficiency_1to2', 0):.1f}% |")

if chart:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{e['rows']}x{e['hidden']}" for e in rows_out]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.25
    for i, (name, key) in enumerate((("dpmlp", "dpmlp_multi_ms"), ("JAX", "jax_multi_ms"), ("PyTorch DDP", "ddp_multi_ms"))):
        ratios = [e["jax_multi_ms"] / e[key] if key in e else 0 for e in rows_out]
        ax.bar([x + (i - 1) * width for x in range(len(labels))], ratios, width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("speed relative to JAX (2 GPUs), higher is faster")
    # `date -u` prints a 12-hour clock in some locales ("03:34:59 PM UTC"): title with the 24-hour time.
    when = date[:16]
    for fmt in ("%a %b %d %I:%M:%S %p UTC %Y", "%a %b %d %H:%M:%S UTC %Y"):
        try:
            when = datetime.datetime.strptime(" ".join(date.split()), fmt).strftime("%a %b %d %Y %H:%M UTC")
            break
        except ValueError:
            pass
    ax.set_title(f"100 SGD steps on 2x H200, {when}")
    ax.axhline(1.0, color="gray", linewidth=0.5)
    ax.legend()
    fig.tight_layout()
    fig.savefig(chart, dpi=120)
