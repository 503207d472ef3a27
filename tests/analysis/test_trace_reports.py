"""`perfdoctor report` on real traces from other projects: the findings an engineer would sign."""


import pytest

from perfdoctor.analysis import analyse_path, analyse_trace
from perfdoctor.errors import InputError
from perfdoctor.facts.model import Facts
from perfdoctor.report import jsonfmt
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import judge
from tests.helpers import TESTS

DATA = TESTS / "data" / "traces"
RESNET = DATA / "kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
HTA_DDP = DATA / "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
MI300 = DATA / "tracelens__mi300__resnet_act_checkpoint.json.gz"
DLRM = DATA / "param__dlrm_kineto_8ranks"
RULES = load_rules()


def rules_of(report):
    return [f.rule for f in report.findings]


def test_resnet50_num_workers_0_is_data_loading_bound():
    r = analyse_path(RESNET)
    assert r.findings[0].rule == "PD002", rules_of(r)
    top = r.findings[0]
    data = next(b for b in r.summary["breakdown"] if b["category"] == "data loading")
    # the saving is the measured wait: with no CPU count in a trace, 8 workers hide all of it
    wait = next(e for e in top.evidence if e.name == "dataloader.wait_ms")
    assert wait.source == "trace" and top.ms_per_step == pytest.approx(wait.value)
    assert 0.3 <= data["fraction"] <= 0.45 and 0.3 <= top.fraction_of_step <= 0.45
    assert top.locations and top.locations[0].line == 42
    assert "PD001" not in rules_of(r)


@pytest.mark.parametrize("trace", [HTA_DDP, MI300])
def test_ddp_traces_never_get_dataparallel(trace):
    assert "PD001" not in rules_of(analyse_path(trace))


def test_mi300_rccl_is_communication_bound():
    r = analyse_path(MI300)
    assert r.facts["device.type"].value == "rocm"
    f = next(f for f in r.findings if f.rule == "PD010")
    assert f.ms_per_step and f.fraction_of_step > 0.2
    assert "PD007" not in rules_of(r)  # bf16 kernels: no fp32 matmul time to win back


def test_v100_fp32_training_gets_amp():
    r = analyse_path(HTA_DDP)
    f = next(f for f in r.findings if f.rule == "PD007")
    # half of the measured fp32 matmul/conv time (expected_speedup 2)
    assert f.ms_per_step == pytest.approx(r.facts["matmul.ms"].value * r.facts["matmul.fp32_share"].value * 0.5)
    assert f.saving_basis.startswith("measured in this trace")
    assert r.facts["device.capability"].value == 7.0 and r.facts["device.amp_available"].value is True


def test_dlrm_8_ranks_shows_the_imbalance():
    r = analyse_path(DLRM)
    assert len(r.ranks) == 8 and r.summary["rank"] == r.facts["ranks.straggler"].value
    f = next(f for f in r.findings if f.rule == "PD012")
    assert f.ms_per_step and f.ms_per_step > 1.0
    assert f"Rank {r.facts['ranks.straggler'].value}" in f.title
    assert {"PD009", "PD010"} <= set(rules_of(r))


@pytest.mark.slow
def test_ranks_in_parallel_processes_give_the_serial_report():
    """The map over ranks in 2 worker processes merges into the very report of 1 (in-process)."""
    serial = jsonfmt.render_report(analyse_trace(DLRM, workers=1))
    assert jsonfmt.render_report(analyse_trace(DLRM, workers=2)) == serial
    assert jsonfmt.render_report(analyse_trace(DLRM, workers=3)) == serial  # 8 ranks over 3: uneven shares


@pytest.mark.slow
def test_ranks_numbered_by_file_order_across_workers(tmp_path):
    """Ranks that clash (the same trace twice) are numbered by file order after the workers return."""
    for name in ("a.json.gz", "b.json.gz", "c.json.gz"):
        (tmp_path / name).write_bytes(HTA_DDP.read_bytes())  # each says rank 0 in its distributedInfo
    r = analyse_trace(tmp_path, workers=2)
    assert [(row["rank"], row["file"]) for row in r.ranks] == [(0, "a.json.gz"), (1, "b.json.gz"), (2, "c.json.gz")]


def test_a_bad_rank_file_from_a_worker_is_left_out_with_a_note(tmp_path):
    (tmp_path / "rank0.json.gz").write_bytes(HTA_DDP.read_bytes())
    (tmp_path / "rank1.json").write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    r = analyse_trace(tmp_path, workers=2)  # the readable rank is analysed
    (note,) = [n for n in r.notes if n.startswith("rank trace rank1.json left out:")]
    assert "truncated" in note
    (tmp_path / "rank0.json.gz").unlink()
    with pytest.raises(InputError) as e:  # no rank readable: the first one's error
        analyse_trace(tmp_path, workers=2)
    assert "rank1.json" in e.value.message and "truncated" in e.value.message


def gpu_facts(**kv):
    f = Facts()
    f.add("device.type", "cuda", "", "trace")
    f.add("step.time_ms", 100.0, "ms", "trace")
    if "step__profiled_time_ms" not in kv:  # a trace alone: its steps are the profiled steps
        f.add("step.profiled_time_ms", 100.0, "ms", "trace")
    for k, v in kv.items():
        f.add(k.replace("__", "."), v, "", "trace")
    return f


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


def test_pd009_discounts_data_loading():
    f = gpu_facts(gpu__idle_host_wait_ms=40.0, step__data_ms=35.0, gpu__utilization=0.6)
    assert "PD009" not in [x.rule for x in judge(f, RULES)]  # PD002's business
    f = gpu_facts(gpu__idle_host_wait_ms=40.0, step__data_ms=5.0, gpu__utilization=0.6)
    (x,) = [x for x in judge(f, RULES) if x.rule == "PD009"]
    assert x.ms_per_step == pytest.approx(35.0 * 0.8)


def test_pd010_and_pd011():
    f = gpu_facts(step__comm_ms=30.0, comm__overlap=0.1, comm__allreduce_per_step=200.0,
                  comm__allreduce_bytes_median=65536.0)
    rules = [x.rule for x in judge(f, RULES)]
    assert "PD010" in rules and "PD011" in rules
    f = gpu_facts(step__comm_ms=5.0, comm__allreduce_per_step=4.0, comm__allreduce_bytes_median=25e6)
    rules = [x.rule for x in judge(f, RULES)]
    assert "PD010" not in rules and "PD011" not in rules


def test_pd012_saving_is_the_straggler_gap():
    f = gpu_facts(ranks__count=8, ranks__imbalance_ratio=1.25, ranks__straggler=3)
    (x,) = [x for x in judge(f, RULES) if x.rule == "PD012"]
    assert x.ms_per_step == pytest.approx(100.0 * (1 - 1 / 1.25))
    assert "Rank 3" in x.title
    f = gpu_facts(ranks__count=8, ranks__imbalance_ratio=1.05, ranks__straggler=3)
    assert "PD012" not in [x.rule for x in judge(f, RULES)]
