#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""workload_jax: the JAX anchor of benchmarks/workload_bench. The same work, written as JAX's best users write
it: an MLP of any widths trained with MSE (the mean over rows and outputs), full batch or in mini-batch epochs,
SGD or Adam, at fp32-level precision (jax_default_matmul_precision=highest) or in float64 (jax_enable_x64).

The problem and the initial parameters are workload_bench's, drawn with the same keys, so the losses agree
with dpmlp's to float rounding:
  kx, kp = split(PRNGKey(0));  x = normal(kx, (rows, inputs));  P = normal(kp, (inputs, outputs))
  y = tanh((x @ P) / sqrt(inputs));  W_l = normal(split(PRNGKey(1), layers)[l], (w_l, w_l+1)) / sqrt(w_l); b_l = 0
(float64 runs draw in float32 and widen, as dpmlp does.)

Variants (--variant, default both, one JSON line each):
  scan  every step of a repeat inside one jax.jit: full mode lax.scan over the steps; epoch mode one jitted
        function an epoch that draws the permutation on the device (jax.random.permutation, key
        fold_in(PRNGKey(seed), epoch)) and lax.scans over the batches (x[idx] gathered inside the step)
  loop  a Python loop over a jitted step (params and optimizer state donated on GPUs), as in a plain training
        loop; epoch mode slices the device-drawn permutation inside the step (lax.dynamic_slice)
Rows that the batch does not divide: every epoch ends with one shorter batch (a second compiled step shape),
so no row is dropped, as in dpmlp's train_epochs.
Adam is written out (optax.adam's arithmetic: bias-corrected moments, epsilon outside the square root) so
the anchor needs jax alone; inside jit XLA fuses it as it fuses optax's.

Timing: compilation is done ahead of time (jit(...).lower(...).compile(), reported as compile_ms), then one
untimed warm-up repeat, then --repeats repeats from the same initial parameters, each ended by
block_until_ready; the median is reported. On CPU (no GPU, or --device cpu) --threads N sets
XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=N (N=1; for N>1 the Eigen pool stays
on) and pins the process to N cores, before jax is imported.

Prints one JSON line a variant: bench "jax_workload", variant, the configuration, device, times_ms,
median_ms, ms_per_100_steps (full) or ms_per_epoch (epoch), compile_ms, first_loss, last_loss (the last
repeat's first and last step loss) and check ("pass": the loss fell and is finite). Exit status 0 when every
variant passed, 1 otherwise, 2 on bad input.
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="workload_jax.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--widths", default="32,256,256,256,1", help="inputs,hidden...,outputs")
    p.add_argument("--activation", default="relu", choices=["relu", "tanh", "identity"], help="hidden layers")
    p.add_argument("--rows", type=int, default=1 << 20, help="rows of the data")
    p.add_argument("--mode", default="full", choices=["full", "epoch"], help="full batch, or mini-batch epochs")
    p.add_argument("--steps", type=int, default=100, help="full mode: steps a repeat")
    p.add_argument("--epochs", type=int, default=1, help="epoch mode: epochs a repeat")
    p.add_argument("--batch", type=int, default=4096, help="epoch mode: rows a batch (the last may be shorter)")
    p.add_argument("--seed", type=int, default=0, help="epoch mode: the seed of the row order")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"], help="the optimizer")
    p.add_argument("--rate", type=float, default=argparse.SUPPRESS,
                   help="learning rate (default: 0.02 for sgd, 0.001 for adam)")
    p.add_argument("--precision", default="float", choices=["float", "double"], help="float32 or float64")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats")
    p.add_argument("--variant", default="all", choices=["scan", "loop", "all"],
                   help="scan: a repeat's steps inside one jit (lax.scan); loop: a Python loop over a jitted step; all: both")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"],
                   help="auto: the first GPU if there is one, else the CPU")
    p.add_argument("--threads", type=int, default=0, help="CPU: threads for XLA (0: its default, every core)")
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


def set_cpu_threads(threads):
    """Before jax is imported: XLA reads XLA_FLAGS once, and sizes its thread pool from the cores it may use."""
    if threads <= 0:
        return
    eigen = "false" if threads == 1 else "true"
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen={eigen} intra_op_parallelism_threads={threads}".strip()
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cores[:threads])


