"""Capture robustness: no torch.optim optimizer; a hand-written SGD update under torch.no_grad()."""
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 60
LR = 0.1


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    inputs = torch.randn(4096, 64, device=device)
    targets = torch.randint(0, 10, (4096,), device=device)
    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (64,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
