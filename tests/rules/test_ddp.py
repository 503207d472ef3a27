"""DistributedDataParallel rules (PD031 find_unused_parameters, PD032 no_sync, PD033
gradient_as_bucket_view): the DDP probe on a one-rank gloo group in this process (a stand-in step
clock), the ddp facts from hand-built probe records, and the rules and their fixes on hand-built
facts. The samples run end to end in tests/analysis/test_e2e_samples.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from perfdoctor.contracts.run import DdpRecord, Probes, Site
from perfdoctor.facts.model import Facts
from perfdoctor.facts.run import RunContext, ddp
from perfdoctor.facts.run.ddp import _target
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import judge
from tests.helpers import SAMPLES, run_cli


class Clock:
    """What the probe reads of `capture.clock.StepClock`."""

    def __init__(self) -> None:
        self.pc = time.perf_counter
        self.steps: list[tuple] = []
        self.own = 0.0

    def exclude(self, t0: float) -> None:
        self.own += self.pc() - t0


@pytest.fixture
def gloo():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # torch.distributed in this process: run by CI, not in the fast tier
def test_the_probe_counts_synchronising_passes_and_reads_the_used_map(gloo, monkeypatch):
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfdoctor.capture.patches import ErrorLog
    from perfdoctor.capture.probes.ddp import DdpProbe

    monkeypatch.setattr("perfdoctor.capture.sites.is_user_file", lambda f: f == __file__)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x, use_b=True):
            return self.b(self.a(x)) if use_b else self.a(x)

    init, post, backward = DDP.__init__, DDP._post_forward, torch.autograd.backward
    clock, err = Clock(), ErrorLog()
    probe = DdpProbe(torch, clock, err)  # type: ignore[arg-type]
    probe.install()
    try:
        model = DDP(Net(), find_unused_parameters=True)
        before = set(vars(model))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            for micro in range(3):  # gradient accumulation: no_sync() on the first two only where step >= 3
                if step >= 3 and micro < 2:
                    with model.no_sync():
                        model(torch.randn(4, 8), use_b=step != 5).sum().backward()
                else:
                    model(torch.randn(4, 8), use_b=step != 5).sum().backward()
            opt.step()
            opt.zero_grad()
            clock.steps.append((step + 1,))
    finally:
        probe.uninstall()
    assert (DDP.__init__, DDP._post_forward, torch.autograd.backward) == (init, post, backward)
    assert set(vars(model)) == before  # nothing kept on the user's DDP
    assert not err.items
    (rec,) = probe.records()
    assert rec.find_unused_parameters and not rec.gradient_as_bucket_view and not rec.static_graph
    assert rec.params == 2 * (8 * 8 + 8) and rec.grad_bytes == rec.params * 4 and rec.world_size == 1
    assert rec.site is not None and rec.site.file == __file__ and "DDP(Net()" in rec.site.code
    assert rec.backward_site is not None and ".backward()" in rec.backward_site.code
    assert [(r[0], r[1], r[3]) for r in rec.by_step] == [(1, 3, 3), (2, 3, 3), (3, 3, 3), (4, 1, 3), (5, 1, 3),
                                                         (6, 1, 3)]
    assert all(r[2] > 0 for r in rec.by_step)  # the unused-parameter search was timed
    # the used map, read before each optimizer step: b went unused on the last step only
    assert rec.steps_checked == 6 and rec.unused_steps == 1
    assert rec.comm_ms is not None and rec.comm_ms > 0
    assert rec.built_by is None  # the user's code built it


@pytest.mark.slow  # torch.distributed in this process: run by CI, not in the fast tier
def test_the_probe_names_the_framework_that_built_the_ddp(gloo, monkeypatch):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfdoctor.capture.patches import ErrorLog
    from perfdoctor.capture.probes.ddp import DdpProbe

    # this file stands for a framework's strategy code (Lightning's, Accelerate's): not the user's
    monkeypatch.setattr("perfdoctor.capture.probes.ddp.is_user_file", lambda f: f != __file__)
    probe = DdpProbe(torch, Clock(), ErrorLog())  # type: ignore[arg-type]
    probe.install()
    try:
        DDP(torch.nn.Linear(4, 4))
    finally:
        probe.uninstall()
    (rec,) = probe.records()
    assert rec.built_by == __name__.split(".")[0]


def _site(line: int, sample: str = "pd031_ddp_unused_parameters.py") -> Site:
    """The sample's line as a probe records it (its text: a fix is written only where it matches)."""
    code = (SAMPLES / sample).read_text().splitlines()[line - 1].strip()
    return Site(file=str(SAMPLES / sample), line=line, code=code, function="main")


