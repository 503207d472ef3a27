"""PD008 (rules/PD008-host-device-sync.toml), judged on hand-built facts: host reads of a CUDA script on a CPU run, syncs that cost GPU time in a trace.

the run's host-read probe end to end: tests/capture/test_host_reads.py."""

from __future__ import annotations

import pytest

from perfdoctor.model import Location
from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run, gpu_facts, target_gpu


def test_pd008_host_reads_of_a_cuda_script_on_a_cpu_run():
    def run(targets=True, count=None, device="cpu"):
        f = cpu_run()
        f.add("device.type", device, "", "machine")
        f.add("script.targets_cuda", targets, "", "static")
        s = f.subject("host_read", "train.py:12")
        s.add("kind", "item", "", "static")
        s.add("in_loop", True, "", "static")
        s.add("count_per_step", count, "count", "run")
        s.locations.append(Location("train.py", 12, "total += loss.item()"))
        return judge(f, RULES)
    (finding,) = run()
    assert finding.rule == "PD008" and finding.locations[0].line == 12
    assert finding.title == ("A host read of a device tensor (item) on every training step: "
                             "a host-device sync each time on the GPU")
    assert finding.saving_basis.startswith("GPU-only") and finding.confidence == "medium"
    (finding,) = run(count=2.0)
    assert "2 time(s) per step" in finding.title and "in the source and in this run" in finding.saving_basis
    assert run(count=0.1) == []  # the probe saw it once every ten steps: logging, not a step cost
    assert run(targets=False) == []  # a CPU-only script: .item() is no device sync
    assert run(device="cuda") == []  # on a GPU the trace's measured syncs decide


def test_pd008_leaves_reads_on_few_steps_to_the_periodic_work():
    """unet-carvana (Pytorch-UNet): every n_train/5 steps a histogram of every parameter reads 64
    values with `if not (torch.isinf(v) | torch.isnan(v)).any()`, on 1 of 11 steady steps: 5.8 reads
    "per step" on average, but no training step syncs there; the evaluation step is PD020's."""
    from perfdoctor.contracts.run import HostReadRecord, Site
    from perfdoctor.facts.run import host_reads

    def facts(series):
        f = cpu_run()
        f.add("script.targets_cuda", True, "", "static")
        rec = HostReadRecord(site=Site(file="/p/train.py", line=137, function="train", code="if not x.any():"),
                             kind="bool", counts_per_step=series)
        ctx = type("Ctx", (), {"steady_idx": list(range(1, len(series))), "facts": f,
                               "probes": type("P", (), {"host_reads": [rec]})()})()
        host_reads.add(ctx)
        return f
    periodic = facts([0] * 9 + [64, 0, 0])
    assert periodic.of_kind("host_read")[0].facts["host_read.step_share"].value == pytest.approx(1 / 11)
    assert [x for x in judge(periodic, RULES) if x.rule == "PD008"] == []
    every = facts([0] + [2] * 11)  # two reads on every step: the training step's syncs
    assert [x.rule for x in judge(every, RULES)] == ["PD008"]
    # luopeixiang's NER trains an HMM, a CRF, then a BiLSTM-CRF: the last phase reads on each of its
    # steps (6 of the 11 steady steps), judged over that phase; a read that starts at the run's last
    # steps, or stops before its end, is not a phase
    phase = facts([0] * 6 + [300] * 6)
    (s,) = phase.of_kind("host_read")
    assert s.facts["host_read.step_share"].value == 1.0 and s.facts["host_read.count_per_step"].value == 300
    assert [x.rule for x in judge(phase, RULES)] == ["PD008"]
    assert [x.rule for x in judge(facts([0] * 8 + [300] * 4), RULES) if x.rule == "PD008"] == []
    assert [x.rule for x in judge(facts([0] * 6 + [300] * 4 + [0, 0]), RULES) if x.rule == "PD008"] == []


