"""Why two sides of a comparison differ: the step-time change split into phases, then into modules and
operators, with the environment first where it differs.

- Phases, from every run folder of each side (steps.json, probes.json): the mean over the steady-state
  steps of data loading, forward, backward, optimizer and the rest of the step. Means, not medians:
  means add up, so the phases' changes sum to the step's change. The training thread's wait for a
  CPU (probes.json `cpu_wait`) is shown beside them: it lies inside the other phases, and where it
  grew by most of the change while the thread's own CPU time stayed the same, the host, not the
  code, is the likely cause (more work on a busy host also waits more: that is the code's).
- Modules and operators, from one profiled trace per side (the run whose steady median is its side's
  median): per profiled step, each module's own time (its span less the modules it called), aligned by
  its path of module classes (`Net > Sequential > Linear`: instance numbers differ between two versions
  of a model, classes do not), and each operator's own time (less the operators it called) within the
  module it ran in; on a GPU trace, kernels by name. The changes are shares of the change of the
  profiled step, whose timings the profiler inflates alike on both sides.
- A module's class is located in the user's files (meta.json `user_files`) where one defines it.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from perfdoctor.contracts.run import Probes, read_meta
from perfdoctor.contracts.run import read as read_run_file
from perfdoctor.contracts.source import read_source
from perfdoctor.errors import PerfdoctorError
from perfdoctor.gate.baseline import RunRecord, meta_and_steps
from perfdoctor.stats import steady_steps
from perfdoctor.trace.model import CPU_OP, KERNEL, PYFUNC

PHASES = (("data loading", "data_ms"), ("forward", "forward_ms"), ("backward", "backward_ms"),
          ("optimizer", "optimizer_ms"))
TOP = 5
HOST_FIRST = 0.5  # the CPU wait grew by at least this share of the step's change: the host is named first,
# unless the thread's own CPU time per step changed by this much (its work changed: more work also waits more on
# a busy host); the same work's CPU time varies by a few per cent from run to run
WORK_CHANGE = 0.10
_INSTANCE = re.compile(r"_\d+$")
_BACKWARD = "autograd::engine::evaluate_function: "


@dataclass
class Part:
    """One contributor to the change: a phase, a module or an operator, per step."""

    name: str
    base_ms: float
    cur_ms: float
    where: str | None = None  # file:line in the user's code, where known

    @property
    def delta_ms(self) -> float:
        return self.cur_ms - self.base_ms

    def as_dict(self, total: float | None) -> dict[str, Any]:
        return {"name": self.name, "baseline_ms": round(self.base_ms, 4), "current_ms": round(self.cur_ms, 4),
                "delta_ms": round(self.delta_ms, 4),
                "share": None if not total else round(self.delta_ms / total, 4), "where": self.where}


@dataclass
class Explanation:
    step_base_ms: float | None = None  # mean steady step per side (run folders)
    step_cur_ms: float | None = None
    phases: list[Part] = field(default_factory=list)
    cpu_wait: Part | None = None
    profiled_base_ms: float | None = None  # mean profiled step per side (the traces)
    profiled_cur_ms: float | None = None
    modules: list[Part] = field(default_factory=list)  # the top contributors, largest change first
    operators: list[Part] = field(default_factory=list)
    unit: str = "operator"  # "operator" on a CPU trace, "kernel" on a GPU trace
    first: list[str] = field(default_factory=list)  # what to say before the parts: the environment, the host
    notes: list[str] = field(default_factory=list)

    @property
    def step_delta_ms(self) -> float | None:
        if self.step_base_ms is None or self.step_cur_ms is None:
            return None
        return self.step_cur_ms - self.step_base_ms

    @property
    def profiled_delta_ms(self) -> float | None:
        if self.profiled_base_ms is None or self.profiled_cur_ms is None:
            return None
        return self.profiled_cur_ms - self.profiled_base_ms

    def as_dict(self) -> dict[str, Any]:
        d, p = self.step_delta_ms, self.profiled_delta_ms
        return {"first": self.first, "step_ms": [_r(self.step_base_ms), _r(self.step_cur_ms)],
                "phases": [x.as_dict(d) for x in self.phases],
                "cpu_wait": None if self.cpu_wait is None else self.cpu_wait.as_dict(d),
                "profiled_step_ms": [_r(self.profiled_base_ms), _r(self.profiled_cur_ms)],
                "modules": [x.as_dict(p) for x in self.modules], "unit": self.unit,
                "operators": [x.as_dict(p) for x in self.operators], "notes": self.notes}

    def headline(self) -> str | None:
        """The change's first cause in one sentence: the environment or the host where they come first,
        else the module, else the phase, that changed most."""
        if self.first:
            return self.first[0]
        if self.modules and self.profiled_delta_ms:
            top, total = self.modules[0], self.profiled_delta_ms
        elif self.phases and self.step_delta_ms:
            top, total = self.phases[0], self.step_delta_ms
        else:
            return None
        return f"{top.name}: {top.delta_ms:+.2f} ms per step, {top.delta_ms / total:.0%} of the change"


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _run_dirs(records: list[RunRecord]) -> list[Path]:
    return [Path(r.source) for r in records if r.source and (Path(r.source) / "steps.json").is_file()]


def _phases(dirs: list[Path]) -> tuple[dict[str, float], float | None, float | None, float | None]:
    """Mean per steady step of each phase, of the whole step, and of the training thread's wait for a CPU
    and time on one, over the side's runs."""
    sums: dict[str, list[float]] = {k: [] for _, k in PHASES}
    walls: list[float] = []
    waits: list[float] = []
    runs: list[float] = []
    for d in dirs:
        meta, steps = meta_and_steps(d)
        window = msgspec.to_builtins(meta.window) if meta.window is not None else None
        steady = steady_steps([s for s in steps if s.get("wall_ms") is not None], window)
        probes = read_run_file(d / "probes.json", Probes) if (d / "probes.json").is_file() else None
        wait = probes.cpu_wait.wait_ms if probes is not None and probes.cpu_wait is not None else []
        run = probes.cpu_wait.run_ms if probes is not None and probes.cpu_wait is not None else []
        for s in steady:
            walls.append(float(s["wall_ms"]))
            for _, k in PHASES:
                sums[k].append(float(s.get(k) or 0.0))
            if 0 < s["i"] <= min(len(wait), len(run)):
                waits.append(float(wait[s["i"] - 1]))
                runs.append(float(run[s["i"] - 1]))
    means = {k: statistics.fmean(v) for k, v in sums.items() if v}
    whole = len(waits) == len(walls)
    return means, _mean(walls), _mean(waits) if whole else None, _mean(runs) if whole else None


