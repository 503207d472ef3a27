"""The cross-rank view of a distributed run (one trace per rank): the straggler and the imbalance."""

from __future__ import annotations

from typing import Any

from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace.context import SRC
from perfdoctor.stats import median
from perfdoctor.trace.model import Trace


def cross_rank(traces: list[Trace], per_rank: list[Facts]) -> tuple[Facts, list[dict[str, Any]]]:
    """Per-rank step, compute and idle time; the straggler and the imbalance across ranks."""
    out = Facts()
    rows = []
    for t, f in zip(traces, per_rank):
        step = f.value("step.time_ms")
        compute = f.value("step.gpu_kernel_ms")
        idle = f.value("step.idle_ms")
        rows.append({"rank": t.rank, "file": t.path.name, "step_ms": step, "compute_ms": compute, "idle_ms": idle,
                     "idle_fraction": round(idle / step, 4) if step and idle is not None else None})
    out.add("ranks.count", len(traces), "count", SRC)
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
