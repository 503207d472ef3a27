"""PD001: `nn.DataParallel` to use several GPUs.

DataParallel is one process driving all GPUs from Python threads: every step it scatters the
batch from GPU 0, replicates the model onto each GPU, gathers the outputs back on GPU 0 and
reduces the gradients there, all under the GIL. DistributedDataParallel (one process per GPU)
is faster even on a single machine; PyTorch's docs recommend it instead.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 120


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    model = nn.DataParallel(model)  # expect: PD001
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    # A synthetic dataset small enough to live on the device.
    inputs = torch.randn(8192, 128, device=device)
    targets = torch.randint(0, 10, (8192,), device=device)

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (128,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 30 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