def _median_run(records: list[RunRecord]) -> Path | None:
    """The run folder with a trace whose steady median is nearest its side's median."""
    runs = [(r.median_ms, Path(r.source)) for r in records
            if r.median_ms and r.source and (Path(r.source) / "trace.json.gz").is_file()]
    if not runs:
        return None
    mid = statistics.median(m for m, _ in runs)
    return min(runs, key=lambda x: abs(x[0] - mid))[1]


@dataclass
class _Profile:
    step_ms: float
    modules: dict[str, float]  # class path -> own ms per step
    operators: dict[tuple[str, str], float]  # (operator or kernel, class path) -> own ms per step
    unit: str


def _own_times(intervals: list[tuple[float, float, int]]) -> dict[int, tuple[float, int | None]]:
    """For intervals (start, end, id) on one thread, each one's own time (less the intervals nested
    directly inside it) and its parent's id."""
    out: dict[int, tuple[float, int | None]] = {}
    stack: list[tuple[float, int]] = []  # (end, id)
    own: dict[int, float] = {}
    parent: dict[int, int | None] = {}
    for start, end, i in sorted(intervals, key=lambda x: (x[0], -x[1])):
        while stack and stack[-1][0] <= start:
            stack.pop()
        p = stack[-1][1] if stack else None
        parent[i] = p
        own[i] = end - start
        if p is not None:
            own[p] -= min(end, stack[-1][0]) - start
        stack.append((end, i))
    for i, v in own.items():
        out[i] = (max(0.0, v), parent[i])
    return out


