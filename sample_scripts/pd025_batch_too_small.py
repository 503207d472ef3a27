"""PD025: a small model trained four samples at a time.

On a GPU each kernel of this step does almost no work, so the GPU waits on Python and kernel
launches; a larger batch (with the learning rate scaled) does more per launch. (No GPU here: the
finding is GPU-only, from the batch size and the step's compute.)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

EPOCHS = 1


class Features(Dataset):
    """Pre-computed feature vectors kept in memory (cheap to fetch)."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Features(4 * 400), batch_size=4, shuffle=True, num_workers=2,  # expect: PD025
                        persistent_workers=True, pin_memory=True)

    for epoch in range(EPOCHS):
        for step, (x, y) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 25 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
