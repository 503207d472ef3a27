"""PD006 fixed: the running total adds `loss.item()`, a Python float."""
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 120
LOG_EVERY = 40


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    inputs = torch.randn(8192, 256, device=device)
    targets = torch.randint(0, 10, (8192,), device=device)

    running_loss = 0.0
    for step in range(1, STEPS + 1):
        idx = torch.randint(0, len(inputs), (128,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
        if step % LOG_EVERY == 0:
            print(f"step {step} mean loss {running_loss / LOG_EVERY:.4f}")
            running_loss = 0.0


if __name__ == "__main__":
    main()
