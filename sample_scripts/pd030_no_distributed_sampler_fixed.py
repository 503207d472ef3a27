"""PD030, fixed: each rank trains on its own shard of the dataset (DistributedSampler). Run it under
`perfdoctor run --nproc-per-node 2` (gloo on CPUs, NCCL on GPUs).

Every rank trains on its own shard (DistributedSampler) of a synthetic dataset; the gradients are
all-reduced by DDP in the backward pass.
"""
# perfdoctor-run: --nproc-per-node 2
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Points(Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Points(32 * 200)
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=True), pin_memory=True)
    loader.sampler.set_epoch(0)
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
