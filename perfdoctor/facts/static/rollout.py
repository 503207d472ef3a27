"""Whether the line a periodic stall names (the run's `periodic_stall` subjects, PD020) is a
reinforcement-learning rollout: in a loop that steps an environment, or a call of a function of this
file that does (`Loops.in_rollout`). Collecting experience between updates is the algorithm's own
work, not a stall to remove (minimalRL's PPO: the model's policy forward inside the `env.step` loop
ran on every third optimizer step)."""

from __future__ import annotations

import ast
import os

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put


def detect(index: SourceIndex, facts: Facts) -> None:
    if not index.loops.env_steps:
        return
    here = os.path.abspath(index.file)
    for s in facts.of_kind("periodic_stall"):
        loc = s.locations[0] if s.locations else None
        if loc is None or os.path.abspath(loc.file) != here:
            continue
        stmts = [n for n in index.nodes if isinstance(n, ast.stmt) and n.lineno == loc.line]
        if any(index.loops.in_rollout(n) for n in stmts):
            put(s, "rollout", True)
