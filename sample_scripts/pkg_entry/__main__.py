"""`python -m pkg_entry [--steps-per-epoch N]`: trains the package's model on synthetic data."""
import argparse

import torch
import torch.nn.functional as F

from pkg_entry.model import build_model


def main():
    parser = argparse.ArgumentParser(prog="pkg_entry")
    parser.add_argument("--steps-per-epoch", type=int, default=60)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs = torch.randn(4096, 64, device=device)
    targets = torch.randint(0, 10, (4096,), device=device)
    for step in range(args.steps_per_epoch):
        idx = torch.randint(0, len(inputs), (64,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"pkg_entry: {args.steps_per_epoch} steps, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
