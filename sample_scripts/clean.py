"""A well-written training loop: perfdoctor should find none of PD001-PD007 here.

Workers prepare batches in parallel, batches are pinned and copied asynchronously, random
tensors are made on the device, the loss is logged as a float every few steps, and autocast is
used where the hardware runs bf16/fp16 faster (CUDA compute capability >= 7.0, or a CPU with AMX).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

EPOCHS = 1
LOG_EVERY = 25


class Features(Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 128, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def amp_helps(device: torch.device) -> bool:
    """Autocast pays off on tensor-core GPUs and on CPUs with AMX; elsewhere it only adds casts."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (7, 0)
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_amp = amp_helps(device)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Features(64 * 80), batch_size=64, shuffle=True, num_workers=2,
                        pin_memory=True, persistent_workers=True, drop_last=True)

    for epoch in range(EPOCHS):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            x = x + 0.01 * torch.randn(x.shape, device=device)  # light input noise, made on the device
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % LOG_EVERY == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
