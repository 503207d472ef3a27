"""A convolution, dropout and a Linear trained with SGD, for the FLOP probe (FlopCounterMode on one
real step): the run must print the same losses (to the last bit) and save the same weights as a bare
run, RNG (dropout) included. Per step, as FlopCounterMode counts it: the Conv2d(3, 8, 3, padding=1) on
a 4x3x16x16 batch 2*(4*8*16*16)*(3*3*3) = 442,368 forward and as much for its weight's gradient (the
input needs none); the Linear(2048, 30) 2*4*2048*30 = 491,520 forward, and as much for each of its
input's and weight's gradients: 2*442,368 + 3*491,520 = 2,359,296 FLOPs."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(8 * 16 * 16, 30))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(4, 3, 16, 16)
y = torch.randint(0, 30, (4,))
for step in range(12):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(step, loss.item().hex(), torch.rand(1).item().hex())
if len(sys.argv) > 1:
    torch.save(model.state_dict(), f"{sys.argv[1]}/weights.pt")
