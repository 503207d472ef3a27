"""Numbers that add up: the run's breakdown (per-step shares, not per-part medians) and the savings'
per-step ranges (synthetic steps.json / probes.json; no child process)."""

from __future__ import annotations

import json
import math

import pytest

from perfdoctor.facts.model import Facts
from perfdoctor.facts.run import load_run
from perfdoctor.model import Location
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import judge, saving_range
from tests.facts.test_run_facts import make_run

RULES = {r.id: r for r in load_rules()}


def _steps(d, rows):
    (d / "steps.json").write_text(json.dumps({"steps": [
        {"i": i, "end_s": i * 0.02, "wall_ms": w, "data_ms": a, "forward_ms": f, "backward_ms": b,
         "optimizer_ms": o, "mem_bytes": 1 << 28} for i, (w, a, f, b, o) in enumerate(rows, 1)]}))


def test_breakdown_adds_up_when_each_part_is_bimodal(tmp_path):
    # three kinds of 20 ms steps, each spending 18 ms in a different part: every per-part median is 0,
    # so summing medians left 97 % "other"; the shares of each step add up
    kinds = [(20.0, 18.0, 1.0, 0.5, 0.2), (20.0, 0.0, 18.0, 1.0, 0.2), (20.0, 0.0, 1.0, 18.0, 0.2)]
    d = make_run(tmp_path, n=60)
    _steps(d, [(500.0, 0, 0, 0, 0)] + [kinds[i % 3] for i in range(59)])
    r = load_run(d)
    parts = {b.category: b.ms for b in r.summary.breakdown}
    assert r.summary.step_time_ms.median == 20.0
    assert math.isclose(sum(parts.values()), 20.0, rel_tol=1e-6)
    # unmeasured: 0.3 ms of the data steps, 0.8 ms of the others
    assert parts["other"] == pytest.approx(20.0 - (19.7 + 19.2 + 19.2) / 3, abs=0.01)
    for cat in ("data loading", "forward", "backward"):
        assert 6.0 <= parts[cat] <= 7.0  # (18 + 1 + 0.5 or so) / 3 of each step
    assert r.facts.value("step.data_ms") == pytest.approx(parts["data loading"], abs=1e-3)


def test_a_single_slow_step_moves_the_shares_by_one_step_only(tmp_path):
    rows = [(500.0, 0, 0, 0, 0)] + [(10.0, 2.0, 3.0, 4.0, 0.5)] * 59
    rows[40] = (2000.0, 0.0, 3.0, 4.0, 0.5)  # a checkpoint save: 2 s of "other" in one step
    d = make_run(tmp_path, n=60)
    _steps(d, rows)
    parts = {b.category: b.ms for b in load_run(d).summary.breakdown}
    assert parts["data loading"] == pytest.approx(2.0 * (1 - 1 / 48), rel=0.01)  # 48 steady steps
    # 0.5 ms of every step, plus at most the median step / 48 for the slow one (not its 2 s / 48)
    assert parts["other"] == pytest.approx(0.5 + 10.0 / 48 * (1992.5 / 2000), abs=0.03)


