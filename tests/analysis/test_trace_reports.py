"""`perfdoctor report` on real traces from other projects: the findings an engineer would sign."""


import pytest

from perfdoctor.analysis import analyse_path, analyse_trace
from perfdoctor.errors import InputError
from perfdoctor.report import jsonfmt
from perfdoctor.rules.catalog import load_rules
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
    data = next(b for b in r.summary.breakdown if b.category == "data loading")
    # the saving is the measured wait: with no CPU count in a trace, 8 workers hide all of it
    wait = next(e for e in top.evidence if e.name == "dataloader.wait_ms")
    assert wait.source == "trace" and top.ms_per_step == pytest.approx(wait.value)
    assert 0.3 <= data.fraction <= 0.45 and 0.3 <= top.fraction_of_step <= 0.45
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
    assert len(r.ranks) == 8 and r.summary.rank == r.facts["ranks.straggler"].value
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
    assert [(row.rank, row.file) for row in r.ranks] == [(0, "a.json.gz"), (1, "b.json.gz"), (2, "c.json.gz")]


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
