"""A script that profiles itself with torch.profiler over steps that overlap perfdoctor's own window
(nanoGPT's bench.py --profile=True does this): kineto runs one profiler at a time, so perfdoctor must
step aside, and the script's own trace must be written as it is bare."""

import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
done = []

with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            schedule=torch.profiler.schedule(wait=4, warmup=2, active=4, repeat=1),
                            on_trace_ready=lambda p: done.append(len(p.key_averages()) > 0)) as prof:
    for _ in range(20):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
print(f"final loss {loss.item():.4f}; own trace ready: {done}")
