"""PD014: the DataLoader workers already have every CPU, and still the loop waits for data.

Each item runs a pure-Python "augmentation" (a brightness jitter summed in an 80,000-step Python
loop), so a batch costs more CPU time than a training step lasts. More workers cannot help; the per-item code has to get cheaper.
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
torch.backends.cudnn.benchmark = True  # fixed input shapes: cuDNN times its algorithms once (PD016)

EPOCHS = 1


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class JitteredImages(Dataset):
    def __init__(self, n: int):
        self.n = n
        self.labels = torch.randint(0, 10, (n,))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, 32, 32, generator=g)
        jitter = 0.0
        for k in range(80000): jitter += math.sin(k * 0.001 + i)  # expect: PD014
        return img + jitter * 1e-6, self.labels[i]


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(JitteredImages(16 * 200), batch_size=16, shuffle=True,
                        num_workers=min(8, usable_cpus()), pin_memory=True)

    for epoch in range(EPOCHS):
        for step, (images, labels) in enumerate(loader):
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 25 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
