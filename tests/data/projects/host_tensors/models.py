"""A small attention classifier whose forward adds positions made on the host and moved each call."""
import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self, d=3, classes=10):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        w = q @ k.transpose(-1, -2)
        pos = torch.arange(w.shape[-1]).expand_as(w).to(x.device)  # host positions, moved every call
        w = torch.softmax(w + pos * 1e-3, -1)
        return self.head((w @ v).mean(1))
