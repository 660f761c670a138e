# SPDX-License-Identifier: BSD-3-Clause
"""Regenerates dpmlp's test reference data from JAX.

What it makes (the files beside this script, which the tests read through DPMLP_REFERENCE_DIR):
  seed_raw.f32           the seed program's raw input: normal(k1, (20000 * 16,)), float32, little-endian, no header,
                         where k1, k2 = split(PRNGKey(0))
  seed_y.f32             the seed's targets: normal(k2, (20000, 1)), float32
  seed_reference.json    the seed's initial parameters (k1, k2 = split(PRNGKey(1)); w1 = normal(k1, (32, 32)) * 0.1,
                         b1 = 0, w2 = normal(k2, (32, 1)) * 0.1, b2 = 0) and the values its transcript prints
                         (the standardize checksum, the first and last loss of the multi-device and the one-device
                         run, and the largest difference between their final parameters)
  jax_prng_vectors.json  threefry test vectors for PRNGKey(0), (1) and (42): key, split, split into 3, fold_in(7),
                         raw 32-bit bits, uniform and normal draws; the first 8 seed draws on the GPU and on the CPU
                         and their largest difference over all 320000. It records the jax version and the
                         jax_threefry_partitionable flag (True: the default since jax 0.5).

The "seed program" is the JAX data-parallel trainer dpmlp's multi_gpu_train example ports
(benchmarks/anchors/jax_ref.py is its plain-Python form): 20000 rows x 16 raw columns, standardized to 32
features, a 32 -> 32 -> 1 ReLU MLP, MSE, 100 SGD steps at rate 0.02, the batch sharded over a mesh of every
accelerator and then the same run on one of them.

How the committed files were made: jax 0.11.2 (jaxlib and the CUDA plugin at the same version) on 2 NVIDIA H200.
The random draws are made on JAX's default device. JAX's GPU and CPU normal() differ in the last bits (up to
7.2e-7 for the seed draw), so only a CUDA GPU reproduces seed_raw.f32, seed_y.f32, the normal vectors of
PRNGKey(1) and (42) and the initial weights bit for bit; the multi-device numbers in seed_reference.json's
"printed" (max_dparam above all) need the same two GPUs.

Run (Python >= 3.12, which jax 0.11 requires):
  python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install "jax[cuda13]==0.11.2"    # or jax==0.11.2 (CPU)
  /tmp/jaxenv/bin/python tests/data/regenerate.py --out /tmp/regenerated
It writes the four files into --out (default: a folder "regenerated" in the current directory; pass
--out tests/data to replace the committed ones) and then compares each with the committed file beside this
script, byte for byte, and field by field for the JSON files.
"""
import argparse
import array
import json
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

ROWS, COLS, HIDDEN, STEPS, RATE = 20000, 16, 32, 100, 0.02
HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("seed_raw.f32", "seed_y.f32", "seed_reference.json", "jax_prng_vectors.json")


# ---- the seed program's pieces, as in benchmarks/anchors/jax_ref.py
def standardize_loop(raw, out, rows, cols):
    total = 0.0
    for row in range(rows):
        base = row * cols
        target = row * cols * 2
        s = 0.0
        for i in range(cols):
            s += raw[base + i]
        mean = s / cols
        spread = 0.0
        for i in range(cols):
            spread += (raw[base + i] - mean) * (raw[base + i] - mean)
        dev = math.sqrt(spread / cols) + 1e-8
        for i in range(cols):
            v = (raw[base + i] - mean) / dev
            out[target + i] = v
            total += v
        for i in range(cols):
            it = out[target + i] * out[target + (i + 1) % cols]
            out[target + cols + i] = it
            total += it
    return total


@jax.jit
def forward_loss(x, y, w1, b1, w2, b2):
    h = jnp.maximum(jnp.dot(x, w1) + b1, 0.0)
    r = jnp.dot(h, w2) + b2 - y
    return jnp.mean(r * r)


