"""A critic trained with a gradient penalty (WGAN-GP's): `autograd.grad(outputs, inputs=x,
create_graph=True)` where x is a leaf made to need a gradient and fed to the critic. A hook that a
profiler puts on x (FlopCounterMode's module tracker registers multi-grad hooks on every module
input that needs a gradient) makes that call raise; under perfdoctor the script must run as bare:
the same losses to the last bit, the same saved weights, exit 0."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
critic = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
real_all, fake_all = torch.randn(12, 16, 32), torch.randn(12, 16, 32)
for step in range(12):
    real, fake = real_all[step], fake_all[step]
    alpha = torch.rand(real.size(0), 1)
    x = (alpha * real + (1 - alpha) * fake).requires_grad_(True)  # a leaf needing a gradient
    d = critic(x)
    (g,) = torch.autograd.grad(d, x, grad_outputs=torch.ones_like(d), create_graph=True)
    penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
    loss = -critic(real).mean() + critic(fake).mean() + 10 * penalty
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item().hex())
if len(sys.argv) > 1:
    torch.save(critic.state_dict(), f"{sys.argv[1]}/critic.pt")
