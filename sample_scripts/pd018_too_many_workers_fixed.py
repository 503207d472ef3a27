"""PD018 fixed: one DataLoader worker per usable CPU.

As many workers as the process has CPUs: the epoch's first batches are loaded as fast as the
machine allows, and the training process is not crowded out by processes waiting for a CPU.
"""
# an epoch is 8 steps and its start the crowded one: 48 steps leave several in the steady steps
# perfdoctor-run: --steps 48
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

EPOCHS = 40


class Augmented(Dataset):
    """Samples augmented on the CPU when they are loaded (noise, a random crop, normalisation)."""

    def __init__(self, n=256):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 3, 28, 28)).astype(np.float32)
        self.y = rng.integers(0, 10, n)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        img = self.x[i] + 0.1 * rng.standard_normal(self.x[i].shape).astype(np.float32)
        for _ in range(3):  # a few augmentation passes
            img = np.tanh(img) * 1.05 + 0.01 * np.sin(img)
        top, left = rng.integers(0, 4, 2)
        crop = img[:, top:top + 24, left:left + 24]
        crop = (crop - crop.mean()) / (crop.std() + 1e-6)
        return torch.from_numpy(np.ascontiguousarray(crop).reshape(-1)), int(self.y[i])


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(3 * 24 * 24, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    workers = len(os.sched_getaffinity(0))
    loader = DataLoader(Augmented(), batch_size=32, shuffle=True, num_workers=workers, pin_memory=True, persistent_workers=True)

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
