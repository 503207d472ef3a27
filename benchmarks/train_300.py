"""A small, ordinary training run of about 300 optimizer steps (a few seconds on 2 CPU cores).

Used by benchmarks/overhead.py to measure what `perfdoctor run` adds. Prints the time of the
training loop itself on its last line (`train_loop_s=...`), so the overhead inside the loop can be
told apart from start-up and analysis.
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

STEPS = 300


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(STEPS * 64, 128), torch.randint(0, 10, (STEPS * 64,)))
    loader = DataLoader(data, batch_size=64, shuffle=True, drop_last=True)

    t0 = time.perf_counter()
    for step, (x, y) in enumerate(loader, 1):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    print(f"train_loop_s={time.perf_counter() - t0:.3f} steps={step}")


if __name__ == "__main__":
    main()
