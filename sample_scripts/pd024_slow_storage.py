"""PD024: the DataLoader workers spend their time opening and reading many small files.

Each sample is stored as 96 tiny .npy tiles, one file each (as image crops or feature chunks often
are), so every item costs 96 opens and reads before any work is done. The workers already have
every CPU; a packed, memory-mapped file removes the per-file cost.
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


def write_tiles(root: Path, n: int) -> list[list[str]]:
    """n samples of TILES small files each (3x4x4 float32), as a file-per-sample dataset is stored."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        sample = []
        for k in range(TILES):
            p = root / f"{i:05d}_{k:02d}.npy"
            np.save(p, rng.standard_normal((3, 4, 4), dtype=np.float32))
            sample.append(str(p))
        paths.append(sample)
    return paths


class TileFiles(Dataset):
    def __init__(self, paths: list[list[str]]):
        self.paths = paths
        self.labels = torch.randint(0, 10, (len(paths),), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        tiles = [np.load(p) for p in self.paths[i]]  # expect: PD024
        img = torch.from_numpy(np.concatenate(tiles, axis=0))  # 288 x 4 x 4
        return img, self.labels[i]


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    root = Path(tempfile.mkdtemp(prefix="pd024-"))
    try:
        train_set = TileFiles(write_tiles(root, 16 * 40))
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
