"""The allocator's events in a trace recorded with `profile_memory` (perfdoctor's window records them)
-> the tensors the steps create and keep, by the user's line that creates them, and the within-step
peak of the allocator above each step's start.

Kept: a block allocated during a recorded step other than the last and never freed by the trace's end
(a step's activations, temporaries and outputs are freed by the next step; what lives on past that is
held by something: a list, a dict, an attribute). The profiler does not record every free (a CPU run of
a transformer: 23 blocks of one attention line allocated again at their live address): where a block's
address is allocated again with no free between, its free was lost (`memory.lost_frees`), and the blocks
of that block's line still alive at the end are not counted as kept, since they may be freed blocks whose
address was not reused yet. Grouped by the innermost user frame around the
allocation (the Python stack the profiler recorded), per step: one `kept_alloc` subject per line
(`kept_alloc.bytes_per_step`, `count_per_step`, `block_bytes`, and `steps`: how many of the recorded
steps left such a block, 1 where one step's tensor outlived the window and nothing repeats), and
`memory.kept_bytes_per_step` in all. The allocator judged is the device's the trace ran on (CUDA on a GPU trace, else the CPU's).

`memory.step_transient_bytes`: the median over the recorded steps of the allocator's highest total
within the step less its total at the step's start: the activations kept for backward and the
temporaries, on any device (on a CPU run the RSS cannot tell them apart)."""

from __future__ import annotations

import ast
import bisect
import re
import statistics
from pathlib import Path
from typing import Any

from perfdoctor.contracts.source import read_source
from perfdoctor.facts.static.index.syntax import called_name
from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.facts.trace.stacks import Frame, location
from perfdoctor.model import Location
from perfdoctor.trace.model import MEMORY

MAX_LINES = 20  # kept_alloc subjects, by bytes kept
_BUILTIN = re.compile(r"^<built-in (?:method|function) (\w+)")
_OWN = re.compile(r"^(?:.*/)?perfdoctor/capture/")
_PYFRAME = re.compile(r"^.*\(\d+\): (\w+)$")
SourceCache = dict[str, tuple[ast.Module, list[str]] | None]  # a user file -> its tree and lines, read once


