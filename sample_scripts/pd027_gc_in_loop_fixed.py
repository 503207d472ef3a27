"""PD027 fixed: no `gc.collect()` in the loop; reference counting frees the step's tensors.

`gc.freeze()` after start-up moves the long-lived objects out of the collector's generations, so
the automatic collections that still run do not walk them either.
"""
import gc

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 120


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    inputs = torch.randn(4096, 128, device=device)
    targets = torch.randint(0, 10, (4096,), device=device)
    # per-sample metadata kept as Python objects: what a full collection has to walk
    metadata = [{"id": i, "tags": [str(i), "train"], "source": ("shard", i % 64)} for i in range(40_000)]

    gc.freeze()
    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (128,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 30 == 0:
            print(f"step {step} loss {loss.item():.4f} ({len(metadata)} samples)")


if __name__ == "__main__":
    main()