def test_step_facts_carry_their_per_step_series(tmp_path):
    d = make_run(tmp_path, n=40, wall=lambda i: 10.0 + (i % 4))
    r = load_run(d)
    st = r.facts.get("step.time_ms")
    assert st is not None and len(st.per_step) == r.summary.step_time_ms.n
    assert sorted(st.per_step)[len(st.per_step) // 2] == pytest.approx(st.value, abs=1.0)
    data = r.facts.get("step.data_ms")
    assert data is not None and set(data.per_step) == {2.0}
    assert "per_step" not in data.as_dict()  # never written out


def _pd002_facts(waits, walls):
    f = Facts()
    f.add("step.time_ms", sorted(walls)[len(walls) // 2], "ms", per_step=tuple(walls))
    f.add("cpu.count", 4, "count", "machine")
    f.add("device.type", "cpu", "", "machine")
    s = f.subject("dataloader", "train.py:10")
    s.add("num_workers", 0, "count")
    s.add("pin_memory", False)
    w = sorted(waits)[len(waits) // 2]
    s.add("wait_ms", w, "ms", per_step=tuple(waits))
    s.add("wait_fraction", w / f.value("step.time_ms"), "ratio",
          per_step=tuple(a / b for a, b in zip(waits, walls)))
    s.locations.append(Location("train.py", 10, "loader = DataLoader(ds)"))
    return f


def test_saving_range_is_p25_to_p75_of_the_per_step_savings():
    waits = [4.0, 6.0, 8.0, 10.0, 12.0, 8.0, 8.0, 8.0]
    walls = [w + 20.0 for w in waits]
    (finding,) = judge(_pd002_facts(waits, walls), [RULES["PD002"]])
    # 4 workers: every step's wait hides behind its compute, so each step saves its whole wait
    assert finding.ms_per_step == pytest.approx(8.0)
    assert finding.saving_range == pytest.approx((7.5, 8.5))
    d = finding.as_dict()["estimated_saving"]
    assert d["range_ms"] == [7.5, 8.5] and d["ms_per_step"] == 8.0


def test_no_range_without_series_or_with_too_few_steps():
    f = _pd002_facts([8.0] * 3, [28.0] * 3)
    (finding,) = judge(f, [RULES["PD002"]])
    assert finding.saving_range is None and "range_ms" not in finding.as_dict()["estimated_saving"]
    assert saving_range("step.time_ms * 2", {"step.time_ms"}, _pd002_facts([1.0] * 2, [5.0] * 2),
                        None, lambda n: 5.0) is None


def test_no_range_from_a_runs_steps_and_its_traces_steps_read_as_one():
    # a run's steady steps and its trace's profiled steps are other steps, even as many of them
    f = _pd002_facts([8.0] * 5, [28.0] * 5)
    f.add("step.gpu_kernel_ms", 3.0, "ms", "trace", per_step=(1.0, 2.0, 3.0, 4.0, 5.0))
    expr, names = "step.time_ms - step.gpu_kernel_ms", {"step.time_ms", "step.gpu_kernel_ms"}
    assert saving_range(expr, names, f, None, lambda n: f.value(n)) is None
    assert saving_range("step.time_ms * 2", {"step.time_ms"}, f, None, lambda n: f.value(n)) == (56.0, 56.0)


def test_text_shows_the_range():
    from rich.console import Console

    from perfdoctor.report.text import _cost

    (finding,) = judge(_pd002_facts([4.0, 6.0, 8.0, 10.0, 12.0, 8.0, 8.0, 8.0], [28.0] * 8), [RULES["PD002"]])
    c = Console(width=200, record=True)
    c.print(_cost(finding))
    assert "saves ~8.0 ms/step (7.5 ms–8.5 ms across steps)" in c.export_text()
    finding.saving_range = (8.01, 8.04)  # prints as "8.0 ms–8.0 ms": no range worth showing
    c = Console(width=200, record=True)
    c.print(_cost(finding))
    text = c.export_text()
    assert "across steps" not in text and "saves ~8.0 ms/step" in text


def test_run_facts_project_the_loading_cost(tmp_path):
    probes = {"dataloaders": [{"id": 0, "site": {"file": str(tmp_path / "train.py"), "line": 3, "code": "",
                                                 "function": "main"},
                               "kwargs": {"num_workers": 0, "batch_size": 8}, "batches": 40,
                               "wait_ms_per_step": [2.0] * 40}]}
    r = load_run(make_run(tmp_path, n=40, wall=lambda i: 50.0, probes=probes))
    (dl,) = r.facts.of_kind("dataloader")
    assert dl.facts["dataloader.load_ms"].value == pytest.approx(2.0)
    assert r.facts.value("step.gpu_compute_ms") == pytest.approx(4.8)
    assert "dataloader.gpu_wait_fraction" not in dl.facts  # PD002 projects it (onto target_gpu.step_ms where traced)
