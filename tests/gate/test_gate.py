"""The CI gate: run records, baseline files, verdicts on synthetic step series."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.contracts.baseline import BASELINE_SCHEMA, GateFinding
from perfdoctor.contracts.report import read_report
from perfdoctor.errors import InputError
from perfdoctor.gate import (
    RunRecord,
    compare,
    compare_files,
    load_baseline,
    noise_floor,
    record_from_run_dir,
    save_baseline,
    stats,
    warmup_steps,
)
from perfdoctor.gate.baseline import interfered_runs
from tests.helpers import REPO, TESTS

ENV = {"python": "3.11.7", "torch": "2.13.0", "platform": "Linux", "cpu_count": 2, "cpu_model": "Xeon",
       "device": "cpu", "device_name": "cpu", "device_count": 0}


def ar1(n: int, mean: float, rel_sd: float, phi: float, rng: random.Random, run_sd: float = 0.0) -> list[float]:
    """Autocorrelated step times: log-normal AR(1) noise around mean, plus a per-run offset."""
    offset = rng.gauss(0, run_sd)
    e, out = 0.0, []
    innov = rel_sd * math.sqrt(1 - phi * phi)
    for _ in range(n):
        e = phi * e + rng.gauss(0, innov)
        out.append(mean * math.exp(offset + e))
    return out


def rec(series: list[float], env: dict | None = None, findings=None, counters=None, source="run") -> RunRecord:
    import statistics
    return RunRecord(source=source, env=dict(env or ENV, script="train.py", script_sha256="ab", args=["--lr", "0.1"]),
                     step_ms=series, median_ms=statistics.median(series), counters=dict(counters or {}),
                     findings=list(findings or []), peak_memory_bytes=500 * 2**20)


def runs(n_runs, n_steps, mean, rng, rel_sd=0.03, phi=0.5, run_sd=0.01, **kw):
    return [rec(ar1(n_steps, mean, rel_sd, phi, rng, run_sd), **kw) for _ in range(n_runs)]


def write_run(folder: Path, wall_ms: list[float], window=(3, 6), findings=(), facts=None, script="train.py") -> Path:
    folder.mkdir(parents=True)
    (folder / script).write_text("print('hi')\n")
    meta = {"schema": "perfdoctor/run/v1", "script": str(folder / script), "module": None,
            "argv": [script, "--lr", "0.1"], "exit": {"code": 0, "reason": "steps-reached", "traceback": None},
            "window": {"skip": 2, "warmup": 1, "active": 3, "first_step": window[0], "last_step": window[1], "completed": True},
            "env": ENV}
    steps = [{"i": i + 1, "end_s": i * 0.1, "wall_ms": w, "mem_bytes": 1000 + i} for i, w in enumerate(wall_ms)]
    report = {"schema": "perfdoctor/report/v1", "run": {"script": str(folder / script)},
              "summary": {"step_time_ms": {"median": 10.0}}, "findings": list(findings),
              "facts": {k: {"fact": k, "value": v, "unit": "count", "source": "trace", "detail": ""}
                        for k, v in (facts or {}).items()}}
    for name, obj in (("meta.json", meta), ("steps.json", {"steps": steps}), ("report.json", report)):
        (folder / name).write_text(json.dumps(obj))
    return folder


def test_steady_state_drops_warmup_and_profiler_window(tmp_path):
    wall = [100.0, 90.0, 50, 50, 50, 50, 50] + [10.0 + 0.01 * i for i in range(33)]  # 40 steps
    d = write_run(tmp_path / "r", wall, window=(3, 6), facts={"sync.count_per_step": 2, "memory.peak_bytes": 7},
                  findings=[{"rule": "PD002", "severity": "high", "title": "t", "fingerprint": "PD002:x",
                             "locations": [{"file": "/a/train.py", "line": 3, "code": "x"}]}])
    r = record_from_run_dir(d)
    assert warmup_steps(40) == 4 and r.warmup_dropped == 4
    # steps 1-4 warm-up, 3-7 window (+1 guard step): the first kept step is step 8
    assert len(r.step_ms) == 33 and r.step_ms[0] == 10.0
    assert r.median_ms == pytest.approx(10.16)
    assert r.steps_per_s == pytest.approx(1000 / 10.16)
    assert r.counters == {"sync.count_per_step": 2.0}
    assert r.peak_memory_bytes == 7
    assert r.findings[0].fingerprint == "PD002:train.py:x" and r.findings[0].severity == "high"
    assert r.env["script"] == "train.py" and r.env["args"] == ["--lr", "0.1"] and len(r.env["script_sha256"]) == 64
    assert r.env["torch"] == "2.13.0" and r.env["cpu_count"] == 2


def test_block_length_grows_with_autocorrelation():
    rng = random.Random(1)
    iid = ar1(400, 10, 0.05, 0.0, rng)
    sticky = ar1(400, 10, 0.05, 0.9, rng)
    assert stats.block_length(iid) <= 8
    assert stats.block_length(sticky) > 2 * stats.block_length(iid)


def test_block_bootstrap_sees_autocorrelated_noise():
    """An i.i.d. bootstrap (block 1) understates the error of a quantile of a correlated series."""
    rng = random.Random(2)
    x = ar1(300, 10, 0.05, 0.9, rng)
    blocked = stats.block_bootstrap(x, 500, random.Random(0), q=0.10)
    iid = stats.block_bootstrap(x, 500, random.Random(0), q=0.10, block=1)
    sd = lambda v: (sum((a - sum(v) / len(v)) ** 2 for a in v) / len(v)) ** 0.5  # noqa: E731
    assert sd(blocked) > 1.8 * sd(iid)


@pytest.mark.slow
def test_identical_runs_give_no_change_across_seeds():
    verdicts = []
    for seed in range(12):
        rng = random.Random(seed)
        base, cur = runs(3, 80, 20.0, rng), runs(1, 80, 20.0, rng)
        c = compare(base, cur, seed=seed)
        verdicts.append(c.rows[0].verdict)
        assert not c.failed
    assert verdicts.count("no-change") >= 10 and "regression" not in verdicts, verdicts


@pytest.mark.slow
def test_fifteen_percent_slower_is_a_regression():
    hits = 0
    for seed in range(6):
        rng = random.Random(100 + seed)
        c = compare(runs(3, 80, 20.0, rng), runs(1, 80, 23.0, rng), max_regression=0.10, seed=seed)
        row = c.rows[0]
        assert row.metric.startswith("step time") and row.change_pct == pytest.approx(15, abs=4)
        hits += row.verdict == "regression" and c.failed
    assert hits >= 5


def contended(series: list[float], rate: float, rng: random.Random) -> list[float]:
    """Bursts of contention from other processes: 8 consecutive steps each slowed 1.3-3x
    (contention only ever adds time), a burst starting at a free step with probability rate/8."""
    out, i = list(series), 0
    while i < len(out):
        if rng.random() < rate / 8:
            for j in range(i, min(len(out), i + 8)):
                out[j] *= rng.uniform(1.3, 3.0)
            i += 8
        else:
            i += 1
    return out


@pytest.mark.slow
def test_contention_bursts_do_not_fail_the_gate_but_a_real_slowdown_does():
    """Other jobs slowing about 40% of the steps move the mean by more than the threshold and make
    the median unjudgeable; the gate judges the fast steps, which they leave alone. A slowdown of
    every step still fails it."""
    import statistics
    for seed in range(6):
        rng = random.Random(500 + seed)
        base = runs(3, 150, 20.0, rng, rel_sd=0.02, phi=0.3, run_sd=0.01)
        noisy = [rec(contended(ar1(150, 20.0, 0.02, 0.3, rng, 0.01), 0.6, rng)) for _ in range(3)]
        slow = [rec(contended(ar1(150, 23.0, 0.02, 0.3, rng, 0.01), 0.6, rng)) for _ in range(3)]
        mean_change = statistics.fmean(v for r in noisy for v in r.step_ms) / statistics.fmean(v for r in base for v in r.step_ms)
        assert mean_change > 1.15  # what a gate on the mean would have called a regression
        c = compare(base, noisy, seed=seed)
        assert not c.failed and c.rows[0].verdict == "no-change", c.rows[0]
        c = compare(base, slow, seed=seed)
        assert c.failed and c.rows[0].verdict == "regression", c.rows[0]


def test_faster_is_an_improvement_and_never_fails():
    rng = random.Random(7)
    c = compare(runs(3, 80, 20.0, rng), runs(2, 80, 15.0, rng))
    assert c.rows[0].verdict == "improvement" and not c.failed
    assert c.rows[1].metric == "throughput" and c.rows[1].change_pct > 20


@pytest.mark.slow
def test_noisy_runs_are_unstable_not_failures():
    """Identical code on a very noisy machine: the gate says it cannot judge, and never fails."""
    verdicts = []
    for seed in range(8):
        rng = random.Random(300 + seed)
        base = runs(3, 60, 20.0, rng, rel_sd=0.25, phi=0.8, run_sd=0.15)
        cur = runs(2, 60, 20.0, rng, rel_sd=0.25, phi=0.8, run_sd=0.15)
        c = compare(base, cur, seed=seed)
        verdicts.append(c.rows[0].verdict)
        assert not c.failed
        if c.rows[0].verdict == "unstable":
            assert any("too noisy" in n for n in c.notes)
    assert verdicts.count("unstable") >= 6, verdicts


def test_inconclusive_when_point_crosses_but_interval_does_not():
    rng = random.Random(5)
    hits = 0
    for seed in range(4):
        base = runs(3, 60, 20.0, rng, rel_sd=0.04, phi=0.6, run_sd=0.025)
        cur = runs(1, 60, 22.6, rng, rel_sd=0.04, phi=0.6, run_sd=0.025)
        c = compare(base, cur, seed=seed)
        r = c.rows[0]
        if r.change_pct > 10 and r.ci_pct[0] < 10 and r.verdict == "inconclusive":
            hits += 1
        assert r.verdict != "regression" or r.ci_pct[0] > 10
    assert hits >= 1


def test_different_environment_is_not_comparable_and_passes():
    rng = random.Random(4)
    base = runs(2, 50, 20.0, rng)
    cur = runs(1, 50, 40.0, rng, env=dict(ENV, torch="2.12.0"))
    c = compare(base, cur)
    assert not c.comparable and not c.failed and c.verdict == "not-comparable"
    assert all(r.verdict == "not-comparable" for r in c.rows)
    assert c.env_differences == [{"key": "torch", "baseline": "2.13.0", "current": "2.12.0"}]
    assert c.notes[0].startswith("NOT COMPARABLE")


def test_changed_script_content_is_noted_not_blocking():
    rng = random.Random(6)
    base = runs(2, 50, 20.0, rng)
    cur = runs(1, 50, 20.0, rng)
    cur[0].env["script_sha256"] = "cd"
    c = compare(base, cur)
    assert c.comparable and any("script changed" in n for n in c.notes)


def test_new_findings_fail_at_or_above_fail_on():
    rng = random.Random(8)
    old = GateFinding(rule="PD002", fingerprint="PD002:train.py:DataLoader(ds)", severity="high", title="workers")
    new_med = GateFinding(rule="PD005", fingerprint="PD005:train.py:empty_cache()", severity="medium", title="cache",
                          file="/w/train.py", line=9)
    base = runs(2, 50, 20.0, rng, findings=[old])
    cur = runs(1, 50, 20.0, rng, findings=[old, new_med])
    assert [f.rule for f in compare(base, cur).new_findings] == ["PD005"]
    assert not compare(base, cur).failed  # no --fail-on: reported, not failing
    assert not compare(base, cur, fail_on="high").failed
    c = compare(base, cur, fail_on="medium")
    assert c.failed and [f.rule for f in c.failing_findings] == ["PD005"]
    assert compare(base, cur, fail_on="low").failed
    fixed = compare(base, runs(1, 50, 20.0, rng), fail_on="low")
    assert not fixed.failed and [f.rule for f in fixed.resolved_findings] == ["PD002"]


def test_counters_are_compared_tightly():
    rng = random.Random(9)
    base = runs(2, 50, 20.0, rng, counters={"sync.count_per_step": 0, "ops.calls_per_step": 400})
    same = compare(base, runs(1, 50, 20.0, rng, counters={"sync.count_per_step": 0, "ops.calls_per_step": 404}))
    rows = {r.metric: r for r in same.rows}
    assert rows["sync.count_per_step"].verdict == "no-change" and rows["ops.calls_per_step"].verdict == "no-change"
    worse = compare(base, runs(1, 50, 20.0, rng, counters={"sync.count_per_step": 2, "ops.calls_per_step": 400}))
    assert {r.metric: r for r in worse.rows}["sync.count_per_step"].verdict == "regression" and worse.failed


def test_compare_is_deterministic():
    rng = random.Random(10)
    base, cur = runs(3, 60, 20.0, rng), runs(1, 60, 21.0, rng)
    a, b = compare(base, cur, seed=3).as_dict(), compare(base, cur, seed=3).as_dict()
    assert a == b and a["rows"][0]["ci_pct"] is not None


def test_noise_floor_measures_both_parts():
    rng = random.Random(11)
    quiet = noise_floor(runs(4, 100, 20.0, rng, rel_sd=0.02, phi=0.5, run_sd=0.0))
    loud = noise_floor(runs(4, 100, 20.0, rng, rel_sd=0.02, phi=0.5, run_sd=0.10))
    assert quiet.within_run_rel_se < 0.02 and loud.between_run_rel_sd > 0.04
    assert loud.single_run_halfwidth > quiet.single_run_halfwidth
    one = noise_floor(runs(1, 100, 20.0, rng))
    assert one.between_run_rel_sd is None and one.within_run_rel_se is not None


def test_baseline_round_trip_and_readable_diff(tmp_path):
    rng = random.Random(12)
    records = runs(3, 40, 20.0, rng, counters={"sync.count_per_step": 1},
                   findings=[GateFinding(rule="PD002", fingerprint="PD002:a", severity="high", title="t")])
    path = tmp_path / "base.json"
    save_baseline(records, path)
    text = path.read_text()
    data = json.loads(text)
    assert data["schema"] == BASELINE_SCHEMA
    assert text == json.dumps(data, sort_keys=True, indent=2) + "\n"  # sorted keys, indent 2
    assert len(data["noise"]["run_values_ms"]) == 3 and data["noise"]["statistic"].startswith("p10") and data["noise"]["between_run_rel_sd"] is not None
    assert data["summary"]["counters"] == {"sync.count_per_step": 1.0}
    # one number per line in the step series
    assert any(line.strip().rstrip(",").replace(".", "", 1).isdigit() for line in text.splitlines())
    loaded = load_baseline(path)
    assert len(loaded.records) == 3
    for a, b in zip(records, loaded.records):
        assert b.step_ms == pytest.approx(a.step_ms, abs=1e-4) and b.env == a.env and b.findings == a.findings
    assert not compare(loaded, records[:1]).failed


def test_load_baseline_rejects_other_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"schema": "something/else"}')
    with pytest.raises(InputError):
        load_baseline(p)
    with pytest.raises(InputError):
        compare_files(tmp_path / "missing.json", p)


def test_compare_files_with_baseline_run_folder_and_bare_report(tmp_path):
    rng = random.Random(13)
    base_path = tmp_path / "base.json"
    save_baseline([record_from_run_dir(write_run(tmp_path / f"b{i}", ar1(60, 10.0, 0.02, 0.3, rng))) for i in range(3)], base_path)
    slow = write_run(tmp_path / "slow", ar1(60, 13.0, 0.02, 0.3, rng))
    c = compare_files(base_path, slow / "report.json")  # a report.json inside a run folder: the whole run
    assert c.rows[0].verdict == "regression" and c.failed
    c2 = compare_files(base_path, slow)
    assert c2.as_dict()["rows"][0]["verdict"] == "regression"
    bare = tmp_path / "bare" / "report.json"
    bare.parent.mkdir()
    bare.write_text(json.dumps({"schema": "perfdoctor/report/v1", "run": {"script": "/x/train.py"},
                                "summary": {"step_time_ms": {"median": 10.1}}, "findings": []}))
    c3 = compare_files(base_path, bare)
    assert c3.rows[0].ci_pct is None and c3.rows[0].verdict == "no-change" and not c3.failed
    assert any("no confidence interval" in n for n in c3.notes)
    d = c3.as_dict()
    assert d["schema"] == "perfdoctor/compare/v1" and d["verdict"] == "passed"


def test_gate_imports_neither_torch_nor_numpy():
    code = ("import sys, perfdoctor.gate, perfdoctor.report.sarif, perfdoctor.report.github, perfdoctor.report.markdown;"
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout.split()
    assert out == ["False", "False"]


def test_slow_outlier_runs_are_named():
    rng = random.Random(8)
    base = runs(4, 100, 20.0, rng, rel_sd=0.02, phi=0.3, run_sd=0.005)
    assert interfered_runs(base, 0.10) == []
    base.insert(1, rec([v * 1.2 for v in ar1(100, 20.0, 0.02, 0.3, rng, 0.005)]))
    (hit,) = interfered_runs(base, 0.10)
    assert hit[0] == 1 and 0.15 < hit[1] < 0.25
    assert interfered_runs(base[:3], 0.10) == []  # two others cannot say how far runs spread


def test_every_golden_report_json_reads_back_through_its_contract():
    """The writer and the reader are the same types (contracts/report.py): every golden report.json
    decodes strictly (no field the contract does not declare) and encodes back to the same document,
    every key in its place; a field the contract does not know is refused, where it is written and
    where it is read."""
    import msgspec

    from perfdoctor.contracts.report import ReportDoc, RunInfoDoc, StepTimeDoc, SummaryDoc
    from perfdoctor.model import Report, to_doc

    golden = sorted((TESTS / "golden" / "expected").glob("*.json"))
    assert len(golden) >= 18
    for path in golden:
        doc = read_report(path)
        raw = json.loads(path.read_text())
        assert doc.schema == "perfdoctor/report/v1" and doc.summary.step_time_ms is not None, path.name
        assert json.dumps(msgspec.to_builtins(doc)) == json.dumps(raw), path.name  # same keys, same order
        assert [f.identity() for f in doc.findings] == [f["fingerprint"] for f in raw["findings"]]
        for where in (raw["run"], raw["summary"], raw["findings"][0] if raw["findings"] else raw):
            where["surprise"] = 1
            with pytest.raises(msgspec.ValidationError, match="surprise"):
                msgspec.convert(raw, ReportDoc)
            del where["surprise"]
    # the writer goes through the contract: a value outside its bounds is refused, not written
    with pytest.raises(msgspec.ValidationError, match=r"summary.step_time_ms.median"):
        to_doc(Report(run=RunInfoDoc(), summary=SummaryDoc(step_time_ms=StepTimeDoc(median=0.0)), findings=[]))


def test_invalid_baseline_or_report_is_one_input_error_naming_file_and_field(tmp_path):
    rng = random.Random(14)
    good = tmp_path / "base.json"
    save_baseline(runs(2, 40, 20.0, rng), good)
    data = json.loads(good.read_text())
    data["runs"][1]["step_ms"][3] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        load_baseline(bad)
    assert str(bad) in e.value.message and "$.runs[1].step_ms[3]" in e.value.message and "\n" not in e.value.message
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"schema": "perfdoctor/report/v1", "summary": {"step_time_ms": {"median": "slow"}},
                                  "findings": []}))
    with pytest.raises(InputError) as e:
        compare_files(good, report)
    assert str(report) in e.value.message and "$.summary.step_time_ms.median" in e.value.message


# -- a busy machine: undecided verdicts, the decision rules, adaptive repeats ---------------------------------

SPREAD = (-0.15, 0.0, 0.15)  # run-to-run offsets of a machine shared with other jobs: no run can be trusted alone


def steady(ms: float, n: int = 60, **kw) -> RunRecord:
    """A run whose steps are all about `ms` (a tiny deterministic ripple): its own noise is nil, so
    the interval is set by the run-to-run offsets the test chooses."""
    return rec([ms * (1 + 0.002 * ((i * 7) % 5)) for i in range(n)], **kw)


def side(center: float, offsets=SPREAD, **kw) -> list[RunRecord]:
    return [steady(center * (1 + o), **kw) for o in offsets]


def test_an_undecided_gate_is_undecided_never_passed():
    from perfdoctor.report import github, markdown
    c = compare(side(20.0), side(23.0))  # +15%: beyond the threshold, but the runs scatter by +-15%
    row = c.rows[0]
    assert row.verdict == "unstable" and row.basis is None and row.ci_pct[0] < 10 < row.ci_pct[1]
    assert c.undecided and not c.failed and c.verdict == "undecided" and not c.settled
    assert c.as_dict()["verdict"] == "undecided" and c.as_dict()["undecided"] is True
    md = markdown.render_comparison(c)
    assert "passed" not in md.replace("not passed", "")
    assert "❔ perfdoctor gate: undecided (not passed)" in md
    assert "The step time changed +15.0% (90% CI" in md and "--max-repeats" in md and "--strict" in md
    gh = github.render_comparison(c)
    assert "::warning title=perfdoctor gate%3A undecided (not passed)::Undecided, not passed: The step time changed +15.0%25" in gh
    assert "::error" not in gh


def test_an_undecided_point_beyond_twice_the_threshold_fails():
    from perfdoctor.report import github, markdown
    c = compare(side(20.0), side(27.0))  # +35%, interval still straddling the 10% threshold
    row = c.rows[0]
    assert row.ci_pct[0] < 10 and row.change_pct == pytest.approx(35, abs=0.5)
    assert row.verdict == "regression" and row.basis == "point-estimate" and c.rows[1].verdict == "regression"
    assert c.failed and c.verdict == "failed" and c.undecided and not c.settled  # more runs may still settle it
    assert any("beyond 2x the threshold" in n for n in c.notes)
    assert "❌ regression (point estimate)" in markdown.render_comparison(c)
    gh = github.render_comparison(c)
    assert "regressed +35.0%25 by its point estimate, beyond twice the threshold" in gh
    assert gh.rstrip().splitlines()[-1].startswith("::error::perfdoctor gate failed: step time (p10) +35.0%25 (point estimate")
    # just under twice the threshold: undecided, not failed; a different threshold moves the line
    assert not compare(side(20.0), side(23.8)).failed
    assert compare(side(20.0), side(23.8), max_regression=0.08).failed


def test_strict_fails_anything_undecided_and_nothing_decided():
    from perfdoctor.report import github
    same = side(20.0)
    c = compare(side(20.0), same, strict=True)  # identical, but too noisy to tell
    assert c.rows[0].verdict == "unstable" and c.failed and c.verdict == "failed" and c.strict
    assert any("--strict" in n for n in c.notes)
    assert github.render_comparison(c).rstrip().endswith("::error::perfdoctor gate failed: the step time is undecided (--strict)")
    quiet = side(20.0, (-0.01, 0.0, 0.01))
    decided = compare(quiet, side(20.0, (-0.01, 0.0, 0.01)), strict=True)
    assert decided.rows[0].verdict == "no-change" and not decided.failed and decided.verdict == "passed"


def test_a_summary_only_side_is_decided_by_its_point_or_left_undecided():
    base = side(20.0, (-0.01, 0.0, 0.01))

    def summary(ms: float) -> RunRecord:
        r = steady(ms)
        r.step_ms = []
        return r

    assert compare(base, [summary(20.5)]).verdict == "passed"
    mid = compare(base, [summary(23.0)])
    assert mid.rows[0].verdict == "inconclusive" and mid.verdict == "undecided" and not mid.failed
    assert compare(base, [summary(23.0)], strict=True).failed
    big = compare(base, [summary(25.0)])
    assert big.failed and big.rows[0].basis == "point-estimate"


def test_a_different_environment_is_never_undecided_nor_failed_by_its_point():
    c = compare(side(20.0), side(40.0, env=dict(ENV, torch="2.12.0")), strict=True)
    assert c.verdict == "not-comparable" and not c.failed and not c.undecided and c.settled


class Feed:
    """A current side for gate_runs: the n-th run's record from `make(n)`, calls counted."""

    def __init__(self, make):
        self.make, self.calls = make, []

    def __call__(self, n: int):
        self.calls.append(n)
        return self.make(n)


