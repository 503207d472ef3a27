"""PD002, config-driven: the DataLoader arguments come from a JSON config that sets no workers.

Nothing on the DataLoader line says `num_workers=0`; only the run shows that the loader works in the training process while the loop waits for it.
"""
import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
torch.backends.cudnn.benchmark = True  # fixed input shapes: cuDNN times its algorithms once (PD016)


class ImageFolderLike(Dataset):
    """Stands in for JPEG files on disk: each item is a read (I/O wait) plus a decode."""

    def __init__(self, n: int):
        self.n = n
        self.labels = torch.randint(0, 10, (n,))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.0005)  # read the file (releases the GIL, like real I/O)
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, 32, 32, generator=g)  # decode
        return (img - 0.5) / 0.25, self.labels[i]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=Path(__file__).parent / "configs" / "pd002.json")
    cfg = json.loads(parser.parse_args().config.read_text())

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), **cfg["optimizer"])
    loader = DataLoader(ImageFolderLike(cfg["train_items"]), **cfg["loader"])  # expect: PD002

    for epoch in range(cfg["epochs"]):
        for step, (images, labels) in enumerate(loader):
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 25 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
