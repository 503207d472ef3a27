"""A small CPU training loop that saves a checkpoint every 15 steps (issue 20's held-out case).

Every step is the same work as benchmarks/steady_train.py; every 15th step also saves the model, the
optimizer and a 16 MB tensor with torch.save into a temporary folder: a periodic stall at one line
that does not run every step, which PD020 should find and name, on a quiet host and beside load.
PERFDOCTOR_BENCH_STEPS sets the number of steps (default 300; `perfdoctor run --steps N` stops it earlier).
"""

import os
import tempfile

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
steps = int(os.environ.get("PERFDOCTOR_BENCH_STEPS", "300"))

model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(1024, 256)
y = torch.randint(0, 10, (1024,))
loss_fn = nn.CrossEntropyLoss()
extra = torch.randn(4 << 20)  # 16 MB saved beside the model

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "ckpt.pt")
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step % 15 == 14:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "extra": extra}, path)
