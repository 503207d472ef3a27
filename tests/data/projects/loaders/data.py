"""The loaders are built here and iterated in train.py."""
import torch
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 32, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def build_loaders(batch):
    train = DataLoader(Synthetic(batch * 64, 0), batch_size=batch, shuffle=True, pin_memory=True)
    val = DataLoader(Synthetic(batch * 4, 1), batch_size=batch)  # evaluation: not pinned, not on the step
    return train, val