def test_adaptive_repeats_stop_at_once_when_the_first_runs_decide():
    from perfdoctor.gate.adaptive import gate_runs
    quiet = side(20.0, (-0.01, 0.0, 0.01))
    feed = Feed(lambda n: steady(20.0))
    g = gate_runs(quiet, feed, repeats=3, max_repeats=8)
    assert feed.calls == [1, 2, 3] and g.added == 0 and g.comparison.verdict == "passed"
    feed = Feed(lambda n: steady(26.0))
    g = gate_runs(quiet, feed, repeats=3, max_repeats=8)
    assert feed.calls == [1, 2, 3] and g.comparison.rows[0].basis == "interval" and g.comparison.failed


def test_adaptive_repeats_add_current_runs_until_the_verdict_settles():
    from perfdoctor.gate.adaptive import gate_runs
    quiet = side(20.0, (-0.01, 0.0, 0.01))
    first = (0.12, -0.08, 0.0)  # the first three runs scatter (a neighbour came and went), then it is quiet
    feed = Feed(lambda n: steady(20.0 * (1 + (first[n - 1] if n <= 3 else 0.0))))
    g = gate_runs(quiet, feed, repeats=3, max_repeats=8)
    assert compare(quiet, [feed.make(n) for n in (1, 2, 3)]).rows[0].verdict == "unstable"
    assert 3 < len(feed.calls) < 8 and feed.calls == list(range(1, len(feed.calls) + 1))
    c = g.comparison
    assert c.rows[0].verdict == "no-change" and c.verdict == "passed" and c.current_runs == len(feed.calls)
    assert g.added == len(feed.calls) - 3 and len(g.records) == len(feed.calls)
    assert any(f"added {g.added} run(s) of the current side" in n and "baseline's runs are fixed" in n for n in c.notes)