def test_pd008_trusts_the_source_over_a_short_logging_interval():
    f = cpu_run()
    f.add("script.targets_cuda", True, "", "static")
    s = f.subject("host_read", "train.py:30")
    s.add("kind", "item", "", "static")
    s.add("in_loop", False, "", "static")  # behind `if it % log_interval == 0`
    s.add("count_per_step", 1.0, "count", "run")  # the run logged every step
    s.locations.append(Location("train.py", 30, "lossf = loss.item()"))
    assert judge(f, RULES) == []


def test_pd008_needs_syncs_that_cost_gpu_time():
    fired = judge(gpu_facts(sync__count_per_step=20, sync__ms=6.0, gpu__idle_host_wait_ms=4.0), RULES)
    (f,) = [x for x in fired if x.rule == "PD008"]
    assert f.ms_per_step == pytest.approx(4.0)
    # the GPU never waited on the host: the syncs cost nothing worth a finding
    assert "PD008" not in [x.rule for x in judge(gpu_facts(sync__count_per_step=20, sync__ms=6.0,
                                                           gpu__idle_host_wait_ms=0.1), RULES)]


def test_pd008_reads_profiled_host_time_as_a_share_of_the_profiled_steps():
    """In a run folder the profiled steps take twice the run's (the profiler's host overhead): 6 ms
    blocked in syncs of a 200 ms profiled step is 3% of the step, 3 ms of the run's 100 ms one."""
    fired = judge(gpu_facts(sync__count_per_step=20, sync__ms=6.0, gpu__idle_host_wait_ms=10.0,
                            step__profiled_time_ms=200.0), RULES)
    (f,) = [x for x in fired if x.rule == "PD008"]
    assert f.ms_per_step == pytest.approx(3.0)
    # on a CPU trace .item() is not a device sync
    cpu = gpu_facts(sync__count_per_step=20, sync__ms=6.0, gpu__idle_host_wait_ms=4.0)
    cpu.add("device.type", "cpu", "", "trace")
    assert "PD008" not in [x.rule for x in judge(cpu, RULES)]


def test_pd008_is_one_finding_for_the_training_steps_reads():
    """ncrfpp-lstmcrf, cifar100-vgg: `.cpu()` of the predictions at three lines and `.item()` of the
    loss at another were one PD008 finding per kind, and a labeller (or a user) saw one problem
    reported two or three times. All the step's reads are one finding, every line a location (a read
    behind a logging guard stays out), titled for the lines together; one read keeps its own title."""
    def facts(reads):
        f = cpu_run()
        f.add("script.targets_cuda", True, "", "static")
        for line, kind, count, in_loop in reads:
            s = f.subject("host_read", f"train.py:{line}")
            s.add("kind", kind, "", "run")
            s.add("in_loop", in_loop, "", "static")
            s.add("count_per_step", count, "count", "run")
            s.locations.append(Location("train.py", line, "x"))
        return [x for x in judge(f, RULES) if x.rule == "PD008"]
    (one,) = facts([(50, "cpu", 3.0, True), (55, "item", 1.0, True), (60, "item", 1.0, False)])
    assert [loc.line for loc in one.locations] == [50, 55]
    assert one.title == ("Host reads of device tensors at 2 lines of the training step: "
                         "a host-device sync each time on the GPU")
    (alone,) = facts([(55, "item", 1.0, True), (60, "item", 1.0, False)])
    assert alone.title.startswith("A host read of a device tensor (item) 1 time(s) per step")


def test_pd008_groups_a_traces_syncs_under_the_costliest_line():
    f = gpu_facts(gpu__idle_host_wait_ms=20.0)
    for line, count, ms in ((10, 4.0, 2.5), (20, 8.0, 3.0)):
        s = f.subject("sync", f"train.py:{line}")
        s.add("count_per_step", count, "count", "trace")
        s.add("ms", ms, "ms", "trace")
        s.locations.append(Location("train.py", line, "x"))
    (one,) = [x for x in judge(f, RULES) if x.rule == "PD008"]
    assert [loc.line for loc in one.locations] == [20, 10]
    assert one.title.startswith("2 lines sync the host with the device in the training step; the costliest, 8 time(s)")


