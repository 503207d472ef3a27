"""Find the training steps of a trace and the CPU-launch -> GPU-event correlation."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from statistics import median

from perfdoctor.trace.model import CPU_OP, GPU_KINDS, RUNTIME, DRIVER, USER_ANN, Trace

_STEP_WORDS = re.compile(r"step|iteration|\biter\b|batch|execute_model", re.IGNORECASE)
_NOT_STEPS = ("Optimizer.", "enumerate(DataLoader)", "ProfilerStep", "## ")
_TRAILING_NUM = re.compile(r"[#\s_:-]*\d+$")


def launch_map(trace: Trace) -> dict[int, int]:
    """correlation id -> index of the runtime/driver call that launched it (CPU side)."""
    kind, corr = trace.kind, trace.corr
    return {corr[i]: i for i in range(len(kind)) if (kind[i] == RUNTIME or kind[i] == DRIVER) and corr[i] >= 0}


def gpu_launch_ts(trace: Trace, launches: dict[int, int] | None = None) -> dict[int, float]:
    """GPU event index -> timestamp of the CPU call that launched it (where the trace says)."""
    launches = launch_map(trace) if launches is None else launches
    kind, corr, ts = trace.kind, trace.corr, trace.ts
    out = {}
    for i in range(len(kind)):
        if kind[i] in GPU_KINDS:
            r = launches.get(corr[i])
            if r is not None:
                out[i] = ts[r]
    return out


def find_steps(trace: Trace) -> None:
    """Fill trace.steps, trace.step_source and trace.dropped_last_step."""
    kind, ts, dur, strings, name = trace.kind, trace.ts, trace.dur, trace.strings, trace.name
    cpu_end = 0.0
    prof, groups = [], defaultdict(list)
    for i in range(len(kind)):
        k = kind[i]
        if k in GPU_KINDS:
            continue
        e = ts[i] + dur[i]
        if e > cpu_end:
            cpu_end = e
        if k == USER_ANN or k == CPU_OP:
            n = strings[name[i]]
            if n.startswith("ProfilerStep#"):
                prof.append((n, ts[i], e))
            elif k == USER_ANN and _STEP_WORDS.search(n) and not n.startswith(_NOT_STEPS):
                groups[_TRAILING_NUM.sub("", n)].append((n, ts[i], e))
    steps, source = [], "whole-run"
    if prof:
        steps, source = prof, "profiler-step"
    else:
        # the most frequent repeated step-like annotation whose instances do not overlap
        for _, cand in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            cand.sort(key=lambda s: s[1])
            if len(cand) >= 2 and all(a[2] <= b[1] + 1 for a, b in zip(cand, cand[1:])):
                steps, source = cand, "annotation"
                break
    if not steps and len(kind):
        steps = [("whole trace", trace.start, trace.end)]
    steps.sort(key=lambda s: s[1])
    cpu_steps = [(s[1], s[2]) for s in steps]
    steps = _extend_to_gpu(trace, steps) if source != "whole-run" else steps
    dropped = False
    if len(steps) >= 2:
        last = steps[-1]
        others = median(s[2] - s[1] for s in steps[:-1])
        cut = last[2] - last[1] < 0.25 * others or prof and last[1] + 1 >= cpu_end
        if cut:
            steps, cpu_steps, dropped = steps[:-1], cpu_steps[:-1], True
    trace.cpu_steps = cpu_steps
    trace.steps, trace.step_source, trace.dropped_last_step = steps, source, dropped


def _extend_to_gpu(trace: Trace, steps: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """A step ends when the GPU work its CPU side launched ends. Where the GPU lags the CPU by a
    step or more, the next step starts where that work ended, so steps never overlap and the
    median step is the throughput period."""
    starts = [s[1] for s in steps]
    ends = [s[2] for s in steps]
    ts, dur = trace.ts, trace.dur
    for i, lts in gpu_launch_ts(trace).items():
        j = bisect_right(starts, lts) - 1
        if j >= 0 and lts <= steps[j][2]:
            e = ts[i] + dur[i]
            if e > ends[j]:
                ends[j] = e
    out, prev_end = [], float("-inf")
    for s, e in zip(steps, ends):  # tile the timeline: a step starts when the previous one's GPU work ended
        start = max(s[1], prev_end)
        out.append((s[0], start, max(e, start)))
        prev_end = max(e, start)
    return out
