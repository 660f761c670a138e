#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Ordinary least squares on the same CSV and the same train/test split as train_csv: the reference that
train_csv's test MSE is held to.

  # the data set (scikit-learn's diabetes data, shipped inside the sklearn wheel; raw units, not scaled):
  python3 benchmarks/ols_reference.py --write-diabetes /tmp/diabetes.csv
  # train_csv writes its split (row,set) with --write-split; OLS then fits on exactly those train rows:
  mpirun -np 2 build/examples/train_csv /tmp/diabetes.csv --target target --write-split /tmp/split.csv ...
  python3 benchmarks/ols_reference.py /tmp/diabetes.csv --target target --split /tmp/split.csv [--json]

OLS here: y = X b + c with an intercept, fitted by numpy.linalg.lstsq on the training rows (train_csv's
`train` and `validation` rows: every row but the test rows) (the features are
not standardized: OLS with an intercept is invariant to that). Prints `train mse <g> test mse <g>`, the
errors in the target's units, like train_csv.
"""
import argparse
import csv
import json
import sys

import numpy as np


def read_csv(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and any(x.strip() for x in r)]
    header = [h.strip().strip('"') for h in rows[0]]
    data = np.array([[float(x) for x in r] for r in rows[1:]], dtype=np.float64)
    return header, data


def read_split(path, rows):
    """The rows OLS fits on: every row but the test rows (train_csv's validation rows too: OLS has nothing to
    tune, so it fits on all the rows train_csv may use)."""
    train = np.zeros(rows, dtype=bool)
    seen = np.zeros(rows, dtype=bool)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for r in reader:
            i = int(r["row"])
            seen[i] = True
            train[i] = r["set"].strip() != "test"
    if not seen.all():
        sys.exit(f"{path}: the split does not cover all {rows} rows")
    return train


def write_diabetes(path):
    from sklearn.datasets import load_diabetes

    d = load_diabetes(scaled=False)
    names = list(d.feature_names) + ["target"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(names)
        for x, y in zip(d.data, d.target):
            w.writerow([repr(float(v)) for v in x] + [repr(float(y))])
    print(f"wrote {path}: {len(d.target)} rows, columns {', '.join(names)}")


def ols(header, data, target, train):
    t = header.index(target)
    X = np.delete(data, t, axis=1)
    y = data[:, t]
    A = np.hstack([X, np.ones((X.shape[0], 1))])
    coef, *_ = np.linalg.lstsq(A[train], y[train], rcond=None)
    pred = A @ coef
    train_mse = float(np.mean((pred[train] - y[train]) ** 2))
    test_mse = float(np.mean((pred[~train] - y[~train]) ** 2)) if (~train).any() else float("nan")
    return train_mse, test_mse


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", nargs="?")
    ap.add_argument("--target")
    ap.add_argument("--split", help="train_csv's --write-split file (row,set)")
    ap.add_argument("--write-diabetes", metavar="PATH", help="write sklearn's diabetes data (raw units) as CSV")
    ap.add_argument("--json", action="store_true", help="print one JSON line instead")
    a = ap.parse_args()
    if a.write_diabetes:
        write_diabetes(a.write_diabetes)
        if not a.data:
            return
    if not (a.data and a.target and a.split):
        ap.error("DATA, --target and --split are needed")
    header, data = read_csv(a.data)
    train = read_split(a.split, data.shape[0])
    train_mse, test_mse = ols(header, data, a.target, train)
    if a.json:
        print(json.dumps(dict(method="ols", train_rows=int(train.sum()), test_rows=int((~train).sum()),
                              train_mse=train_mse, test_mse=test_mse)))
    else:
        print(f"train mse {train_mse:g} test mse {test_mse:g}")


if __name__ == "__main__":
    main()
