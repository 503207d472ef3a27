"""PD005 (rules/PD005-empty-cache.toml), judged on hand-built facts: a call once per epoch is not flagged.

Its sample: sample_scripts/pd005_empty_cache.py (end to end: tests/analysis/test_e2e_samples.py; the fixed twin: tests/rules/test_fixes_applied.py);
its goldens: tests/golden/expected/pd005_empty_cache.* (tests/report/test_golden.py)."""

from __future__ import annotations

import pytest

from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run, gpu_facts


def test_pd005_once_per_epoch_is_not_flagged():
    f = cpu_run()
    f.subject("empty_cache", "t.py:9").add("calls_per_step", 0.01, "count", "run")
    assert judge(f, RULES) == []


def test_pd005_on_a_gpu_costs_what_the_trace_measured_of_its_calls():
    # a call that releases blocks (a sync and cudaFree each) and the cudaMalloc that follows: 8 % of a
    # 100 ms step; the H200 sample's call freed nothing (0.2 %): found, but minor
    for share, ms, severity in [(0.08, 8.0, "medium"), (0.0019, 0.19, "low")]:
        f = gpu_facts()
        s = f.subject("empty_cache", "t.py:9")
        s.add("calls_per_step", 1.0, "count", "run")
        s.add("cost_share", share, "ratio", "trace")
        [x] = judge(f, RULES)
        assert x.rule == "PD005" and x.ms_per_step == pytest.approx(ms) and x.severity == severity