def _profile(run_dir: Path) -> _Profile | None:
    from perfdoctor.trace.loader import load_trace  # the traces only where a comparison is explained

    try:
        t = load_trace(run_dir / "trace.json.gz")
    except PerfdoctorError:
        return None
    if not t.steps:
        return None
    lo, hi = t.steps[0][1], t.steps[-1][2]
    n = len(t.steps)
    by_track: dict[str, list[tuple[float, float, int]]] = {}
    for i in t.indices(PYFUNC):
        if t.name_of(i).startswith("nn.Module: ") and lo <= t.ts[i] < hi:
            by_track.setdefault(t.track_of(i), []).append((t.ts[i], t.ts[i] + t.dur[i], i))
    path: dict[int, str] = {}
    modules: dict[str, float] = {}
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for track, ivs in by_track.items():
        own = _own_times(ivs)
        for start, end, i in sorted(ivs, key=lambda x: (x[0], -x[1])):
            name = _INSTANCE.sub("", t.name_of(i)[len("nn.Module: "):])
            p = own[i][1]
            path[i] = f"{path[p]} > {name}" if p is not None and p in path else name
            modules[path[i]] = modules.get(path[i], 0.0) + own[i][0] / 1000 / n
            spans.setdefault(track, []).append((start, end, path[i]))
    # the backward: each autograd node (`evaluate_function: XBackward0`) belongs to the module whose
    # forward op made it (they share autograd's sequence number), its time to that module's
    ops: dict[str, list[tuple[float, float, int]]] = {}
    for i in t.indices(CPU_OP):
        if lo <= t.ts[i] < hi:
            ops.setdefault(t.track_of(i), []).append((t.ts[i], t.ts[i] + t.dur[i], i))
    made_in: dict[int, str] = {}
    backward: dict[str, list[tuple[float, float, int]]] = {}
    for track, ivs in ops.items():
        mods = sorted(spans.get(track, []))
        for start, end, i in ivs:
            q = t.seq.get(i)
            if q is None:
                continue
            if t.name_of(i).startswith(_BACKWARD):
                backward.setdefault(track, []).append((start, end, q))
            elif q not in made_in:
                where = _innermost(mods, start)
                if where:
                    made_in[q] = where
    for track, bws in backward.items():
        resolved = []
        for start, end, q in bws:
            owner = made_in.get(q)
            if owner is not None:
                modules[owner] = modules.get(owner, 0.0) + (end - start) / 1000 / n
                resolved.append((start, end, owner))
        spans.setdefault(track, []).extend(resolved)
    gpu = t.indices(KERNEL)
    operators: dict[tuple[str, str], float] = {}
    if gpu:
        for i in gpu:
            if lo <= t.ts[i] < hi + 1e6:
                key = (t.name_of(i), "")
                operators[key] = operators.get(key, 0.0) + t.dur[i] / 1000 / n
    else:
        for track, ivs in ops.items():
            own = _own_times(ivs)
            mods = sorted(spans.get(track, []))
            for start, _end, i in ivs:
                if t.name_of(i).startswith(_BACKWARD):
                    continue  # its operators are counted, not the node's wrapper again
                key = (t.name_of(i), _innermost(mods, start))
                operators[key] = operators.get(key, 0.0) + own[i][0] / 1000 / n
    step_ms = statistics.fmean((e - s) / 1000 for _, s, e in t.steps)
    return _Profile(step_ms, modules, operators, "kernel" if gpu else "operator")


def _innermost(spans: list[tuple[float, float, str]], ts: float) -> str:
    """The innermost module span holding `ts` (spans sorted by start)."""
    best = ""
    best_len = math.inf
    for start, end, p in spans:
        if start > ts:
            break
        if start <= ts < end and end - start < best_len:
            best, best_len = p, end - start
    return best


