#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""CPU benchmarks of dpmlp against numpy and PyTorch, in one go. Writes benchmarks/results/cpu-<date>.json and
the chart docs/img/cpu-benchmarks.png.

  (a) standardize: dpmlp::Standardizer::transform_rows (cpu_standardize_bench, one thread) against numpy's
      standardize_np (benchmarks/anchors/jax_ref.py, copied below), on 20000x16 and 1Mx16 raw doubles.
      Goal: dpmlp >= 15x faster.
  (b) training at the seed size (20000 rows, 32 -> 32 -> 1, 100 full-batch SGD steps, rate 0.02): dpmlp's
      train_bench on 2 MPI ranks x 1 thread against PyTorch on the CPU with 2 threads. Goal: >= 2x faster.
  (c) threads against ranks, with a Kokkos OpenMP build: train_bench on 1 rank x 2 threads against 2 ranks x 1
      thread (OMP_NUM_THREADS / KOKKOS_NUM_THREADS).

  python3 benchmarks/cpu_bench.py [--build build] [--build-omp /tmp/build-omp] [--repeats 5] [--rounds 3]

Every timing is the median of `repeats` warm runs; the script runs `rounds` rounds, alternating the two sides of
each comparison, and reports each round's medians, their median, and the best (minimum) round, because a
shared machine's load moves the medians. The ratio it judges a goal by is that of the medians of rounds.
Needs numpy; torch and matplotlib are optional (skipped, and said so, when missing).
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


def standardize_np(raw, rows, cols):
    # Verbatim from benchmarks/anchors/jax_ref.py (the anchor the goal is stated against).
    import numpy as np

    r = raw.reshape(rows, cols)
    mean = r.mean(1, keepdims=True)
    dev = np.sqrt(((r - mean) ** 2).mean(1, keepdims=True)) + 1e-8
    v = (r - mean) / dev
    out = np.concatenate([v, v * np.roll(v, -1, axis=1)], 1)
    return out, float(out.sum())


def median(xs):
    return statistics.median(xs)


def loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


def machine():
    info = {"platform": platform.platform(), "python": platform.python_version(), "cores": os.cpu_count()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        info["os"] = [l.split("=", 1)[1].strip().strip('"') for l in open("/etc/os-release") if l.startswith("PRETTY_NAME")][0]
    except (OSError, IndexError):
        pass
    return info


def run_json(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1])


def threads_env(n):
    return dict(ENV, OMP_NUM_THREADS=str(n), KOKKOS_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n), MKL_NUM_THREADS=str(n),
                OMP_PROC_BIND="false")


def mpirun(n):
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    return [exe, "--oversubscribe", "--bind-to", "none", "-np", str(n)]


# ---- (a) standardize
def numpy_standardize(rows, repeats):
    import numpy as np

    raw = np.random.default_rng(0).standard_normal(rows * 16)
    standardize_np(raw, rows, 16)  # warm-up
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        standardize_np(raw, rows, 16)
        ts.append((time.perf_counter() - t) * 1e3)
    return ts


def bench_standardize(a, results):
    exe = a.std_exe or os.path.join(a.build, "benchmarks", "cpu_standardize_bench")
    if not os.path.exists(exe):
        results["standardize"] = {"skipped": f"{exe} not built"}
        print(f"(a) skipped: {exe} not built", flush=True)
        return
    out = []
    for rows in (20000, 1000000):
        reps = a.repeats if rows <= 20000 else max(3, a.repeats // 2)
        rounds = []
        for _ in range(a.rounds):
            np_ms = numpy_standardize(rows, reps)
            d = run_json([exe, "--rows", str(rows), "--repeats", str(reps)], threads_env(1))
            rounds.append({"numpy_ms": np_ms, "numpy_median_ms": median(np_ms), "dpmlp_ms": d["times_ms"],
                           "dpmlp_median_ms": d["median_ms"], "checksum": d["checksum"]})
        np_med = median([r["numpy_median_ms"] for r in rounds])
        dp_med = median([r["dpmlp_median_ms"] for r in rounds])
        np_best = min(min(r["numpy_ms"]) for r in rounds)
        dp_best = min(min(r["dpmlp_ms"]) for r in rounds)
        row = {"rows": rows, "cols": 16, "threads": 1, "rounds": rounds, "numpy_ms": np_med, "dpmlp_ms": dp_med,
               "speedup": np_med / dp_med, "numpy_best_ms": np_best, "dpmlp_best_ms": dp_best,
               "speedup_best": np_best / dp_best, "goal": 15.0, "met": np_med / dp_med >= 15.0}
        out.append(row)
        print(f"(a) standardize {rows}x16, 1 thread: numpy {np_med:.2f} ms, dpmlp {dp_med:.3f} ms -> {row['speedup']:.1f}x "
              f"(best runs: {np_best:.2f} / {dp_best:.3f} ms = {row['speedup_best']:.1f}x); goal 15x: "
              f"{'met' if row['met'] else 'MISSED'}", flush=True)
    results["standardize"] = out


# ---- (b) training against PyTorch
def torch_train(rows, hidden, steps, repeats, threads):
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 32, generator=g)
    y = torch.randn(rows, 1, generator=g)
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.02)

    def loop(n):
        t = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
        return (time.perf_counter() - t) * 1e3

    loop(5)  # warm-up
    return [loop(steps) for _ in range(repeats)], torch.__version__


