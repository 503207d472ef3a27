"""The DataParallel probe's records (capture/probes/dataparallel.py) -> one `dataparallel` subject per
construction site (PD001)."""

from __future__ import annotations

from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    for dp in ctx.probes.dataparallel:
        s = site_subject(ctx.facts, "dataparallel", dp.site)
        if s is not None:
            s.add("constructed", True)
            s.add("device_count", dp.device_count, "count")
