"""Capture robustness: argparse with a required `--epochs` (pass it after `--`)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batches-per-epoch", type=int, default=20)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        for _ in range(args.batches_per_epoch):
            x = torch.randn(32, 64, device=device)
            y = torch.randint(0, 10, (32,), device=device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        print(f"epochs={args.epochs} epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