def torch_worker(a):
    ts, version = torch_train(20000, 32, 100, a.repeats, 2)
    print(json.dumps({"times_ms": ts, "median_ms": median(ts), "torch": version}))


def train_bench(build, ranks, threads, repeats, check=True):
    exe = os.path.join(build, "benchmarks", "train_bench")
    cmd = mpirun(ranks) + [exe, "--allow-cpu-devices", "--repeats", str(repeats)] + ([] if check else ["--no-check"])
    return run_json(cmd, threads_env(threads))


def bench_train(a, results):
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    rounds = []
    for _ in range(a.rounds):
        d = train_bench(a.build, 2, 1, a.repeats)
        r = {"dpmlp_ms": d["times_ms"], "dpmlp_median_ms": d["median_ms"], "dpmlp_check": d["check"],
             "dpmlp_space": d["space"], "dpmlp_gemm": d["gemm"]}
        if have_torch:
            # A separate process, so torch's thread pools cannot disturb the MPI runs.
            t = run_json([sys.executable, os.path.abspath(__file__), "--torch-worker", "--repeats", str(a.repeats)], threads_env(2))
            r.update({"torch_ms": t["times_ms"], "torch_median_ms": t["median_ms"], "torch": t["torch"]})
        rounds.append(r)
    dp = median([r["dpmlp_median_ms"] for r in rounds])
    row = {"rows": 20000, "hidden": 32, "features": 32, "steps": 100, "dpmlp": "2 ranks x 1 thread (Serial)",
           "dpmlp_ms": dp, "dpmlp_best_ms": min(min(r["dpmlp_ms"]) for r in rounds), "rounds": rounds, "goal": 2.0}
    if have_torch:
        tm = median([r["torch_median_ms"] for r in rounds])
        row.update({"torch": "1 process x 2 threads (torch.set_num_threads(2))", "torch_version": rounds[0]["torch"],
                    "torch_ms": tm, "torch_best_ms": min(min(r["torch_ms"]) for r in rounds), "speedup": tm / dp,
                    "met": tm / dp >= 2.0})
        row["speedup_best"] = row["torch_best_ms"] / row["dpmlp_best_ms"]
        print(f"(b) train 20000x32, 100 steps: dpmlp 2x1 {dp:.2f} ms, torch 2 threads {tm:.2f} ms -> {row['speedup']:.2f}x "
              f"(best runs {row['speedup_best']:.2f}x); goal 2x: {'met' if row['met'] else 'MISSED'}", flush=True)
    else:
        row["torch"] = "skipped: torch is not installed"
        print(f"(b) train: dpmlp 2x1 {dp:.2f} ms; torch not installed, comparison skipped", flush=True)
    results["train_vs_torch"] = row


# ---- (c) threads against ranks (OpenMP build)
def bench_threads(a, results):
    exe = os.path.join(a.build_omp, "benchmarks", "train_bench") if a.build_omp else ""
    if not exe or not os.path.exists(exe):
        results["threads_vs_ranks"] = {"skipped": f"no OpenMP train_bench at '{exe}'"}
        print(f"(c) skipped: no OpenMP train_bench at '{exe}'", flush=True)
        return
    rounds = []
    for _ in range(a.rounds):
        t = train_bench(a.build_omp, 1, 2, a.repeats, check=False)
        r = train_bench(a.build_omp, 2, 1, a.repeats)
        rounds.append({"1x2_ms": t["times_ms"], "1x2_median_ms": t["median_ms"], "2x1_ms": r["times_ms"],
                       "2x1_median_ms": r["median_ms"], "space": t["space"], "gemm": t["gemm"], "check_2x1": r["check"]})
    t = median([r["1x2_median_ms"] for r in rounds])
    r = median([r["2x1_median_ms"] for r in rounds])
    results["threads_vs_ranks"] = {"rows": 20000, "hidden": 32, "steps": 100, "space": rounds[0]["space"],
                                   "one_rank_two_threads_ms": t, "two_ranks_one_thread_ms": r,
                                   "threads_over_ranks": t / r, "rounds": rounds}
    print(f"(c) OpenMP build, 20000x32, 100 steps: 1 rank x 2 threads {t:.2f} ms, 2 ranks x 1 thread {r:.2f} ms "
          f"(ratio {t / r:.2f})", flush=True)


