#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""check_train_csv_onnx.py: `train_csv --export` end to end (driven by tests/check_onnx_runtime.cmake).

  check_train_csv_onnx.py make DIR
      writes DIR/data.csv: 400 rows of columns a, y, b, c (the target between features, so the export must
      drop it from the right place), features with large offsets (a ~ 1000 +- 10, b ~ -50 +- 2, c ~ 0 +- 300)
      and y = 2 (a - 1000) - 5 (b + 50) + c / 100 + noise in units of about 30.
  check_train_csv_onnx.py check DIR TRAIN_MSE TEST_MSE
      runs DIR/model.onnx (written by train_csv --export) with onnxruntime on the raw feature columns of the
      rows DIR/split.csv (--write-split) puts in train and in test, and requires the mean squared errors of
      its predictions against y to match the ones train_csv printed (its own evaluator) within 1e-4 relative
      (train_csv prints 6 significant digits).
"""
import sys

import numpy as np


def make(root):
    rng = np.random.default_rng(2024)
    n = 400
    a = 1000 + 10 * rng.standard_normal(n)
    b = -50 + 2 * rng.standard_normal(n)
    c = 300 * rng.standard_normal(n)
    y = 2 * (a - 1000) - 5 * (b + 50) + c / 100 + rng.uniform(-0.5, 0.5, n)
    with open(f"{root}/data.csv", "w") as f:
        f.write("a,y,b,c\n")
        for row in zip(a, y, b, c):
            f.write(",".join(f"{v:.6f}" for v in row) + "\n")


def check(root, train_mse, test_mse):
    import onnx
    import onnxruntime as ort

    data = np.loadtxt(f"{root}/data.csv", delimiter=",", skiprows=1)
    x = data[:, [0, 2, 3]].astype(np.float32)
    y = data[:, 1]
    split = np.loadtxt(f"{root}/split.csv", delimiter=",", skiprows=1, dtype=str)
    sets = {"train": [], "validation": [], "test": []}  # train_csv prints the errors of train and test
    for row, which in split:
        sets[which].append(int(row))
    model = onnx.load(f"{root}/model.onnx")
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(f"{root}/model.onnx", providers=["CPUExecutionProvider"])
    failures = 0
    for which, printed in (("train", train_mse), ("test", test_mse)):
        rows = np.array(sets[which])
        pred = session.run(["y"], {"x": x[rows]})[0][:, 0].astype(np.float64)
        mse = float(np.mean((pred - y[rows]) ** 2))
        rel = abs(mse - printed) / printed
        ok = rel <= 1e-4
        failures += not ok
        print(f"{which}: {len(rows)} rows, onnxruntime mse {mse:.6g}, train_csv printed {printed:.6g}, "
              f"relative difference {rel:.3g} {'ok' if ok else 'FAIL'}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "check":
        check(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit("usage: check_train_csv_onnx.py make DIR | check DIR TRAIN_MSE TEST_MSE")