@pytest.mark.slow
def test_adaptive_repeats_stop_at_max_repeats_and_say_it_is_undecided():
    from perfdoctor.gate.adaptive import gate_runs
    offsets = (-0.15, 0.0, 0.15, -0.15, 0.15, 0.0)
    feed = Feed(lambda n: steady(23.0 * (1 + offsets[n - 1])))  # +15% on a machine that never calms down
    g = gate_runs(side(20.0), feed, repeats=3, max_repeats=5)
    assert feed.calls == [1, 2, 3, 4, 5] and g.comparison.verdict == "undecided" and not g.comparison.failed
    assert any(n.startswith("still undecided after 5 run(s) (--max-repeats 5): the step time changed +") for n in g.comparison.notes)
    strict = gate_runs(side(20.0), Feed(lambda n: steady(23.0 * (1 + offsets[n - 1]))), repeats=3, max_repeats=5, strict=True)
    assert strict.comparison.failed and strict.comparison.current_runs == 5
    # a large slowdown: undecided by its interval after 3 runs, it fails on its point estimate when no
    # more runs are allowed, and more runs settle it by the interval
    big = Feed(lambda n: steady(28.0 * (1 + offsets[n - 1])))
    g = gate_runs(side(20.0), big, repeats=3, max_repeats=3)
    assert big.calls == [1, 2, 3] and g.comparison.failed and g.comparison.rows[0].basis == "point-estimate"
    assert any(n.startswith("still undecided after 3 run(s)") for n in g.comparison.notes)
    big = Feed(lambda n: steady(28.0 * (1 + offsets[n - 1])))
    g = gate_runs(side(20.0), big, repeats=3, max_repeats=6)
    assert 3 < len(big.calls) <= 6 and g.comparison.failed and g.comparison.rows[0].basis == "interval"
    assert g.comparison.settled and not any(n.startswith("still undecided") for n in g.comparison.notes)


