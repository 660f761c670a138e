#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Assembles one workload-suite session (benchmarks/run_workloads.sh) into one JSON record and prints its
Markdown table: one row per workload; dpmlp's default (the reproducible reduction, with --graph where the
suite passes it), JAX (lax.scan, Python loop), PyTorch (eager, torch.compile); the best anchor over dpmlp;
issue 37's goal for that workload, met or not; and, where the suite ran it, dpmlp's default over dpmlp with
`--reduction fast` (issue 37: at most 1.10).

Times are ms per 100 steps (full batch) or ms per epoch (epochs), each the median of the run's repeats.
A cell whose run failed its check (the loss did not fall, or is not finite) is marked "(fail)"; a run that
timed out, failed without a result or was skipped for want of time says so. A goal is met when dpmlp's time
is within it and dpmlp's check passed.

Usage: assemble_workloads.py OUT_DIR RESULT.json
  OUT_DIR      run_workloads.sh's $OUT: workloads.jsonl, and where present date.txt, gpus.txt, versions.txt,
               command.txt
  RESULT.json  written: date, GPU, command, versions, one entry a workload, every raw line
"""
import json
import os
import sys

# issue 37, item 4: (what the workload is, as dpmlp's line says it) -> the most dpmlp may take.
GOALS = [
    ({"widths": [32, 32, 1], "rows": 20000, "mode": "full", "optimizer": "sgd", "precision": "float"}, 1.8),
    ({"widths": [32, 256, 1], "rows": 4194304, "mode": "full", "optimizer": "sgd", "precision": "float"}, 235),
    ({"widths": [32, 64, 64, 64, 1], "rows": 1048576, "mode": "full", "optimizer": "sgd", "precision": "float"}, 80),
    ({"widths": [32, 256, 256, 256, 1], "rows": 1048576, "mode": "full", "optimizer": "sgd", "precision": "float"},
     900),
    ({"widths": [32, 256, 256, 256, 1], "rows": 1048576, "mode": "full", "optimizer": "adam", "precision": "float"},
     900),
    ({"widths": [32, 32, 1], "rows": 1048576, "mode": "epoch", "batch": 4096, "optimizer": "sgd",
      "precision": "float"}, 4),
    ({"widths": [32, 256, 256, 256, 1], "rows": 1048576, "mode": "epoch", "batch": 4096, "optimizer": "sgd",
      "precision": "float"}, 20),
]
# The table's columns: (key in an entry, header, the tool, the variant).
COLUMNS = [("dpmlp", "dpmlp default", "dpmlp", None), ("jax_scan", "JAX scan", "jax", "scan"),
           ("jax_loop", "JAX loop", "jax", "loop"), ("torch_eager", "PyTorch eager", "torch", "eager"),
           ("torch_compile", "PyTorch compiled", "torch", "compile")]
ANCHORS = [c[0] for c in COLUMNS[1:]]
# dpmlp with --reduction fast (run_workloads.sh's tool, and its entry's key): the default may take at most
# FAST_LIMIT times its time.
FAST, FAST_LIMIT = "dpmlp_fast", 1.10


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def rows_text(n):
    for size, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def describe(line):
    widths = "[" + ",".join(str(w) for w in line["widths"]) + "]"
    text = f"{rows_text(line['rows'])} x {widths}"
    if line["mode"] == "epoch":
        epochs = line.get("epochs") or 1
        text += f", {'one epoch' if epochs == 1 else f'{epochs} epochs'}, batch {line['batch']}"
    else:
        text += ", full batch"
    if line.get("activation", "relu") != "relu":
        text += f", {line['activation']}"
    if line.get("optimizer") == "adam":
        text += ", Adam"
    if line.get("precision") == "double":
        text += ", float64"
    return text


def from_options(text):
    """What a workload is, from the options run_workloads.sh gave it (its error lines carry them): the fields
    of a result line, with the programs' defaults."""
    line = {"widths": None, "rows": 1048576, "mode": "full", "batch": 4096, "epochs": 1, "optimizer": "sgd",
            "precision": "float", "activation": "relu"}
    words = text.split()
    for name, value in zip(words[::2], words[1::2]):
        key = name.lstrip("-")
        if key == "widths":
            line["widths"] = [int(w) for w in value.split(",")]
        elif key in ("rows", "batch", "epochs"):
            line[key] = int(value)
        elif key in line:
            line[key] = value
    if line["mode"] == "full":
        line["batch"] = line["rows"]
    return line if line["widths"] else None


def metric(line):
    key = "ms_per_epoch" if line.get("mode") == "epoch" else "ms_per_100_steps"
    return line.get(key)


def goal_for(line):
    for match, limit in GOALS:
        if all(line.get(k) == v for k, v in match.items()):
            return limit
    return None


def cell(result):
    """A run's result as a table cell."""
    if result is None:
        return "-"
    if result.get("ms") is not None:
        text = f"{result['ms']:.4g}" if result["ms"] < 1000 else f"{result['ms']:,.0f}"
        return text if result.get("check") == "pass" else text + " (fail)"
    error = result.get("error", "")
    if result.get("skipped"):
        return "skipped"
    if error.startswith("timeout"):
        return f"timeout ({result.get('timeout_s', '?')} s)"
    return "error"