def _class_lines(run_dir: Path, names: set[str]) -> dict[str, str]:
    """file:line where the user's files define each class name."""
    try:
        files = read_meta(run_dir).user_files
    except PerfdoctorError:
        return {}
    out: dict[str, str] = {}
    for f in files if isinstance(files, list) else []:
        sf = read_source(f)
        if sf is None:
            continue
        for n, line in enumerate(sf.lines, 1):
            m = re.match(r"\s*class\s+(\w+)\s*[(:]", line)
            if m and m.group(1) in names and m.group(1) not in out:
                out[m.group(1)] = f"{f}:{n}"
    return out


def _defined(path: str, lines: dict[str, str]) -> str | None:
    """Where the innermost class of a module path that the user's files define is defined."""
    return next((lines[c] for c in reversed(path.split(" > ")) if c in lines), None)


def _top(base: dict[Any, float], cur: dict[Any, float], delta: float | None) -> list[tuple[Any, float, float]]:
    keys = set(base) | set(cur)
    rows = [(k, base.get(k, 0.0), cur.get(k, 0.0)) for k in keys]
    sign = 1.0 if (delta or 0.0) >= 0 else -1.0  # a regression's contributors are what grew
    rows.sort(key=lambda r: -sign * (r[2] - r[1]))
    return rows[:TOP]


def explain(base: list[RunRecord], cur: list[RunRecord], env_differences: list[dict[str, Any]]) -> Explanation | None:
    """The explanation of the change between two sides' runs; None where neither side has a run folder."""
    bdirs, cdirs = _run_dirs(base), _run_dirs(cur)
    if not bdirs or not cdirs:
        return None
    e = Explanation()
    for d in env_differences:
        e.first.append(f"the environment differs: {d['key']} {d['baseline']} -> {d['current']}; the change may be "
                       f"the environment's rather than the code's")
    bp, e.step_base_ms, bwait, brun = _phases(bdirs)
    cp, e.step_cur_ms, cwait, crun = _phases(cdirs)
    delta = e.step_delta_ms
    if e.step_base_ms is not None and e.step_cur_ms is not None:
        named = [Part(label, bp.get(k, 0.0), cp.get(k, 0.0)) for label, k in PHASES if k in bp or k in cp]
        rest = Part("other (the rest of the step)", e.step_base_ms - sum(x.base_ms for x in named),
                    e.step_cur_ms - sum(x.cur_ms for x in named))
        e.phases = sorted([*named, rest], key=lambda x: -abs(x.delta_ms))
        if bwait is not None and cwait is not None:
            e.cpu_wait = Part("waiting for a CPU (inside the phases above)", bwait, cwait)
            more_work = brun is None or crun is None or not brun or abs(crun / brun - 1) >= WORK_CHANGE
            if delta and e.cpu_wait.delta_ms * delta > 0 and abs(e.cpu_wait.delta_ms) >= HOST_FIRST * abs(delta) \
                    and not more_work:
                e.first.append(f"host contention: the training thread's wait for a CPU changed by "
                               f"{e.cpu_wait.delta_ms:+.2f} ms per step, {abs(e.cpu_wait.delta_ms / delta):.0%} of the "
                               f"step's change: other processes competed for the CPUs, the code may not have changed speed")
    bdir, cdir = _median_run(base), _median_run(cur)
    bprof = _profile(bdir) if bdir is not None else None
    cprof = _profile(cdir) if cdir is not None and bprof is not None else None
    if bprof is None or cprof is None:
        e.notes.append("no profiled trace on both sides: the change is split into phases only")
        return e
    e.profiled_base_ms, e.profiled_cur_ms, e.unit = bprof.step_ms, cprof.step_ms, cprof.unit
    pdelta = e.profiled_delta_ms
    assert cdir is not None
    classes = {p.split(" > ")[-1] for p in set(bprof.modules) | set(cprof.modules)}
    lines = _class_lines(cdir, classes)
    e.modules = [Part(k, b, c, _defined(k, lines)) for k, b, c in _top(bprof.modules, cprof.modules, pdelta)]
    e.operators = [Part(f"{op}" + (f" in {mod}" if mod else ""), b, c) for (op, mod), b, c
                   in _top(bprof.operators, cprof.operators, pdelta)]
    return e
