#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""check_npy_numpy.py <dir>: dpmlp's npy files, checked by numpy itself, and files numpy writes for dpmlp.

1. Reads <dir>/from_cpp/manifest.txt (written by `test_npy [numpy-write]`): every file it lists is loaded with
   numpy.load and must have exactly the listed dtype, shape, C order, format version 1.0 with the data
   64-byte aligned, and bit for bit the listed values. For every model it lists ("forward" lines) numpy
   recomputes the forward pass, x @ W0 + b0 -> activation -> ... -> x @ W_last + b_last, and must match the
   predictions dpmlp's device-callable evaluator wrote (to float rounding), so weights really are (in, out).
2. Writes <dir>/from_numpy/ with numpy.save (arrays of several dtypes and ranks, a version 2.0 file, a
   model's w<l>/b<l> files, and files dpmlp must refuse: Fortran order, float64 and big-endian where float32
   is expected) and a manifest of what `test_npy [numpy-read]` must find in them.
Exit status 0 when every check passes; it prints each failure.
"""
import os
import sys

import numpy as np

FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    print("FAIL: " + msg)


def parse_manifest(path):
    """Yields (head words, value words) per line."""
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            head, bar, values = line.partition(" =")
            yield head.split(), values.split() if bar else []


def expected_array(dtype, shape, words):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        values = np.array([float.fromhex(w) for w in words], dtype=np.float64).astype(dt)
    else:
        values = np.array([int(w) for w in words], dtype=dt)
    return values.reshape(shape)


def check_raw_header(path):
    with open(path, "rb") as f:
        raw = f.read(12)
        f.seek(0)
        version = np.lib.format.read_magic(f)
        _, fortran_order, _ = np.lib.format.read_array_header_1_0(f)  # raises on a header numpy refuses
        offset = f.tell()
    if fortran_order:
        fail(f"{path}: fortran_order is True")
    if raw[:6] != b"\x93NUMPY":
        fail(f"{path}: bad magic {raw[:6]!r}")
    if version != (1, 0):
        fail(f"{path}: format version {version}, expected (1, 0)")
    if offset % 64 != 0:
        fail(f"{path}: data starts at byte {offset}, not a multiple of 64")


def check_from_cpp(root):
    manifest = os.path.join(root, "manifest.txt")
    if not os.path.exists(manifest):
        fail(f"{manifest} is missing (did `test_npy [numpy-write]` run?)")
        return
    files = forwards = 0
    for head, words in parse_manifest(manifest):
        if head[0] == "forward":
            _, name, activation, layers, xfile, predfile = head
            check_forward(root, name, activation, int(layers), xfile, predfile)
            forwards += 1
            continue
        name, dtype, ndim = head[0], head[1], int(head[2])
        shape = tuple(int(d) for d in head[3:3 + ndim])
        path = os.path.join(root, name)
        check_raw_header(path)
        a = np.load(path, allow_pickle=False)
        if a.dtype.str != dtype:
            fail(f"{name}: numpy reads dtype {a.dtype.str}, manifest says {dtype}")
            continue
        if a.shape != shape:
            fail(f"{name}: numpy reads shape {a.shape}, manifest says {shape}")
            continue
        if not a.flags.c_contiguous:
            fail(f"{name}: not C order")
        want = expected_array(dtype, shape, words)
        if a.dtype.kind == "f":
            bits = np.dtype(f"<u{a.dtype.itemsize}")
            same = np.array_equal(a.reshape(-1).view(bits), want.reshape(-1).view(bits))
        else:
            same = np.array_equal(a, want)
        if not same:
            fail(f"{name}: values differ from the manifest (first values {a.reshape(-1)[:4]} vs {want.reshape(-1)[:4]})")
        files += 1
    print(f"from_cpp: {files} files checked (dtype, shape, order, header, bits), {forwards} forward passes")
    if files < 8 or forwards < 1:
        fail(f"from_cpp: too few entries ({files} files, {forwards} forward lines)")


def check_forward(root, name, activation, layers, xfile, predfile):
    x = np.load(os.path.join(root, xfile))
    pred = np.load(os.path.join(root, predfile))
    a = x.astype(np.float64)
    for l in range(layers):
        w = np.load(os.path.join(root, name, f"w{l}.npy")).astype(np.float64)
        b = np.load(os.path.join(root, name, f"b{l}.npy")).astype(np.float64)
        if w.ndim != 2 or w.shape[0] != a.shape[1] or b.shape != (w.shape[1],):
            fail(f"{name}: layer {l}: w {w.shape}, b {b.shape} do not chain from inputs of width {a.shape[1]}")
            return
        a = a @ w + b
        if l + 1 < layers:
            if activation == "relu":
                a = np.maximum(a, 0.0)
            elif activation == "tanh":
                a = np.tanh(a)
            elif activation != "identity":
                fail(f"{name}: unknown activation {activation}")
                return
    tol = 1e-4 if pred.dtype == np.float32 else 1e-10
    err = np.max(np.abs(a - pred)) if a.size else 0.0
    scale = max(1.0, float(np.max(np.abs(a)))) if a.size else 1.0
    if a.shape != pred.shape or err > tol * scale:
        fail(f"{name}: numpy's forward pass differs from dpmlp's by {err} (shape {a.shape} vs {pred.shape})")
    else:
        print(f"  {name}: numpy forward pass (x @ W + b, {activation}) matches dpmlp's evaluator, max diff {err:.3g}")


def hexes(a):
    a = np.asarray(a).reshape(-1)
    if a.dtype.kind == "f":
        return " ".join(float(v).hex() for v in a)
    return " ".join(str(int(v)) for v in a)


def write_from_numpy(root):
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(2024)
    lines = ["# written by tests/check_npy_numpy.py; read by tests/test_npy.cpp [numpy-read]",
             "# <file> <dtype to load as> <ndim> <dims...> <ok|refuse-fortran|refuse-dtype> = <values>",
             "# model <dir> <activation> <n widths> <widths...> = <parameters in the dpmlp::Mlp layout>"]

    def entry(name, a, status="ok", load_as=None):
        np.save(os.path.join(root, name), a)
        dtype = load_as or a.dtype.str
        values = hexes(a) if status == "ok" else ""
        lines.append(f"{name} {dtype} {a.ndim} {' '.join(str(d) for d in a.shape)} {status} = {values}".replace("  ", " "))

    entry("a32.npy", rng.standard_normal((3, 5)).astype(np.float32))
    entry("a64.npy", rng.standard_normal((2, 3, 4)))
    entry("row.npy", rng.standard_normal(7).astype(np.float32))
    entry("scalar.npy", np.array(2.75))
    entry("empty.npy", np.zeros((0, 2), dtype=np.float32))
    entry("i32.npy", np.array([-3, 0, 7, 2**31 - 1], dtype=np.int32))
    entry("i64.npy", np.array([[2**40], [-9]], dtype=np.int64))
    entry("u8.npy", np.array([0, 9, 255], dtype=np.uint8))
    # A transposed view: numpy.save writes it in Fortran order, which dpmlp refuses (it does not transpose);
    # np.ascontiguousarray makes it acceptable.
    t = rng.standard_normal((4, 3)).astype(np.float32).T
    entry("fortran.npy", np.asfortranarray(t), status="refuse-fortran")
    entry("fortran_fixed.npy", np.ascontiguousarray(t))
    entry("f64_as_f32.npy", rng.standard_normal(3), status="refuse-dtype", load_as="<f4")
    entry("big_endian.npy", np.arange(4, dtype=">f4"), status="refuse-dtype", load_as="<f4")
    # A version 2.0 file (numpy writes one when a header outgrows 65535 bytes; forced here).
    v2 = rng.standard_normal((2, 2)).astype(np.float32)
    with open(os.path.join(root, "v2.npy"), "wb") as f:
        np.lib.format.write_array(f, v2, version=(2, 0))
    lines.append(f"v2.npy <f4 2 2 2 ok = {hexes(v2)}")
    # A model, as a numpy user would hand one over: W_l (in, out) and b_l (out,), float32.
    widths = [3, 4, 2]
    os.makedirs(os.path.join(root, "model"), exist_ok=True)
    flat = []
    for l in range(len(widths) - 1):
        w = rng.standard_normal((widths[l], widths[l + 1])).astype(np.float32)
        b = rng.standard_normal(widths[l + 1]).astype(np.float32)
        np.save(os.path.join(root, "model", f"w{l}.npy"), w)
        np.save(os.path.join(root, "model", f"b{l}.npy"), b)
        flat += [w.reshape(-1), b]
    lines.append(f"model model relu {len(widths)} {' '.join(map(str, widths))} = {hexes(np.concatenate(flat))}")
    with open(os.path.join(root, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"from_numpy: wrote {len(lines) - 3} entries with numpy {np.__version__}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    base = sys.argv[1]
    check_from_cpp(os.path.join(base, "from_cpp"))
    write_from_numpy(os.path.join(base, "from_numpy"))
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("numpy agrees with dpmlp's npy files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