def add(ctx: TraceContext) -> None:
    t = ctx.trace
    want = 1 if ctx.gpu else 0  # "Device Type": 0 CPU, 1 CUDA
    ts, nbytes, addr, dtype = t.ts, t.nbytes, t.ext, t.stream
    evs = sorted((i for i in t.indices(MEMORY) if dtype[i] == want), key=ts.__getitem__)
    windows = ctx.cpu_windows
    if not evs or len(windows) < 2:
        return
    _transient(ctx, evs, windows)
    live: dict[int, int] = {}  # address -> the event that allocated the block living there
    lost: list[int] = []  # blocks whose free the trace lost: their address was allocated again, no free between
    for i in evs:
        if nbytes[i] > 0:
            if addr[i] in live:
                lost.append(live[addr[i]])
            live[addr[i]] = i
        elif nbytes[i] < 0:
            live.pop(addr[i], None)
    start, last = windows[0][0], windows[-1][0]
    sources: SourceCache = {}
    steps = len(windows) - 1  # the steps whose allocations had a whole step to be freed in
    # a line some of whose blocks lost their free in the trace: its blocks still live at the end may be
    # freed blocks whose address was not reused yet, so they say nothing of what the line keeps
    lossy = {found[0] for i in lost if (found := site(ctx, i, sources)) is not None}
    if lost:
        ctx.put("memory.lost_frees", len(lost), "count",
                f"allocator blocks ({'CUDA' if want else 'CPU'}) whose free the trace did not record: their address "
                f"was allocated again with no free between; blocks left alive at {len(lossy)} line(s) with such "
                "blocks are not counted as kept")
    by_line: dict[str, tuple[Any, list[int]]] = {}
    total_kept = 0
    for i in live.values():
        if not start <= ts[i] < last:
            continue
        found = site(ctx, i, sources)
        if found is not None and found[0] in lossy:
            continue
        total_kept += nbytes[i]
        if found is None:
            continue
        by_line.setdefault(found[0], (found[1], []))[1].append(i)
    ctx.put("memory.kept_bytes_per_step", total_kept / steps, "bytes",
            f"allocator blocks ({'CUDA' if want else 'CPU'}) allocated in the first {steps} recorded step(s) and "
            "never freed by the trace's end, per step")
    ranked = sorted(by_line.items(), key=lambda kv: -sum(nbytes[i] for i in kv[1][1]))[:MAX_LINES]
    for key, (loc, idx) in ranked:
        s = ctx.facts.subject("kept_alloc", key)
        if loc not in s.locations:
            s.locations.append(loc)
        kept = sum(nbytes[i] for i in idx)
        sizes = sorted(nbytes[i] for i in idx)
        s.add("bytes_per_step", kept / steps, "bytes", "trace",
              f"{len(idx)} block(s), {kept:,} bytes, allocated at this line in {steps} recorded step(s) and never freed")
        s.add("count_per_step", len(idx) / steps, "count", "trace")
        s.add("block_bytes", sizes[len(sizes) // 2], "bytes", "trace", "the median block's size")
        starts = [w[0] for w in windows]
        kept_in = {bisect.bisect_right(starts, ts[i]) for i in idx}
        s.add("steps", len(kept_in), "count", "trace",
              f"recorded steps (of {steps}) that left a block from this line alive at the trace's end")
        s.add("recorded_steps", steps, "count", "trace",
              "recorded steps whose allocations had a whole step to be freed in (all but the last)")
    return


def site(ctx: TraceContext, i: int, sources: SourceCache) -> tuple[str, Location, bool, Frame] | None:
    """The user's line that made the call leading to event i (an allocation, an op), with whether the
    source named that call and the user frame (its file as the run knows it). The profiler names a Python
    frame by its function's first line (a script's top level: by the line it was at when the profiler
    started), never by the line running: the line is the one call in that function's source to what
    the frame called next on the way to the event (`torch.ones`, `torch.cat`, a helper); where
    the source does not say (no such call, a module call, an indexing), the frame's own line. In a run
    folder (its user files known), None where that frame is no file of the run's: the profiler names an
    installed library's frame by its path under sys.path (`torchmetrics/...py`), whose own work is not
    the user's line to change."""
    chain = ctx.stacks.chain(i)
    names, strings = ctx.trace.name, ctx.trace.strings
    for k, p in enumerate(chain):
        u = ctx.stacks.named_frame(names[p])
        if u is None:
            continue
        # what it called: perfdoctor's own wrappers (a probe around torch.ones) are not the script's calls
        inner = [strings[names[q]] for q in chain[:k] if not _OWN.match(strings[names[q]])]
        callee = _callee(inner[-1]) if inner else None
        file = _resolve(u[0], ctx.user_files)
        if ctx.user_files and not Path(file).is_absolute():
            return None
        line = _call_line((file, u[1], u[2]), callee, sources) if callee else None
        key, loc = location((file, line or u[1], u[2]))
        text = sources.get(file)
        if line and text is not None and 0 < line <= len(text[1]):
            loc = Location(loc.file, loc.line, text[1][line - 1].strip(), loc.function)
        return key, loc, line is not None, (file, u[1], u[2])
    return None


def _resolve(file: str, user_files: list[Path]) -> str:
    """A frame's file as the run knows it: the one user file whose path ends with the trace's name for it."""
    if Path(file).is_absolute():
        return file
    match = [p for p in user_files if str(p).endswith("/" + file.lstrip("./"))]
    return str(match[0]) if len(match) == 1 else file


def _callee(name: str) -> str | None:
    """The function a profiler frame name calls: `<built-in method ones of ...>` -> ones, `f.py(3): helper` -> helper."""
    m = _BUILTIN.match(name) or _PYFRAME.match(name)
    return m.group(1) if m else None


def read_tree(file: str, sources: SourceCache) -> tuple[ast.Module, list[str]] | None:
    """A user file's syntax tree and lines, read once per trace (`sources`); None where it cannot be read."""
    if file not in sources:
        src = read_source(file)
        tree = src.parse(file) if src is not None else None
        sources[file] = None if src is None or tree is None else (tree, src.lines)
    return sources[file]


def _call_line(u: Frame, callee: str, sources: SourceCache) -> int | None:
    """The first line calling `callee` (as `callee(...)` or `x.callee(...)`) in the function of user frame
    `u` (file, first line, name), or in the file's top level for `<module>`; None where there is none."""
    file, first, func = u
    got = read_tree(file, sources)
    if got is None:
        return None
    lines = sorted(n.lineno for b in function_body(got[0], first, func) for n in ast.walk(b)
                   if isinstance(n, ast.Call) and called_name(n) == callee)
    return lines[0] if lines else None


def function_body(tree: ast.Module, first: int, func: str) -> list[Any]:
    """The function `func` whose first line (or a decorator's) is `first`, as a one-node list; for
    `<module>`, the file's top-level statements outside functions and classes."""
    if func == "<module>":
        return [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func
            and (n.lineno == first or any(d.lineno == first for d in n.decorator_list))][:1]


def _transient(ctx: TraceContext, evs: list[int], windows: list[tuple[float, float]]) -> None:
    t = ctx.trace
    ts, nbytes, total = t.ts, t.nbytes, t.corr
    peaks: list[float] = []
    k = 0
    for a, b in windows:
        while k < len(evs) and ts[evs[k]] < a:
            k += 1
        first = k
        top = None
        while k < len(evs) and ts[evs[k]] <= b:
            if total[evs[k]] >= 0:
                top = total[evs[k]] if top is None else max(top, total[evs[k]])
            k += 1
        if top is None or first >= len(evs) or total[evs[first]] < 0:
            continue
        base = total[evs[first]] - nbytes[evs[first]]  # the allocator's total before the step's first event
        peaks.append(top - base)
    if peaks:
        ctx.put("memory.step_transient_bytes", statistics.median(peaks), "bytes",
                f"median over {len(peaks)} recorded step(s) of the allocator's highest total within the step less "
                "its total at the step's start: the activations kept for backward and the temporaries")
