"""PD006 fixed: the meter stores a Python float (`loss.item()`), not the loss tensor."""
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 120


class AverageMeter:
    """Keeps the values of one epoch and reports their mean."""

    def __init__(self, name: str):
        self.name = name
        self.vals = []

    def update(self, val):
        self.vals.append(val)

    @property
    def avg(self):
        return sum(self.vals) / max(len(self.vals), 1)


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    inputs = torch.randn(8192, 256, device=device)
    targets = torch.randint(0, 10, (8192,), device=device)
    loss_meter = AverageMeter("loss")

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (128,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_meter.update(loss.item())
        if step % 30 == 0:
            print(f"step {step} {loss_meter.name} {loss_meter.avg:.4f}")


if __name__ == "__main__":
    main()