def _facts(world: int | None = 2, steps: int = 20, **kw) -> Facts:
    """A run's ddp facts from a hand-built probe record (every steady step i = 1..steps)."""
    syncs, backs, walk = kw.pop("syncs", 1), kw.pop("backwards", 1), kw.pop("walk_ms", 0.4)
    site = kw.pop("site", _site(37))
    rec = DdpRecord(site=site, module="Tower",
                    params=1000, grad_bytes=4000, world_size=world or 1,
                    by_step=[[i, syncs, walk, backs] for i in range(1, steps + 1)],
                    backward_site=_site(45), comm_ms=5.0, comm_overlap_ms=1.0, **kw)
    f = Facts()
    if world is not None:
        f.add("run.world_size", world, "count")
    f.add("step.time_ms", 40.0, "ms")
    ddp.add(RunContext(f, Probes(ddp=[rec]), [{"i": i} for i in range(1, steps + 1)]))
    return f


def _found(f: Facts, rule: str) -> list:
    samples = sorted(SAMPLES.glob("pd03*.py"))  # the run's own files: the fixes may read them
    return [x for x in judge(f, [r for r in load_rules() if r.id == rule], user_files=samples) if x.rule == rule]


@pytest.mark.parametrize("kw, fires", [
    ({"find_unused_parameters": True, "steps_checked": 20}, True),
    ({"find_unused_parameters": True, "steps_checked": 20, "unused_steps": 1}, False),  # one step needed it
    ({"find_unused_parameters": True, "steps_checked": 20, "static_graph": True}, False),
    ({"find_unused_parameters": True, "steps_checked": 3}, False),  # too few steps to say
    ({"find_unused_parameters": False}, False),
])
def test_pd031_fires_where_every_parameter_was_used_on_every_step_checked(kw, fires):
    found = _found(_facts(**kw), "PD031")
    assert bool(found) is fires
    if fires:
        (x,) = found
        assert x.ms_per_step == pytest.approx(0.4)
        assert "20 steps checked" in x.title and x.locations[0].line == 37
        # the fix sets the keyword on the user's own DDP(...) call (imported as DDP)
        assert x.fix is not None and not x.fix.example
        assert "find_unused_parameters=False" in x.fix.after and "gradient_as_bucket_view=True" in x.fix.after


@pytest.mark.parametrize("syncs, backwards, fires", [(4, 4, True), (1, 4, False), (1, 1, False), (2, 2, True)])
def test_pd032_fires_on_accumulation_that_all_reduces_every_micro_batch(syncs, backwards, fires):
    f = _facts(gradient_as_bucket_view=True, syncs=syncs, backwards=backwards)
    found = _found(f, "PD032")
    assert bool(found) is fires
    if backwards == 1:
        assert not f.of_kind("ddp_sync")  # no accumulation: no subject at the backward line
    if fires:
        (x,) = found
        assert x.locations[0].line == 45  # the backward line
        assert x.ms_per_step is not None
        assert x.ms_per_step == pytest.approx((syncs - 1) * 5.0)
        assert f"{syncs} of {backwards} backward passes" in x.title
        assert x.fix is not None and x.fix.before == "loss.backward()"
        assert "model.no_sync()" in x.fix.after and "loss.backward()" in x.fix.after


