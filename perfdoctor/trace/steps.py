"""Find the training steps of a trace and the CPU-launch -> GPU-event correlation."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from operator import add
from statistics import median

from perfdoctor.trace.model import CPU_OP, DRIVER, GPU_KINDS, KIND_NAMES, RUNTIME, USER_ANN, Trace

_STEP_WORDS = re.compile(r"step|iteration|\biter\b|batch|execute_model", re.IGNORECASE)
_NOT_STEPS = ("Optimizer.", "enumerate(DataLoader)", "ProfilerStep", "## ")
_DIGITS = "0123456789"
_NUM_SEPARATORS = "#_:- \t\n\r\f\v"


def _without_number(n: str) -> str:
    """The name without a trailing step number and its separator ("train_step#12" -> "train_step"),
    in linear time (a regex such as `[#\\s_:-]*\\d+$` backtracks quadratically on a hostile name)."""
    stem = n.rstrip(_DIGITS)
    return stem.rstrip(_NUM_SEPARATORS) if len(stem) < len(n) else n


def launch_map(trace: Trace) -> dict[int, int]:
    """correlation id -> index of the runtime/driver call that launched it (CPU side)."""
    corr = trace.corr
    return {corr[i]: i for i in trace.indices(RUNTIME, DRIVER) if corr[i] >= 0}


def gpu_launch_ts(trace: Trace, launches: dict[int, int] | None = None) -> dict[int, float]:
    """GPU event index -> timestamp of the CPU call that launched it (where the trace says)."""
    launches = launch_map(trace) if launches is None else launches
    corr, ts = trace.corr, trace.ts
    out = {}
    for i in trace.indices(*GPU_KINDS):
        r = launches.get(corr[i])
        if r is not None:
            out[i] = ts[r]
    return out


def _step_group(n: str) -> str | None:
    """"" for a ProfilerStep, the group of a step-like name (user annotations only), else None."""
    if n.startswith("ProfilerStep#"):
        return ""
    if _STEP_WORDS.search(n) and not n.startswith(_NOT_STEPS):
        return _without_number(n)
    return None


def find_steps(trace: Trace) -> None:
    """Fill trace.steps, trace.step_source and trace.dropped_last_step."""
    kind, ts, dur, strings, name = trace.kind, trace.ts, trace.dur, trace.strings, trace.name
    # the end of the CPU side, kind by kind (no need to merge the kinds into file order first)
    cpu_end = max((max(map(add, map(ts.__getitem__, ix), map(dur.__getitem__, ix)))
                   for k in range(len(KIND_NAMES)) if k not in GPU_KINDS if (ix := trace.indices(k))), default=0.0)
    prof, groups = [], defaultdict(list)
    ops = trace.indices(USER_ANN, CPU_OP)
    # the names of those events only (the string table also holds tracks and call stacks, many and long)
    group_of = {j: g for j in set(map(name.__getitem__, ops)) if (g := _step_group(strings[j])) is not None}
    for i in ops:
        g = group_of.get(name[i])
        if g == "":
            prof.append((strings[name[i]], ts[i], ts[i] + dur[i]))
        elif g is not None and kind[i] == USER_ANN:
            groups[g].append((strings[name[i]], ts[i], ts[i] + dur[i]))
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
