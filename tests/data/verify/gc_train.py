"""verify's end-to-end tests: sample_scripts/pd027_gc_in_loop.py made small (14 steps, 6000 objects for
every `gc.collect()` to walk), so that a run costs about its start-up."""
import gc

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 14


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    inputs = torch.randn(4096, 128, device=device)
    targets = torch.randint(0, 10, (4096,), device=device)
    # per-sample metadata kept as Python objects: what a full collection has to walk
    metadata = [{"id": i, "tags": [str(i), "train"], "source": ("shard", i % 64)} for i in range(6_000)]

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (128,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        gc.collect()  # expect: PD027
        if step % 30 == 0:
            print(f"step {step} loss {loss.item():.4f} ({len(metadata)} samples)")


if __name__ == "__main__":
    main()
