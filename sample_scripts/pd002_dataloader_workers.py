"""PD002: the DataLoader loads and decodes every batch in the training process (num_workers=0).

Each item costs a file read and a decode, so the GPU (here: the CPU) sits idle while the next batch is prepared; more than a third of every step is spent waiting for data.
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
torch.backends.cudnn.benchmark = True  # fixed input shapes: cuDNN times its algorithms once (PD016)

EPOCHS = 1


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
        img = (img - 0.5) / 0.25  # normalise
        return img, self.labels[i]


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    )


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train_set = ImageFolderLike(32 * 80)
    loader = DataLoader(train_set, batch_size=32, shuffle=True, pin_memory=True)  # expect: PD002

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
