"""What the source says of the line a periodic stall names (the run's `periodic_stall` subjects, PD020):

- `periodic_stall.rollout`: a reinforcement-learning rollout, in a loop that steps an environment, or a
  call of a function of this file that does (`Loops.in_rollout`). Collecting experience between updates
  is the algorithm's own work, not a stall to remove (minimalRL's PPO: the model's policy forward inside
  the `env.step` loop ran on every third optimizer step).
- `periodic_stall.every_step`: the line runs on every training step (`Loops.every_step`: in the step's
  loop with nothing that can pass it by, or the step loop's own header). Some steps being slower there
  (a loaded host, the allocator, a worker's batch arriving late) is no work done every N steps: a
  checkpoint, an evaluation or a log behind `if step % N == 0:` is not on every step.

The run names a pattern's candidate lines in order (`periodic_stall.rank`, the outermost first); once
every file is read, `choose` keeps the first that does not run on every step: one line per pattern.
"""

from __future__ import annotations

import ast
import os

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put


def _statement_at(index: SourceIndex, line: int) -> ast.stmt | None:
    """The innermost statement whose lines hold `line` (a sampled frame's line may be a continuation
    line of a call written over several)."""
    best: ast.stmt | None = None
    for n in index.nodes:
        if isinstance(n, ast.stmt) and n.lineno <= line <= (n.end_lineno or n.lineno):
            if best is None or n.lineno >= best.lineno and (n.end_lineno or n.lineno) <= (best.end_lineno or best.lineno):
                best = n
    return best


def detect(index: SourceIndex, facts: Facts) -> None:
    here = os.path.abspath(index.file)
    for s in facts.of_kind("periodic_stall"):
        loc = s.locations[0] if s.locations else None
        if loc is None or os.path.abspath(loc.file) != here:
            continue
        if index.loops.env_steps:
            stmts = [n for n in index.nodes if isinstance(n, ast.stmt) and n.lineno == loc.line]
            if any(index.loops.in_rollout(n) for n in stmts):
                put(s, "rollout", True)
        stmt = _statement_at(index, loc.line)
        if stmt is not None:
            put(s, "every_step", index.loops.every_step(stmt))


def choose(facts: Facts) -> None:
    """Of the run's ranked candidate lines of a stall (`periodic_stall.rank`), keep the first that does
    not run on every step (`every_step` not true), else the first: one subject per pattern. A subject
    with no rank (not the run's sampler) stands alone."""
    subjects = facts.of_kind("periodic_stall")
    rank, every = "periodic_stall.rank", "periodic_stall.every_step"
    ranked = sorted((s for s in subjects if rank in s.facts), key=lambda s: s.facts[rank].value)
    if len(ranked) < 2:
        return
    keep = next((s for s in ranked if every not in s.facts or s.facts[every].value is not True), ranked[0])
    facts.subjects["periodic_stall"] = [s for s in subjects if s is keep or rank not in s.facts]