def test_adaptive_repeats_never_fewer_than_repeats_and_stop_on_a_failed_run():
    from perfdoctor.gate.adaptive import gate_runs
    feed = Feed(lambda n: steady(20.0))
    g = gate_runs(side(20.0, (-0.01, 0.0, 0.01)), feed, repeats=4, max_repeats=2)
    assert feed.calls == [1, 2, 3, 4] and g.comparison is not None
    feed = Feed(lambda n: None if n == 2 else steady(20.0))  # the script failed in its second run
    g = gate_runs(side(20.0), feed, repeats=3, max_repeats=8)
    assert feed.calls == [1, 2] and g.comparison is None and len(g.records) == 1
    feed = Feed(lambda n: None if n == 4 else steady(23.0 * (1 + SPREAD[(n - 1) % 3])))  # fails in an added run
    g = gate_runs(side(20.0), feed, repeats=3, max_repeats=8)
    assert feed.calls == [1, 2, 3, 4] and g.comparison is None


def test_adaptive_repeats_stop_when_a_finding_already_fails_the_gate():
    from perfdoctor.gate.adaptive import gate_runs
    new = GateFinding(rule="PD005", fingerprint="PD005:train.py:empty_cache()", severity="high", title="cache")
    feed = Feed(lambda n: steady(23.0 * (1 + SPREAD[n - 1]), findings=[new]))
    g = gate_runs(side(20.0), feed, repeats=3, max_repeats=8, fail_on="high")
    assert feed.calls == [1, 2, 3] and g.comparison.failed and g.comparison.failed_beyond_timing
    assert g.comparison.rows[0].verdict == "unstable"  # undecided, but more runs cannot pass it


