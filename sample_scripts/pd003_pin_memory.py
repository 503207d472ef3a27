"""PD003: batches go to the GPU from pageable memory (no `pin_memory`, no `non_blocking`).

Without pinned memory every host-to-device copy is staged through a bounce buffer and blocks the
Python thread until it finishes, so the copy cannot overlap with the previous step's kernels.
The workers keep up; the copy is the problem. (On a CPU-only machine `.to(device)` is a no-op and the problem shows only in the code path taken on a GPU.)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
torch.backends.cudnn.benchmark = True  # fixed input shapes: cuDNN times its algorithms once (PD016)

EPOCHS = 1


class Spectrograms(Dataset):
    """Pre-computed features kept in memory (cheap to fetch)."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 1, 40, 40, generator=g)
        self.y = torch.randint(0, 12, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(64 * 16, 12),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Spectrograms(32 * 80), batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)  # expect: PD003

    for epoch in range(EPOCHS):
        for step, (x, y) in enumerate(loader):
            x = x.to(device)
            y = y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 25 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
