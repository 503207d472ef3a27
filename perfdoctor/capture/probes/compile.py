"""torch.compile's graph breaks and (re)compilations, by step and by the user's line (PD029).

Nothing is hooked: dynamo keeps its own records, and the probe reads them after each step (outside
the step's time) once the script has loaded dynamo (`torch._dynamo.utils` in `sys.modules`; the
probe never imports it). `graph_break_reasons` holds every graph break with the user's stack where
dynamo broke the graph, `get_compilation_metrics()` one row per compiled frame (its code's file and
first line, its time, the guard that failed where it is a recompilation). Both are read
incrementally: what a step added is that step's. The compilations of one frame after its first are
recompilations; a graph break costs on every call of the compiled code (the graph ends, Python runs
the rest until the next graph), so a break is reported once with the steps it was compiled on.
"""

from __future__ import annotations

import linecache
import os
import sys
from typing import Any

from perfdoctor.capture.patches import ErrorLog
from perfdoctor.contracts.run import CompiledFrame, CompileRecord, GraphBreakRecord, Site
from perfdoctor.usercode import is_user_file

MAX_REASONS = 5  # recompile reasons kept per frame
MAX_SITES = 100  # graph-break lines and compiled frames kept


def _site(file: str | None, line: int | None, function: str = "") -> Site | None:
    if not file or not line or not is_user_file(file):
        return None
    fn = os.path.abspath(file)
    return Site(file=fn, line=line, code=linecache.getline(fn, line).strip(), function=function)


class CompileProbe:
    def __init__(self, err: ErrorLog):
        self.err = err
        self.n_breaks = 0  # graph_break_reasons read so far
        self.last_metric: Any = None  # the newest compilation-metrics row read so far
        self.breaks: dict[tuple[str, int, str], GraphBreakRecord] = {}
        self.frames: dict[tuple[str, int], CompiledFrame] = {}

    def install(self) -> None:
        pass

    def uninstall(self) -> None:
        pass

    def end_step(self, i: int) -> None:
        """Read what dynamo recorded since the last look; it belongs to step `i`."""
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is None:
            return
        try:
            self._breaks(utils, i)
            self._compiles(utils, i)
        except Exception as e:  # noqa: BLE001 - another torch's records: the probe stays quiet
            self.err("compile", e)

    def _breaks(self, utils: Any, i: int) -> None:
        reasons = getattr(utils, "graph_break_reasons", None)
        if reasons is None:
            return
        if len(reasons) < self.n_breaks:  # torch._dynamo.reset() cleared them
            self.n_breaks = 0
        for r in reasons[self.n_breaks:]:
            frame = next((f for f in reversed(getattr(r, "user_stack", None) or []) if is_user_file(f.filename)), None)
            site = _site(frame.filename, frame.lineno, frame.name) if frame is not None else None
            if site is None:
                continue
            text = str(getattr(r, "reason", "")).strip().splitlines()
            reason = text[0].strip() if text else ""
            key = (site.file, site.line, reason)
            b = self.breaks.get(key)
            if b is None:
                if len(self.breaks) >= MAX_SITES:
                    continue
                b = self.breaks[key] = GraphBreakRecord(site=site, reason=reason, steps=[])
            b.steps.append(i)
        self.n_breaks = len(reasons)

    def _compiles(self, utils: Any, i: int) -> None:
        get = getattr(utils, "get_compilation_metrics", None)
        if get is None:
            return
        rows = get()
        new = rows
        if self.last_metric is not None:
            at = next((k for k in range(len(rows) - 1, -1, -1) if rows[k] is self.last_metric), None)
            new = rows[at + 1:] if at is not None else rows
        if rows:
            self.last_metric = rows[-1]
        for m in new:
            site = _site(getattr(m, "co_filename", None), getattr(m, "co_firstlineno", None),
                         getattr(m, "co_name", "") or "")
            if site is None:
                continue
            key = (site.file, site.line)
            f = self.frames.get(key)
            if f is None:
                if len(self.frames) >= MAX_SITES:
                    continue
                f = self.frames[key] = CompiledFrame(site=site, name=site.function, compiles=[], reasons=[])
            secs = getattr(m, "entire_frame_compile_time_s", None)
            if secs is None:
                us = getattr(m, "duration_us", None)
                secs = us / 1e6 if us is not None else 0.0
            f.compiles.append([i, round(float(secs) * 1e3, 3)])
            why = getattr(m, "recompile_reason", None)
            if why and len(f.reasons) < MAX_REASONS:
                f.reasons.append(str(why).strip().splitlines()[0])

    def records(self, last_step: int) -> CompileRecord | None:
        self.end_step(last_step)
        if not self.breaks and not self.frames:
            return None
        return CompileRecord(graph_breaks=list(self.breaks.values()), frames=list(self.frames.values()))
