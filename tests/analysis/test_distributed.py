"""Distributed training: `perfdoctor run --nproc-per-node N` (the job through torch.distributed.run,
every rank captured into job/rank-R), the launcher's command line given as the target, ranks under
an outside launcher, the merged report of a job folder (rank table, straggler and its cause), the
rank's CPU share, and the gate on a job folder. The unit tests build rank facts and job folders by
hand; the e2e tests run small gloo jobs on the CPU."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from perfdoctor.capture.env import cpu_share
from perfdoctor.capture.runner import is_launcher, launcher_command, new_run_dir, split_launcher_args
from perfdoctor.capture.writer import write, write_meta
from perfdoctor.contracts.run import SCHEMA, Env, Meta, Rank, Step, Steps, rank_dirs, rank_from_env
from perfdoctor.errors import InputError
from perfdoctor.facts.model import Facts
from perfdoctor.facts.ranks import MAX_P, cross_rank, straggler_test
from perfdoctor.gate.baseline import record_from_run_dir
from perfdoctor.orchestrate import claim_out_dir
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import judge
from tests.helpers import REPO, run_cli

SAMPLES = REPO / "sample_scripts"
RULES = {r.id: r for r in load_rules()}


def test_torchrun_command_line_is_split_into_launcher_script_and_args():
    assert split_launcher_args(["--nproc-per-node", "2", "--standalone", "--rdzv-endpoint=h:1", "train.py",
                                "--lr", "0.1"]) == (["--nproc-per-node", "2", "--standalone", "--rdzv-endpoint=h:1"],
                                                    "train.py", False, ["--lr", "0.1"])
    assert split_launcher_args(["--", "--nnodes", "1", "-m", "pkg.train", "-x"]) == (["--nnodes", "1"], "pkg.train",
                                                                                    True, ["-x"])
    with pytest.raises(InputError, match="no-python"):
        split_launcher_args(["--no-python", "bash"])
    with pytest.raises(InputError, match="no training script"):
        split_launcher_args(["--nproc-per-node", "2"])
    assert is_launcher("torch.distributed.run", True) and is_launcher("/usr/bin/torchrun", False)
    assert not is_launcher("train.py", False) and not is_launcher("torch.distributed.run", False)


def test_the_launcher_is_torchs_own_and_runs_the_child_as_each_ranks_entrypoint():
    cmd = launcher_command(["--nproc-per-node", "2"], ["--run-dir", "/j", "--job", "t.py", "--"])
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--nproc-per-node"]
    assert cmd[5:8] == ["-m", "perfdoctor.capture.child", "--run-dir"]


def test_rank_from_the_environment_and_its_folder(tmp_path):
    assert rank_from_env({}) is None
    assert rank_from_env({"RANK": "0", "WORLD_SIZE": "1"}) is None  # a world of one is no job
    r = rank_from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"})
    assert (r.rank, r.local_rank, r.world_size, r.local_world_size, r.node_rank) == (3, 1, 4, 2, 1)
    assert rank_from_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)"}).rank == 5
    # under an outside launcher every rank writes rank-<R> inside one job folder
    import os

    old = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    os.environ.update(RANK="1", WORLD_SIZE="2")
    try:
        with claim_out_dir(tmp_path / "job") as claimed:
            assert claimed == tmp_path / "job" / "rank-1"
        assert new_run_dir("train.py", False, None, base=tmp_path).parent.parent == tmp_path / ".perfdoctor" / "runs"
        assert new_run_dir("train.py", False, None, base=tmp_path).name == "rank-1"
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_a_ranks_cpu_share():
    import os

    n = os.cpu_count() or 1
    assert cpu_share(n, None) == n and cpu_share(n, 1) == n
    assert cpu_share(n, 2) == max(1, n // 2)
    assert cpu_share(n, 4 * n) == 1  # never 0
    if n > 1:
        assert cpu_share(n - 1, 2) == n - 1  # pinned by the launcher: its own CPUs


def _rank_facts(step, data, fwd, bwd, opt, host_comm):
    f = Facts()
    for name, v in (("step.time_ms", step), ("step.data_ms", data), ("step.forward_ms", fwd),
                    ("step.backward_ms", bwd), ("step.optimizer_ms", opt)):
        f.add(name, v, "ms", "run")
    f.add("comm.host_share", host_comm / step, "ratio", "trace")
    return f


def test_straggler_is_the_rank_that_waits_least_and_its_cause_is_its_own_evidence():
    # every rank's step lasts 40 ms (synchronous); rank 1 loads data for 35 ms, the others wait for it
    fast = [_rank_facts(40, 0.4, 0.6, 37, 0.2, 36) for _ in range(3)]
    slow = _rank_facts(40.3, 35.4, 0.7, 3.5, 0.2, 0.9)
    g, rows = cross_rank([(0, "rank-0"), (1, "rank-1"), (2, "rank-2"), (3, "rank-3")],
                         [fast[0], slow, fast[1], fast[2]], "run")
    assert g.value("ranks.straggler") == 1 and g.value("ranks.imbalance_ratio") > 5
    assert g.value("ranks.straggler_cause") == "data loading"
    assert g.value("ranks.straggler_excess_ms") == pytest.approx(35.0)
    assert [r.comm_ms for r in rows] == pytest.approx([36, 0.9, 36, 36])
    assert rows[1].compute_ms == pytest.approx(0.7 + 3.5 + 0.2 - 0.9)
    # a compute straggler is named so
    heavy = _rank_facts(40, 0.4, 10, 28, 0.2, 2)
    g, _ = cross_rank([(0, "a"), (1, "b")], [fast[0], heavy], "run")
    assert g.value("ranks.straggler") == 1 and g.value("ranks.straggler_cause") == "compute"
    # balanced ranks: no imbalance worth a finding
    g, _ = cross_rank([(0, "a"), (1, "b")], [fast[0], fast[1]], "run")
    assert g.value("ranks.imbalance_ratio") == 1.0


def _noisy(rng: random.Random, base: float, n: int, spread: float) -> tuple[float, ...]:
    return tuple(base * (1 + rng.uniform(-spread, spread)) for _ in range(n))


@pytest.mark.slow
def test_the_straggler_test_tells_a_rank_ahead_at_every_step_from_the_steps_noise():
    rng = random.Random(1)
    # two ranks, 10 steps, rank 1 works 20 % more at every step under 10 % noise: exact, 2 of 1024 as far
    ahead = [_noisy(rng, 1.0, 10, 0.1), _noisy(rng, 1.2, 10, 0.1)]
    who, p = straggler_test(ahead)
    assert who == 1 and p == pytest.approx(2 / 1024)
    # 5 steps: ahead at every step is the best two ranks can show (1 in 16), once behind is not enough
    assert straggler_test([(1.0,) * 5, (1.2,) * 5]) == (1, pytest.approx(1 / 16))
    _, p = straggler_test([(1.0, 1.0, 1.0, 1.0, 1.3), (1.2, 1.2, 1.2, 1.2, 1.1)])
    assert p > MAX_P
    # eight ranks (a sample of the relabellings, seeded: the same p every time), one ahead
    ranks = [_noisy(rng, 1.0, 6, 0.1) for _ in range(8)]
    ranks[5] = _noisy(rng, 1.3, 6, 0.1)
    who, p = straggler_test(ranks)
    assert who == 5 and p < 0.01 and straggler_test(ranks) == (who, p)
    # the same ranks where none is ahead: the greatest excess is the noise's
    ps = [straggler_test([_noisy(rng, 1.0, 10, 0.3) for _ in range(k)])[1] for k in (2, 4) for _ in range(40)]
    assert sum(p <= MAX_P for p in ps) <= 16  # 10 % of 80 expected; far more would be a test that is wrong
    assert sorted(ps)[len(ps) // 2] > 0.2
    # too few steps, or steps that do not line up: no test
    assert straggler_test([(1.0, 2.0), (3.0, 4.0)]) is None
    assert straggler_test([(1.0,) * 5, (1.2,) * 4]) is None and straggler_test([(1.0,) * 5]) is None


def _series_facts(step, shares, data=0.5):
    """A gloo rank whose host collectives (in its backward) take `shares` of each profiled step."""
    f = Facts()
    for name, v in (("step.time_ms", step), ("step.data_ms", data), ("step.forward_ms", 1.0),
                    ("step.backward_ms", step - data - 1.5), ("step.optimizer_ms", 0.5)):
        f.add(name, v, "ms", "run")
    f.add("comm.host_share", sorted(shares)[len(shares) // 2], "ratio", "trace", per_step=tuple(shares))
    return f


def test_a_rank_ahead_by_the_steps_noise_alone_is_no_straggler():
    # 2 ranks of one shared host: which rank waits for the other changes step by step; the medians
    # differ by a quarter of the step, and a finding on them would be a guess
    a = _series_facts(5.0, [0.10, 0.40, 0.12, 0.45, 0.11, 0.13, 0.38, 0.12, 0.41, 0.12])
    b = _series_facts(5.0, [0.40, 0.11, 0.42, 0.12, 0.39, 0.40, 0.12, 0.40, 0.14, 0.38])
    g, _ = cross_rank([(0, "a"), (1, "b")], [a, b], "run")
    assert g.value("ranks.imbalance_ratio") > 1.1 and g.value("ranks.imbalance_p") > MAX_P
    assert g.get("ranks.straggler") is None and g.get("ranks.straggler_cause") is None
    assert "PD012" not in [x.rule for x in judge(g, [RULES["PD012"]])]
    # the same medians, rank 0 waiting at every step: rank 1 is the straggler
    a = _series_facts(5.0, [0.40, 0.41, 0.38, 0.45, 0.39, 0.42, 0.38, 0.43, 0.41, 0.40], data=0.5)
    b = _series_facts(5.0, [0.10, 0.11, 0.12, 0.12, 0.09, 0.13, 0.12, 0.10, 0.14, 0.11], data=1.9)
    g, _ = cross_rank([(0, "a"), (1, "b")], [a, b], "run")
    assert g.value("ranks.straggler") == 1 and g.value("ranks.imbalance_p") <= MAX_P
    assert g.value("ranks.straggler_cause") == "data loading"
    assert [x.rule for x in judge(g, [RULES["PD012"]])] == ["PD012"]


def test_a_cause_a_few_microseconds_over_the_others_is_not_named():
    # rank 1 works 0.7 ms more per step, outside its loading, forward, backward and optimizer step (a
    # log line of its own, say); its data wait and compute are 0.02 ms over the others' and explain nothing
    a = _series_facts(5.0, [0.30] * 6, data=0.50)
    b = _series_facts(5.0, [0.16] * 6, data=0.52)
    b.add("step.backward_ms", 2.32, "ms", "run")
    g, _ = cross_rank([(0, "a"), (1, "b")], [a, b], "run")
    assert g.value("ranks.straggler") == 1 and g.get("ranks.straggler_cause") is None


@pytest.mark.parametrize("ops", [(87, 87, 87), (87, 120, 87)])
def test_compute_on_the_same_work_as_the_others_is_a_slower_cpu(ops):
    # rank 1's forward and backward take 0.7 ms more per step; the others wait for it in the all-reduce
    ranks = [_series_facts(5.0, [0.30] * 6), _series_facts(5.0, [0.16] * 6), _series_facts(5.0, [0.30] * 6)]
    for f, n in zip(ranks, ops):
        f.add("ops.calls_per_step", n, "count", "trace")
    g, _ = cross_rank([(0, "a"), (1, "b"), (2, "c")], ranks, "run")
    assert g.value("ranks.straggler") == 1
    if ops[1] == ops[0]:  # as many operator calls as the others: its CPU runs them slower
        assert g.value("ranks.straggler_cause") == "a slower CPU"
        assert "same work (87 operator calls per step" in g.get("ranks.straggler_cause").detail
    else:  # more of them: more work (a longer sequence, an extra branch), not a slower CPU
        assert g.value("ranks.straggler_cause") == "compute"
    assert g.value("ranks.straggler_excess_ms") == pytest.approx(0.7)


def _write_rank(job: Path, rank: int, walls: list[float]) -> None:
    d = job / f"rank-{rank}"
    d.mkdir(parents=True)
    write_meta(d, Meta(schema=SCHEMA, script=str(SAMPLES / "pd030_no_distributed_sampler_fixed.py"), argv=["pd030_no_distributed_sampler_fixed.py"], env=Env(cpu_count=2),
                       complete=True, step_clock="optimizer", rank=Rank(rank=rank, world_size=2, local_world_size=2)))
    write(d / "steps.json", Steps(steps=[Step(i=i, wall_ms=w) for i, w in enumerate(walls, 1)]))


def test_gate_takes_the_slowest_ranks_step_of_a_job_folder(tmp_path):
    job = tmp_path / "job"
    _write_rank(job, 0, [10.0] * 30)
    _write_rank(job, 1, [12.0] * 29)  # one step fewer: only the steps every rank has count
    assert [r for r, _ in rank_dirs(job)] == [0, 1]
    rec = record_from_run_dir(job)
    assert rec.median_ms == 12.0 and set(rec.step_ms) == {12.0}


def _job(tmp_path: Path, script: str, nproc: int, *extra: str) -> tuple[dict, Path]:
    job = tmp_path / "job"
    out = tmp_path / "report.json"
    p = run_cli("run", "--nproc-per-node", str(nproc), "--steps", "15", "--out-dir", str(job), "-f", "json",
                "-o", str(out), *extra, str(SAMPLES / script), timeout=420)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text()), job


@pytest.mark.e2e
@pytest.mark.parametrize("nproc", [2, 4])
def test_a_balanced_gloo_job_gives_one_merged_report(tmp_path, nproc):
    doc, job = _job(tmp_path, "pd030_no_distributed_sampler_fixed.py", nproc)
    assert [r for r, _ in rank_dirs(job)] == list(range(nproc))
    for _, d in rank_dirs(job):
        meta = json.loads((d / "meta.json").read_text())
        assert meta["rank"]["world_size"] == nproc and meta["exit"]["reason"] == "steps-reached"
        assert meta["window"]["first_step"] == 9  # the same window on every rank, by step number
        assert meta["window"]["steps_profiled"] == 7  # a job's 10 steps, shrunk to end by --steps 15
        assert len(json.loads((d / "steps.json").read_text())["steps"]) == 15
        assert (d / "report.json").is_file()  # each rank's own report, labelled
        assert json.loads((d / "report.json").read_text())["run"]["label"].startswith(f"rank {d.name[5:]} of")
    assert (job / "report.json").is_file()
    assert doc["run"]["kind"] == "job" and doc["run"]["ranks"] == list(range(nproc))
    assert [r["rank"] for r in doc["ranks"]] == list(range(nproc))
    for r in doc["ranks"]:
        assert r["step_ms"] > 0 and r["compute_ms"] is not None and r["comm_ms"] is not None
        assert r["data_ms"] is not None
    rules = {f["rule"] for f in doc["findings"]}
    if nproc == 2:  # with 4 ranks on this 2-core box each rank has less than one CPU: loading can wait
        assert "PD002" not in rules  # no rank waits for its data
    # a rank starved of CPU by other jobs on this shared 2-core box can be a (real) straggler, never
    # one for its data
    assert "PD012" not in rules or doc["facts"]["ranks.straggler_cause"]["value"] != "data loading"
    # the report of the job folder is the same merged view
    again = run_cli("report", str(job), "-f", "json")
    assert again.returncode == 0 and [r["rank"] for r in json.loads(again.stdout)["ranks"]] == list(range(nproc))


@pytest.mark.e2e
def test_a_straggler_is_named_with_its_cause(tmp_path):
    doc, job = _job(tmp_path, "ddp_straggler.py", 2)
    facts = doc["facts"]
    assert facts["ranks.straggler"]["value"] == 1
    assert facts["ranks.straggler_cause"]["value"] == "data loading"
    assert facts["ranks.imbalance_p"]["value"] <= 0.1  # ahead at the profiled steps, beyond their noise
    pd012 = next(f for f in doc["findings"] if f["rule"] == "PD012")
    assert "Rank 1" in pd012["title"] and "data loading" in pd012["message"]
    pd002 = next(f for f in doc["findings"] if f["rule"] == "PD002")
    assert "(ranks 1)" in pd002["message"]  # rank 1's loader only, with its CPU share
    cpus = next(e for e in pd002["evidence"] if e["fact"] == "cpu.count")
    assert "ranks on this node" in cpus["detail"]  # the rank's CPU share: in the evidence, not the message
    # the gate on the job folder: its step is the slowest rank's
    rec = record_from_run_dir(job)
    assert rec.median_ms >= max(r["step_ms"] for r in doc["ranks"]) * 0.9


@pytest.mark.e2e
def test_torchrun_given_as_the_target_runs_the_job(tmp_path):
    job = tmp_path / "job"
    p = run_cli("run", "-m", "torch.distributed.run", "--steps", "12", "--out-dir", str(job), "-f", "json", "--",
                "--nproc-per-node", "2", str(SAMPLES / "pd030_no_distributed_sampler_fixed.py"), timeout=420)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["run"]["kind"] == "job" and len(doc["ranks"]) == 2
    assert doc["summary"]["steps_observed"] == 12


@pytest.mark.e2e
def test_ranks_under_an_outside_launcher_are_labelled_and_merge(tmp_path):
    """torchrun running perfdoctor on every rank: each rank's folder and --output carry its rank, and
    `perfdoctor report JOB` merges them."""
    import os
    import subprocess
    import sys

    job, out = tmp_path / "job", tmp_path / "r.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "perfdoctor",
                        "run", "--steps", "12", "--out-dir", str(job), "-f", "json", "-o", str(out),
                        str(SAMPLES / "ddp_straggler.py")], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=420)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [r for r, _ in rank_dirs(job)] == [0, 1]
    for r in (0, 1):
        doc = json.loads((tmp_path / f"r.rank-{r}.json").read_text())
        assert doc["run"]["label"] == f"rank {r} of 2"
    merged = run_cli("report", str(job), "-f", "json")
    doc = json.loads(merged.stdout)
    assert doc["facts"]["ranks.straggler"]["value"] == 1
    assert doc["facts"]["ranks.straggler_cause"]["value"] == "data loading"


@pytest.mark.e2e
def test_a_straggler_slowed_by_its_garbage_collections_is_named_so(tmp_path):
    doc, _ = _job(tmp_path, "ddp_gc_straggler.py", 2)
    facts = doc["facts"]
    assert facts["ranks.straggler"]["value"] == 1
    assert facts["ranks.straggler_cause"]["value"] == "garbage collection"
    rows = {r["rank"]: r for r in doc["ranks"]}
    assert rows[1]["gc_ms"] > 5 * max(rows[0]["gc_ms"], 0.1)


def test_a_straggler_slowed_by_garbage_collection_is_named_so():
    """GC time is a rank's own evidence: it leaves the compute column and names the cause."""
    fast = [_rank_facts(40, 0.4, 1.0, 38.0, 0.2, 35) for _ in range(2)]  # backward waits 35 ms in the all-reduce
    for f in fast:
        f.add("gc.ms", 0.3, "ms", "run")
    slow = _rank_facts(40, 0.4, 14.0, 25.0, 0.2, 3.5)  # its collections make its forward and backward long
    slow.add("gc.ms", 31.0, "ms", "run")
    slow.add("gc.compute_ms", 31.0, "ms", "run")
    g, rows = cross_rank([(0, "a"), (1, "b"), (2, "c")], [fast[0], slow, fast[1]], "run")
    assert g.value("ranks.straggler") == 1 and g.value("ranks.straggler_cause") == "garbage collection"
    assert g.value("ranks.straggler_excess_ms") == pytest.approx(30.7)
    assert rows[1].gc_ms == 31.0 and rows[1].compute_ms == pytest.approx(14.0 + 25.0 + 0.2 - 3.5 - 31.0)
    # no gc.ms (a trace, an older run folder): no column, compute as before
    g, rows = cross_rank([(0, "a"), (1, "b")], [_rank_facts(40, 0.4, 1, 38, 0.2, 35) for _ in range(2)])
    assert rows[0].value("gc_ms") is None and rows[0].compute_ms == pytest.approx(1 + 38 + 0.2 - 35)


