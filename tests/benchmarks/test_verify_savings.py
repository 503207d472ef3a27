"""benchmarks/verify_savings.py's per-rule summary."""

import importlib.util
import sys

import pytest

from tests.helpers import REPO

_spec = importlib.util.spec_from_file_location("verify_savings_bench", REPO / "benchmarks" / "verify_savings.py")
assert _spec is not None and _spec.loader is not None
vs = importlib.util.module_from_spec(_spec)
sys.modules["verify_savings_bench"] = vs
_spec.loader.exec_module(vs)


def row(rule, predicted, measured, interval, verdict="verified"):
    return {"script": "s", "rule": rule, "predicted_ms": predicted, "measured_ms": measured,
            "interval_ms": interval, "verdict": verdict, "load": [1.0, 1.0]}


def test_per_rule_counts_the_rows_measured_negative():
    """The median over positive rows says 1.0; the rows measured negative pull the sum ratio to 3.0."""
    rows = [row("PD002", 10.0, 10.0, [5.0, 15.0]), row("PD002", 10.0, -2.0, [-8.0, 4.0], "no-saving-here"),
            row("PD002", 10.0, 2.0, [-3.0, 7.0], "no-saving-here"), row("PD002", 10.0, None, None, "did-not-hold"),
            row("PD027", 5.0, 10.0, [8.0, 12.0], "larger")]
    s = vs.per_rule(rows)
    assert s["PD002"]["median"] == pytest.approx(3.0)  # 10/10 and 10/2
    assert s["PD002"]["sum_ratio"] == pytest.approx(30.0 / 10.0)
    assert (s["PD002"]["rows"], s["PD002"]["inside"], s["PD002"]["real"]) == (3, 1, 1)
    assert s["PD027"]["median"] == pytest.approx(0.5) and s["PD027"]["inside"] == 0
    assert "| PD002 | 3.00 | 2 | NO | 3.00 | 1 of 3 | 1 of 3 |" in vs.table(rows)
