"""Anomaly mode's backward: with `set_detect_anomaly(True)` the autograd engine checks every gradient
a backward node returns for NaN (`at::isnan(grad)._is_any_true().item()`, torch/csrc/autograd/engine.cpp),
ops the profiler records inside the engine's `evaluate_function` spans. Their share of the profiled
step is `autograd.nan_check_fraction`: PD013 adds it, scaled to the run's unprofiled step, to the
forward's stack captures the anomaly probe times (capture/probes/anomaly.py). A share, not the
profiled milliseconds: the profiler inflates every op it records, the checks' small ops as much as
the rest (to first order)."""

from __future__ import annotations

from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.facts.trace.intervals import merge, share_per_window, subtract
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP

CHECK_OPS = frozenset({"aten::isnan", "aten::_is_any_true"})  # NaN check of one gradient: isnan, then any + item
ENGINE = "autograd::engine::evaluate_function"


def add(ctx: TraceContext) -> None:
    """autograd.nan_check_fraction: the median over the profiled steps of the NaN checks' share of the
    step (the check ops inside the engine's node evaluations: a user's own isnan elsewhere is not one)."""
    t = ctx.trace
    checks = t.names_where(CHECK_OPS.__contains__)
    if not checks or not ctx.windows:
        return
    engine = t.names_where(lambda s: s.startswith(ENGINE))
    name, ts, dur = t.name, t.ts, t.dur
    ops = t.indices(CPU_OP)
    inside = merge([(ts[i], ts[i] + dur[i]) for i in ops if name[i] in engine])
    found = merge([(ts[i], ts[i] + dur[i]) for i in ops if name[i] in checks])
    found = subtract(found, subtract(found, inside))  # the checks that ran inside a node's evaluation
    if not found:
        return
    shares = share_per_window(found, ctx.windows)
    ctx.put("autograd.nan_check_fraction", median(shares), "ratio",
            "share of the profiled step in anomaly mode's NaN checks of the backward's gradients",
            per_step=tuple(round(v, 4) for v in shares))
