#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""workload_torch: the PyTorch anchor of benchmarks/workload_bench. The same work, written as PyTorch's best
users write it: an nn.Sequential of nn.Linear layers and the activation, F.mse_loss (the mean over rows and
outputs), torch.optim.SGD or Adam (fused on CUDA, foreach elsewhere), full batch or in mini-batch epochs
(torch.randperm on the device each epoch, the last batch shorter when the batch does not divide the rows), at
fp32 precision (TF32 off for matmuls and cuDNN, float32 matmul precision "highest") or in float64.

The problem is workload_bench's in distribution: x normal (rows x inputs), y = tanh((x @ P) / sqrt(inputs))
with P normal, LeCun-normal weights (std 1/sqrt(fan_in)), zero biases; drawn with torch's generator on the
device (seed 0), so the values are not dpmlp's or JAX's and the losses agree with theirs only statistically.

Variants (--variant, default both, one JSON line each):
  eager    the plain training step
  compile  the model under torch.compile (dynamic=False: the last, shorter batch of an epoch gets its own
           graph; --compile-mode picks the mode); the fused optimizer step stays eager
Timing: compilation is not timed: the compile variant's first step (where compilation happens) is reported as
compile_ms, then one untimed warm-up repeat (which compiles any other batch shape), then --repeats repeats,
each from the same initial parameters with a fresh optimizer, fenced with torch.cuda.synchronize; the losses
stay on the device until a repeat ends. The median is reported. On CPU (no GPU, or --device cpu) --threads N
calls torch.set_num_threads(N).

