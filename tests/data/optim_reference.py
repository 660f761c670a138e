#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Writes tests/data/optim_reference.json: what PyTorch's torch.optim does to a parameter vector over a few
steps, in float64, for the optimizers and learning-rate schedules (torch.optim.lr_scheduler, one
scheduler.step() after each optimizer step) dpmlp has and the settings tests/test_reference_math.cpp checks. The
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

sched = torch.optim.lr_scheduler
# (name, optimizer settings, optimizer, schedule as dpmlp's test reads it, the scheduler; None: none)
cases = [
    ("sgd", dict(lr=0.1), torch.optim.SGD, None, None),
    ("sgd_momentum", dict(lr=0.05, momentum=0.9), torch.optim.SGD, None, None),
    ("adam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8), torch.optim.Adam, None, None),
    ("adam_small_eps", dict(lr=0.003, betas=(0.8, 0.99), eps=1e-3), torch.optim.Adam, None, None),
    ("sgd_step_decay", dict(lr=0.1), torch.optim.SGD, dict(kind="step_decay", step_size=2, gamma=0.5),
     lambda o: sched.StepLR(o, step_size=2, gamma=0.5)),
    ("sgd_momentum_warmup_cosine", dict(lr=0.05, momentum=0.9), torch.optim.SGD,
     dict(kind="cosine", t_max=3, min_factor=0.1, warmup=2, warmup_start=0.25),
     lambda o: sched.SequentialLR(o, [sched.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=2),
                                      sched.CosineAnnealingLR(o, T_max=3, eta_min=0.005)], milestones=[2])),
    ("adam_exponential", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8), torch.optim.Adam,
     dict(kind="exponential", gamma=0.8), lambda o: sched.ExponentialLR(o, gamma=0.8)),
    ("adamw", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1), torch.optim.AdamW, None, None),
    ("adamw_cosine", dict(lr=0.02, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05), torch.optim.AdamW,
     dict(kind="cosine", t_max=6, min_factor=0.0), lambda o: sched.CosineAnnealingLR(o, T_max=6, eta_min=0.0)),
    # With global-norm clipping (torch.nn.utils.clip_grad_norm_ before each step): max_norm 3 leaves the first
    # step's gradient (norm about 1.7) as it is and scales the later ones.
    ("sgd_momentum_clip", dict(lr=0.05, momentum=0.9), torch.optim.SGD, None, None),
    ("adamw_clip", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1), torch.optim.AdamW, None, None),
]
clip = {"sgd_momentum_clip": 3.0, "adamw_clip": 3.0}
out = {"torch": torch.__version__, "initial": p0.tolist(), "grads": [g.tolist() for g in grads], "cases": []}
for name, kw, make, schedule, make_scheduler in cases:
    p = torch.nn.Parameter(p0.clone())
    opt = make([p], **kw)
    scheduler = make_scheduler(opt) if make_scheduler else None
    after = []
    for g in grads:
        p.grad = g.clone()
        if name in clip:
            torch.nn.utils.clip_grad_norm_([p], clip[name])
        opt.step()
        if scheduler:
            scheduler.step()
        after.append(p.detach().clone().tolist())
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items()}
    case = {"name": name, "settings": settings, "after": after}
    if schedule:
        case["schedule"] = schedule
    if name in clip:
        case["clip_grad_norm"] = clip[name]
    out["cases"].append(case)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_reference.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", path)