def test_gc_time_is_counted_on_the_training_steps_and_becomes_gc_ms():
    import gc
    import time

    from perfdoctor.capture.patches import ErrorLog
    from perfdoctor.capture.probes.gc_time import GcTimeProbe
    from perfdoctor.contracts.run import Probes
    from perfdoctor.facts.run import RunContext, gc_time

    class Clock:
        pc = staticmethod(time.perf_counter)
        kind: str | None = None
        steps: list = []
        bwd_depth = opt_depth = 0

    clock = Clock()
    probe = GcTimeProbe(clock, ErrorLog(), lambda: True)  # type: ignore[arg-type]
    probe.install()
    try:
        gc.collect()  # before the first step: not counted
        clock.kind = "optimizer"
        for i in range(4):
            if i % 2:
                junk = [[j] for j in range(20000)]  # something for the collector to walk
                gc.collect()
                del junk
            clock.steps.append((i + 1,))
    finally:
        probe.uninstall()
    assert probe._callback not in gc.callbacks
    rec = probe.records()
    assert [int(r[0]) for r in rec.ms_by_step] == [2, 4] and all(r[1] > 0 and r[2] >= 1 for r in rec.ms_by_step)
    f = Facts()
    gc_time.add(RunContext(f, Probes(gc_time=rec), [{"i": i} for i in range(1, 5)]))
    assert f.value("gc.ms") == pytest.approx(sum(r[1] for r in rec.ms_by_step) / 4)
    assert f.get("gc.ms").per_step[0] == 0.0
    assert f.value("gc.compute_ms") == f.value("gc.ms")  # all inside "forward" here