loss_and_grads = jax.value_and_grad(forward_loss, argnums=(2, 3, 4, 5))


@jax.jit
def train_step(x, y, w1, b1, w2, b2, rate):
    loss, g = loss_and_grads(x, y, w1, b1, w2, b2)
    return loss, w1 - rate * g[0], b1 - rate * g[1], w2 - rate * g[2], b2 - rate * g[3]


def init_params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    w1 = jax.random.normal(k1, (COLS * 2, HIDDEN)) * 0.1
    b1 = jnp.zeros((HIDDEN,))
    w2 = jax.random.normal(k2, (HIDDEN, 1)) * 0.1
    b2 = jnp.zeros((1,))
    return w1, b1, w2, b2


def train(devices, x_host, y_host):
    mesh = Mesh(devices, ("batch",))
    by_batch = NamedSharding(mesh, PartitionSpec("batch"))
    everywhere = NamedSharding(mesh, PartitionSpec())
    x = jax.device_put(x_host, by_batch)
    y = jax.device_put(y_host, by_batch)
    w1, b1, w2, b2 = (jax.device_put(a, everywhere) for a in init_params())
    first = loss = None
    for _ in range(STEPS):
        loss, w1, b1, w2, b2 = train_step(x, y, w1, b1, w2, b2, RATE)
        if first is None:
            first = loss
    return float(first), float(loss), (w1, b1, w2, b2)


# ---- the files
def as_list(a):
    return np.asarray(a).tolist()


def prng_vectors(seed):
    k = jax.random.PRNGKey(seed)
    return {
        "key": as_list(k),
        "split": as_list(jax.random.split(k)),
        "split3": as_list(jax.random.split(k, 3)),
        "fold_in_7": as_list(jax.random.fold_in(k, 7)),
        "bits_u32_10": as_list(jax.random.bits(k, (10,), jnp.uint32)),
        "bits_u32_2x3": as_list(jax.random.bits(k, (2, 3), jnp.uint32)),
        "uniform_10": as_list(jax.random.uniform(k, (10,))),
        "normal_10": as_list(jax.random.normal(k, (10,))),
        "normal_4x3": as_list(jax.random.normal(k, (4, 3))),
    }


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def generate(out):
    accelerators = [d for d in jax.devices() if d.platform != "cpu"]
    devices = accelerators or jax.devices()
    cpu = jax.devices("cpu")[0]
    print(f"jax {jax.__version__}, default backend {jax.default_backend()}, devices {devices}, "
          f"threefry_partitionable {jax.config.jax_threefry_partitionable}", flush=True)
    if not accelerators:
        print("note: no accelerator: the draws are JAX's CPU ones, which differ in the last bits from the GPU "
              "draws the committed files hold", flush=True)
    if len(devices) < 2:
        print(f"note: {len(devices)} device(s): the multi-device run is a one-device run, so printed.max_dparam "
              "is 0 (the committed value comes from 2 GPUs)", flush=True)

    # The seed's draws, on the default device (as the seed makes them) and, for comparison, on the CPU.
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    raw_dev = jax.random.normal(k1, (ROWS * COLS,))
    y_dev = jax.random.normal(k2, (ROWS, 1))
    with jax.default_device(cpu):
        raw_cpu = np.asarray(jax.random.normal(k1, (ROWS * COLS,)))
    np.asarray(raw_dev, dtype="<f4").tofile(os.path.join(out, "seed_raw.f32"))
    np.asarray(y_dev, dtype="<f4").tofile(os.path.join(out, "seed_y.f32"))

    vectors = {"jax": jax.__version__, "threefry_partitionable": bool(jax.config.jax_threefry_partitionable)}
    for seed in (0, 1, 42):
        vectors[f"seed{seed}"] = prng_vectors(seed)
    vectors["seed_raw_first8_gpu"] = as_list(raw_dev[:8])
    vectors["seed_raw_first8_cpu"] = raw_cpu[:8].tolist()
    vectors["cpu_vs_gpu_raw_maxdiff"] = float(np.max(np.abs(np.asarray(raw_dev) - raw_cpu)))
    write_json(os.path.join(out, "jax_prng_vectors.json"), vectors)

    # The seed program: standardize (the plain loop, in doubles), train on every device, then on one.
    raw = array.array("d", raw_dev.tolist())
    feats = array.array("d", [0.0] * (ROWS * COLS * 2))
    checksum = standardize_loop(raw, feats, ROWS, COLS)
    x_host = jnp.asarray(feats, dtype=jnp.float32).reshape(ROWS, COLS * 2)
    first, last, params = train(devices, x_host, y_dev)
    single_first, single_last, single = train(devices[:1], x_host, y_dev)
    drift = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(params, single))
    print(f"prep checksum={checksum:.6f}\ntrain loss {first:.4f} -> {last:.4f}\n"
          f"single device: loss {single_first:.4f} -> {single_last:.4f}, max |dparam| {drift:.2e}", flush=True)

    init = [np.asarray(a) for a in init_params()]
    kinds = sorted({d.device_kind for d in devices})
    reference = {
        "source": f"the original JAX program (45_multi_gpu_jax), jax {jax.__version__}, "
                  f"{len(devices)} x {'/'.join(kinds)}",
        "init_params": {
            "note": "k1, k2 = split(PRNGKey(1)); w1 = normal(k1, (32, 32)) * 0.1 (row-major, 32 inputs x 32 hidden); "
                    "b1 = zeros(32); w2 = normal(k2, (32, 1)) * 0.1; b2 = zeros(1); float32",
            **{name: a.ravel().tolist() for name, a in zip(("w1", "b1", "w2", "b2"), init)},
        },
        # As the transcript prints them: the checksum to 6 decimals, the losses to 4; max |dparam| unrounded.
        "printed": {
            "checksum": float(f"{checksum:.6f}"),
            "loss_first": float(f"{first:.4f}"),
            "loss_last": float(f"{last:.4f}"),
            "single_loss_first": float(f"{single_first:.4f}"),
            "single_loss_last": float(f"{single_last:.4f}"),
            "max_dparam": drift,
        },
    }
    write_json(os.path.join(out, "seed_reference.json"), reference)


