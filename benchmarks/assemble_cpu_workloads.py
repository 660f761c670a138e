#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Assembles CPU runs of benchmarks/run_workloads.sh --cpu into one JSON file and prints a Markdown table.

  python3 benchmarks/assemble_cpu_workloads.py OUT_DIR [OUT_DIR...] RESULT.json

Several OUT_DIRs (runs of the suite one after the other on a shared machine): each figure is the best of them.
For each row and thread count: dpmlp as ranks of one thread ("dpmlp-ranks"), as one rank of OpenMP threads
("dpmlp-threads", where the run had an OpenMP build), JAX (the faster of its scan and loop variants) and PyTorch
(the faster of eager and compiled), each the median of its repeats, in ms per 100 steps (full batch) or ms per
epoch; the ratios are anchor / dpmlp (above 1: dpmlp is faster), against dpmlp's faster mode.
"""
import json
import os
import sys


def load(out, index):
    runs = []
    with open(os.path.join(out, "workloads.jsonl")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                runs.append(dict(json.loads(line), suite_run=index))
    return runs


def figure(run):
    if run.get("error") or run.get("check") != "pass":
        return None
    return run.get("ms_per_100_steps", run.get("ms_per_epoch"))


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    outs, result = sys.argv[1:-1], sys.argv[-1]
    runs = []
    meta = []
    for i, out in enumerate(outs):
        runs += load(out, i)
        m = {"suite_run": i}
        for name in ("command.txt", "date.txt", "versions.txt", "cpu.txt"):
            path = os.path.join(out, name)
            if os.path.exists(path):
                m[name.split(".")[0]] = open(path).read().strip()
        meta.append(m)
    table = {}
    order = []
    for r in runs:
        tool, _, threads = r["tool"].partition("@")
        key = (r["row"], int(threads or 0))
        if key not in table:
            table[key] = {}
            order.append(key)
        v = figure(r)
        if v is None:
            table[key].setdefault(tool + "_errors", []).append(r.get("error", r.get("check")))
            continue
        best = table[key].get(tool)
        if best is None or v < best["value"]:
            table[key][tool] = {"value": v, "variant": r.get("variant"), "unit": "ms/epoch" if "ms_per_epoch" in r else "ms/100 steps",
                                "times_ms": r.get("times_ms"), "params_digest": r.get("params_digest"),
                                "block_rows": r.get("block_rows"), "engine": r.get("engine"),
                                "suite_run": r["suite_run"]}
    rows = []
    for key in order:
        row, threads = key
        t = table[key]
        d = [t[m]["value"] for m in ("dpmlp-ranks", "dpmlp-threads") if m in t]
        best = min(d) if d else None
        entry = {"row": row, "threads": threads, **t}
        for anchor in ("torch", "jax"):
            if best and anchor in t:
                entry[f"{anchor}_over_dpmlp"] = round(t[anchor]["value"] / best, 3)
                if "dpmlp-ranks" in t:
                    entry[f"{anchor}_over_dpmlp_ranks"] = round(t[anchor]["value"] / t["dpmlp-ranks"]["value"], 3)
                if "dpmlp-threads" in t:
                    entry[f"{anchor}_over_dpmlp_threads"] = round(t[anchor]["value"] / t["dpmlp-threads"]["value"], 3)
        rows.append(entry)
    with open(result, "w") as f:
        json.dump({"meta": meta, "rows": rows, "runs": runs}, f, indent=1)

    def cell(t, m):
        if m not in t:
            return "(not run)" if m + "_errors" not in t else "(failed)"
        x = t[m]
        return f"{x['value']:,.1f}" + (f" ({x['variant']})" if x.get("variant") else "")

    print("| workload | unit | threads or ranks | dpmlp ranks | dpmlp OpenMP threads | PyTorch | JAX | PyTorch / dpmlp | JAX / dpmlp |")
    print("|---|---|---|---|---|---|---|---|---|")
    for e in rows:
        t = table[(e["row"], e["threads"])]
        unit = next((t[m]["unit"] for m in ("dpmlp-ranks", "torch", "jax") if m in t), "")
        tr = f"{e['torch_over_dpmlp']:.2f}x" if "torch_over_dpmlp" in e else "-"
        jr = f"{e['jax_over_dpmlp']:.2f}x" if "jax_over_dpmlp" in e else "-"
        print(f"| {e['row']} | {unit} | {e['threads']} | {cell(t, 'dpmlp-ranks')} | {cell(t, 'dpmlp-threads')} | "
              f"{cell(t, 'torch')} | {cell(t, 'jax')} | {tr} | {jr} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