@pytest.mark.parametrize(("reads", "step_ms", "severity", "share"), [
    ([(55, 1.0)], 20.0, "low", 0.0023),  # one loss.item() beside a 20 ms GPU step: 46 us, 0.2 %
    ([(55, 1.0)], 2.0, "medium", 0.023),  # the same read beside a launch-bound 2 ms step: 2.3 %
    # four lines of the step, five reads in all: their costs add up, 1.15 % of a 20 ms step
    ([(50, 2.0), (55, 1.0), (57, 1.0), (59, 1.0)], 20.0, "medium", 0.0115),
    ([(55, 1.0)], None, "medium", None),  # no estimate of the GPU step: the rule's own severity
])
def test_pd008_severity_follows_the_reads_share_of_the_target_gpu_step(reads, step_ms, severity, share):
    """A host read costs the GPU step the script targets its call and the drained queue's wait for the next
    launch (target_gpu.sync_ms, as PD004's copies): one read a step is minor where that step is long."""
    f = cpu_run()
    f.add("script.targets_cuda", True, "", "static")
    if step_ms is not None:
        f.add("target_gpu.step_ms", step_ms, "ms", "trace")
        f.add("target_gpu.sync_ms", 0.046, "ms", "trace")
    for line, count in reads:
        s = f.subject("host_read", f"train.py:{line}")
        s.add("kind", "item", "", "run")
        s.add("in_loop", True, "", "static")
        s.add("count_per_step", count, "count", "run")
        s.locations.append(Location("train.py", line, "x"))
    (finding,) = [x for x in judge(f, RULES) if x.rule == "PD008"]
    assert finding.severity == severity and len(finding.locations) == len(reads)
    if share is not None:
        assert f"an estimated {share:.1%} of the step on the GPU" in finding.saving_basis


def test_pd008_selections_by_value_on_a_cpu_run_and_the_costliest_speaks():
    """PointNet++: 1,280 `distance[mask] = dist[mask]` selections a step (the trace's `selection`
    subject) beside one `loss.item()`: one finding at both lines, the selection's (the larger share of
    the estimated GPU step, as neither has a measured saving) first, its title and the shape-keeping
    advice; a selection seen on few of the profiled steps is not one of every step."""
    def run(share=1.0):
        f = cpu_run()
        f.add("device.type", "cpu", "", "machine")
        f.add("script.targets_cuda", True, "", "static")
        target_gpu(f, 170.0)
        r = f.subject("host_read", "train.py:192")
        r.add("kind", "item", "", "static")
        r.add("in_loop", True, "", "static")
        r.add("count_per_step", 1.0, "count", "run")
        r.locations.append(Location("train.py", 192, "correct = pred.eq(target).cpu().sum().item()"))
        s = f.subject("selection", "pointnet2_utils.py:82")
        s.add("ops", "aten::nonzero", "", "trace")
        s.add("count_per_step", 1280.0, "count", "trace")
        s.add("step_share", share, "ratio", "trace")
        s.locations.append(Location("pointnet2_utils.py", 82, "distance[mask] = dist[mask]"))
        return [x for x in judge(f, RULES) if x.rule == "PD008"]
    (finding,) = run()
    assert [loc.line for loc in finding.locations] == [82, 192]
    assert finding.title.startswith("Host reads of device tensors or selections by value at 2 places")
    assert "a selection by value (aten::nonzero) 1280 time(s) per step" in finding.title
    assert "torch.where(mask, x, y)" in finding.message
    (finding,) = run(share=0.25)
    assert [loc.line for loc in finding.locations] == [192]