def chart(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart", flush=True)
        return
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    st = results.get("standardize")
    ax = axes[0]
    if isinstance(st, list):
        labels = [f"{r['rows'] // 1000}k x 16" if r["rows"] < 10**6 else "1M x 16" for r in st]
        xs = range(len(st))
        ax.bar([x - 0.2 for x in xs], [r["numpy_ms"] for r in st], 0.4, label="numpy (standardize_np)")
        ax.bar([x + 0.2 for x in xs], [r["dpmlp_ms"] for r in st], 0.4, label="dpmlp Standardizer")
        for x, r in zip(xs, st):
            ax.text(x + 0.2, r["dpmlp_ms"] * 1.15, f"{r['speedup']:.1f}x", ha="center")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels)
        ax.set_yscale("log")
        ax.set_ylabel("ms (median, log scale)")
        ax.set_ylim(top=max(r["numpy_ms"] for r in st) * 8)
        ax.legend(fontsize=8, loc="upper left")
    ax.set_title("(a) standardize rows, 1 thread")
    tr = results.get("train_vs_torch", {})
    ax = axes[1]
    names, vals = ["dpmlp\n2 ranks x 1 thr"], [tr.get("dpmlp_ms", 0)]
    if "torch_ms" in tr:
        names.append("PyTorch\n2 threads")
        vals.append(tr["torch_ms"])
    ax.bar(names, vals, color=["tab:orange", "tab:blue"][: len(vals)])
    ax.set_ylabel("ms for 100 steps (median)")
    ax.set_title("(b) train 20000 x (32-32-1)" + (f": dpmlp {tr['speedup']:.2f}x faster" if "speedup" in tr else ""))
    th = results.get("threads_vs_ranks", {})
    ax = axes[2]
    if "one_rank_two_threads_ms" in th:
        ax.bar(["1 rank x\n2 threads", "2 ranks x\n1 thread"], [th["one_rank_two_threads_ms"], th["two_ranks_one_thread_ms"]],
               color=["tab:green", "tab:orange"])
        ax.set_ylabel("ms for 100 steps (median)")
    ax.set_title("(c) Kokkos OpenMP: threads vs ranks" +
                 (f" ({th['threads_over_ranks']:.2f}x)" if "threads_over_ranks" in th else ""))
    fig.suptitle(f"dpmlp CPU benchmarks, {results['date']}, {results['machine'].get('cpu', '?')}, "
                 f"{results['machine'].get('cores')} cores", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"chart: {path}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the Serial (default) build dir")
    ap.add_argument("--build-omp", default="/tmp/build-omp", help="a build dir configured with a Kokkos OpenMP")
    ap.add_argument("--std-exe", help="cpu_standardize_bench (default: <build>/benchmarks/cpu_standardize_bench)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="the JSON (default benchmarks/results/cpu-<date>.json)")
    ap.add_argument("--chart", default=os.path.join(ROOT, "docs", "img", "cpu-benchmarks.png"))
    ap.add_argument("--only", choices=["standardize", "train", "threads"], action="append")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the chart from a results file")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    if a.replot:
        return chart(json.load(open(a.replot)), a.chart)
    date = datetime.date.today().isoformat()
    results = {"date": date, "time": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(),
               "loadavg_before": loadavg(), "repeats": a.repeats, "rounds": a.rounds}
    try:
        import numpy

        results["numpy"] = numpy.__version__
    except ImportError:
        sys.exit("numpy is needed (python3 -m pip install numpy)")
    only = a.only or ["standardize", "train", "threads"]
    if "standardize" in only:
        bench_standardize(a, results)
    if "train" in only:
        bench_train(a, results)
    if "threads" in only:
        bench_threads(a, results)
    results["loadavg_after"] = loadavg()
    out = a.out or os.path.join(ROOT, "benchmarks", "results", f"cpu-{date}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"results: {out} (load average before {results['loadavg_before']}, after {results['loadavg_after']})", flush=True)
    chart(results, a.chart)


if __name__ == "__main__":
    main()