@pytest.mark.parametrize("world, bucket_view, syncs, fires", [(2, False, 1, True), (2, True, 1, False),
                                                              (None, False, 1, False), (2, False, 0, False)])
def test_pd033_fires_on_a_multi_rank_ddp_without_bucket_views(world, bucket_view, syncs, fires):
    site = _site(24, "pd033_ddp_bucket_view.py")
    found = _found(_facts(world=world, gradient_as_bucket_view=bucket_view, syncs=syncs, site=site), "PD033")
    assert bool(found) is fires
    if fires:
        (x,) = found
        assert x.ms_per_step is None and "3.9 KB" in x.title
        assert x.fix is not None and not x.fix.example and "# expect: PD033" in x.fix.before
        assert "gradient_as_bucket_view=True" in x.fix.after and "gradient_as_bucket_view" not in x.fix.before


@pytest.mark.parametrize("rule, kw", [("PD033", {}), ("PD031", {"find_unused_parameters": True, "steps_checked": 20})])
@pytest.mark.parametrize("built_by, says", [("lightning", "DDPStrategy("), ("accelerate", "DistributedDataParallelKwargs("),
                                            (None, None)])
def test_a_framework_built_ddp_gets_the_frameworks_fix(rule, kw, built_by, says):
    # the site is the user's line that led to it (trainer.fit): no DDP call there to rewrite
    site = Site(file=str(SAMPLES / "pd033_ddp_bucket_view.py"), line=1, code="trainer.fit(model)", function="main")
    (x,) = _found(_facts(site=site, built_by=built_by, **kw), rule)
    assert x.fix is not None and not x.fix.before and not x.fix.after  # words only
    if says:
        assert says in x.fix.note and x.fix.note.index(says) < x.fix.note.index(";")
    else:
        assert "DDPStrategy" not in x.fix.note and "DistributedDataParallelKwargs" not in x.fix.note


def test_the_ddps_name_for_the_no_sync_fix():
    assert _target("model = DDP(net, device_ids=[0])") == "model"
    assert _target("self.model = DistributedDataParallel(net)") == "self.model"
    assert _target("model: DDP = DDP(net)") == "model"
    assert _target("train(DDP(net))") is None and _target("a, b = DDP(x), 1") is None
    assert _target("model = DDP(net,") is None  # a call spread over lines: its first line only


def test_samples_plant_one_ddp_problem_each():
    """Each DDP sample differs from its twin in the one setting its rule is about."""
    for stem, setting in (("pd031_ddp_unused_parameters", "find_unused_parameters=True"),
                          ("pd032_ddp_no_sync", "model.no_sync()"), ("pd033_ddp_bucket_view", "gradient_as_bucket_view=True")):
        bad, good = (Path(SAMPLES / f"{stem}{s}.py").read_text() for s in ("", "_fixed"))
        assert "# perfdoctor-run: --nproc-per-node 2" in bad and "# perfdoctor-run: --nproc-per-node 2" in good
        code = [[line for line in text.splitlines() if not line.startswith('"""')][4:] for text in (bad, good)]
        assert any(setting in line for line in code[0]) != any(setting in line for line in code[1])


