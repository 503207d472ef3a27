"""A loader built in data.py, iterated here through a progress wrapper over enumerate(), its
batches moved by a helper in utils.py; an evaluation loader every 10 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from data import build_loaders
from utils import Progress, to_device

STEPS = int(os.environ.get("STEPS", "60"))


def evaluate(model, loader, device):
    model.eval()
    with torch.no_grad():
        total = sum(F.cross_entropy(model(x), y).item() for x, y in (to_device(b, device) for b in loader))
    model.train()
    return total


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader, val_loader = build_loaders(16)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i, (x, y) in Progress(enumerate(train_loader)):
        x, y = to_device((x, y), device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % 10 == 9:
            print(f"step {i} val {evaluate(model, val_loader, device):.3f}")
        if i + 1 >= STEPS:
            break


if __name__ == "__main__":
    main()