def main():
    a = parse_args()
    if a.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    set_cpu_threads(a.threads)
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax import lax

    jax.config.update("jax_default_matmul_precision", "highest")
    if a.precision == "double":
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.float64 if a.precision == "double" else jnp.float32
    gpus = [d for d in jax.devices() if d.platform != "cpu"]
    if a.device == "gpu" and not gpus:
        print("workload_jax.py: error: --device gpu, but jax sees no GPU", file=sys.stderr)
        return 2
    dev = gpus[0] if gpus and a.device != "cpu" else jax.devices("cpu")[0]
    on_cpu = dev.platform == "cpu"
    widths, L = a.widths, len(a.widths) - 1
    act = {"relu": jax.nn.relu, "tanh": jnp.tanh, "identity": lambda z: z}[a.activation]

    with jax.default_device(dev):
        kx, kp = jax.random.split(jax.random.PRNGKey(0))
        x = jax.random.normal(kx, (a.rows, widths[0]), jnp.float32)
        proj = jax.random.normal(kp, (widths[0], widths[-1]), jnp.float32)
        y = jnp.tanh(jnp.dot(x, proj) * np.float32(1 / np.sqrt(widths[0])))
        x, y = x.astype(dtype), y.astype(dtype)
        keys = jax.random.split(jax.random.PRNGKey(1), L)
        init = [(jax.random.normal(keys[l], (widths[l], widths[l + 1]), jnp.float32).astype(dtype)
                 * np.asarray(1 / np.sqrt(widths[l]), dtype),
                 jnp.zeros((widths[l + 1],), dtype)) for l in range(L)]
        jax.block_until_ready((x, y, init))

    def loss_fn(params, xb, yb):
        h = xb
        for l, (w, b) in enumerate(params):
            h = jnp.dot(h, w) + b
            if l + 1 < L:
                h = act(h)
        return jnp.mean(jnp.square(h - yb))

    grad_fn = jax.value_and_grad(loss_fn)
    rate = a.rate
    b1, b2, eps = 0.9, 0.999, 1e-8

    def opt_init(params):
        if a.optimizer == "sgd":
            return ()
        # Two trees of their own: the loop variant donates the state, and a buffer may be donated only once.
        return (jnp.zeros((), jnp.int32), jax.tree_util.tree_map(jnp.zeros_like, params),
                jax.tree_util.tree_map(jnp.zeros_like, params))

    def opt_update(params, grads, state):
        if a.optimizer == "sgd":
            return jax.tree_util.tree_map(lambda p, g: p - rate * g, params, grads), state
        t, m, v = state
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        c1 = 1 - b1 ** t.astype(dtype)
        c2 = 1 - b2 ** t.astype(dtype)
        params = jax.tree_util.tree_map(lambda p, m, v: p - rate * (m / c1) / (jnp.sqrt(v / c2) + eps), params, m, v)
        return params, (t, m, v)

    def step(params, state, xb, yb):
        loss, g = grad_fn(params, xb, yb)
        params, state = opt_update(params, g, state)
        return params, state, loss

    full_batches, tail = a.rows // a.batch, a.rows % a.batch
    steps_per_epoch = full_batches + (1 if tail else 0)
    steps = a.steps if a.mode == "full" else a.epochs * steps_per_epoch
    donate = () if on_cpu else (0, 1)  # the CPU backend does not donate buffers (and warns)

    def epoch_key(e):
        return jax.random.fold_in(jax.random.PRNGKey(a.seed), e)

    # Each variant: (compile() -> compile ms, run(params, state) -> (params, losses)); run does one repeat.
    def make_scan():
        if a.mode == "full":
            def train(params, state, x, y):
                def body(carry, _):
                    p, s, loss = step(*carry, x, y)
                    return (p, s), loss
                (params, state), losses = lax.scan(body, (params, state), None, length=a.steps)
                return params, state, losses
            fn = jax.jit(train)
            compiled = {}

            def compile_():
                t0 = time.perf_counter()
                compiled["f"] = fn.lower(init, opt_init(init), x, y).compile()
                return (time.perf_counter() - t0) * 1e3

            def run(params, state):
                params, state, losses = compiled["f"](params, state, x, y)
                return params, [losses]
            return compile_, run

        def train_epoch(params, state, x, y, key):
            perm = jax.random.permutation(key, a.rows)
            batches = perm[: full_batches * a.batch].reshape(full_batches, a.batch)

            def body(carry, idx):
                p, s, loss = step(*carry, x[idx], y[idx])
                return (p, s), loss
            (params, state), losses = lax.scan(body, (params, state), batches)
            if tail:
                idx = perm[full_batches * a.batch:]
                params, state, loss = step(params, state, x[idx], y[idx])
                losses = jnp.concatenate([losses, loss[None]])
            return params, state, losses
        fn = jax.jit(train_epoch)
        compiled = {}

        def compile_():
            t0 = time.perf_counter()
            compiled["f"] = fn.lower(init, opt_init(init), x, y, epoch_key(0)).compile()
            return (time.perf_counter() - t0) * 1e3

        def run(params, state):
            out = []
            for e in range(a.epochs):
                params, state, losses = compiled["f"](params, state, x, y, epoch_key(e))
                out.append(losses)
            return params, out
        return compile_, run

    def make_loop():
        if a.mode == "full":
            fn = jax.jit(step, donate_argnums=donate)
            compiled = {}

            def compile_():
                t0 = time.perf_counter()
                compiled["f"] = fn.lower(init, opt_init(init), x, y).compile()
                return (time.perf_counter() - t0) * 1e3

            def run(params, state):
                f, losses = compiled["f"], []
                for _ in range(a.steps):
                    params, state, loss = f(params, state, x, y)
                    losses.append(loss)
                return params, losses
            return compile_, run

        def batch_step(params, state, x, y, perm, start, size):
            idx = lax.dynamic_slice(perm, (start,), (size,))
            return step(params, state, x[idx], y[idx])
        # One compiled step a batch size (the slice's size must be static): the size is bound as the lambda's
        # default, which jit does not see as an argument.
        steps_fn = {size: jax.jit(lambda p, s, x, y, perm, start, size=size: batch_step(p, s, x, y, perm, start, size),
                                  donate_argnums=donate)
                    for size in ({a.batch, tail} - {0})}
        perm_fn = jax.jit(lambda key: jax.random.permutation(key, a.rows))
        compiled = {}

        def compile_():
            t0 = time.perf_counter()
            perm0 = perm_fn(epoch_key(0))
            for size, f in steps_fn.items():
                compiled[size] = f.lower(init, opt_init(init), x, y, perm0, 0).compile()
            compiled["perm"] = perm_fn.lower(epoch_key(0)).compile()
            return (time.perf_counter() - t0) * 1e3

        def run(params, state):
            losses = []
            for e in range(a.epochs):
                perm = compiled["perm"](epoch_key(e))
                for k in range(full_batches):
                    params, state, loss = compiled[a.batch](params, state, x, y, perm, k * a.batch)
                    losses.append(loss)
                if tail:
                    params, state, loss = compiled[tail](params, state, x, y, perm, full_batches * a.batch)
                    losses.append(loss)
            return params, losses
        return compile_, run

    variants = ["scan", "loop"] if a.variant == "all" else [a.variant]
    ok = True
    for variant in variants:
        compile_, run = (make_scan if variant == "scan" else make_loop)()

        def fresh():
            # Copies: a donated buffer is gone after the call, and every repeat starts from the same parameters.
            params = jax.tree_util.tree_map(jnp.copy, init)
            state = opt_init(params)
            jax.block_until_ready((params, state))
            return params, state

        record = {"bench": "jax_workload", "variant": variant, "widths": widths, "activation": a.activation,
                  "rows": a.rows, "mode": a.mode, "batch": a.batch if a.mode == "epoch" else a.rows,
                  "steps": steps, "epochs": a.epochs if a.mode == "epoch" else None, "optimizer": a.optimizer,
                  "rate": rate, "precision": a.precision, "ranks": 1, "devices": 1, "platform": dev.platform,
                  "device": getattr(dev, "device_kind", str(dev)), "threads": a.threads if on_cpu else None,
                  "jax": jax.__version__, "matmul_precision": jax.config.jax_default_matmul_precision,
                  "x64": bool(jax.config.jax_enable_x64), "repeats": a.repeats}
        try:
            with jax.default_device(dev):
                record["compile_ms"] = round(compile_(), 3)
                params, losses = run(*fresh())  # warm-up
                jax.block_until_ready((params, losses))
                times = []
                for _ in range(a.repeats):
                    params, state = fresh()
                    t0 = time.perf_counter()
                    params, losses = run(params, state)
                    jax.block_until_ready((params, losses))
                    times.append((time.perf_counter() - t0) * 1e3)
            losses = np.concatenate([np.ravel(np.asarray(l)) for l in losses]).astype(np.float64)
            med = statistics.median(times)
            record.update(times_ms=[round(t, 3) for t in times], median_ms=round(med, 3))
            if a.mode == "full":
                record["ms_per_100_steps"] = round(med * 100 / a.steps, 3)
            else:
                record["ms_per_epoch"] = round(med / a.epochs, 3)
            first, last = float(losses[0]), float(losses[-1])
            finite = bool(np.isfinite(losses).all())
            record.update(first_loss=first if np.isfinite(first) else None,
                          last_loss=last if np.isfinite(last) else None,
                          check="pass" if finite and last < first else "fail")
        except Exception as e:  # one variant's failure (out of memory, say) must not hide the other's result
            record.update(check="fail", error=f"{type(e).__name__}: {e}"[:2000])
        ok = ok and record["check"] == "pass"
        print(json.dumps(record), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