Prints one JSON line a variant: bench "torch_workload", variant, the configuration, device, times_ms,
median_ms, ms_per_100_steps (full) or ms_per_epoch (epoch), compile_ms, first_loss, last_loss (the last
repeat's first and last step loss) and check ("pass": the loss fell and is finite). Exit status 0 when every
variant passed, 1 otherwise, 2 on bad input.
"""
import argparse
import json
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="workload_torch.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--widths", default="32,256,256,256,1", help="inputs,hidden...,outputs")
    p.add_argument("--activation", default="relu", choices=["relu", "tanh", "identity"], help="hidden layers")
    p.add_argument("--rows", type=int, default=1 << 20, help="rows of the data")
    p.add_argument("--mode", default="full", choices=["full", "epoch"], help="full batch, or mini-batch epochs")
    p.add_argument("--steps", type=int, default=100, help="full mode: steps a repeat")
    p.add_argument("--epochs", type=int, default=1, help="epoch mode: epochs a repeat")
    p.add_argument("--batch", type=int, default=4096, help="epoch mode: rows a batch (the last may be shorter)")
    p.add_argument("--seed", type=int, default=0, help="epoch mode: the seed of the row order")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"], help="torch.optim.SGD or Adam")
    p.add_argument("--rate", type=float, default=argparse.SUPPRESS,
                   help="learning rate (default: 0.02 for sgd, 0.001 for adam)")
    p.add_argument("--precision", default="float", choices=["float", "double"], help="float32 or float64")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats")
    p.add_argument("--variant", default="all", choices=["eager", "compile", "all"],
                   help="eager: the plain step; compile: the model under torch.compile; all: both")
    p.add_argument("--compile-mode", default="default",
                   choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                   help="torch.compile's mode")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto: the first GPU if there is one, else the CPU")
    p.add_argument("--threads", type=int, default=0, help="CPU: torch.set_num_threads (0: torch's default)")
    a = p.parse_args(argv)
    try:
        a.widths = [int(w) for w in a.widths.split(",")]
    except ValueError:
        p.error(f"--widths: not a list of integers: {a.widths!r}")
    if len(a.widths) < 2 or min(a.widths) <= 0:
        p.error("--widths needs at least inputs,outputs, all positive")
    for name in ("rows", "steps", "epochs", "batch", "repeats"):
        if getattr(a, name) <= 0:
            p.error(f"--{name} must be positive")
    if a.mode == "epoch" and a.batch > a.rows:
        p.error("--batch must not exceed --rows")
    if a.threads < 0:
        p.error("--threads must not be negative")
    if not hasattr(a, "rate"):
        a.rate = 0.02 if a.optimizer == "sgd" else 1e-3
    return a


def main():
    a = parse_args()
    import math
    import torch
    import torch.nn.functional as F
    from torch import nn

    # fp32 means fp32: no TF32 in cuBLAS or cuDNN (NVIDIA_TF32_OVERRIDE=0 in run_workloads.sh says it again).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("workload_torch.py: error: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if a.device != "cpu" and torch.cuda.is_available() else "cpu")
    on_cuda = dev.type == "cuda"
    if not on_cuda and a.threads > 0:
        torch.set_num_threads(a.threads)
    dtype = torch.float64 if a.precision == "double" else torch.float32
    widths, L = a.widths, len(a.widths) - 1

    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    x = torch.randn(a.rows, widths[0], device=dev, generator=gen)
    proj = torch.randn(widths[0], widths[-1], device=dev, generator=gen)
    y = torch.tanh((x @ proj) / math.sqrt(widths[0]))
    x, y = x.to(dtype), y.to(dtype)

    def make_model():
        layers = []
        for l in range(L):
            lin = nn.Linear(widths[l], widths[l + 1])
            layers.append(lin)
            if l + 1 < L and a.activation != "identity":
                layers.append(nn.ReLU() if a.activation == "relu" else nn.Tanh())
        return nn.Sequential(*layers).to(device=dev, dtype=dtype)

    torch.manual_seed(1)
    model = make_model()
    with torch.no_grad():
        for m in model:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=1 / math.sqrt(m.in_features))
                nn.init.zeros_(m.bias)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def make_optimizer():
        # Fused kernels on CUDA (one launch for every parameter), foreach elsewhere: each the fastest form its
        # users pick on that device.
        # A torch without fused SGD (before 2.4) gets foreach there.
        kind = torch.optim.SGD if a.optimizer == "sgd" else torch.optim.Adam
        if on_cuda:
            try:
                return kind(model.parameters(), lr=a.rate, fused=True), {"fused": True}
            except (RuntimeError, TypeError, ValueError):
                pass
        return kind(model.parameters(), lr=a.rate, foreach=True), {"foreach": True}

    full_batches, tail = a.rows // a.batch, a.rows % a.batch
    steps = a.steps if a.mode == "full" else a.epochs * (full_batches + (1 if tail else 0))
    perm_gen = torch.Generator(device=dev)

    def sync():
        if on_cuda:
            torch.cuda.synchronize(dev)

    def run(net, opt):
        """One repeat; returns the step losses (on the device until the end)."""
        losses = []

        def step(xb, yb):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(net(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.detach())

        if a.mode == "full":
            for _ in range(a.steps):
                step(x, y)
        else:
            perm_gen.manual_seed(a.seed)
            for _ in range(a.epochs):
                perm = torch.randperm(a.rows, device=dev, generator=perm_gen)
                for start in range(0, a.rows, a.batch):
                    idx = perm[start:start + a.batch]
                    step(x[idx], y[idx])
        return torch.stack(losses)

    variants = ["eager", "compile"] if a.variant == "all" else [a.variant]
    device_name = torch.cuda.get_device_name(dev) if on_cuda else "cpu"
    ok = True
    for variant in variants:
        record = {"bench": "torch_workload", "variant": variant, "widths": widths, "activation": a.activation,
                  "rows": a.rows, "mode": a.mode, "batch": a.batch if a.mode == "epoch" else a.rows,
                  "steps": steps, "epochs": a.epochs if a.mode == "epoch" else None, "optimizer": a.optimizer,
                  "rate": a.rate, "precision": a.precision, "ranks": 1, "devices": 1, "platform": dev.type,
                  "device": device_name, "threads": torch.get_num_threads() if not on_cuda else None,
                  "torch": torch.__version__, "tf32": torch.backends.cuda.matmul.allow_tf32,
                  "repeats": a.repeats}
        if variant == "compile":
            record["compile_mode"] = a.compile_mode
        try:
            net = model
            if variant == "compile":
                net = torch.compile(model, dynamic=False, mode=None if a.compile_mode == "default" else a.compile_mode)
                # The first step compiles the forward and backward graphs of the first batch shape.
                model.load_state_dict(init)
                opt, _ = make_optimizer()
                xb, yb = (x, y) if a.mode == "full" else (x[: a.batch], y[: a.batch])
                sync()
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                F.mse_loss(net(xb), yb).backward()
                opt.step()
                sync()
                record["compile_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
            model.load_state_dict(init)
            opt, impl = make_optimizer()
            record["optimizer_impl"] = next(iter(impl))
            sync()
            t0 = time.perf_counter()
            run(net, opt)  # warm-up: caches, cuBLAS handles, the other batch shape's graph
            sync()
            record["warmup_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
            times = []
            for _ in range(a.repeats):
                model.load_state_dict(init)  # in place: the same Parameters, so no recompilation
                opt, _ = make_optimizer()
                sync()
                t0 = time.perf_counter()
                losses = run(net, opt)
                sync()
                times.append((time.perf_counter() - t0) * 1e3)
            losses = losses.double().cpu()
            med = statistics.median(times)
            record.update(times_ms=[round(t, 3) for t in times], median_ms=round(med, 3))
            if a.mode == "full":
                record["ms_per_100_steps"] = round(med * 100 / a.steps, 3)
            else:
                record["ms_per_epoch"] = round(med / a.epochs, 3)
            first, last = float(losses[0]), float(losses[-1])
            finite = bool(torch.isfinite(losses).all())
            record.update(first_loss=first if math.isfinite(first) else None,
                          last_loss=last if math.isfinite(last) else None,
                          check="pass" if finite and last < first else "fail")
        except Exception as e:  # one variant's failure (out of memory, a compiler error) must not hide the other's
            record.update(check="fail", error=f"{type(e).__name__}: {e}"[:2000])
        ok = ok and record["check"] == "pass"
        print(json.dumps(record), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
