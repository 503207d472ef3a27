"""PD005: `torch.cuda.empty_cache()` in the training loop.

It does not free memory that tensors still use; it hands the caching allocator's free blocks back
to the driver, so the next step has to cudaMalloc them again (slow, and it synchronises). It is
not a fix for out-of-memory errors. (On a CPU-only machine the call does nothing.)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 120


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    inputs = torch.randn(8192, 256, device=device)
    targets = torch.randint(0, 10, (8192,), device=device)

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (128,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()  # expect: PD005
        if step % 30 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
