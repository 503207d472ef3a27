"""An optimizer step that runs tensor by tensor on a GPU (`foreach=False`, or torch's own fallback): its
update function, `torch/optim/<name>.py(N): _single_tensor_<name>` in the trace's Python frames, runs
each operator once per parameter tensor, and each of those ops launches its own kernels. The foreach
form (CUDA's default) runs each operator once over a group of tensors; the fused form once a step.

`optimizer_loop.saving_share`: the median over the profiled steps of the share of the step that the
per-tensor update spends on repeats, the update function's time times (N - D) / N, where N counts its
ops (the aten ops no other op encloses) and D the distinct operators among them: the ops a foreach step
would not run, with the Python between them. A share, not the profiled milliseconds (as anomaly's NaN
checks): the profiler inflates the update's many small ops and calls about as much as the rest of the
step. Each optimizer subject of the step's class built per tensor (`optimizer.foreach` False, not
fused) gets its class's share, split evenly where several are (`optimizer.loop_saving_share`): PD021's
saving. On the H200 (pd021's sample, six tensors, 60 ops of 8 operators a step): 0.22 of the profiled
step, 0.76 ms of the run's 3.5 ms step; `perfdoctor verify` measured 0.82 ms (90 % interval 0.20-1.46).

A GPU trace only: on a CPU the per-tensor form is torch's default and launches nothing."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict

from perfdoctor.facts.trace.context import SRC, TraceContext
from perfdoctor.facts.trace.intervals import outermost
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, PYFUNC, USER_ANN

UPDATE = re.compile(r"^torch/optim/\w+\.py\(\d+\): _single_tensor_\w+$")
STEP = "Optimizer.step#"  # `Optimizer.step#AdamW.step`: the class whose step encloses the update


def add(ctx: TraceContext) -> None:
    t = ctx.trace
    updates = t.names_where(UPDATE.match)
    if not ctx.gpu or not updates or not ctx.windows:
        return
    ts, dur, name, track = t.ts, t.dur, t.name, t.track
    frames = sorted((i for i in t.indices(PYFUNC) if name[i] in updates), key=ts.__getitem__)
    steps = t.names_where(lambda s: s.startswith(STEP))
    spans = [(ts[i], ts[i] + dur[i], t.strings[name[i]][len(STEP):].split(".", 1)[0])
             for i in t.indices(CPU_OP, USER_ANN) if name[i] in steps]
    aten = t.names_where(lambda s: s.startswith("aten::"))
    ops_by_track: dict[int, list[int]] = defaultdict(list)
    for i in t.indices(CPU_OP):
        if name[i] in aten:
            ops_by_track[track[i]].append(i)
    starts: dict[int, list[float]] = {}
    for k, lst in ops_by_track.items():
        lst.sort(key=ts.__getitem__)
        starts[k] = [ts[i] for i in lst]
    # per class: (start, repeats' time) of each update frame
    saved: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in frames:
        a, b = ts[f], ts[f] + dur[f]
        cls = next((c for s, e, c in spans if s <= a and b <= e), "")
        lst, at = ops_by_track.get(track[f], []), starts.get(track[f], [])
        inside = [i for i in lst[bisect_left(at, a):bisect_right(at, b)] if ts[i] + dur[i] <= b]
        outer = outermost(inside, ts, dur)
        if not outer:
            continue
        n, d = len(outer), len(Counter(name[i] for i in outer))
        saved[cls].append((a, dur[f] * (n - d) / n))
    if not saved:
        return
    share: dict[str, float] = {}
    for cls, rows in saved.items():
        per = [sum(x for a, x in rows if s <= a < e) / ((e - s) or 1.0) for s, e in ctx.windows]
        m = median(per)
        if m is not None:
            share[cls] = m
    if not share:
        return
    total = sum(share.values())
    ctx.put("optimizer_loop.saving_share", total, "ratio",
            "share of the profiled step that a per-tensor optimizer update spends on repeating its operators "
            "tensor by tensor (" + ", ".join(f"{c or '?'} {v:.3f}" for c, v in sorted(share.items())) + ")")
    for cls, v in share.items():
        mine = [s for s in ctx.facts.of_kind("optimizer")
                if s.facts.get("optimizer.foreach") is not None and s.facts["optimizer.foreach"].value is False
                and not (s.facts.get("optimizer.fused") is not None and s.facts["optimizer.fused"].value)
                and (not cls or s.facts.get("optimizer.name") is None or s.facts["optimizer.name"].value == cls)]
        for s in mine:
            s.add("loop_saving_share", round(v / len(mine), 4), "ratio", SRC,
                  f"{cls or 'the'} step's per-tensor update: its repeated operators' share of the profiled step"
                  + (f", split over {len(mine)} such optimizers" if len(mine) > 1 else ""))
