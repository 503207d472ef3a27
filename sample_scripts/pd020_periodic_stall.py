"""PD020: a checkpoint written synchronously every few steps.

Every CHECKPOINT_EVERY steps the loop stops while torch.save serialises the model and the optimizer
state to disk; the median step does not show it, the run's total time does.
"""
# a stall every 3rd step: 60 steps leave enough of them in the steady steps to name the line
# perfdoctor-run: --steps 60
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 120
CHECKPOINT_EVERY = 3


def save_checkpoint(model, optimizer, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(4096, 512, device=device)
    targets = torch.randint(0, 10, (4096,), device=device)
    ckpt = os.path.join(tempfile.mkdtemp(), "ckpt.pt")

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (32,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % CHECKPOINT_EVERY == 0:
            save_checkpoint(model, optimizer, ckpt)  # expect: PD020
        if step % 30 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    save_checkpoint(model, optimizer, ckpt)


if __name__ == "__main__":
    main()
