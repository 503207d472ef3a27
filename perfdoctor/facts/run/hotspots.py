"""hotspots.json -> the report's hot spots: the user's functions by time per profiled step (cProfile,
with their hot lines from the line sampler) and in the DataLoader worker processes (py-spy), the
hottest worker function as a `worker_hotspot` subject (PD014), and a note where py-spy could not
sample every worker."""

from __future__ import annotations

import ast
import os
import re
from typing import NamedTuple

from perfdoctor.capture.window import MAX_FUNCTIONS
from perfdoctor.contracts.report import HotLineDoc
from perfdoctor.contracts.run import Hotspots, Step, Window, Workers
from perfdoctor.contracts.source import read_source
from perfdoctor.facts.model import Facts
from perfdoctor.facts.run.context import RunContext
from perfdoctor.model import Hotspot, Location


def add(ctx: RunContext) -> None:
    workers = ctx.hotspot_file.workers
    worker_hot = worker_hotspots(workers)
    if workers is not None and worker_hot and worker_hot[0].lines:
        _worker_hotspot_subject(ctx.facts, workers, worker_hot[0], ctx.run_steps, ctx.window)
    if workers is not None and workers.error:
        ctx.notes.append(f"py-spy could not sample every DataLoader worker ({workers.error}); "
                         f"hot spots in the workers are {'partial' if workers.samples else 'missing'}")
    ctx.hotspots = _hotspots(ctx.hotspot_file) + worker_hot


def functions_called(ctx: RunContext) -> dict[str, frozenset[int]] | None:
    """Per user file (its real path), the first lines of the functions cProfile saw called in the
    window's profiled steps (a decorated function's first decorator line): a function of the user's not
    among them, and not on the step's call chain (entered before the steps), ran no code in those
    steps. None where the run cannot say: fewer than 2 profiled steps, a list cut at MAX_FUNCTIONS, or
    a compiled region (dynamo runs its graph, not the functions)."""
    h = ctx.hotspot_file
    if h.steps < 2 or not h.functions or len(h.functions) >= MAX_FUNCTIONS or (
            ctx.probes.compile is not None and ctx.probes.compile.frames):
        return None
    out: dict[str, set[int]] = {}
    for f in h.functions:
        out.setdefault(os.path.realpath(f.file), set()).add(f.line)
    return {f: frozenset(v) for f, v in out.items()}


class FunctionShare(NamedTuple):
    """A user function in cProfile's profiled steps (`function_shares`)."""
    share: float  # its cumulative time over the profiled steps' wall time
    calls: float  # its calls per profiled step
    own: float  # its own time (callees not counted) over that wall time


def function_shares(ctx: RunContext) -> dict[str, dict[int, FunctionShare]] | None:
    """Per user file (its real path), per function's first line: its cumulative time's share of the
    profiled steps' wall time, its calls per profiled step and its own time's share, from cProfile. A generator's every resume
    is a call, so a generator the training loop draws its batches from has its batch making as its
    cumulative time, and about one call per step. The share, not the milliseconds: cProfile slows
    Python code, so its times are the profiled steps' (read against their wall time, in steps.json),
    not a steady step's. None where the run cannot say (`functions_called`'s cases, or no wall time
    for the profiled steps)."""
    h, window = ctx.hotspot_file, ctx.window
    if functions_called(ctx) is None or window is None or window.skip is None:
        return None
    first, last = window.skip + 1, window.skip + h.steps
    wall_ms = sum(s.wall_ms for s in ctx.run_steps if first <= s.i <= last)
    if wall_ms <= 0:
        return None
    out: dict[str, dict[int, FunctionShare]] = {}
    for f in h.functions:
        out.setdefault(os.path.realpath(f.file), {})[f.line] = FunctionShare(
            f.cumtime_s * 1e3 / wall_ms, f.ncalls / h.steps, f.tottime_s * 1e3 / wall_ms)
    return out


