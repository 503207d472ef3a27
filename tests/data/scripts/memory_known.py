"""A model of known size trained with Adam, for the memory facts: two Linear(1024, 1024) layers (with
bias) in fp32 and one frozen Linear(1024, 8) that no optimizer updates. LEAK=1 keeps 2 MiB (a
524,288-element fp32 tensor, written so its pages are resident) every step, as a leak would."""

import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
frozen = nn.Linear(1024, 8).requires_grad_(False)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(64, 1024)
kept = []
for _ in range(60):
    opt.zero_grad(set_to_none=True)
    loss = frozen(model(x)).square().mean()
    loss.backward()
    opt.step()
    if os.environ.get("LEAK"):
        kept.append(torch.ones(524_288))
