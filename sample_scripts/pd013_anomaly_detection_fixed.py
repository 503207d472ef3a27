"""The PD013 twin: anomaly detection only when asked for (DEBUG_NAN=1), to hunt a NaN."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 80


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.autograd.set_detect_anomaly(os.environ.get("DEBUG_NAN") == "1")
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randn(4096, 128, device=device)
    targets = torch.randint(0, 10, (4096,), device=device)
    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (64,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
