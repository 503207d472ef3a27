"""The step clock's step ends, driven event by event (a stand-in torch: no tensors, no CUDA): a
backward or a DataLoader batch inside an optimizer step (LBFGS's closure, Lightning's automatic
optimisation) ends no step, before the optimizer clock was first seen as after. One end-to-end run
(marked e2e): an LBFGS script under `perfdoctor run --steps 2`."""

from __future__ import annotations

import json
import textwrap
import time
import types
from typing import Any

import pytest

from perfdoctor.capture import run_script
from perfdoctor.capture.clock import StepClock, StepsReached
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

    def step(self, body: Any = None, opt: Any = None) -> None:
        """`opt.step()` as torch runs it: one frame (its step wrapper) calls the pre hooks, the
        step's body (`body()`: a closure's backward, an inner optimizer's step), the post hooks."""
        opt = self.opt if opt is None else opt
        self.clock._opt_pre(opt, (), {})
        if body is not None:
            body()
        self.clock._opt_post(opt, (), {})

    def lbfgs_step(self, closures: int) -> None:
        def closures_() -> None:
            for _ in range(closures):
                self.backward()
        self.step(closures_)


def test_closure_backwards_inside_the_first_optimizer_step_end_no_step():
    run = Run()

    def closures() -> None:
        run.backward()
        assert run.ticks == [] and run.clock.kind is None  # no backward clock, no step inside the optimizer step
        run.backward()
    run.step(closures)
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


def test_own_work_inside_a_closure_is_neither_optimizer_nor_step_time():
    run = Run()

    def closures() -> None:
        run.backward()
        t0 = run.clock.pc()
        time.sleep(0.05)  # the profiled window stops inside the optimizer step
        run.clock.exclude(t0)
        run.backward()
    run.step(closures)
    (_, _, wall, _, _, bwd, opt, *_), = run.clock.steps
    assert opt < 20 and wall < bwd + 20  # ms: the 50 ms are out of both


def test_nested_optimizer_steps_and_batches_inside_one_end_one_step():
    run = Run()
    run.clock.before_batch()  # the first batch: it ends nothing

    def inner() -> None:
        run.backward()
        run.clock.before_batch()  # a closure that fetches a batch: part of the optimizer step

    def outer() -> None:
        run.step(inner)  # a wrapping optimizer (Lookahead-like) steps its inner one
        assert run.ticks == []
    run.step(outer)
    assert run.ticks == [1] and run.clock.kind == "optimizer"


def test_backward_without_an_optimizer_step_still_clocks_and_is_merged_later():
    run = Run()
    run.backward()
    run.backward()
    assert run.ticks == [1, 2] and run.clock.kind == "backward"
    run.lbfgs_step(5)  # an optimizer appears: the backward steps so far merge into its first step
    assert run.merges == 1 and run.clock.kind == "optimizer" and len(run.clock.steps) == 1


def test_steps_limit_is_reached_at_the_optimizer_step_not_inside_its_closure():
    run = Run()
    run.clock.steps_limit = 1
    limits: list[int] = []
    run.clock.on_limit = lambda: limits.append(len(run.clock.steps))

    def closures() -> None:
        for _ in range(3):
            run.backward()  # `--steps 1` would have stopped the script inside its first closure
        assert limits == [] and not run.clock.stopping
    with pytest.raises(StepsReached):
        run.step(closures)
    assert limits == [1] and run.clock.kind == "optimizer"


def test_a_step_that_raised_out_of_the_optimizer_and_was_caught_ends_there():
    run = Run()
    run.lbfgs_step(1)

    def fails() -> None:
        run.backward()
        raise FloatingPointError("nan in the update")  # the script catches it and goes on
    for _ in range(2):
        with pytest.raises(FloatingPointError):
            run.step(fails)  # its post hook never comes
        assert run.clock.opt_depth == 1
    run.lbfgs_step(1)  # the next step of the optimizer is a step again (it was never, before)
    run.lbfgs_step(1)
    assert run.ticks == [1, 2, 3] and run.clock.opt_depth == 0


LBFGS = """
import torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
x, y = torch.randn(64, 8), torch.randn(64, 1)
opt = torch.optim.LBFGS(model.parameters(), max_iter=5, tolerance_grad=0, tolerance_change=0)
evals = 0
for step in range(4):
    def closure():
        global evals
        evals += 1
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss
    opt.step(closure)
    print("step", step, "closure evaluations", evals, flush=True)
"""


@pytest.mark.e2e
def test_lbfgs_steps_are_optimizer_steps_under_perfdoctor_run(tmp_path, capfd):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LBFGS).lstrip())
    r = run_script(str(script), out_dir=tmp_path / "run", steps=2, window=(0, 0, 1))
    assert r.exit_code == 0
    meta = json.loads((r.run_dir / "meta.json").read_text())
    steps = json.loads((r.run_dir / "steps.json").read_text())["steps"]
    # two LBFGS steps of 5 closure evaluations each: `--steps 2` stops after the second optimizer
    # step, never inside the first one's closures
    assert meta["step_clock"] == "optimizer" and meta["exit"]["reason"] == "steps-reached"
    assert len(steps) == 2 and all(s["backward_ms"] > 0 for s in steps)
    assert meta["window"]["trace"] and meta["window"]["first_step"] == 1
    out = capfd.readouterr().out
    assert "step 0 closure evaluations 5" in out and "step 1 closure evaluations 10" not in out


