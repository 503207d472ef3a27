"""The anomaly probe's records (capture/probes/anomaly.py) -> `autograd.anomaly_enabled` and one
`anomaly` subject per line that switched anomaly detection on."""

from __future__ import annotations

from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    for an in ctx.probes.anomaly:
        if an.enabled:
            ctx.facts.add("autograd.anomaly_enabled", True, detail="set_detect_anomaly/detect_anomaly seen")
            s = site_subject(ctx.facts, "anomaly", an.site)
            if s is not None:
                s.add("enabled", True)
