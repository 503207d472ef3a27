"""The gate on a busy machine (issue 20): verdicts judged on recorded per-step series.

tests/data/contention_gate.json holds real runs of benchmarks/steady_train.py beside other jobs
(tests/data/README.md). Where the training thread waited for a CPU materially, the gate judges the
step time less that wait and the process tree's CPU time per step, each with its own interval; a
wall-time regression that the wait explains is `host-contention` (exit 0, --strict fails)."""

from __future__ import annotations

import json

import pytest

from perfdoctor.gate.baseline import RunRecord, load_baseline, save_baseline
from perfdoctor.gate.compare import compare
from perfdoctor.report import github, markdown
from tests.helpers import TESTS

DATA = json.loads((TESTS / "data" / "contention_gate.json").read_text())
ENV = {"torch": "2.13.0", "device": "cpu", "cpu_count": 2, "script": "steady_train.py", "args": []}


def run(name: str, quiet: bool = False) -> RunRecord:
    d = DATA[name]
    if quiet:  # as a host without neighbours would have timed it: the steps less their wait, no wait
        steps = [w - x for w, x in zip(d["step_ms"], d["wait_ms"])]
        return RunRecord(name, dict(ENV), steps, sorted(steps)[len(steps) // 2], wait_ms=[0.0] * len(steps),
                         cpu_ms=list(d["cpu_ms"]))
    return RunRecord(name, dict(ENV), list(d["step_ms"]), sorted(d["step_ms"])[len(d["step_ms"]) // 2],
                     wait_ms=list(d["wait_ms"]), cpu_ms=list(d["cpu_ms"]), loadavg=list(d["loadavg"]))


def rows(c):
    return {r.kind: r for r in c.rows}


def test_a_quiet_host_is_judged_on_wall_time():
    c = compare([run("quiet-same-2", quiet=True)], [run("sustained-same-2", quiet=True)])
    assert not c.contended and c.rows[0].metric == "step time (p10)" and c.rows[0].kind == "timing"
    assert c.verdict == "passed" and not any(r.kind in ("wall", "cpu") for r in c.rows)


def test_a_slowdown_the_wait_for_a_cpu_explains_is_host_contention():
    # the same script beside two busy processes: the wall time more than doubled, the work did not
    c = compare([run("quiet-same-2")], [run("sustained-same-2")])
    r = rows(c)
    assert c.contended and c.host_contention and c.verdict == "host-contention" and not c.failed
    assert r["wall"].change_pct > 100 and r["wall"].verdict == "host-contention"
    assert r["timing"].verdict == "no-change" and r["cpu"].verdict == "no-change"
    assert c.settled  # more runs would not decide it: the evidence did
    assert any(n.startswith("host contention: not decided") for n in c.notes)
    assert "waited for a CPU" in c.notes[0] and "load average" in c.notes[0]
    strict = compare([run("quiet-same-2")], [run("sustained-same-2")], strict=True)
    assert strict.failed and strict.verdict == "failed"
    doc = c.as_dict()
    assert doc["verdict"] == "host-contention"
    assert "host contention" in markdown.render_comparison(c)
    assert "::warning title=perfdoctor gate%3A host contention (not passed)::host contention: not decided" in (
        github.render_comparison(c))


def test_more_work_under_load_fails_as_a_regression():
    c = compare([run("bursty-same-1")], [run("bursty-work-1")])
    r = rows(c)
    assert c.failed and c.verdict == "failed" and not c.host_contention
    # the process tree's CPU time grew 17 % (its interval clear of 10 %): more work, whatever the load
    assert r["cpu"].verdict == "regression" and r["timing"].change_pct > 10


def test_more_sleep_under_load_fails_though_the_cpu_time_did_not_grow():
    c = compare([run("sustained-same-1")], [run("sustained-sleep-1")])
    r = rows(c)
    assert c.failed and r["timing"].verdict == "regression" and r["timing"].change_pct > 100
    assert r["cpu"].verdict == "no-change"  # sleeping is no work: only the step less its wait shows it


def test_a_wall_regression_is_not_judged_on_its_own_under_contention():
    # the wall time's own interval would fail the gate (sustained beside the other jobs' load), but
    # the wall row is shown, not judged: the corrected rows decide
    c = compare([run("quiet-same-2")], [run("sustained-same-1")])
    assert rows(c)["wall"].ci_pct[0] > 10 and not c.failed


def test_a_baseline_keeps_the_contention_series_and_old_ones_still_read(tmp_path):
    base = [run("quiet-same-2")]
    save_baseline(base, tmp_path / "b.json")
    back = load_baseline(tmp_path / "b.json").records[0]
    assert back.wait_ms == pytest.approx(base[0].wait_ms)
    assert back.loadavg == base[0].loadavg and back.cpu_ms == pytest.approx(base[0].cpu_ms)
    # a baseline written before issue 20 has no wait: the wall time decides, as it did
    doc = json.loads((tmp_path / "b.json").read_text())
    for k in ("wait_ms", "cpu_ms", "loadavg"):
        del doc["runs"][0][k]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = load_baseline(tmp_path / "old.json")
    assert old.records[0].wait_ms == [] and not compare(old, [run("sustained-same-2")]).contended
