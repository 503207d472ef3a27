"""Record a small CPU torch.profiler trace (tiny MLP, DataLoader num_workers=0, 5 steps)."""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
ds = TensorDataset(torch.randn(512, 64), torch.randint(0, 10, (512,)))
loader = DataLoader(ds, batch_size=32, num_workers=0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
out = sys.argv[1]
sched = torch.profiler.schedule(wait=1, warmup=1, active=5, repeat=1)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                            record_shapes=True, with_stack=True, profile_memory=True) as prof:
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(loss.item()) if i == 3 else None
        prof.step()
        if i >= 8:
            break
prof.export_chrome_trace(out)