def test_a_straggler_starved_of_cpu_is_named_so():
    fast = [_rank_facts(40, 0.4, 1.0, 38.0, 0.2, 35) for _ in range(2)]
    for f in fast:  # 4 ms of work, 0.5 ms of waiting for a CPU: 1/9 of the time they had work to run
        f.add("cpu.wait_ms", 0.5, "ms", "run")
        f.add("cpu.run_ms", 4.0, "ms", "run")
    slow = _rank_facts(40, 0.4, 12.0, 27.0, 0.2, 3.0)  # its forward and backward wait for a CPU
    slow.add("cpu.wait_ms", 30.0, "ms", "run")
    slow.add("cpu.run_ms", 8.0, "ms", "run")  # at the others' share it would have waited 1 ms
    g, rows = cross_rank([(0, "a"), (1, "b"), (2, "c")], [fast[0], slow, fast[1]], "run")
    assert g.value("ranks.straggler") == 1 and g.value("ranks.straggler_cause") == "waiting for a CPU"
    assert g.value("ranks.straggler_excess_ms") == pytest.approx(29.0, abs=0.01)
    assert "share of waiting (11%" in g.get("ranks.straggler_cause").detail
    assert rows[1].cpu_wait_ms == 30.0 and rows[1].compute_ms == pytest.approx(12 + 27 + 0.2 - 3)
    # a compute straggler waits longer for a CPU in proportion to its work on a busy machine: still
    # one for its compute, less only the wait beyond the others' share
    slow = _rank_facts(40, 0.4, 12.0, 27.0, 0.2, 3.0)
    slow.add("cpu.wait_ms", 4.5, "ms", "run")
    slow.add("cpu.run_ms", 32.0, "ms", "run")  # the others' 1/9 share: 4 ms expected, 0.5 beyond it
    g, _ = cross_rank([(0, "a"), (1, "b"), (2, "c")], [fast[0], slow, fast[1]], "run")
    assert g.value("ranks.straggler_cause") == "compute"
    assert g.value("ranks.straggler_excess_ms") == pytest.approx(36.2 - 4.2 - 0.5, abs=0.01)


