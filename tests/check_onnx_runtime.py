#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""check_onnx_runtime.py <dir>: dpmlp's ONNX files, run by onnxruntime, against dpmlp's own predictions.

<dir>/manifest.txt (written by `onnx_export_test [onnxruntime-write]`) lists the cases. For each one:
  - onnx.checker.check_model(full_check=True) accepts <name>.onnx (ONNX's strict shape inference included);
  - the graph is what dpmlp/onnx.hpp says: opset 13, one input "x" of float32 [N, inputs] and one output "y" of
    float32 [N, outputs] with N symbolic, only Sub/Div (x standardization), Gemm, Relu/Tanh, Mul/Add
    (y standardization), as many Gemm nodes as layers;
  - onnxruntime (CPU) runs it on <name>_x.npy (1,000 raw rows) and must match <name>_y.npy (dpmlp's
    predictions) within 1e-5 relative: for each output column, max |onnx - dpmlp| / max |dpmlp|;
  - the batch dimension is dynamic: 1 row and 7 rows run too, and match the same predictions.
The comparison is itself checked: predictions off by 1e-4 relative must fail it.
Exit status 0 when every check passes; it prints each failure and the largest error seen.
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

TOLERANCE = 1e-5
FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    print("FAIL: " + msg)


def relative_error(got, want):
    """max over output columns of max_rows |got - want| / max_rows |want| (NaN anywhere: inf)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return float("inf")
    worst = 0.0
    for j in range(want.shape[1]):
        denom = np.max(np.abs(want[:, j]))
        err = np.max(np.abs(got[:, j] - want[:, j]))
        worst = max(worst, err / denom if denom > 0 else err)
    return worst


def dims(value_info):
    out = []
    for d in value_info.type.tensor_type.shape.dim:
        out.append(d.dim_param if d.HasField("dim_param") else d.dim_value)
    return out


def check_graph(name, model, inputs, outputs, layers, activation, xstd, ystd):
    g = model.graph
    opsets = {o.domain: o.version for o in model.opset_import}
    if opsets.get("", opsets.get("ai.onnx")) != 13:
        fail(f"{name}: opset {opsets}, expected 13")
    if [i.name for i in g.input] != ["x"] or [o.name for o in g.output] != ["y"]:
        fail(f"{name}: inputs {[i.name for i in g.input]}, outputs {[o.name for o in g.output]}")
        return
    for vi, cols in ((g.input[0], inputs), (g.output[0], outputs)):
        if vi.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            fail(f"{name}: {vi.name} is not float32")
        d = dims(vi)
        if len(d) != 2 or not isinstance(d[0], str) or not d[0] or d[1] != cols:
            fail(f"{name}: {vi.name} has shape {d}, expected [N, {cols}] with N symbolic")
    ops = [n.op_type for n in g.node]
    expected = (["Sub", "Div"] if xstd else [])
    for layer in range(layers):
        expected.append("Gemm")
        if layer + 1 < layers and activation != "identity":
            expected.append({"relu": "Relu", "tanh": "Tanh"}[activation])
    expected += (["Mul", "Add"] if ystd else [])
    if ops != expected:
        fail(f"{name}: nodes {ops}, expected {expected}")
    for n in g.node:
        if n.op_type == "Gemm":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            if attrs.get("transA", 0) or attrs.get("transB", 0) or attrs.get("alpha", 1.0) != 1.0:
                fail(f"{name}: Gemm {n.name} has attributes {attrs}")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_onnx_runtime.py <dir>")
    root = sys.argv[1]
    print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}, numpy {np.__version__}")
    cases = []
    with open(os.path.join(root, "manifest.txt")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                cases.append(line.split())
    if not cases:
        fail("the manifest lists no case")
    worst_all = 0.0
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for name, inputs, outputs, layers, activation, xstd, ystd, scalar in cases:
        inputs, outputs, layers = int(inputs), int(outputs), int(layers)
        path = os.path.join(root, name + ".onnx")
        model = onnx.load(path)
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as e:  # noqa: BLE001 - any checker complaint is a failure
            fail(f"{name}: onnx.checker: {e}")
        check_graph(name, model, inputs, outputs, layers, activation, xstd == "1", ystd == "1")
        x = np.load(os.path.join(root, name + "_x.npy"))
        want = np.load(os.path.join(root, name + "_y.npy"))
        if x.dtype != np.float32 or x.shape != (1000, inputs) or want.shape != (1000, outputs):
            fail(f"{name}: inputs {x.dtype} {x.shape}, predictions {want.shape}")
            continue
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        got = session.run(["y"], {"x": x})[0]
        err = relative_error(got, want)
        small = max(relative_error(session.run(["y"], {"x": x[:n]})[0], want[:n]) for n in (1, 7))
        worst_all = max(worst_all, err, small)
        verdict = "ok" if err <= TOLERANCE and small <= TOLERANCE else "FAIL"
        print(f"{name}: {scalar} model, {layers} layers, {activation}, x std {xstd}, y std {ystd}: "
              f"max relative error {err:.3g} over 1000 rows ({small:.3g} over 1 and 7 rows) {verdict}")
        if err > TOLERANCE or small > TOLERANCE:
            fail(f"{name}: relative error {max(err, small):.3g} > {TOLERANCE}")
        # The comparison must see a difference of 1e-4 relative.
        off = want * (1 + 1e-4)
        if relative_error(off, want) <= TOLERANCE:
            fail(f"{name}: the comparison does not see predictions off by 1e-4")
    print(f"largest relative error over {len(cases)} cases: {worst_all:.3g} (tolerance {TOLERANCE})")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        sys.exit(1)
    print("all cases passed")


if __name__ == "__main__":
    main()
