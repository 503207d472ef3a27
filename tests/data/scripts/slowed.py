"""A small model trained from a DataLoader, slowed on purpose for `perfdoctor compare`'s explanation:
SLOWED=layer adds one wide layer to the Head module's forward (more compute in one module);
SLOWED=data makes every batch take longer to load (2 ms of sleep per item fetch)."""

import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
torch.set_num_threads(1)
SLOWED = os.environ.get("SLOWED", "")


class Items(Dataset):
    def __init__(self) -> None:
        self.x = torch.randn(4096, 128)
        self.y = torch.randint(0, 10, (4096,))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if SLOWED == "data":
            time.sleep(0.0005)
        return self.x[i], self.y[i]


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(256, 10)
        self.extra = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 256)) if SLOWED == "layer" else None

    def forward(self, h):
        if self.extra is not None:
            h = self.extra(h)
        return self.out(h)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(128, 256), nn.ReLU())
        self.head = Head()

    def forward(self, x):
        return self.head(self.body(x))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Items(), batch_size=64, shuffle=True)
for _ in range(100):
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
