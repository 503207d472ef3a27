"""PD024 fixed: the tiles are packed once into one array file, which each worker memory-maps.

The same samples, but one open per worker instead of 96 per item: a read is a slice of a mapped
file. (WebDataset shards, LMDB or HDF5 do the same for data that is not one dense array.)
"""
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
torch.backends.cudnn.benchmark = True  # fixed input shapes: cuDNN times its algorithms once (PD016)

EPOCHS = 1
TILES = 96


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def write_packed(root: Path, n: int) -> str:
    """The same n samples of TILES tiles, packed into one (n, 3 * TILES, 4, 4) float32 array file."""
    rng = np.random.default_rng(0)
    data = np.stack([np.concatenate([rng.standard_normal((3, 4, 4), dtype=np.float32) for _ in range(TILES)])
                     for _ in range(n)])
    path = root / "tiles.npy"
    np.save(path, data)
    return str(path)


class PackedTiles(Dataset):
    def __init__(self, path: str):
        self.path = path
        self.n = np.load(path, mmap_mode="r").shape[0]
        self.data = None  # mapped in each worker, on first use
        self.labels = torch.randint(0, 10, (self.n,), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.data is None:
            self.data = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(np.array(self.data[i])), self.labels[i]


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    root = Path(tempfile.mkdtemp(prefix="pd024-"))
    try:
        train_set = PackedTiles(write_packed(root, 16 * 40))
        model = nn.Sequential(
            nn.Conv2d(3 * TILES, 32, 3, padding=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(32 * 4 * 4, 10),
        ).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = DataLoader(train_set, batch_size=16, shuffle=True,
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
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