def test_repeat_folders_are_found_in_run_order_and_compared_as_one_side(tmp_path):
    from perfdoctor.gate.baseline import repeat_dirs
    rng = random.Random(15)
    out = tmp_path / "gate-out"
    for n in (1, 2, 9, 10):
        write_run(out / f"repeat-{n}", ar1(60, 13.0, 0.02, 0.3, rng))
    (out / "repeat-x").mkdir()
    (out / "repeat-3").mkdir()  # no meta.json: not a run folder
    assert [d.name for d in repeat_dirs(out)] == ["repeat-1", "repeat-2", "repeat-9", "repeat-10"]
    assert repeat_dirs(tmp_path / "nowhere") == [] and repeat_dirs(out / "repeat-1") == []
    base_path = tmp_path / "base.json"
    save_baseline([record_from_run_dir(write_run(tmp_path / f"b{i}", ar1(60, 10.0, 0.02, 0.3, rng))) for i in range(3)], base_path)
    c = compare_files(base_path, out)
    assert c.current_runs == 4 and c.rows[0].verdict == "regression" and c.failed
    with pytest.raises(InputError, match="no repeat-N run folders"):
        compare_files(base_path, tmp_path / "b0" / "..")


def test_report_of_a_gate_out_dir_is_its_last_run_with_every_run_noted(tmp_path):
    import shutil
    sys.path.insert(0, str(TESTS / "golden"))
    import record as golden

    from perfdoctor.analysis import analyse_path, analyse_run
    out = tmp_path / "perf-run"
    for n in (1, 2, 3):
        run = out / f"repeat-{n}"
        shutil.copytree(golden.RUNS / "clean", run)
        for f in run.iterdir():
            golden._swap_text(f, [(golden.REPO_MARK, str(golden.REPO)), (golden.RUN_MARK, str(run))])
    steps = json.loads((out / "repeat-2" / "steps.json").read_text())
    for s in steps["steps"]:
        s["wall_ms"] *= 3  # the second run was slow: the note shows it
    (out / "repeat-2" / "steps.json").write_text(json.dumps(steps))
    report = analyse_path(out)
    last = analyse_run(out / "repeat-3")
    assert report.summary == last.summary and [f.rule for f in report.findings] == [f.rule for f in last.findings]
    note = report.notes[0]
    assert note.startswith(f"{out} holds 3 runs of one `perfdoctor run` (repeat-1..repeat-3); this is the report of the last, repeat-3")
    med = {m.split(" ")[0]: float(m.split(" ")[1].replace(",", "")) for m in note.split("per run: ")[1].split(". ")[0].split(", ")}
    assert list(med) == ["repeat-1", "repeat-2", "repeat-3"] and med["repeat-2"] == pytest.approx(3 * med["repeat-1"], rel=0.01)
    assert f"perfdoctor compare BASELINE {out}" in note
