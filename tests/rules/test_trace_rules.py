"""The rules a GPU trace decides (PD009 data loading on the GPU's critical path, PD010/PD011 communication, PD012
stragglers), judged on hand-built trace facts. Real traces: tests/analysis/test_trace_reports.py and their goldens
(tests/golden/expected/kineto__*, hta__*, param__*, tracelens__*)."""

from __future__ import annotations

import pytest

from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, gpu_facts


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
