"""PD005 (rules/PD005-empty-cache.toml), judged on hand-built facts: a call once per epoch is not flagged.

Its sample: sample_scripts/pd005_empty_cache.py (end to end: tests/analysis/test_e2e_samples.py; the fixed twin: tests/rules/test_fixes_applied.py);
its goldens: tests/golden/expected/pd005_empty_cache.* (tests/report/test_golden.py)."""

from __future__ import annotations

from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run


def test_pd005_once_per_epoch_is_not_flagged():
    f = cpu_run()
    f.subject("empty_cache", "t.py:9").add("calls_per_step", 0.01, "count", "run")
    assert judge(f, RULES) == []