def differing_fields(a, b, path=""):
    """The paths at which two parsed JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = list(a) + [k for k in b if k not in a]
        return [p for k in keys for p in differing_fields(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        if all(not isinstance(v, (dict, list)) for v in a + b):
            n = sum(x != y for x, y in zip(a, b))
            return [f"{path} ({n} of {len(a)} values)"] if n else []
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in differing_fields(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def compare(out, committed):
    same = True
    for name in FILES:
        with open(os.path.join(out, name), "rb") as f:
            new = f.read()
        with open(os.path.join(committed, name), "rb") as f:
            old = f.read()
        if new == old:
            print(f"{name}: identical")
            continue
        same = False
        if name.endswith(".json"):
            fields = differing_fields(json.loads(new), json.loads(old))
            print(f"{name}: DIFFERS in {', '.join(fields) or 'formatting only'}")
        else:
            a, b = np.frombuffer(new, "<f4"), np.frombuffer(old, "<f4")
            if a.shape != b.shape:
                print(f"{name}: DIFFERS ({a.size} values vs {b.size})")
            else:
                print(f"{name}: DIFFERS in {int(np.sum(a != b))} of {a.size} values, "
                      f"by at most {float(np.max(np.abs(a - b))):.3g}")
    return same


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="regenerated", help="folder to write the four files into")
    parser.add_argument("--against", default=HERE, help="folder of the files to compare with (default: beside "
                        "this script)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    generate(args.out)
    if os.path.realpath(args.out) == os.path.realpath(args.against):
        return 0
    return 0 if compare(args.out, args.against) else 1


if __name__ == "__main__":
    sys.exit(main())
