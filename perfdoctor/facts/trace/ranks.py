"""The cross-rank view of a distributed run (one trace per rank): the straggler and the imbalance.

A map-reduce over ranks: each rank's trace is measured on its own (`RankSummary`, small and
picklable: its facts and summary, never the trace), then `cross_rank` merges the per-rank rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace.context import SRC
from perfdoctor.stats import median


@dataclass
class RankSummary:
    """What one rank's trace leaves once measured: its facts and summary (add_trace_facts), the rank
    and where it was read from (settled across the run by trace.settle_ranks), how its steps were
    found, and the events the loader dropped or repaired. Tens of KB whatever the trace's size."""

    path: Path
    rank: int
    rank_source: str
    facts: Facts
    summary: dict[str, Any]
    step_source: str
    dropped_last_step: bool
    dropped: dict[str, int] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """This rank's row of the report's rank table: step, compute and idle time."""
        step = self.facts.value("step.time_ms")
        idle = self.facts.value("step.idle_ms")
        return {"rank": self.rank, "file": self.path.name, "step_ms": step,
                "compute_ms": self.facts.value("step.gpu_kernel_ms"), "idle_ms": idle,
                "idle_fraction": round(idle / step, 4) if step and idle is not None else None}


def cross_rank(ranks: list[RankSummary]) -> tuple[Facts, list[dict[str, Any]]]:
    """Per-rank step, compute and idle time (the rows, in the order given); the straggler and the
    imbalance across ranks."""
    out = Facts()
    rows = [r.row() for r in ranks]
    out.add("ranks.count", len(ranks), "count", SRC)
    key = "compute_ms" if all(r["compute_ms"] for r in rows) else "step_ms"
    vals = [r[key] for r in rows if r[key] is not None]
    mid = median(vals)
    if len(vals) >= 2 and mid is not None and mid > 0:
        out.add("ranks.imbalance_ratio", round(max(vals) / mid, 4), "ratio", SRC, f"max/median {key}")
        out.add("ranks.straggler", max(rows, key=lambda r: r[key] or 0)["rank"], "", SRC, f"rank with most {key}")
    idles = [r["idle_fraction"] for r in rows if r["idle_fraction"] is not None]
    if len(idles) >= 2:
        out.add("ranks.idle_spread", round(max(idles) - min(idles), 4), "ratio", SRC, "max - min idle fraction")
    return out, rows
