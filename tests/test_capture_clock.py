"""The step clock's step ends, driven event by event (a stand-in torch: no tensors, no CUDA): a
backward or a DataLoader batch inside an optimizer step (LBFGS's closure, Lightning's automatic
optimisation) ends no step, before the optimizer clock was first seen as after."""

from __future__ import annotations

import time
import types
from typing import Any

from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog


class Writer:
    """What the clock writes of the steps (nothing reaches a disk)."""

    def __init__(self) -> None:
        self.restarts: list[str] = []

    def restart_steps(self, kind: str) -> None:
        self.restarts.append(kind)

    def append_steps(self, steps: list[tuple]) -> None:
        pass


BACKWARD_S = 0.005


def _backward(*args: Any, **kwargs: Any) -> None:
    time.sleep(BACKWARD_S)


def _torch() -> Any:
    cuda = types.SimpleNamespace(is_initialized=lambda: False, reset_peak_memory_stats=lambda device=None: None)
    return types.SimpleNamespace(autograd=types.SimpleNamespace(backward=_backward), cuda=cuda)


class Run:
    """A StepClock with its backward wrapper installed on a stand-in torch, and what it reported."""

    def __init__(self) -> None:
        self.torch = _torch()
        self.writer = Writer()
        self.clock = StepClock(self.torch, self.writer, ErrorLog())  # type: ignore[arg-type]
        self.ticks: list[int] = []
        self.merges = 0
        self.clock.on_step = self.ticks.append
        self.clock.on_merge = self._merged
        self.clock._install_backward()
        self.opt = object()

    def _merged(self) -> None:
        self.merges += 1

    def backward(self) -> None:
        self.torch.autograd.backward()

    def opt_pre(self) -> None:
        self.clock._opt_pre(self.opt, (), {})

    def opt_post(self) -> None:
        self.clock._opt_post(self.opt, (), {})

    def lbfgs_step(self, closures: int) -> None:
        self.opt_pre()
        for _ in range(closures):
            self.backward()
        self.opt_post()


def test_closure_backwards_inside_the_first_optimizer_step_end_no_step():
    run = Run()
    run.opt_pre()
    run.backward()
    assert run.ticks == [] and run.clock.kind is None  # no backward clock, no step inside the optimizer step
    run.backward()
    run.opt_post()
    assert run.ticks == [1] and run.clock.kind == "optimizer"
    assert run.merges == 0 and run.writer.restarts == ["optimizer"]  # nothing counted to merge
    run.lbfgs_step(20)
    run.lbfgs_step(3)
    assert run.ticks == [1, 2, 3] and len(run.clock.steps) == 3


def test_closure_time_is_backward_inside_the_one_step():
    run = Run()
    run.lbfgs_step(4)
    (_, _, wall, _, _, bwd, opt, *_), = run.clock.steps
    assert bwd >= 4 * BACKWARD_S * 1e3 > opt >= 0  # the closures' backward is backward, not optimizer
    assert bwd + opt <= wall + 1e-6


def test_nested_optimizer_steps_and_batches_inside_one_end_one_step():
    run = Run()
    run.clock.before_batch()  # the first batch: it ends nothing
    run.opt_pre()
    run.opt_pre()  # a wrapping optimizer (Lookahead-like) steps its inner one
    run.backward()
    run.clock.before_batch()  # a closure that fetches a batch: part of the optimizer step
    run.opt_post()
    assert run.ticks == []
    run.opt_post()
    assert run.ticks == [1] and run.clock.kind == "optimizer"


def test_backward_without_an_optimizer_step_still_clocks_and_is_merged_later():
    run = Run()
    run.backward()
    run.backward()
    assert run.ticks == [1, 2] and run.clock.kind == "backward"
    run.lbfgs_step(5)  # an optimizer appears: the backward steps so far merge into its first step
    assert run.merges == 1 and run.clock.kind == "optimizer" and len(run.clock.steps) == 1