def test_batches_of_a_loader_that_feeds_no_model_end_no_step():
    """A pass over a loader with no model forward (a dataset's mean and std computed before
    training: sam's `torch.cat([d[0] for d in DataLoader(train_set)])`) is data loading: `--steps 2`
    must not stop the script inside it; batches with a forward between them are steps."""
    run = Run()
    run.clock.steps_limit = 2
    for _ in range(50):  # the statistics pass: batches only
        run.clock.before_batch()
    assert run.ticks == [] and not run.clock.stopping
    run.clock.forwards += 1  # the model's forward (ForwardProbe counts it) on the training loader's batch
    run.clock.before_batch()
    assert run.ticks == [1] and run.clock.kind == "dataloader"
    run.clock.before_batch()  # a batch with no forward since the last step: still the same step
    assert run.ticks == [1]
    run.clock.forwards += 1
    with pytest.raises(StepsReached):
        run.clock.before_batch()
    assert run.ticks == [1, 2]


class _Sam:
    """A user's optimizer wrapper (SAM's `second_step`): its method steps the base optimizer."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def second_step(self) -> None:
        self.run.step()


def _log(t: Any) -> float:
    return t.sum().item()  # a metrics helper's read


def test_a_helpers_read_names_the_loop_line_through_a_users_optimizer_wrapper(monkeypatch):
    import torch

    from perfdoctor.capture.probes.host_reads import HostReadProbe
    monkeypatch.setattr("perfdoctor.capture.sites.is_user_file", lambda f: f == __file__)
    monkeypatch.setattr("perfdoctor.capture.probes.host_reads.is_user_file", lambda f: f == __file__)
    run = Run()
    probe = HostReadProbe(torch, run.clock, ErrorLog())  # type: ignore[arg-type]
    probe.install()
    try:
        sam, x = _Sam(run), torch.ones(3)
        for _ in range(3):
            sam.second_step()
            _log(x)  # the training loop's line that leads into the reading helper
            probe.end_step()
    finally:
        probe.uninstall()
    (rec,) = probe.records()
    assert rec.site is not None and rec.site.function == "_log"
    assert rec.caller is not None and rec.caller.code == "_log(x)  # the training loop's line that leads into the reading helper"


def test_the_call_chain_to_the_first_optimizer_step_is_kept(monkeypatch):
    """`step_chain`: the user's frames at the first optimizer step, innermost first (the line that
    steps, then the line that called its function): static reading tells the loops around the outer
    calls (a sweep over experiments around `exp.train(...)`) from the training loop."""
    monkeypatch.setattr("perfdoctor.capture.sites.is_user_file", lambda f: f == __file__)
    run = Run()

    def train() -> None:
        for _ in range(2):
            run.backward()
            run.step()  # the training loop's optimizer step

    train()  # the call into training
    chain = run.clock.step_chain
    assert [s.function for s in chain[:2]] == ["train", "test_the_call_chain_to_the_first_optimizer_step_is_kept"]
    assert chain[0].code == "run.step()  # the training loop's optimizer step"
    assert chain[1].code == "train()  # the call into training"
    train()
    assert run.clock.step_chain == chain  # the first step's, kept


TIMED = """
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 32 * 40
    def __getitem__(self, i):
        return torch.randn(8), torch.tensor(float(i % 2))

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Items(), batch_size=32)
infer = "infer" in sys.argv
for x, y in loader:
    out = model(x).squeeze(1)
    if infer:
        continue
    loss = ((out - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"loss {loss.item():.3f}")
"""


@pytest.mark.e2e
@pytest.mark.parametrize("infer", [False, True], ids=["optimizer", "dataloader"])
def test_the_timing_capture_counts_the_steps_the_full_one_does_and_nothing_else(tmp_path, infer):
    """`perfdoctor verify`'s capture: the step clock (also a clock made of loader batches fed to a model),
    the first losses, no probe's records, no profiler; the same steps as the full capture counts."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TIMED).lstrip())
    args = ["infer"] if infer else []
    full = run_script(str(script), script_args=args, out_dir=tmp_path / "full", steps=12, window=(2, 1, 2))
    timed = run_script(str(script), script_args=args, out_dir=tmp_path / "timed", steps=12, timing=True)
    assert full.exit_code == timed.exit_code == 0
    metas = [json.loads((r.run_dir / "meta.json").read_text()) for r in (full, timed)]
    steps = [json.loads((r.run_dir / "steps.json").read_text())["steps"] for r in (full, timed)]
    probes = [json.loads((r.run_dir / "probes.json").read_text()) for r in (full, timed)]
    clock = "dataloader" if infer else "optimizer"
    assert [m["step_clock"] for m in metas] == [clock, clock]
    assert [len(s) for s in steps] == [12, 12] and all(s["wall_ms"] > 0 for s in steps[1])
    assert metas[1]["capture"] == "timing" and "capture" not in metas[0]
    assert metas[1]["window"] is None and not (timed.run_dir / "trace.json.gz").exists()
    assert metas[0]["window"]["trace"]
    assert probes[1]["host_reads"] == [] and probes[1]["stalls"]["samples_by_step"] == []
    # the forward count serves a clock of batches only: once an optimizer step ends one, the probe goes
    assert probes[1]["forward"][0]["calls"] >= 12 if infer else probes[1]["forward"][0]["calls"] == 1
    if not infer:
        assert probes[0]["host_reads"]  # the print's .item(), which the full capture counts
        assert len(probes[1]["losses"]) == 5 and probes[1]["losses"] == probes[0]["losses"]