def test_cpu_wait_is_read_per_step_with_the_cgroups_throttling(tmp_path):
    import time

    from perfdoctor.capture.patches import ErrorLog
    from perfdoctor.capture.probes.cpu_wait import CpuWaitProbe, cgroup_cpu_stat, throttling
    from perfdoctor.contracts.run import Probes
    from perfdoctor.facts.run import RunContext
    from perfdoctor.facts.run.cpu_wait import worker_contention

    assert throttling("usage_usec 10\nnr_throttled 4\nthrottled_usec 2500\n") == (2.5, 4)  # cgroup v2
    assert throttling("nr_throttled 3\nthrottled_time 7000000\n") == (7.0, 3)  # v1, ns
    assert throttling("usage_usec 10\n") is None
    v2 = tmp_path / "v2"
    (v2 / "job.slice").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu io\n")
    (v2 / "job.slice" / "cpu.stat").write_text("throttled_usec 0\n")
    (tmp_path / "cg2").write_text("0::/job.slice\n")
    assert cgroup_cpu_stat(str(tmp_path / "cg2"), str(v2)) == v2 / "job.slice" / "cpu.stat"
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "rank1").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "rank1" / "cpu.stat").write_text("throttled_time 0\n")
    (tmp_path / "cg1").write_text("4:memory:/x\n2:cpu,cpuacct:/rank1\n0::/\n")
    assert cgroup_cpu_stat(str(tmp_path / "cg1"), str(v1)) == v1 / "cpu,cpuacct" / "rank1" / "cpu.stat"
    assert cgroup_cpu_stat(str(tmp_path / "missing"), str(v1)) is None

    probe = CpuWaitProbe(ErrorLog())
    probe.install()
    try:
        if probe.last is None:
            pytest.skip("no /proc/self/schedstat here")
        for i in range(1, 5):
            sum(range(400000))  # work for a few scheduler ticks (the kernel updates its counts on them)
            probe.end_step(i)
            time.sleep(0.01)  # perfdoctor's own work between the steps: not counted
            probe.begin_step()
    finally:
        probe.uninstall()
    rec = probe.records()
    assert rec is not None and len(rec.wait_ms) == len(rec.throttled_ms) == len(rec.throttled_periods) == len(rec.run_ms) == 4
    assert all(w >= t >= 0 for w, t in zip(rec.wait_ms, rec.throttled_ms))
    f = Facts()
    worker_contention(RunContext(f, Probes(cpu_wait=rec), [{"i": i, "wall_ms": 10.0} for i in range(1, 5)]))
    assert f.value("cpu.wait_ms") == pytest.approx(sum(rec.wait_ms) / 4)
    assert f.value("cpu.run_ms") == pytest.approx(sum(rec.run_ms) / 4) and f.value("cpu.run_ms") > 0
    f = Facts()
    worker_contention(RunContext(f, Probes(cpu_wait=rec), [{"i": i, "wall_ms": 10.0} for i in range(1, 11)]))
    assert "cpu.wait_ms" not in f  # fewer than half the steady steps read: no fact


