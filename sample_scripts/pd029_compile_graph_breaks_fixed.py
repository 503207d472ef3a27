"""PD029 fixed: the rescaling decision stays on the device (`torch.where`), one graph per call.

(backend="eager" keeps the sample quick: graph breaks happen in dynamo, whatever the backend.)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 60


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU())
        self.head = nn.Linear(512, 10)

    def forward(self, x):
        h = self.body(x)
        scale = h.abs().mean()
        h = torch.where(scale > 1.0, h / scale, h)
        return self.head(h)


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.compile(Net().to(device), backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    inputs = torch.randn(4096, 256, device=device)
    targets = torch.randint(0, 10, (4096,), device=device)

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (128,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.detach().cpu().item():.4f}")


if __name__ == "__main__":
    main()
