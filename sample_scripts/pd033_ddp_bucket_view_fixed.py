"""PD033, fixed: DistributedDataParallel with gradient_as_bucket_view=True: the parameters' .grad are views
into DDP's all-reduce buckets, one copy of the gradients and no copy between them. Run it under
`perfdoctor run --nproc-per-node 2` (gloo on CPUs, NCCL on GPUs).
"""
# perfdoctor-run: --nproc-per-node 2
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    model = DDP(net.to(device), device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(200):
        x = torch.randn(32, 512, generator=g).to(device)
        y = torch.randint(0, 10, (32,), generator=g).to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
