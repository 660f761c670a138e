#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Writes tests/data/optim_reference.json: what PyTorch's torch.optim does to a parameter vector over a few
steps, in float64, for the optimizers dpmlp has and the settings tests/test_reference_math.cpp checks. The
parameters and each step's gradients are fixed numbers (drawn once from a seeded generator and stored), so the
test feeds dpmlp's optimizers the same gradients and compares the parameters after every step.

Run: python3 tests/data/optim_reference.py   (needs torch; written with torch 2.15, any recent one agrees)
"""
import json, os
import torch

torch.manual_seed(20261203)
n, steps = 12, 6
p0 = torch.randn(n, dtype=torch.float64)
grads = [torch.randn(n, dtype=torch.float64) * (0.5 + s) for s in range(steps)]

cases = [
    ("sgd", dict(lr=0.1), lambda ps, kw: torch.optim.SGD(ps, **kw)),
    ("sgd_momentum", dict(lr=0.05, momentum=0.9), lambda ps, kw: torch.optim.SGD(ps, **kw)),
    ("adam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8), lambda ps, kw: torch.optim.Adam(ps, **kw)),
    ("adam_small_eps", dict(lr=0.003, betas=(0.8, 0.99), eps=1e-3), lambda ps, kw: torch.optim.Adam(ps, **kw)),
]
out = {"torch": torch.__version__, "initial": p0.tolist(), "grads": [g.tolist() for g in grads], "cases": []}
for name, kw, make in cases:
    p = torch.nn.Parameter(p0.clone())
    opt = make([p], kw)
    after = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        after.append(p.detach().clone().tolist())
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items()}
    out["cases"].append({"name": name, "settings": settings, "after": after})

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_reference.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", path)
