"""PD032, fixed: gradient accumulation under DistributedDataParallel with `no_sync()` on every micro-batch
but the last: the gradients are all-reduced once per optimizer step.
Run it under `perfdoctor run --nproc-per-node 2` (gloo on CPUs, NCCL on GPUs).
"""
# perfdoctor-run: --nproc-per-node 2
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUMULATE = 4  # micro-batches per optimizer step


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    model = DDP(net.to(device), device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(200):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(ACCUMULATE):
            x = torch.randn(8, 256, generator=g).to(device)
            y = torch.randint(0, 10, (8,), generator=g).to(device)
            last = micro == ACCUMULATE - 1
            with (contextlib.nullcontext() if last else model.no_sync()):
                loss = F.cross_entropy(model(x), y) / ACCUMULATE
                loss.backward()
        optimizer.step()
        if rank == 0 and step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