def main(argv):
    if len(argv) > 1 and argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) != 3:
        print("usage: assemble_workloads.py OUT_DIR RESULT.json (--help says more)", file=sys.stderr)
        return 2
    session, out = argv[1], argv[2]
    try:
        with open(os.path.join(session, "workloads.jsonl")) as f:
            lines = [json.loads(l) for l in f if l.startswith("{")]
    except (OSError, ValueError) as e:
        print(f"assemble_workloads.py: {e}", file=sys.stderr)
        return 2

    # One entry a row, in the suite's order; the row's description comes from any line that describes it.
    entries, order = {}, []
    for line in lines:
        row = line.get("row", describe(line) if "widths" in line else "?")
        if row not in entries:
            entries[row] = {"row": row}
            order.append(row)
        e = entries[row]
        if "widths" not in line and line.get("options"):
            described = from_options(line["options"])
            if described:
                line = dict(line, **described)
        if "widths" in line and "workload" not in e:
            e.update(workload=describe(line), unit="ms / epoch" if line["mode"] == "epoch" else "ms / 100 steps",
                     goal_ms=goal_for(line))
        tool = line.get("tool") or line.get("bench", "").split("_")[0]
        for key, _, col_tool, variant in COLUMNS + [(FAST, None, FAST, None)]:
            if tool != col_tool or (variant is not None and line.get("variant", variant) != variant):
                continue
            if "variant" not in line and variant is not None and key in e:
                continue  # a tool-level error line: the variants that have a result keep it
            result = {"ms": metric(line), "median_ms": line.get("median_ms"), "check": line.get("check"),
                      "first_loss": line.get("first_loss"), "last_loss": line.get("last_loss")}
            for k in ("error", "skipped", "timeout_s", "kernel", "engine", "block_rows", "graph", "params_digest",
                      "compile_ms", "device"):
                if k in line:
                    result[k] = line[k]
            if key in e and e[key].get("ms") is not None and result["ms"] is None:
                continue  # a timeout after this variant printed its result leaves the result
            e[key] = result

    for e in entries.values():
        anchors = [(e[k]["ms"], k) for k in ANCHORS if k in e and e[k].get("ms") is not None
                   and e[k].get("check") == "pass"]
        mine = e.get("dpmlp", {})
        if anchors:
            e["best_anchor_ms"], e["best_anchor"] = min(anchors)
            if mine.get("ms"):
                e["best_anchor_over_dpmlp"] = e["best_anchor_ms"] / mine["ms"]
        if e.get("goal_ms") is not None:
            e["goal_met"] = bool(mine.get("ms") is not None and mine.get("check") == "pass"
                                 and mine["ms"] <= e["goal_ms"])
        fast = e.get(FAST, {})
        if mine.get("ms") and fast.get("ms") and fast.get("check") == "pass":
            e["default_over_fast"] = mine["ms"] / fast["ms"]
            e["default_within_fast_limit"] = e["default_over_fast"] <= FAST_LIMIT

    gpus = read_text(os.path.join(session, "gpus.txt"))
    doc = {"date": read_text(os.path.join(session, "date.txt")),
           "gpu": gpus.splitlines()[0] if gpus else None,
           "command": read_text(os.path.join(session, "command.txt")),
           "versions": (read_text(os.path.join(session, "versions.txt")) or "").splitlines(),
           "note": "medians of warm repeats; full batch: ms per 100 steps, epochs: ms per epoch; dpmlp: "
                   "benchmarks/workload_bench (reproducible reduction); JAX: benchmarks/anchors/workload_jax.py "
                   "(matmul precision highest); PyTorch: benchmarks/anchors/workload_torch.py (TF32 off); "
                   "NVIDIA_TF32_OVERRIDE=0 for both anchors; one machine session (benchmarks/run_workloads.sh); "
                   "dpmlp_fast: workload_bench --reduction fast",
           "workloads": [entries[r] for r in order], "runs": lines}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)

    print(f"{doc['gpu'] or 'GPU unknown'}, {doc['date'] or 'date unknown'}")
    print()
    with_fast = any("default_over_fast" in e for e in entries.values())
    print("| workload | unit | " + " | ".join(c[1] for c in COLUMNS) + " | best anchor / dpmlp | goal |" +
          (" default / fast |" if with_fast else ""))
    print("|---|---|" + "---|" * len(COLUMNS) + "---|---|" + ("---|" if with_fast else ""))
    for r in order:
        e = entries[r]
        ratio = f"{e['best_anchor_over_dpmlp']:.2f}x" if "best_anchor_over_dpmlp" in e else "-"
        goal = "-"
        if e.get("goal_ms") is not None:
            goal = f"<= {e['goal_ms']:g}: {'met' if e['goal_met'] else 'not met'}"
        fast = ""
        if with_fast:
            fast = " - |"
            if "default_over_fast" in e:
                fast = f" {e['default_over_fast']:.2f}{'' if e['default_within_fast_limit'] else f' (over {FAST_LIMIT:.2f})'} |"
        print(f"| {e.get('workload', r)} | {e.get('unit', '-')} | " +
              " | ".join(cell(e.get(c[0])) for c in COLUMNS) + f" | {ratio} | {goal} |" + fast)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
