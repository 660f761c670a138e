#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Writes tests/data/loss_reference.json: PyTorch's losses and their gradients with respect to the predictions,
in float64, for the losses dpmlp has (loss.hpp) and the settings tests/test_loss.cpp checks. Predictions and
targets are fixed numbers (drawn once from a seeded generator and stored); a few targets equal their
predictions exactly (d = 0, where L1's gradient is torch's sign(0) = 0), and two differences sit at +-0.75
(within rounding; Huber(0.75)'s two regimes meet there).

Unweighted cases are torch.nn.MSELoss / L1Loss / HuberLoss(delta) with reduction='mean' (the mean over rows and
outputs); weighted ones are the PyTorch idiom (w * loss_fn(pred, y, reduction='none')).mean(), the weights
broadcast over rows: the weights multiply the terms and the mean still divides by rows * outputs.

Run: python3 tests/data/loss_reference.py   (needs torch; written with torch 2.15, any recent one agrees)
"""
import json, os
import torch
import torch.nn.functional as F

torch.manual_seed(20261204)
rows, outputs = 7, 3
pred = torch.randn(rows, outputs, dtype=torch.float64) * 1.5
y = torch.randn(rows, outputs, dtype=torch.float64)
y[0, 0] = pred[0, 0]          # d = 0
y[3, 2] = pred[3, 2]          # d = 0
y[1, 1] = pred[1, 1] - 0.75   # d = +delta for delta 0.75
y[5, 0] = pred[5, 0] + 0.75   # d = -delta

weights = [0.5, 2.0, 0.0]
# (name, dpmlp loss as the test reads it, the elementwise loss, the module with reduction='mean' or None)
cases = []
for w in (None, weights):
    suffix = "" if w is None else "_weighted"
    cases += [
        ("mse" + suffix, dict(kind="mse", weights=w), lambda p, t: F.mse_loss(p, t, reduction="none"),
         torch.nn.MSELoss()),
        ("l1" + suffix, dict(kind="l1", weights=w), lambda p, t: F.l1_loss(p, t, reduction="none"), torch.nn.L1Loss()),
        ("huber_0.75" + suffix, dict(kind="huber", delta=0.75, weights=w),
         lambda p, t: F.huber_loss(p, t, reduction="none", delta=0.75), torch.nn.HuberLoss(delta=0.75)),
        ("huber_default" + suffix, dict(kind="huber", delta=1.0, weights=w),
         lambda p, t: F.huber_loss(p, t, reduction="none"), torch.nn.HuberLoss()),
    ]

out = {"torch": torch.__version__, "rows": rows, "outputs": outputs, "pred": pred.flatten().tolist(),
       "y": y.flatten().tolist(), "cases": []}
for name, loss, elementwise, module in cases:
    p = pred.clone().requires_grad_(True)
    terms = elementwise(p, y)
    if loss["weights"] is None:
        value = terms.mean()
        assert torch.equal(value, module(p, y)), name  # the idiom is the module's reduction='mean'
    else:
        value = (torch.tensor(loss["weights"], dtype=torch.float64) * terms).mean()
    value.backward()
    case = dict(name=name, kind=loss["kind"], weights=loss["weights"] or [], loss=value.item(),
                grad=p.grad.flatten().tolist())
    if "delta" in loss:
        case["delta"] = loss["delta"]
    out["cases"].append(case)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loss_reference.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print("wrote", path)
