"""PD015: DataLoader workers shut down and started again every epoch.

Each worker runs a `worker_init_fn` that takes a while (here it opens a connection to the storage
that holds the samples), and the epochs are short: with persistent_workers=False (the default)
every epoch waits for new workers to start before its first batch.
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

EPOCHS = 40


class Samples(Dataset):
    def __init__(self, n=512):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 512, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def connect_to_storage(worker_id):
    time.sleep(0.15)  # stands in for opening a connection / loading an index in each worker


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    loader = DataLoader(Samples(), batch_size=32, shuffle=True, num_workers=2, pin_memory=True, worker_init_fn=connect_to_storage)  # expect: PD015

    for epoch in range(EPOCHS):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
