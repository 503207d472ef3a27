"""A DistributedDataParallel job with a straggler slowed by Python's garbage collector: rank 1 keeps a
large heap of objects and makes reference cycles on every step (as a per-rank cache or a graph-building
data structure would), so its collections walk that heap again and again and every rank waits for it.
`perfdoctor run --nproc-per-node 2 sample_scripts/ddp_gc_straggler.py`: rank 1 is named the straggler,
with garbage collection as its cause.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it
        self.payload = [0] * 4


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    model = DDP(net.to(device), device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    heap = [[Node() for _ in range(2000)] for _ in range(100)] if rank == 1 else []
    g = torch.Generator().manual_seed(rank)
    for step in range(200):
        if rank == 1:
            for _ in range(30000):
                Node()
        x = torch.randn(32, 64, generator=g).to(device)
        y = torch.randint(0, 10, (32,), generator=g).to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    del heap
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