def _render(fmt: str, report) -> str:
    import io

    from rich.console import Console

    from perfdoctor.report.formats import render

    if fmt != "text":
        return render(fmt, report)
    buf = io.StringIO()
    Console(file=buf, width=200, no_color=True).print(render(fmt, report))
    return buf.getvalue()


def test_the_rank_table_draws_every_measured_column_and_only_those():
    """The columns a job's ranks measured (GC, waiting for a CPU, host syncs, ...) are drawn in the text,
    markdown and HTML reports; a column no rank has is not drawn."""
    import msgspec

    from perfdoctor.contracts.report import RankRowDoc, RunInfoDoc, SummaryDoc
    from perfdoctor.model import Report

    base = [{"rank": r, "file": f"rank-{r}", "step_ms": 40.0, "data_ms": 0.4, "compute_ms": 3.0, "comm_ms": 36.0,
             "idle_ms": None, "idle_fraction": None} for r in (0, 1)]
    plain = Report(run=RunInfoDoc(), summary=SummaryDoc(), findings=[], ranks=msgspec.convert(base, list[RankRowDoc]))
    full = Report(run=RunInfoDoc(), summary=SummaryDoc(), findings=[], ranks=msgspec.convert([
        {**row, "sync_ms": 0.25, "gc_ms": 0.3 + 30 * row["rank"], "cpu_wait_ms": 0.5 + 7 * row["rank"],
         "cpu_wait_share": 0.1 + 0.3 * row["rank"], "busy_share": 0.1 + 0.8 * row["rank"],
         "gpu_clock_mhz": 1980.0 - 780 * row["rank"]} | ({"gpu_throttle": "power cap"} if row["rank"] else {})
        for row in base], list[RankRowDoc]))
    text = _render("text", full)
    heads = ("GC (ms)", "CPU wait (ms)", "CPU wait share", "host syncs (ms)", "own work share")  # the labels, as in Markdown
    for head in heads:
        assert head in text and head not in _render("text", plain)
    head = next(line for line in text.splitlines() if "┃ rank" in line)
    row1 = next(line for line in text.splitlines() if line.startswith("│    1 │"))
    cells = dict(zip([c.strip() for c in head.split("┃")[1:-1]], [c.strip() for c in row1.split("│")[1:-1]]))
    assert (cells["GC (ms)"], cells["CPU wait (ms)"], cells["CPU wait share"], cells["own work share"]) == (
        "30.3", "7.5", "40%", "90%")
    assert (cells["SM clock (MHz)"], cells["GPU throttle reasons"]) == ("1200", "power cap")
    assert "GPU idle" not in text and "idle_ms" not in text  # no rank has it
    md = _render("markdown", full)
    assert "| GC (ms) | CPU wait (ms) | CPU wait share | own work share |" in md
    assert "| 1 | 40.0 | 0.4 | 3.0 | 36.0 | 0.2 | 30.3 | 7.5 | 40% | 90% | 1,200 | power cap |" in md
    assert "| 0 | 40.0 | 0.4 | 3.0 | 36.0 | 0.2 | 0.3 | 0.5 | 10% | 10% | 1,980 |  |" in md
    assert "GC (ms)" not in _render("markdown", plain) and "| Rank | step (ms) |" in _render("markdown", plain)
    page = _render("html", full)
    assert '<th class="n">GC</th><th class="n">CPU wait</th>' in page and '<td class="n">30.3 ms</td>' in page
    assert '<td class="n">1200 MHz</td><td>power cap</td>' in page
    assert "<th class=\"n\">GC</th>" not in _render("html", plain)


