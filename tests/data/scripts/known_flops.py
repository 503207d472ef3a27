"""Matmuls of known shapes for the FLOP count: a batch of 64 through two Linear(1024, 1024) layers
(with bias) and a loss, trained with SGD. Per step, as FlopCounterMode counts it (2*M*K*N per
matmul, the bias add not counted): forward 2 addmm, backward 3 mm (the second layer's input grad and
both weight grads; the input needs no grad): 5 * 2 * 64 * 1024 * 1024 = 671,088,640 FLOPs."""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 1024)
for _ in range(40):
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()
