"""Capture robustness: the script raises after a few optimizer steps (perfdoctor exits 3, keeps the report)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

CRASH_AT = 8


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(64, 10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 100):
        x = torch.randn(32, 64, device=device)
        y = torch.randint(0, 10, (32,), device=device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == CRASH_AT:
            raise RuntimeError(f"simulated failure at step {step}: NaN in validation metrics")


if __name__ == "__main__":
    main()
