"""A DistributedDataParallel job with a straggler slowed by Python's garbage collector: rank 1 makes
thousands of reference cycles of wide objects on every step (as a per-rank graph-building data
structure would: nodes that point back at themselves, each holding a list of a thousand entries), so
the collector runs many times a step, walks every reference of those objects and frees them, and every
rank waits for it. The collector's share of rank 1's extra time (about two thirds: the rest is making
the objects) does not depend on how fast the machine is.
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
        self.payload = [0] * 1000


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
    g = torch.Generator().manual_seed(rank)
    for step in range(200):
        if rank == 1:
            for _ in range(3000):
                Node()
        x = torch.randn(32, 64, generator=g).to(device)
        y = torch.randint(0, 10, (32,), generator=g).to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
