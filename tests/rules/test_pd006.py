"""PD006 (rules/PD006-loss-graph-retained.toml), judged on hand-built facts: the run's evidence decides over the source.

Its samples: sample_scripts/pd006_loss_graph_retained.py, sample_scripts/pd006_running_sum.py (end to end: tests/analysis/test_e2e_samples.py; the fixed twin: tests/rules/test_fixes_applied.py);
its goldens: tests/golden/expected/pd006_loss_graph_retained.*, tests/golden/expected/pd006_running_sum.* (tests/report/test_golden.py);
the memory growth it reports: tests/facts/test_memory.py."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run


def test_pd006_run_evidence_decides_over_static():
    f = cpu_run()
    s = f.subject("loss_holder", "t.py:12")
    s.add("kind", "attribute", "", "static")
    s.add("tensor_name", "loss", "", "static")
    assert judge(f, RULES) == []  # the run scanned and saw nothing retained there
    s.add("graphs_per_step", 1.0, "count", "run")
    s.add("holder", "meter.vals", "", "run")
    f.add("memory.growth_bytes_per_step", 3 * 1024 * 1024, "bytes", "run")
    f.add("memory.steps_to_oom", 5000.0, "count", "run")
    (finding,) = judge(f, RULES)
    assert finding.rule == "PD006" and finding.severity == "high"
    assert "meter.vals" in finding.title
    assert "3.0 MB per step" in finding.message and "5000 steps" in finding.message


def test_pd006_static_only_without_a_run():
    f = Facts()
    s = f.subject("loss_holder", "t.py:12")
    s.add("kind", "list", "", "static")
    (finding,) = judge(f, RULES)
    assert finding.confidence == "medium"