def test_a_straggler_held_back_by_its_cpu_quota_is_named_cpu_throttling():
    """The wait for a CPU that the CPU cgroup's quota made (cpu.stat throttled time beyond the other
    ranks') is CPU throttling; a wait with no more throttling than theirs stays waiting for a CPU."""
    def rank(wait, run, throttled, periods, fwd=1.0, bwd=38.0, comm=35):
        f = _rank_facts(40, 0.4, fwd, bwd, 0.2, comm)
        f.add("cpu.wait_ms", wait, "ms", "run")
        f.add("cpu.run_ms", run, "ms", "run")
        f.add("cpu.throttled_ms", throttled, "ms", "run")
        f.add("cpu.throttled_periods", periods, "number", "run")
        return f

    fast = [rank(0.5, 4.0, 0.0, 0) for _ in range(2)]
    g, rows = cross_rank([(0, "a"), (1, "b"), (2, "c")], [fast[0], rank(30.0, 8.0, 26.0, 6.5, 12.0, 27.0, 3.0),
                                                          fast[1]], "run")
    assert g.value("ranks.straggler") == 1 and g.value("ranks.straggler_cause") == "CPU throttling"
    assert g.value("ranks.straggler_excess_ms") == pytest.approx(26.0)
    assert "held rank 1 back 26.0 ms per step in 6.5 of the quota's periods" in g.get("ranks.straggler_cause").detail
    assert [r.cpu_throttled_ms for r in rows] == [0.0, 26.0, 0.0]
    # throttled as much as the others (one cgroup for the node's ranks): its run-queue wait is the cause
    fast = [rank(0.5, 4.0, 0.0, 0) for _ in range(2)]
    g, rows = cross_rank([(0, "a"), (1, "b"), (2, "c")], [fast[0], rank(30.0, 8.0, 0.0, 0, 12.0, 27.0, 3.0),
                                                          fast[1]], "run")
    assert g.value("ranks.straggler_cause") == "waiting for a CPU"
    assert all(r.value("cpu_throttled_ms") is None and r.value("cpu_throttled_periods") is None for r in rows)  # no rank throttled


