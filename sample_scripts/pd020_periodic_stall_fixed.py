"""PD020 fixed: checkpoints as often as losing that much work is acceptable, written off the loop.

The state is copied to the CPU on the loop's thread (cheap, and consistent), then a background
thread serialises it; the next save waits for the previous one.
"""
# a stall every 3rd step: 60 steps leave enough of them in the steady steps to name the line
# perfdoctor-run: --steps 60
import os
import tempfile
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 120
CHECKPOINT_EVERY = 1000


def save_checkpoint(model, optimizer, path, previous=None):
    if previous is not None:
        previous.join()
    state = {"model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
             "optimizer": optimizer.state_dict()}
    t = threading.Thread(target=torch.save, args=(state, path))
    t.start()
    return t


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(4096, 512, device=device)
    targets = torch.randint(0, 10, (4096,), device=device)
    ckpt = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
    writer = None

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (32,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % CHECKPOINT_EVERY == 0:
            writer = save_checkpoint(model, optimizer, ckpt, writer)
        if step % 30 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    save_checkpoint(model, optimizer, ckpt, writer).join()


if __name__ == "__main__":
    main()