def _function_spans(file: str) -> list[tuple[int, int, int]]:
    """(def line, first body line, end line) of every function in `file` (a user file the run names:
    contracts.source reads it), outer ones first."""
    sf = read_source(file)
    tree = sf.parse(file) if sf is not None else None
    if tree is None:
        return []
    return [(n.lineno, n.body[0].lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _function_end(spans: list[tuple[int, int, int]], def_line: int) -> int | None:
    """The end line of the function whose header holds `def_line` (cProfile's first line)."""
    return next((end for start, body, end in spans if start <= def_line <= body), None)


def _enclosing_start(spans: list[tuple[int, int, int]], line: int) -> int | None:
    """The def line of the innermost function around `line`."""
    return max((start for start, _, end in spans if start <= line <= end), default=None)


def _hot_lines(file: str, rows: list[dict]) -> list[HotLineDoc]:
    """A function's hottest lines (up to 5, each at least 5% of its samples) with their code."""
    total = sum(x["samples"] for x in rows)
    sf = read_source(file)
    return [HotLineDoc(line=x["line"], code=sf.line(x["line"]).strip() if sf is not None else "",
                       share=round(x["samples"] / total, 3), samples=x["samples"])
            for x in sorted(rows, key=lambda x: -x["samples"])[:5] if x["samples"] / total >= 0.05]


_INNER_FRAME = re.compile(r"(\.<locals>)?\.<(listcomp|dictcomp|setcomp|genexpr|lambda)>")


def worker_hotspots(workers: Workers | None) -> list[Hotspot]:
    """User functions in the DataLoader worker processes (py-spy samples through the window), by
    worker CPU time per step summed over the workers, with their hot lines."""
    if workers is None or not workers.samples or not workers.steps:
        return []
    per_sample_ms = 1000.0 / (workers.rate_hz or 100) / workers.steps
    spans: dict[str, list[tuple[int, int, int]]] = {}  # each file parsed once
    groups: dict[tuple[str, str, int], dict[int, int]] = {}  # (file, function, def line) -> samples per line
    for x in workers.lines or []:
        fs = spans.get(x.file)
        if fs is None:
            fs = spans[x.file] = _function_spans(x.file)
        start = _enclosing_start(fs, x.line) or x.line
        # a comprehension or lambda is a frame of its own (`collate.<locals>.<listcomp>`): its time
        # belongs to the function written around it
        per_line = groups.setdefault((x.file, _INNER_FRAME.sub("", x.function), start), {})
        per_line[x.line] = per_line.get(x.line, 0) + x.samples
    out = []
    for (file, func, start), per_line in groups.items():
        rows = [{"line": ln, "samples": n} for ln, n in per_line.items()]
        out.append(Hotspot(function=func, file=file, line=start,
                           ms_per_step=sum(per_line.values()) * per_sample_ms, calls_per_step=0.0,
                           lines=_hot_lines(file, rows), process="dataloader-workers"))
    out.sort(key=lambda h: -h.ms_per_step)
    return [h for h in out if h.ms_per_step >= 0.01][:5]


def _worker_hotspot_subject(facts: Facts, workers: Workers, h: Hotspot, steps: list[Step],
                            window: Window | None) -> None:
    """The hottest user function in the DataLoader workers, located at its hottest line (PD014)."""
    rate, top = workers.rate_hz or 100, h.lines[0]
    samples, n_steps = workers.samples, workers.steps
    assert isinstance(samples, int) and n_steps  # worker_hotspots found h: both are known and non-zero
    s = facts.subject("worker_hotspot", f"{h.file}:{top.line}")
    s.locations.append(Location(h.file, top.line, top.code, h.function))
    s.add("function", h.function)
    s.add("ms_per_step", h.ms_per_step, "ms", detail="worker CPU time per step in this function, summed over "
          f"the workers (py-spy, {rate} Hz, {n_steps} profiled steps)")
    all_ms = samples * 1000.0 / rate / n_steps
    s.add("share", h.ms_per_step / all_ms, "ratio", detail="of all the workers' sampled time")
    n_workers = len(workers.pids)
    s.add("workers", n_workers, "count")
    # py-spy samples only running threads (not a worker blocked on a full queue), so samples over
    # what the window's wall time allows say how saturated the workers were
    skip, last = (window.skip or 0, window.last_step) if window is not None else (0, None)
    window_s = sum(x.wall_ms for x in steps if last is not None and skip < x.i <= last) / 1000
    if window_s > 0 and n_workers:
        s.add("busy", min(1.0, samples / (rate * window_s * n_workers)),
              "ratio", detail=f"sampled running time of the workers over the window's {window_s:.2f} s")


def _hotspots(hs: Hotspots) -> list[Hotspot]:
    """User functions by time per profiled step (cProfile records no frame entered before it was
    enabled, so the training loop and `main` do not appear), with their hot lines."""
    steps = hs.steps
    if not steps:
        return []
    out = []
    for f in hs.functions:
        if f.function == "<module>":
            continue
        ms = f.cumtime_s * 1e3 / steps
        if ms < 0.01:
            continue
        h = Hotspot(function=f.function, file=f.file, line=f.line, ms_per_step=ms, calls_per_step=f.ncalls / steps)
        end = _function_end(_function_spans(h.file), h.line)
        if end:
            lines = [{"line": x.line, "samples": x.samples} for x in hs.lines
                     if x.file == h.file and h.line <= x.line <= end]
            if lines:
                h.lines = _hot_lines(h.file, lines)
        out.append(h)
        if len(out) >= 10:
            break
    return out