def _gpu_rank(kernel_ms, comm_ms, mhz, share=0.0, reasons=None):
    f = Facts()
    f.add("step.time_ms", 50.0, "ms", "trace")
    f.add("step.gpu_kernel_ms", kernel_ms, "ms", "trace")
    f.add("step.comm_ms", comm_ms, "ms", "trace")
    f.add("step.idle_ms", 50.0 - kernel_ms - comm_ms, "ms", "trace")
    if mhz is not None:
        f.add("gpu.sm_clock_mhz", mhz, "number", "run")
        f.add("gpu.throttled_share", share, "ratio", "run")
        f.add("gpu.throttle_reasons", reasons, "str", "run")
    return f


def test_a_straggler_whose_gpu_runs_at_a_lower_clock_is_named_gpu_throttling():
    fast = [_gpu_rank(20.0, 25.0, 1980.0) for _ in range(3)]
    hot = _gpu_rank(33.0, 12.0, 1200.0, 0.9, "power cap, thermal (hardware)")
    g, rows = cross_rank([(0, "a"), (1, "b"), (2, "c"), (3, "d")], [fast[0], fast[1], hot, fast[2]], "run")
    assert g.value("ranks.straggler") == 2 and g.value("ranks.straggler_cause") == "GPU throttling"
    assert g.value("ranks.straggler_excess_ms") == pytest.approx(13.0)
    detail = g.get("ranks.straggler_cause").detail
    assert "1200 MHz" in detail and "1980 MHz on the other ranks" in detail and "power cap, thermal (hardware) (90%" in detail
    assert rows[2].gpu_clock_mhz == 1200.0 and rows[2].gpu_throttled_share == 0.9
    assert rows[0].gpu_clock_mhz == 1980.0 and rows[0].value("gpu_throttle") is None  # no reason set there
    # the same clock as the others: its compute is the cause
    g, _ = cross_rank([(0, "a"), (1, "b")], [fast[0], _gpu_rank(33.0, 12.0, 1980.0)], "run")
    assert g.value("ranks.straggler_cause") == "compute"
    # no clock readings (no NVML, a trace): compute, and no clock column
    g, rows = cross_rank([(0, "a"), (1, "b")], [_gpu_rank(20.0, 25.0, None), _gpu_rank(33.0, 12.0, None)], "run")
    assert g.value("ranks.straggler_cause") == "compute" and all(r.value("gpu_clock_mhz") is None for r in rows)
    # as many kernels per step as the others at the same clock: a slower GPU (another model, say)
    ranks = [_gpu_rank(20.0, 25.0, 1980.0), _gpu_rank(33.0, 12.0, 1980.0)]
    for f in ranks:
        f.add("kernels.launches_per_step", 412, "count", "trace")
    g, _ = cross_rank([(0, "a"), (1, "b")], ranks, "run")
    assert g.value("ranks.straggler_cause") == "a slower GPU" and "412 kernel launches" in g.get("ranks.straggler_cause").detail


