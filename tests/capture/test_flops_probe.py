"""The FLOP probe (capture/probes/flops.py) on one step it counts."""

from __future__ import annotations

import warnings

import torch

from perfdoctor.capture.patches import ErrorLog
from perfdoctor.capture.probes.flops import COUNT_STEP, FlopProbe


def _count(step) -> int:
    err = ErrorLog()
    probe = FlopProbe(torch, err)
    probe.after_step(COUNT_STEP - 1, True)
    step()
    probe.step_ended(COUNT_STEP)
    assert not err.items
    assert probe.record is not None
    return probe.record.flops


def test_a_sparse_operand_is_not_counted_as_the_dense_product():
    """A graph net's `torch.sparse.mm(adjacency, x)`: FlopCounterMode's registry counts it as the dense
    [1000 x 1000] x [1000 x 64] product (128 MFLOP, backward as much again) where 3 non-zeros do 384
    FLOPs; only the dense layer's matmuls are the step's math (ngcf, lightgcn: 'mm 100 %')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adj = torch.sparse_coo_tensor(torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.ones(3), (1000, 1000)).coalesce()
    emb = torch.nn.Parameter(torch.randn(1000, 64))
    lin = torch.nn.Linear(64, 32, bias=False)

    def step() -> None:
        lin(torch.sparse.mm(adj, emb)).sum().backward()

    dense = 2 * 1000 * 64 * 32  # the linear's forward
    # forward, and its backward's two gradients (input and weight)
    assert _count(step) == 3 * dense


def test_a_dense_matmul_is_counted():
    a = torch.randn(128, 256, requires_grad=True)
    b = torch.randn(256, 64, requires_grad=True)
    assert _count(lambda: (a @ b).sum().backward()) == 3 * 2 * 128 * 256 * 64
