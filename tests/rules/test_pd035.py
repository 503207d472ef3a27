"""PD035 (rules/PD035-memory-leak.toml), judged on hand-built facts: memory that grows every step,
at the line whose blocks the steps keep; a block that only one recorded step left alive is no leak.

End to end: tests/facts/test_memory.py (a script that keeps one tensor per step)."""

from __future__ import annotations

from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run, ids


def _growing(kept_steps, recorded=4):
    f = cpu_run()
    f.add("memory.growth_bytes_per_step", 246_686.0, "bytes", "run")
    s = f.subject("kept_alloc", "/x/model.py:168")
    s.add("bytes_per_step", 7_157_760 * kept_steps / 4, "bytes", "trace")
    s.add("count_per_step", kept_steps / 4, "count", "trace")
    s.add("block_bytes", 7_157_760, "bytes", "trace")
    s.add("steps", kept_steps, "count", "trace")
    s.add("recorded_steps", recorded, "count", "trace")
    return f


def test_a_leak_keeps_blocks_from_every_step_one_steps_block_is_none():
    """LightGCN-PyTorch: one 7 MB torch.stack result of one of 4 recorded steps alive at the trace's end,
    beside 240 KB a step of RSS slope: not a tensor kept every step."""
    assert "PD035" not in ids(judge(_growing(1), RULES))
    assert "PD035" in ids(judge(_growing(4), RULES))
    # "created here each step": blocks from 3 of the 4 recorded steps are not that (lost frees, a cache
    # that filled and stopped growing)
    assert "PD035" not in ids(judge(_growing(3), RULES))
    assert "PD035" in ids(judge(_growing(3, recorded=3), RULES))
