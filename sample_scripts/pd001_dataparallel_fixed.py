"""PD001 fixed: DistributedDataParallel, one process per GPU.

Launch on N GPUs with `torchrun --nproc_per_node=N pd001_dataparallel_fixed.py`. Started with
plain `python`, it runs as a one-process group (gloo on CPU, nccl on GPU), so the same file works
on a laptop.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 120


def main():
    # torchrun sets these; without it we are rank 0 of 1 (port 0: any free port).
    for key, default in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                         ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "0")):
        os.environ.setdefault(key, default)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts them)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    model = DDP(model.to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    torch.manual_seed(1 + rank)  # each rank draws its own batches
    inputs = torch.randn(8192, 128, device=device)
    targets = torch.randint(0, 10, (8192,), device=device)

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (128,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # gradients are all-reduced across ranks during backward
        optimizer.step()
        if step % 30 == 0 and rank == 0:
            print(f"step {step} loss {loss.item():.4f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
