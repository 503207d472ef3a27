"""Capture robustness: the script calls sys.exit(0) after a few steps (early stopping)."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

PATIENCE_STEPS = 10


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(64, 10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 1000):
        x = torch.randn(32, 64, device=device)
        y = torch.randint(0, 10, (32,), device=device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == PATIENCE_STEPS:
            print(f"early stop at step {step}, loss {loss.item():.4f}")
            sys.exit(0)


if __name__ == "__main__":
    main()