def _ddp_trace(path: Path, synced, hook: str = "torch::autograd::AccumulateGrad", steps: int = 4) -> Path:
    """A CPU trace of DDP with gradient accumulation as torch.profiler writes it (gloo): per profiled
    step the micro-batches' forward ops on the training thread, their backward passes (the autograd
    engine's evaluate_function spans, DDP's c10d::allreduce_ inside `hook`'s, gloo's all-reduce on a
    worker thread), then the optimizer step. `synced`: which micro-batches all-reduce."""
    import gzip
    import json

    ev, ts = [], 0.0

    def x(name, start, dur, tid=1, cat="cpu_op"):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": start, "dur": dur})

    for n in range(steps):
        t0 = ts
        for sync in synced:
            x("aten::linear", ts, 300)
            x("aten::cross_entropy_loss", ts + 320, 50)
            b = ts + 400
            x("autograd::engine::evaluate_function: AddmmBackward0", b, 200)
            x(f"autograd::engine::evaluate_function: {hook}", b + 210, 400)
            if sync:
                x("c10d::allreduce_", b + 300, 50)
                x("gloo:all_reduce", b + 310, 2000, tid=2, cat="user_annotation")
            ts = b + 2500
        x("Optimizer.step#SGD.step", ts, 200, cat="user_annotation")
        ts += 300
        x(f"ProfilerStep#{n + 1}", t0, ts - t0, cat="user_annotation")
        ts += 10
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
    return path


@pytest.mark.parametrize("synced, hook, fires", [
    ((1, 1, 1, 1), "torch::autograd::AccumulateGrad", True),
    ((0, 0, 0, 1), "torch::autograd::AccumulateGrad", False),  # no_sync() on all but the last
    ((1,), "torch::autograd::AccumulateGrad", False),  # no accumulation
    ((1, 1, 1, 1), "RowParallelLinearBackward", False),  # a model's own collective in its backward: not DDP's
])
def test_pd032_from_a_trace_alone(tmp_path, synced, hook, fires):
    from perfdoctor.facts.trace import add_trace_facts
    from perfdoctor.trace import load_trace

    f = Facts()
    f.add("step.time_ms", 12.0, "ms")
    add_trace_facts(load_trace(_ddp_trace(tmp_path / "rank0.pt.trace.json.gz", synced, hook)), f)
    found = _found(f, "PD032")
    assert bool(found) is fires
    if fires:
        (s,) = f.of_kind("ddp_sync")
        got = {k.split(".", 1)[1]: v.value for k, v in s.facts.items()}
        assert (got["syncs_per_step"], got["backwards_per_step"]) == (4, 4) and got["statement"] == "loss.backward()"
        assert got["comm_ms"] == pytest.approx(2.0)  # gloo's span in one backward
        (x,) = found
        assert "4 of 4 backward passes" in x.title and x.ms_per_step == pytest.approx(6.0)
    else:
        assert not f.of_kind("ddp_sync")


def test_pd032_from_a_trace_is_left_to_the_run_where_the_probe_measured_ddp(tmp_path):
    from perfdoctor.facts.trace import add_trace_facts
    from perfdoctor.trace import load_trace

    f = _facts(gradient_as_bucket_view=True, syncs=1, backwards=1)  # the probe: no accumulation seen
    add_trace_facts(load_trace(_ddp_trace(tmp_path / "t.pt.trace.json.gz", (1, 1, 1, 1))), f)
    assert not f.of_kind("ddp_sync")


@pytest.mark.e2e
@pytest.mark.parametrize("stem, fires", [("pd032_ddp_no_sync", True), ("pd032_ddp_no_sync_fixed", False)])
def test_pd032_from_each_ranks_trace_of_a_gloo_job(tmp_path, stem, fires):
    """The trace a rank of a 2-rank gloo job recorded, reported on its own (no probe), shows PD032."""
    import json

    job = tmp_path / "job"
    p = run_cli("run", "--nproc-per-node", "2", "--steps", "15", "--out-dir", str(job), "-f", "json",
                "-o", str(tmp_path / "job.json"), str(SAMPLES / f"{stem}.py"), timeout=420)
    assert p.returncode == 0, p.stderr[-3000:]
    for rank in (0, 1):
        p = run_cli("report", str(job / f"rank-{rank}" / "trace.json.gz"), "-f", "json")
        found = [f for f in json.loads(p.stdout)["findings"] if f["rule"] == "PD032"]
        assert bool(found) is fires, (rank, p.stdout[-2000:])
        if fires:
            assert found[0]["title"].startswith("4 of 4 backward passes") and found[0]["estimated_saving"]["ms_per_step"] > 0