def test_throttling_facts_from_the_probe_records():
    from perfdoctor.contracts.run import CpuWaitRecord, GpuClockRecord, Probes
    from perfdoctor.facts.run import RunContext, cpu_wait, gpu_clock

    steady = [{"i": i} for i in (3, 4, 5, 6)]
    cpu = CpuWaitRecord(wait_ms=[9.0] * 6, run_ms=[5.0] * 6, throttled_ms=[0, 0, 4.0, 0.0, 8.0, 4.0],
                        throttled_periods=[0, 0, 1, 0, 2, 1], cgroup=True)
    gpu = GpuClockRecord(max_mhz=1980.0, by_step=[[1, 1980, 0], [3, 1410, 0x4], [5, 1395, 0x4 | 0x40 | 0x1],
                                                  [6, 1980, 0x1]])
    f = Facts()
    ctx = RunContext(f, Probes(cpu_wait=cpu, gpu_clock=gpu), steady)
    cpu_wait.throttling(ctx)
    gpu_clock.add(ctx)
    assert f.value("cpu.throttled_ms") == pytest.approx(4.0) and f.value("cpu.throttled_periods") == 1.0
    assert f.value("gpu.sm_clock_mhz") == 1410.0  # the steady steps' readings only
    assert f.value("gpu.throttled_share") == pytest.approx(2 / 3)  # idle (0x1) is no slowdown
    assert f.value("gpu.throttle_reasons") == "power cap, thermal (hardware)"
    assert f.value("gpu.sm_clock_max_mhz") == 1980.0
    f = Facts()  # no cgroup readable, no NVML: nothing
    ctx = RunContext(f, Probes(cpu_wait=CpuWaitRecord(wait_ms=[1.0] * 6, throttled_ms=[0.0] * 6)), steady)
    cpu_wait.throttling(ctx)
    gpu_clock.add(ctx)
    assert "cpu.throttled_ms" not in f and "gpu.sm_clock_mhz" not in f


def test_gpu_clock_probe_reads_nvml_a_few_times_a_second_and_is_silent_without_it(monkeypatch):
    import types

    from perfdoctor.capture.patches import ErrorLog
    from perfdoctor.capture.probes import gpu_clock

    class Cuda:
        initialized = False

        def is_initialized(self):
            return self.initialized

        def current_device(self):
            return 0

        def get_device_properties(self, d):
            return types.SimpleNamespace(uuid="1234-abcd")

    calls = []

    def fake_nvml():
        m = types.ModuleType("pynvml")
        m.NVML_CLOCK_SM = 1
        m.nvmlInit = lambda: calls.append("init")
        m.nvmlShutdown = lambda: calls.append("shutdown")
        m.nvmlDeviceGetHandleByUUID = lambda uuid: calls.append(uuid) or "h0"
        m.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
        m.nvmlDeviceGetClockInfo = lambda h, kind: 1410 if (h, kind) == ("h0", 1) else 0
        m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x4  # an older binding's name
        return m

    now = [0.0]
    monkeypatch.setattr(gpu_clock.time, "perf_counter", lambda: now[0])
    torch = types.SimpleNamespace(cuda=Cuda())
    err = ErrorLog()
    probe = gpu_clock.GpuClockProbe(torch, err, fake_nvml)
    probe.install()
    probe.end_step(1)  # CUDA not initialised yet (a CPU run, or before the model moved): nothing
    assert probe.records() is None and calls == []
    torch.cuda.initialized = True
    for i in range(2, 12):
        now[0] += 0.03  # 30 ms steps: a look every 0.1 s at most (step 1's counts): steps 5 and 9
        probe.end_step(i)
    probe.uninstall()
    rec = probe.records()
    assert calls[:2] == ["init", "GPU-1234-abcd"] and calls[-1] == "shutdown"
    assert rec.max_mhz == 1980.0 and [r[0] for r in rec.by_step] == [5, 9]
    assert all(r[1:] == [1410.0, 4] for r in rec.by_step) and not err.items

    def no_nvml():
        raise ImportError("No module named 'pynvml'")

    probe = gpu_clock.GpuClockProbe(torch, err, no_nvml)
    for i in range(1, 5):
        now[0] += 1.0
        probe.end_step(i)
    assert probe.records() is None and probe.off and not err.items  # nothing said


def test_ranks_whose_windows_ended_at_different_steps_are_tested_over_the_steps_they_share():
    """A budget ended rank 1's profiled window a step early (6 steps against 7): the straggler test runs
    over the 6 steps both profiled instead of giving up on series of unequal length."""
    from perfdoctor.facts.ranks import common_steps, straggler_test

    fast = tuple(0.5 + 0.01 * (i % 2) for i in range(7))
    slow = tuple(0.9 + 0.01 * (i % 3) for i in range(6))
    series = common_steps([fast, slow])
    assert [len(s) for s in series] == [6, 6]
    test = straggler_test(series)
    assert test is not None and test[0] == 1 and test[1] <= 0.1
    assert common_steps([fast, ()]) == [fast, ()]
