"""Helpers the training step calls: each makes a tensor on the host that its caller moves."""
import torch


def random_labels(batch, classes):
    return torch.randint(0, classes, (batch,))  # made on the host, every step


def make_batch(batch):
    g = torch.Generator().manual_seed(batch)
    return torch.randn(batch, 3, 8, 8, generator=g)  # a generator on the host: device= cannot be given
